"""Fit conversation history into a token budget (issue 2, gateway item 7).

History items are dropped oldest first; the persona card (system prompt), the final instruction and the
latest user message are never dropped. Seed context (a meeting excerpt) counts as the oldest items, so a
21k-character excerpt is cut from its start until the prompt fits.
"""

from __future__ import annotations

from typing import Callable, Sequence, TypeVar

T = TypeVar("T")


def trim_oldest_first(items: Sequence[T], render: Callable[[Sequence[T]], str], count_tokens: Callable[[str], int],
                      budget_tokens: int, protected: Callable[[int, T], bool] = lambda i, t: False) -> list[T]:
    """Drop the oldest unprotected items until ``count_tokens(render(kept)) <= budget_tokens``.

    Uses a binary search over how many unprotected oldest items to drop, so it costs O(log n) renders.

    Args:
        items: History items, oldest first.
        render: Builds the full prompt text for a candidate list of items.
        count_tokens: Tokenizer length of a text.
        budget_tokens: Most prompt tokens allowed (context window minus ``max_tokens``).
        protected: ``protected(index, item)`` True for items that must stay (e.g. the latest user message).

    Returns:
        The kept items, in order.

    Raises:
        ValueError: the prompt does not fit even with every unprotected item dropped.
    """
    items = list(items)
    droppable = [i for i, it in enumerate(items) if not protected(i, it)]

    def kept(k: int) -> list[T]:
        gone = set(droppable[:k])
        return [it for i, it in enumerate(items) if i not in gone]

    if count_tokens(render(items)) <= budget_tokens:
        return items
    lo, hi = 1, len(droppable)
    if count_tokens(render(kept(hi))) > budget_tokens:
        raise ValueError(f"the prompt does not fit in {budget_tokens} tokens even without history; "
                         "shorten the message or raise engine.max_model_len")
    while lo < hi:
        mid = (lo + hi) // 2
        if count_tokens(render(kept(mid))) <= budget_tokens:
            hi = mid
        else:
            lo = mid + 1
    return kept(lo)
