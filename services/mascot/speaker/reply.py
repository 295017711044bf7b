"""Generate one streamed reply (a persona's or the simulated user's) and split off its thinking text."""

from __future__ import annotations

import asyncio
import time
from contextlib import aclosing
from dataclasses import dataclass, field, replace
from typing import Any, AsyncIterator, Callable, Sequence

from mascot.core.adapters.registry import parse_version_name
from mascot.core.context import fit_history
from mascot.core.dialogue import HistoryTurn, strip_control_chars
from mascot.core.engine import BASE_ADAPTER, GenerationRequest, GenerationResult, SamplingParams, StreamDelta
from mascot.core.guard import GuardSettings, ReplyContext, SentenceGate, cut_back, supporter_reason
from mascot.core.personas import PersonaCard
from mascot.speaker.prompts import (
    VisibleTextFilter,
    build_persona_messages,
    build_user_sim_messages,
    directive_text,
    stop_strings,
)


@dataclass
class ReplyOutcome:
    """The finished reply: ``text`` equals the joined visible deltas; neither it nor ``think`` holds a control
    character (:data:`mascot.core.dialogue.CONTROL_CHARS` are removed from the model's output).

    Attributes:
        rejections: ``{"attempt", "reason", "text"}`` per attempt the reply checks refused (nothing of it was sent).
        rejected: True when every attempt was refused (``text`` is then empty).
        cut_reason: Why the accepted reply was cut back to a sentence end ("" when it was not).
        attempts: Generations made (1 + regenerations).
    """

    text: str
    think: str
    adapter_version: str
    generated_tokens: int
    first_token_seconds: float
    truncated: bool
    rejections: list = field(default_factory=list)
    rejected: bool = False
    cut_reason: str = ""
    attempts: int = 1
    #: Tokens of the text delivered (``text`` as released plus ``think``, counted by the engine's tokenizer); the
    #: rest of ``generated_tokens`` went to refused attempts and cut text.
    delivered_tokens: int = 0


@dataclass(frozen=True)
class RetryPolicy:
    """How a rejected reply is generated again (the ``guard`` config section).

    Attributes:
        max_attempts: Generations per reply, >= 1.
        penalty_step: Added to the repetition penalty per regeneration.
        retry_temperature: Temperature of a regeneration when the configured one is 0.
    """

    max_attempts: int = 3
    penalty_step: float = 0.1
    retry_temperature: float = 0.7

    @classmethod
    def from_guard(cls, guard: Any) -> "RetryPolicy":
        """The policy of a ``guard`` config section (:class:`mascot.core.config.GuardConfig`): its attempts,
        penalty step and retry temperature; one attempt when the checks are off."""
        return cls(max_attempts=guard.max_attempts if guard.enabled else 1, penalty_step=guard.retry_penalty_step,
                   retry_temperature=guard.retry_temperature)

    def sampling(self, base: SamplingParams, attempt: int) -> SamplingParams:
        """Sampling of attempt ``attempt`` (0 = ``base``): a new seed, a higher repetition penalty and, when
        ``base`` is greedy, ``retry_temperature`` (so every regeneration changes something that takes effect)."""
        if attempt == 0:
            return base
        return replace(base, seed=None if base.seed is None else base.seed + 7919 * attempt,
                       temperature=base.temperature if base.temperature > 0 else self.retry_temperature,
                       repetition_penalty=min(10.0, base.repetition_penalty + self.penalty_step * attempt))


def choose_adapter(loaded: Sequence[str], persona_id: str, mode: str, shared: str = "") -> str | None:
    """Pick the LoRA adapter for a persona.

    ``per_persona``: the highest loaded version named ``<persona_id>--v<N>``, else none;
    ``shared``: ``shared`` if loaded; ``none``: no adapter. Returns the adapter name or None (base model).
    """
    if mode == "shared":
        return shared if shared and shared in loaded else None
    if mode != "per_persona":
        return None
    best = None
    for name in loaded:
        try:
            persona, n = parse_version_name(name)
        except ValueError:  # another kind of adapter (the shared one, a base-model name)
            continue
        if persona == persona_id and (best is None or n > best[0]):
            best = (n, name)
    return best[1] if best else None


async def _attempt(engine: Any, prompt: str, sampling: SamplingParams, adapter: str | None,
                   filt: VisibleTextFilter, gate: SentenceGate, t0: float, first: list[float]
                   ) -> AsyncIterator[str | tuple[GenerationResult | None, int]]:
    """One generation through the visible-text filter and the sentence gate: yields released text, then
    ``(result, tokens)`` (result None when the gate stopped generation early)."""
    result: GenerationResult | None = None
    tokens = 0
    agen = engine.stream(GenerationRequest(prompt, sampling, adapter=adapter))
    try:
        async for item in agen:
            if isinstance(item, StreamDelta):  # control characters (NUL, ESC, ...) never reach a person or the store
                tokens += 1
                out = gate.feed(filt.feed(strip_control_chars(item.text)))
            else:
                result = item
                tokens = len(item.token_ids)
                out = gate.feed(filt.feed("", final=True))
                out += gate.finish("stop" if filt.truncated else item.finish_reason)
            if out:
                if not first[0]:
                    first[0] = time.perf_counter() - t0
                yield out
            if gate.stopped:
                break
    finally:
        await agen.aclose()  # a stopped gate ends the engine request (it frees its batch slot)
    yield (result, tokens)


async def guarded_reply(engine: Any, build_filter: Callable[[], VisibleTextFilter], prompt: str,
                        sampling: SamplingParams, adapter: str | None, ctx: ReplyContext, guard: GuardSettings,
                        policy: RetryPolicy, extra_check: Callable[[str, str], str | None] | None = None
                        ) -> AsyncIterator[str | ReplyOutcome]:
    """Generate a reply under the reply checks: stream released sentences, then a :class:`ReplyOutcome`.

    Each attempt's text goes through :class:`~mascot.speaker.prompts.VisibleTextFilter` and
    :class:`~mascot.core.guard.SentenceGate`; an attempt whose first sentence fails is regenerated
    (:meth:`RetryPolicy.sampling`), a later failing sentence cuts the reply there.
    """
    t0 = time.perf_counter()
    first = [0.0]
    rejections: list[dict] = []
    tokens = 0
    filt = build_filter()
    for attempt in range(policy.max_attempts):
        filt = build_filter()
        gate = SentenceGate(ctx, guard, extra_check)
        async for item in _attempt(engine, prompt, policy.sampling(sampling, attempt), adapter, filt, gate, t0,
                                   first):
            if isinstance(item, tuple):
                tokens += item[1]
            else:
                yield item
        if gate.accepted:
            shown = gate.released + filt.think  # the reply and its thinking text are both stored
            delivered = min(tokens, engine.count_tokens(shown)) if shown else 0
            yield ReplyOutcome(text=gate.released, think=filt.think, adapter_version=adapter or BASE_ADAPTER,
                               generated_tokens=tokens, delivered_tokens=delivered, first_token_seconds=first[0],
                               truncated=filt.truncated,
                               rejections=rejections, cut_reason=gate.cut_reason or "", attempts=attempt + 1)
            return
        rejections.append({"attempt": attempt, "reason": gate.rejected_reason or "empty",
                           "text": gate.rejected_text[:500]})
    yield ReplyOutcome(text="", think=filt.think, adapter_version=adapter or BASE_ADAPTER, generated_tokens=tokens,
                       first_token_seconds=0.0, truncated=filt.truncated, rejections=rejections, rejected=True,
                       attempts=policy.max_attempts)


async def coalesced(source: AsyncIterator[Any], interval_s: float) -> AsyncIterator[Any]:
    """``source``'s items with consecutive text deltas (``str``) merged: the first delta passes at once, then the
    text that arrives within ``interval_s`` seconds of a delta goes out as one; any other item (a
    :class:`ReplyOutcome`) passes unchanged after the text before it. ``interval_s`` <= 0 passes every item as it
    comes. Closing this generator stops ``source`` (its engine request ends)."""
    if interval_s <= 0:
        async with aclosing(source) as items:
            async for item in items:
                yield item
        return
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue = asyncio.Queue(maxsize=256)  # bounded: a consumer that stops reading stops generation
    end = object()

    async def pump() -> None:
        try:
            async with aclosing(source) as items:
                async for item in items:
                    await queue.put(item)
        except asyncio.CancelledError as e:
            if asyncio.current_task().cancelling():  # ours: the consumer is gone
                raise
            await queue.put(_Failed(e))  # the source's own: handed on like any error
            return
        except Exception as e:  # noqa: BLE001 - handed to the consumer, raised there
            await queue.put(_Failed(e))  # waits for room, so the consumer always gets it
            return
        await queue.put(end)

    task = asyncio.create_task(pump())

    def check(item: Any) -> Any:
        if isinstance(item, _Failed):
            raise item.error
        return item

    try:
        first = True
        while True:
            item = check(await queue.get())
            if item is end:
                return
            if not isinstance(item, str) or first:
                first = first and not isinstance(item, str)
                yield item
                continue
            parts, after = [item], None
            deadline = loop.time() + interval_s
            while (left := deadline - loop.time()) > 0:
                try:
                    nxt = check(await asyncio.wait_for(queue.get(), left))
                except asyncio.TimeoutError:
                    break
                if isinstance(nxt, str):
                    parts.append(nxt)
                else:
                    after = nxt
                    break
            yield "".join(parts)
            if after is end:
                return
            if after is not None:
                yield after
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


@dataclass
class _Failed:
    error: BaseException


def persona_sources(card: PersonaCard, system: str, action: str, tone: str) -> list[str]:
    """Prompt texts a persona's reply may not echo: its system prompt, its card's fields, the directive."""
    fields = [card.goal, card.role, *card.expertise, *card.allowed_moves, *card.forbidden_moves, *card.style]
    return [system, " ".join(fields), action, tone, directive_text(card.name, action, tone)]


async def persona_reply(engine: Any, card: PersonaCard, roster: Sequence[PersonaCard], history: Sequence[HistoryTurn],
                        context: Sequence[tuple[str, str]], action: str, tone: str, *, max_tokens: int,
                        temperature: float, top_p: float, seed: int | None,
                        adapter: str | None, persona_prompt: bool = True, repetition_penalty: float = 1.0,
                        frequency_penalty: float = 0.0, guard: GuardSettings | None = None,
                        policy: RetryPolicy | None = None) -> AsyncIterator[str | ReplyOutcome]:
    """Stream a persona's checked visible deltas, then a :class:`ReplyOutcome` (``persona_prompt`` False: MASCOT-P).

    The reply is checked against its prompt (system text, card, directive), the earlier turns and the speaker tags
    (:func:`guarded_reply`); ``guard`` None uses the default thresholds, ``policy`` None the default retries.

    Raises:
        ValueError: the prompt cannot fit the context window even with history trimmed.
    """
    names = {c.id: c.name for c in roster}
    names.setdefault(card.id, card.name)

    def build(h: list, c: list) -> list[dict[str, str]]:
        return build_persona_messages(card, h, c, action, tone, names, persona_prompt)

    msgs = fit_history(build, history, context, engine.render_chat, engine.count_tokens,
                       engine.max_context_tokens - max_tokens)
    sp = SamplingParams(max_tokens=max_tokens, temperature=temperature, top_p=top_p, seed=seed,
                        stop=stop_strings(card.name, list(names.values())), repetition_penalty=repetition_penalty,
                        frequency_penalty=frequency_penalty)
    ctx = persona_reply_context(card, names, msgs[0]["content"], action, tone, history)
    async for item in guarded_reply(engine, lambda: persona_text_filter(card, names),
                                    engine.render_chat(msgs), sp, adapter, ctx, guard or GuardSettings(),
                                    policy or RetryPolicy()):
        yield item


def persona_reply_context(card: PersonaCard, names: dict[str, str], system: str, action: str, tone: str,
                          history: Sequence[HistoryTurn]) -> ReplyContext:
    """What a persona's reply is checked against: its prompt texts (:func:`persona_sources`), the earlier turns of
    ``history``, every speaker tag (``names``: persona id -> display name, the roster's) and the latest user message
    (the feeling it must fit)."""
    users = [t.text for t in history if t.role == "user"]
    return ReplyContext(sources=persona_sources(card, system, action, tone), earlier=[t.text for t in history],
                        tags=["User", "Director", *names.values()], answers=users[-1] if users else "")


def persona_text_filter(card: PersonaCard, names: dict[str, str]) -> VisibleTextFilter:
    """The visible-text filter of ``card``'s replies: its own tag is dropped, another speaker's tag cuts the reply."""
    return VisibleTextFilter(own_tag=card.name,
                             foreign_tags=["User", "Director", *[n for n in names.values() if n != card.name]])


def served_persona_text(card: PersonaCard, names: dict[str, str], system: str, history: Sequence[HistoryTurn],
                        completion: str, finish_reason: str, guard: GuardSettings, action: str,
                        tone: str) -> tuple[str, str]:
    """What serving would deliver of one whole generated persona reply, without generating again.

    The completion is cut at the first stop sequence serving decodes with (:func:`stop_strings`, finish reason
    then ``stop``), passed through the visible-text filter and the sentence gate, exactly as a streamed attempt is
    (:func:`guarded_reply`). Used where replies are sampled outside serving (phase 1's GRPO completions).

    Args:
        card: The speaking persona; ``names`` maps persona id -> display name for the roster (tags, stops).
        system: The system message of the prompt the completion answers (the echo check's prompt text).
        history: Visible turns before the reply (the copy check's earlier turns).
        completion: The generated text; ``finish_reason``: ``"stop"`` (end of sequence) or ``"length"`` (token
            budget reached: an unfinished last sentence is dropped).
        guard: Thresholds of the reply checks.
        action, tone: The directive the prompt carried.

    Returns:
        ``(text, reason)``: the delivered text and why the rest was cut (``""`` when nothing was); ``("",
        reason)`` when serving would refuse this attempt (``echo``, ``loop``, ``duplicate``, ``short``,
        ``unfinished``, ``empty``).
    """
    names = {**names, card.id: card.name}
    cuts = [k for k in (completion.find(s) for s in stop_strings(card.name, list(names.values()))) if k != -1]
    if cuts:
        completion, finish_reason = completion[:min(cuts)], "stop"
    filt = persona_text_filter(card, names)
    visible = filt.feed(strip_control_chars(completion), final=True)
    return cut_back(visible, persona_reply_context(card, names, system, action, tone, history), guard,
                    "stop" if filt.truncated else finish_reason)


async def user_reply(engine: Any, situation: str, emotion: str, personality: str, roster: Sequence[PersonaCard],
                     history: Sequence[HistoryTurn], context: Sequence[tuple[str, str]], *, max_tokens: int,
                     temperature: float, top_p: float, seed: int | None, repetition_penalty: float = 1.0,
                     frequency_penalty: float = 0.0, guard: GuardSettings | None = None,
                     policy: RetryPolicy | None = None) -> AsyncIterator[str | ReplyOutcome]:
    """Stream the simulated user's checked visible deltas (base model, no adapter), then a :class:`ReplyOutcome`.

    Besides the reply checks (echo of its instructions, loop, copy of an earlier turn) a sentence written as a
    supporter (:func:`mascot.core.guard.supporter_reason`: a letter, comforting or advising the helpers) is refused.
    """
    names = {c.id: c.name for c in roster}

    def build(h: list, c: list) -> list[dict[str, str]]:
        return build_user_sim_messages(situation, emotion, personality, h, c, names)

    msgs = fit_history(build, history, context, engine.render_chat, engine.count_tokens,
                       engine.max_context_tokens - max_tokens)
    sp = SamplingParams(max_tokens=max_tokens, temperature=temperature, top_p=top_p, seed=seed,
                        stop=tuple(f"\n{n}:" for n in [*names.values(), "Director"]),
                        repetition_penalty=repetition_penalty, frequency_penalty=frequency_penalty)
    ctx = ReplyContext(sources=[msgs[0]["content"]], earlier=[t.text for t in history],
                       tags=["Director", *names.values()])
    async for item in guarded_reply(engine, lambda: VisibleTextFilter(own_tag="User",
                                                                      foreign_tags=["Director", *names.values()]),
                                    engine.render_chat(msgs), sp, None, ctx, guard or GuardSettings(),
                                    policy or RetryPolicy(), supporter_reason):
        yield item
