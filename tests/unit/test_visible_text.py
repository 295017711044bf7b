"""User text with nothing visible (mascot.core.dialogue.has_visible_text) and the gateway's check of a message
(SendMessage text, RunSelfPlay opening): empty text and text of only whitespace, control, format, private-use or
non-characters is refused with INVALID_ARGUMENT and a message a person can act on; emoji and any script pass."""

from __future__ import annotations

import grpc
import pytest

from mascot.core.dialogue import has_visible_text, is_noncharacter
from mascot.core.errors import InvalidArgument
from mascot.gateway.servicer import _nonblank

NOTHING_VISIBLE = {
    "empty": "",
    "ascii-whitespace": " \t\n\r\n ",
    "unicode-spaces": "\u3000\u00a0\u2003\u2009\u205f\u2028\u2029",
    "noncharacter-ffff": "\uffff",
    "noncharacters-fdd0-fdef": "\ufdd0\ufde5\ufdef",
    "noncharacters-of-other-planes": "\U0001fffe\U0010ffff\U000effff",
    "private-use": "\ue000\uf8ff",
    "private-use-planes": "\U000f0000\U0010fffd",
    "format-zero-width": "\u200b\u200c\u200d\u2060\ufeff\u00ad",
    "format-bidi": "\u200e\u200f\u202e\u2066",
    "controls": "\x01\x07\x1b\x7f\x85\x9f",
    "fillers-and-braille-blank": "\u3164\u115f\uffa0\u2800",
    "variation-selectors-and-tags": "\ufe0f\U000e0041\U000e0100\u034f",
    "all-kinds-mixed": " \uffff\ue000\u200b\x01\n\ufdd0\t\u3000",
}

VISIBLE = {
    "emoji-only": "😢😢",
    "emoji-newer-than-pythons-unicode-tables": "🪿",  # unassigned (Cn) in Python 3.11's tables: still accepted
    "emoji-with-variation-selector": "\u2764\ufe0f",
    "latin": "ok",
    "arabic": "مرحبا",
    "han": "你好",
    "devanagari": "नमस्ते",
    "one-visible-among-invisible": "\u200b\uffff.\ue000",
    "combining-mark": "\u0301",
    "digit": "7",
}


@pytest.mark.parametrize("text", list(NOTHING_VISIBLE.values()), ids=list(NOTHING_VISIBLE))
def test_text_with_nothing_visible(text):
    assert not has_visible_text(text)


@pytest.mark.parametrize("text", list(VISIBLE.values()), ids=list(VISIBLE))
def test_text_with_something_visible(text):
    assert has_visible_text(text)


def test_the_66_noncharacters():
    found = [cp for cp in range(0x110000) if is_noncharacter(chr(cp))]
    assert len(found) == 66
    assert found[:2] == [0xFDD0, 0xFDD1] and found[-2:] == [0x10FFFE, 0x10FFFF]
    assert not is_noncharacter("\ufffd") and not is_noncharacter("\ufdcf") and not is_noncharacter("\ufdf0")


@pytest.mark.parametrize("text", list(NOTHING_VISIBLE.values()), ids=list(NOTHING_VISIBLE))
@pytest.mark.parametrize("field", ["text", "opening_text"])
def test_the_gateway_refuses_a_message_with_nothing_visible(text, field):
    with pytest.raises(InvalidArgument) as e:
        _nonblank(text, field, 4000)
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert e.value.message.startswith(f"the message has no visible text: {field} is empty or holds only whitespace")
    assert "send some words or emoji" in e.value.message


@pytest.mark.parametrize("text", list(VISIBLE.values()), ids=list(VISIBLE))
def test_the_gateway_accepts_visible_text_verbatim(text):
    assert _nonblank(text, "text", 4000) == text
