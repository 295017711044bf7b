"""coalesced(): speaker deltas merged within an interval, everything else passed in order, errors always raised."""

import asyncio

import pytest

from mascot.speaker.reply import coalesced


async def _source(items, error=None):
    for item in items:
        yield item
    if error is not None:
        raise error


async def test_text_is_merged_and_other_items_keep_their_place():
    marker = object()
    out = [x async for x in coalesced(_source(["a", "b", "c", marker, "d"]), 0.05)]
    assert out[0] == "a" and "".join(x for x in out if isinstance(x, str)) == "abcd"
    assert out.index(marker) == len(out) - 2 and len(out) <= 4


async def test_an_error_after_more_items_than_the_read_ahead_holds_is_raised_not_hung():
    with pytest.raises(ValueError, match="boom"):
        await asyncio.wait_for(_drain(coalesced(_source(["x"] * 600, ValueError("boom")), 0.05)), 10)


async def _drain(gen):
    return [x async for x in gen]
