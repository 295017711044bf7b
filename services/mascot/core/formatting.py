"""The one formatter of reward-model and judge inputs.

The reward service, the judge service and the training Jobs all build their inputs here, so a reward
model scores at serving time exactly the text it was trained on (the docs: "Input: persona
card + context + answer"). Thinking text never appears: callers pass visible text only.

Text layout of a reward-model input (plain text, no chat template)::

    [Persona] The Anchor, Emotional Validator. Goal: ... Do: ...; ... Never: ...; ... Style: ...
    [Context]
    Meeting transcript line 1            (only when there is seed context)
    [Conversation]
    User: ...
    The Catalyst: ...
    [Reply by The Anchor]
    <the reply>

A tokenizer's EOS token is appended by :func:`with_eos`, exactly as TRL's ``RewardTrainer`` does for
non-conversational samples (TRL 1.16 ``RewardConfig.eos_token``), so serving and training see the same ids.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

from mascot.core.context import trim_history_context
from mascot.core.dialogue import HistoryTurn
from mascot.core.personas import PersonaCard

#: Version of the layout below; recorded in reward-model metadata and judge cache keys.
FORMAT_VERSION = "1"


def persona_card_text(card: PersonaCard) -> str:
    """One paragraph describing a persona card."""
    def join(xs: Sequence[str]) -> str:
        return "; ".join(xs) if xs else "-"
    return (f"{card.name}, {card.role}. Goal: {card.goal} Do: {join(card.allowed_moves)}. "
            f"Never: {join(card.forbidden_moves)}. Style: {join(card.style)}.")


def speaker_tag(turn: HistoryTurn, names: Mapping[str, str]) -> str:
    """``"User"`` for user turns, else the persona's display name (its id when unknown)."""
    return "User" if turn.role == "user" else names.get(turn.persona_id, turn.persona_id or "Agent")


def transcript_text(history: Sequence[HistoryTurn], names: Mapping[str, str]) -> str:
    """History as ``Tag: text`` lines, oldest first; ``(no earlier turns)`` when empty."""
    if not history:
        return "(no earlier turns)"
    return "\n".join(f"{speaker_tag(t, names)}: {t.text}" for t in history)


def context_text(context: Sequence[tuple[str, str]]) -> str:
    """Seed context ``(speaker, content)`` pairs as ``speaker: content`` lines."""
    return "\n".join(f"{s}: {c}" for s, c in context)


def meeting_transcript(context: Sequence[tuple[str, str]]) -> str:
    """The seed context (a meeting excerpt) as the director, the speakers and the baselines show it in a prompt:
    ``Meeting transcript:`` and then :func:`context_text`."""
    return "Meeting transcript:\n" + context_text(context)


def _reward_layout(card: PersonaCard, history: Sequence[HistoryTurn], context: Sequence[tuple[str, str]],
                   reply: str, names: Mapping[str, str]) -> str:
    parts = [f"[Persona] {persona_card_text(card)}"]
    if context:
        parts.append("[Context]\n" + context_text(context))
    parts.append("[Conversation]\n" + transcript_text(history, names))
    parts.append(f"[Reply by {card.name}]\n{reply.strip()}")
    return "\n".join(parts)


def reward_text(card: PersonaCard, history: Sequence[HistoryTurn], reply: str, *,
                context: Sequence[tuple[str, str]] = (), names: Mapping[str, str] | None = None,
                count_tokens: Callable[[str], int] | None = None, budget_tokens: int = 0) -> tuple[str, bool]:
    """The reward-model input for one reply.

    Args:
        card: The persona that wrote ``reply``.
        history: Visible history before the reply, oldest first.
        reply: The reply's visible text.
        context: Seed context, treated as older than the history.
        names: ``{persona_id: display name}`` for speaker tags; the card's own name is always known.
        count_tokens: Token counter of the reward model's tokenizer; with ``budget_tokens`` > 0, context and
            history are dropped oldest first until the text fits (the card and the reply are never dropped).
        budget_tokens: Most tokens allowed (the window minus room for special tokens); 0 disables trimming.

    Returns:
        ``(text, truncated)``; ``truncated`` is True when anything was dropped.

    Raises:
        ValueError: the card and the reply alone exceed ``budget_tokens``.
    """
    names = {**(names or {}), card.id: card.name}
    if not count_tokens or budget_tokens <= 0:
        return _reward_layout(card, history, context, reply, names), False
    h, c, cut = trim_history_context(history, context, lambda h, c: _reward_layout(card, h, c, reply, names),
                                     count_tokens, budget_tokens, protect_last_user=False)
    return _reward_layout(card, h, c, reply, names), cut


def with_eos(text: str, eos_token: str | None) -> str:
    """Append ``eos_token`` unless ``text`` already ends with it (TRL 1.16 RewardTrainer's rule)."""
    if eos_token and not text.endswith(eos_token):
        return text + eos_token
    return text


#: Tokens kept free for special tokens (the EOS) when fitting a reward-model input to its window.
SPECIAL_TOKEN_ROOM = 4


def reward_model_text(tokenizer: Any, max_length: int, card: PersonaCard, history: Sequence[HistoryTurn],
                      reply: str, *, context: Sequence[tuple[str, str]] = (),
                      names: Mapping[str, str] | None = None) -> tuple[str, bool]:
    """The exact reward-model input of one reply, for serving and training alike: :func:`reward_text` fitted to
    ``max_length - SPECIAL_TOKEN_ROOM`` tokens of ``tokenizer`` (oldest context dropped first), plus its EOS
    (:func:`with_eos`).

    Returns:
        ``(text, truncated)``.

    Raises:
        ValueError: the card and the reply alone do not fit.
    """
    text, cut = reward_text(card, history, reply, context=context, names=names,
                            count_tokens=lambda s: len(tokenizer(s)["input_ids"]),
                            budget_tokens=max_length - SPECIAL_TOKEN_ROOM)
    return with_eos(text, tokenizer.eos_token), cut


def block_text(block: Sequence[HistoryTurn], names: Mapping[str, str]) -> str:
    """An N-turn block as numbered ``[k] Tag: text`` lines (collective rubric and group reward model)."""
    return "\n".join(f"[{i + 1}] {speaker_tag(t, names)}: {t.text}" for i, t in enumerate(block))


def roster_text(cards: Sequence[PersonaCard]) -> str:
    """The active personas, one card paragraph per line."""
    return "\n".join(f"- {persona_card_text(c)}" for c in cards)


def group_reward_text(cards: Sequence[PersonaCard], history: Sequence[HistoryTurn], block: Sequence[HistoryTurn],
                      context: Sequence[tuple[str, str]] = ()) -> str:
    """Group reward-model input: roster, context, the prefix and the N-turn block."""
    names = {c.id: c.name for c in cards}
    parts = ["[Personas]\n" + roster_text(cards)]
    if context:
        parts.append("[Context]\n" + context_text(context))
    parts.append("[Conversation]\n" + transcript_text(history, names))
    parts.append("[Block]\n" + block_text(block, names))
    return "\n".join(parts)


def group_reward_model_text(tokenizer: Any, max_length: int, cards: Sequence[PersonaCard],
                            history: Sequence[HistoryTurn], block: Sequence[HistoryTurn],
                            context: Sequence[tuple[str, str]] = ()) -> tuple[str, bool]:
    """The exact group reward-model input of one N-turn block, for serving and training:
    :func:`group_reward_text` with context and prefix history dropped oldest first until it fits
    ``max_length - SPECIAL_TOKEN_ROOM`` tokens of ``tokenizer`` (roster and block are never dropped), plus EOS.

    Returns:
        ``(text, truncated)``.

    Raises:
        ValueError: the roster and the block alone do not fit.
    """
    h, c, cut = trim_history_context(history, context, lambda h, c: group_reward_text(cards, h, block, c),
                                     lambda s: len(tokenizer(s)["input_ids"]), max_length - SPECIAL_TOKEN_ROOM,
                                     protect_last_user=False)
    return with_eos(group_reward_text(cards, h, block, c), tokenizer.eos_token), cut
