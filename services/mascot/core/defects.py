"""Reply defect detectors shared by the evaluation's defect rates and the training jobs' publish gate: fixed
definitions, independent of the reply-check settings (the ``guard`` config section).

- echo: a reply shares a word 8-gram with a source text (its persona's prompt, card or directive);
- loop: a word 4-gram occurs 3 or more times in one reply, a word 8-gram twice, a word 3-gram three times (a
  refrain), three sentences open with the same two words (one frame repeated), or a line (or sentence) of the reply
  repeats.
"""

from __future__ import annotations

from typing import Iterable

from mascot.core.guard import is_loop as guard_is_loop
from mascot.core.guard import shares_ngram

ECHO_NGRAM, LOOP_NGRAM, LOOP_COUNT = 8, 4, 3


def is_echo(reply: str, sources: Iterable[str]) -> bool:
    """True when ``reply`` shares a word 8-gram with any source text."""
    return shares_ngram(reply, sources, ECHO_NGRAM)


def is_loop(reply: str) -> bool:
    """True when a word 4-gram occurs 3+ times in ``reply``, a word 8-gram twice, or a line or sentence of it repeats
    (:func:`mascot.core.guard.is_loop` at these fixed settings)."""
    return guard_is_loop(reply, LOOP_NGRAM, LOOP_COUNT)


def card_source_text(card) -> str:
    """A persona card's fields a reply must not copy from (goal, role, expertise, moves, style), as one text."""
    return " ".join([card.goal, card.role, *card.expertise, *card.allowed_moves, *card.forbidden_moves, *card.style])
