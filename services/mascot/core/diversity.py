"""Distinct-n, the lexical diversity of a dialogue's agent turns: one definition for the evaluation report
(:mod:`mascot.eval.automatic`) and the training jobs' publish check of a new adapter's answers.
"""

from __future__ import annotations

from typing import Sequence

from mascot.core.embedding import check_texts


def tokenize(text: str) -> list[str]:
    """Lower-case ``text`` and split it with sacrebleu's 13a tokeniser (the one of the evaluation's Self-BLEU).

    13a (mteval-v13a.pl) splits most punctuation off words but keeps in-word apostrophes:
    ``"Don't stop."`` -> ``["don't", "stop", "."]``.

    Returns:
        The tokens; empty for a blank text.
    """
    from sacrebleu.tokenizers.tokenizer_13a import Tokenizer13a

    return Tokenizer13a()(text.lower()).split()


def distinct_n(turns: Sequence[str], n: int) -> float | None:
    """Distinct-n of one dialogue: unique n-grams / total n-grams over all its agent turns.

    Li et al. 2016 ("A Diversity-Promoting Objective Function for Neural Conversation Models", section 4.3), pooled
    over the dialogue: each turn is tokenised by :func:`tokenize` (lower-cased, 13a); n-grams are taken inside each
    turn (never across a turn boundary); the unique count is over the whole dialogue.

    Args:
        turns: The dialogue's agent-turn texts.
        n: n-gram order, >= 1.

    Returns:
        A value in (0, 1] (1 = no n-gram repeats); ``None`` when the turns hold no n-gram (no turns, or every turn
        shorter than ``n`` tokens).

    Raises:
        ValueError: ``n`` < 1.
        TypeError: a turn is not a str.
    """
    if n < 1:
        raise ValueError(f"distinct-n needs n >= 1, got {n}")
    turns = check_texts(turns)
    grams: list[tuple[str, ...]] = []
    for t in turns:
        toks = tokenize(t)
        grams.extend(tuple(toks[i:i + n]) for i in range(len(toks) - n + 1))
    if not grams:
        return None
    return len(set(grams)) / len(grams)
