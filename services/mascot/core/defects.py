"""Reply defect detectors shared by the evaluation's defect rates and the training jobs' publish gate: fixed
definitions, independent of the reply-check settings (the ``guard`` config section).

- echo: a reply shares a word 8-gram with a source text (its persona's prompt, card or directive);
- loop: a word 4-gram occurs 3 or more times in one reply, or a line (or sentence) of the reply repeats.
"""

from __future__ import annotations

from collections import Counter
from typing import Iterable

from mascot.core.guard import shares_ngram, split_sentences, words

ECHO_NGRAM, LOOP_NGRAM, LOOP_COUNT = 8, 4, 3


def is_echo(reply: str, sources: Iterable[str]) -> bool:
    """True when ``reply`` shares a word 8-gram with any source text."""
    return shares_ngram(reply, sources, ECHO_NGRAM)


def is_loop(reply: str) -> bool:
    """True when a word 4-gram occurs 3+ times in ``reply``, or a line or sentence of it repeats."""
    w = words(reply)
    c = Counter(tuple(w[i:i + LOOP_NGRAM]) for i in range(len(w) - LOOP_NGRAM + 1))
    if c and max(c.values()) >= LOOP_COUNT:
        return True
    for parts in ([ln for ln in reply.splitlines() if ln.strip()], split_sentences(reply)):
        keys = [" ".join(words(p)) for p in parts]
        keys = [k for k in keys if k]
        if len(set(keys)) < len(keys):
            return True
    return False


def card_source_text(card) -> str:
    """A persona card's fields a reply must not copy from (goal, role, expertise, moves, style), as one text."""
    return " ".join([card.goal, card.role, *card.expertise, *card.allowed_moves, *card.forbidden_moves, *card.style])
