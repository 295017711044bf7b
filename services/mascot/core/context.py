"""Fit conversation history into a token budget.

History items are dropped oldest first; the persona card (system prompt), the final instruction and the
latest user message are never dropped. Seed context (a meeting excerpt) counts as the oldest items, so a
21k-character excerpt is cut from its start until the prompt fits. When the latest user message alone is too long
for the window (any message within ``dialogue.max_message_chars`` is valid input, whatever the model's window), the
prompt shows it with its middle elided (:data:`ELISION`); the stored turn keeps every character.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Sequence, TypeVar

#: Put where the middle of a too-long latest user message was cut out of a prompt.
ELISION = " [...] "

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


def fit_history(build: Callable[[list, list], list[dict[str, str]]], history: Sequence, context: Sequence,
                render: Callable[[list], str], count_tokens: Callable[[str], int], budget_tokens: int,
                protect_last_user: bool = True) -> list[dict[str, str]]:
    """Call ``build(history, context)`` with items trimmed oldest first (seed context first, then history).

    The one window-fitting rule of speaker, baseline and judge prompts: the system prompt and the final
    instruction (built by ``build``) always stay; with ``protect_last_user`` the latest user turn
    (``item.role == "user"``) is never dropped.

    Args:
        build: Makes chat messages from the kept history and context.
        history: History items (with ``role``), oldest first.
        context: Seed context items, treated as older than the history.
        render: Renders messages to the prompt text that is counted.
        count_tokens: Tokenizer length of a text.
        budget_tokens: Most prompt tokens allowed.
        protect_last_user: Keep the latest user turn whatever it costs.

    Raises:
        ValueError: the prompt does not fit even with every droppable item gone.
    """
    h, c, _ = trim_history_context(history, context, lambda h, c: render(build(h, c)), count_tokens, budget_tokens,
                                   protect_last_user)
    return build(h, c)


def trim_history_context(history: Sequence, context: Sequence, render: Callable[[list, list], str],
                         count_tokens: Callable[[str], int], budget_tokens: int,
                         protect_last_user: bool = True) -> tuple[list, list, bool]:
    """Drop seed context, then history, oldest first, until ``count_tokens(render(history, context))`` fits.

    The one trimming rule behind every prompt and reward-model input (:func:`fit_history`, the director chat,
    :mod:`mascot.core.formatting`); with ``protect_last_user`` the latest user turn is never dropped.

    Returns:
        ``(kept_history, kept_context, truncated)``; ``truncated`` is True when anything was dropped.

    Raises:
        ValueError: the text does not fit even with every droppable item gone.
    """
    items: list[tuple[str, object]] = [("c", c) for c in context] + [("h", h) for h in history]
    last_user = max((i for i, (k, h) in enumerate(items) if k == "h" and h.role == "user"), default=-1) \
        if protect_last_user else -1

    def split(kept: Sequence[tuple[str, object]]) -> tuple[list, list]:
        return [v for k, v in kept if k == "h"], [v for k, v in kept if k == "c"]

    try:
        kept = trim_oldest_first(items, lambda kept: render(*split(kept)), count_tokens, budget_tokens,
                                 protected=lambda i, it: i == last_user)
    except ValueError:
        if last_user < 0 or not dataclasses.is_dataclass(items[last_user][1]):
            raise
        shortened = _elide_to_fit(items[last_user][1], lambda t: render(*split([("h", t)])), count_tokens,
                                  budget_tokens)
        return (*split([("h", shortened)]), True)
    return (*split(kept), len(kept) < len(items))


def elide_middle(text: str, keep: int) -> str:
    """``text`` cut to its first ``ceil(keep / 2)`` and last ``floor(keep / 2)`` characters around :data:`ELISION`
    (the text itself when ``keep >= len(text)``)."""
    if keep >= len(text):
        return text
    head = (keep + 1) // 2
    return text[:head] + ELISION + text[len(text) - (keep - head):]


def _elide_to_fit(turn: T, render: Callable[[T], str], count_tokens: Callable[[str], int], budget_tokens: int) -> T:
    """``turn`` (a dataclass with ``text``) with the most characters of its text kept (middle elided) such that the
    prompt with it as the only history item fits; binary search, O(log len(text)) renders.

    Raises:
        ValueError: the prompt does not fit even with the text cut to nothing (system prompt and instruction alone
            are over the budget).
    """
    text = turn.text  # type: ignore[attr-defined]

    def with_keep(keep: int) -> T:
        return dataclasses.replace(turn, text=elide_middle(text, keep))  # type: ignore[type-var]

    if count_tokens(render(with_keep(0))) > budget_tokens:
        raise ValueError(f"the prompt does not fit in {budget_tokens} tokens even without history and with the "
                         "latest message cut out; raise engine.max_model_len or shorten the persona card")
    lo, hi = 0, len(text)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if count_tokens(render(with_keep(mid))) <= budget_tokens:
            lo = mid
        else:
            hi = mid - 1
    return with_keep(lo)
