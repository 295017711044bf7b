"""Generate one streamed reply (a persona's or the simulated user's) and split off its thinking text."""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import Any, AsyncIterator, Sequence

from mascot.core.context import fit_history
from mascot.core.dialogue import HistoryTurn, strip_control_chars
from mascot.core.engine import BASE_ADAPTER, GenerationRequest, GenerationResult, SamplingParams, StreamDelta
from mascot.core.personas import PersonaCard
from mascot.speaker.prompts import (
    VisibleTextFilter,
    build_persona_messages,
    build_user_sim_messages,
    stop_strings,
)

_VERSION_RE = re.compile(r"^(?P<persona>[a-z][a-z0-9_]*)--v(?P<n>\d+)$")


@dataclass
class ReplyOutcome:
    """The finished reply: ``text`` equals the joined visible deltas; neither it nor ``think`` holds a control
    character (:data:`mascot.core.dialogue.CONTROL_CHARS` are removed from the model's output)."""

    text: str
    think: str
    adapter_version: str
    generated_tokens: int
    first_token_seconds: float
    truncated: bool


def choose_adapter(loaded: Sequence[str], persona_id: str, mode: str, shared: str = "") -> str | None:
    """Pick the LoRA adapter for a persona.

    ``per_persona``: the highest loaded version named ``<persona_id>--v<N>`` (DESIGN.md section 5), else none;
    ``shared``: ``shared`` if loaded; ``none``: no adapter. Returns the adapter name or None (base model).
    """
    if mode == "shared":
        return shared if shared and shared in loaded else None
    if mode != "per_persona":
        return None
    best = None
    for name in loaded:
        m = _VERSION_RE.match(name)
        if m and m["persona"] == persona_id and (best is None or int(m["n"]) > best[0]):
            best = (int(m["n"]), name)
    return best[1] if best else None


async def _stream(engine: Any, messages: list[dict[str, str]], sampling: SamplingParams, adapter: str | None,
                  filt: VisibleTextFilter) -> AsyncIterator[str | ReplyOutcome]:
    t0 = time.perf_counter()
    first = 0.0
    result: GenerationResult | None = None
    async for item in engine.stream(GenerationRequest(engine.render_chat(messages), sampling, adapter=adapter)):
        if isinstance(item, StreamDelta):  # control characters (NUL, ESC, ...) never reach a person or the store
            out = filt.feed(strip_control_chars(item.text))
        else:
            result = item
            out = filt.feed("", final=True)
        if out:
            if not first:
                first = time.perf_counter() - t0
            yield out
    assert result is not None
    yield ReplyOutcome(text=filt.visible, think=filt.think, adapter_version=adapter or BASE_ADAPTER,
                       generated_tokens=len(result.token_ids), first_token_seconds=first, truncated=filt.truncated)


async def persona_reply(engine: Any, card: PersonaCard, roster: Sequence[PersonaCard], history: Sequence[HistoryTurn],
                        context: Sequence[tuple[str, str]], action: str, tone: str, *, max_tokens: int,
                        temperature: float, top_p: float, seed: int | None,
                        adapter: str | None, persona_prompt: bool = True) -> AsyncIterator[str | ReplyOutcome]:
    """Stream a persona's visible deltas, then a :class:`ReplyOutcome` (``persona_prompt`` False: MASCOT-P).

    Raises:
        ValueError: the prompt cannot fit the context window even with history trimmed.
    """
    names = {c.id: c.name for c in roster}
    names.setdefault(card.id, card.name)

    def build(h: list, c: list) -> list[dict[str, str]]:
        return build_persona_messages(card, h, c, action, tone, names, persona_prompt)

    msgs = fit_history(build, history, context, engine.render_chat, engine.count_tokens,
                       engine.max_context_tokens - max_tokens)
    others = [n for n in names.values() if n != card.name]
    filt = VisibleTextFilter(own_tag=card.name, foreign_tags=["User", "Director", *others])
    sp = SamplingParams(max_tokens=max_tokens, temperature=temperature, top_p=top_p, seed=seed,
                        stop=stop_strings(card.name, list(names.values())))
    async for item in _stream(engine, msgs, sp, adapter, filt):
        yield item


async def user_reply(engine: Any, situation: str, emotion: str, personality: str, roster: Sequence[PersonaCard],
                     history: Sequence[HistoryTurn], context: Sequence[tuple[str, str]], *, max_tokens: int,
                     temperature: float, top_p: float, seed: int | None) -> AsyncIterator[str | ReplyOutcome]:
    """Stream the simulated user's visible deltas (base model, no adapter), then a :class:`ReplyOutcome`."""
    names = {c.id: c.name for c in roster}

    def build(h: list, c: list) -> list[dict[str, str]]:
        return build_user_sim_messages(situation, emotion, personality, h, c, names)

    msgs = fit_history(build, history, context, engine.render_chat, engine.count_tokens,
                       engine.max_context_tokens - max_tokens)
    filt = VisibleTextFilter(own_tag="User", foreign_tags=["Director", *names.values()])
    sp = SamplingParams(max_tokens=max_tokens, temperature=temperature, top_p=top_p, seed=seed,
                        stop=tuple(f"\n{n}:" for n in [*names.values(), "Director"]))
    async for item in _stream(engine, msgs, sp, None, filt):
        yield item
