"""One director decision: prompt, (constrained) generation, parse, cap, retries, fallback."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Sequence

import random

from mascot.core.dialogue import HistoryTurn, consecutive_turns, fallback_persona, strip_control_chars
from mascot.core.engine import GenerationRequest, SamplingParams, StructuredOutput
from mascot.core.personas import PersonaCard
from mascot.director.directive import (
    DirectiveError,
    ParsedDirective,
    check_cap,
    action_verbs,
    check_content,
    directive_regex,
    fallback_directive,
    parse_directive,
)

from mascot.director.prompts import EXAMPLE_ACTION, fit_messages

MODEL, RETRY, FALLBACK, RANDOM = "model", "retry", "fallback", "random"
#: Reasons of the content rules (:func:`mascot.director.directive.check_content`): the re-prompt states the reason
#: without the refused answer.
CONTENT_REASONS = ("directive_name", "directive_voice", "directive_addressee", "directive_person", "directive_copy")


@dataclass
class Decision:
    """The outcome of one decision.

    Attributes:
        directive: The chosen directive.
        source: ``model`` (first attempt valid), ``retry`` (a re-prompt valid), ``fallback``, or ``random``
            (``director.policy = random``).
        raw_attempts: Raw director text per attempt (1 + retries entries).
        parse_errors: The error of each failed attempt.
        model_choice: Persona the model named in its last attempt that named exactly one, before the cap; '' if none.
        generated_tokens: Tokens generated over all attempts.
        delivered_tokens: Tokens of the accepted attempt (0 for a fallback or random directive).
        rejection_reasons: :attr:`DirectiveError.reason` of each failed attempt.
    """

    directive: ParsedDirective
    source: str
    raw_attempts: list[str] = field(default_factory=list)
    parse_errors: list[str] = field(default_factory=list)
    model_choice: str = ""
    generated_tokens: int = 0
    delivered_tokens: int = 0
    rejection_reasons: list[str] = field(default_factory=list)

    @property
    def retries(self) -> int:
        """Re-prompts made: attempts after the first."""
        return max(0, len(self.raw_attempts) - 1)

    @property
    def raw(self) -> str:
        """Raw text of the deciding (or last failed) attempt."""
        return self.raw_attempts[-1] if self.raw_attempts else ""


def recent_speakers(history: Sequence[HistoryTurn], n: int) -> set[str]:
    """Persona ids of the last ``n`` agent turns of ``history`` (empty for ``n`` <= 0)."""
    if n <= 0:
        return set()
    return {t.persona_id for t in [t for t in history if t.role == "agent"][-n:]}


def choosable_personas(roster: Sequence[PersonaCard], history: Sequence[HistoryTurn],
                       cfg: Any) -> tuple[set[str], list[PersonaCard]]:
    """``(recent, choosable)``: the persona ids of the last ``cfg.rest_turns`` agent turns (at most all but one of the
    roster), and the personas a decision may pick: neither recent nor at ``cfg.max_consecutive_turns`` (the whole
    roster when that leaves none)."""
    recent = recent_speakers(history, min(cfg.rest_turns, len(roster) - 1))
    choosable = [c for c in roster if c.id not in recent
                 and consecutive_turns(history, c.id) + 1 <= cfg.max_consecutive_turns] or list(roster)
    return recent, choosable


def decision_regex(roster: Sequence[PersonaCard], choosable: Sequence[PersonaCard],
                   history: Sequence[HistoryTurn], cfg: Any) -> str:
    """The grammar a constrained decision samples under (:func:`~mascot.director.directive.directive_regex`):
    ``Agent`` among ``choosable``, an Action opening with a verb no recent directive opened with (``cfg.action_verbs``),
    a Tone of the chosen persona's words (``cfg.tone_vocabulary``), lengths from ``cfg``."""
    return directive_regex(
        choosable, max_action_chars=cfg.max_action_chars, max_tone_chars=cfg.max_tone_chars,
        max_think_chars=cfg.max_think_chars,
        verbs=action_verbs(history, cfg.fresh_verbs) if cfg.action_verbs else None,
        persona_tones=getattr(cfg, "tone_vocabulary", True))


def check_decision(parsed: ParsedDirective, roster: Sequence[PersonaCard], recent: set[str],
                   choosable: Sequence[PersonaCard], history: Sequence[HistoryTurn], cfg: Any,
                   names: Sequence[str], context: Sequence[tuple[str, str]] = ()) -> None:
    """The rules a parsed directive must pass to be served: the consecutive-turn cap, a rest for the ``recent``
    personas (while another is ``choosable``) and, with ``cfg.check_content``, the content rules
    (:func:`~mascot.director.directive.check_content` against every name in ``names``, the prompt's example, the
    cards' goals, and the people of ``history`` and the seed ``context``).

    Raises:
        DirectiveError: the first rule broken, with its reason.
    """
    check_cap(parsed.persona_id, history, cfg.max_consecutive_turns)
    if parsed.persona_id in recent and len(choosable) < len(roster):
        raise DirectiveError(f"{parsed.persona_id} spoke in the last {len(recent)} agent turns; pick another agent")
    if cfg.check_content:
        check_content(parsed, names, history, (EXAMPLE_ACTION, *(c.goal for c in roster)), cfg.min_action_words,
                      context=context)


async def decide(engine: Any, roster: Sequence[PersonaCard], history: Sequence[HistoryTurn],
                 context: Sequence[tuple[str, str]], cfg: Any, *, adapter: str | None = None,
                 seed: int | None = None, exclude: Sequence[str] = ()) -> Decision:
    """Ask the director model for the next directive.

    Args:
        engine: An :class:`~mascot.core.engine.Engine`.
        roster: Active personas (at least one).
        history: Visible history, oldest first.
        context: Seed context lines.
        cfg: :class:`~mascot.core.config.DirectorConfig` (constrained, max_retries, max_consecutive_turns, ...).
        adapter: Director LoRA adapter name, or None.
        seed: Sampling seed (used when ``cfg.decoding.temperature > 0``; a retry of a greedy director samples at
            ``cfg.retry_temperature``).
        exclude: Persona ids that may not be chosen (their reply was refused for this turn); the prompt lists and
            the grammar allows only the others. Personas of the last ``cfg.rest_turns`` agent turns and those at
            the consecutive-turn cap are left out of the grammar too (while another persona remains).

    Returns:
        A :class:`Decision`; after ``1 + max_retries`` invalid attempts the fallback persona (least recent, cap
        respected). When the cap excludes everyone, the least recent persona regardless of the cap.

    Raises:
        ValueError: empty roster, every persona excluded, or the prompt cannot fit the context window.
    """
    if not roster:
        raise ValueError("empty roster")
    all_names = {c.id: c.name for c in roster}
    if exclude:
        roster = [c for c in roster if c.id not in set(exclude)]
        if not roster:
            raise ValueError("every persona is excluded")
    if getattr(cfg, "policy", "model") == "random":
        # MASCOT-C ablation: a seeded uniform choice among the personas the cap allows, with the
        # fallback action and the persona's default tone; no model call.
        allowed = [c for c in roster if consecutive_turns(history, c.id) + 1 <= cfg.max_consecutive_turns]
        card = random.Random(seed).choice(allowed or list(roster))
        return Decision(directive=fallback_directive(card), source=RANDOM, model_choice=card.id)
    recent, choosable = choosable_personas(roster, history, cfg)
    structured = None
    if cfg.constrained and engine.supports_structured_output:
        structured = StructuredOutput(regex=decision_regex(roster, choosable, history, cfg))
    decision = Decision(directive=fallback_directive(roster[0]), source=FALLBACK)
    failed: list[tuple[str, str]] = []
    for attempt in range(1 + cfg.max_retries):
        # after a copy, the re-prompt shows the conversation without the earlier directives: a small model keeps
        # copying an Action it can see, at any temperature
        shown = [replace(t, directive="") for t in history] if "directive_copy" in decision.rejection_reasons \
            else history
        msgs = fit_messages(roster, shown, context, cfg.max_consecutive_turns, failed, engine.render_chat,
                            engine.count_tokens, engine.max_context_tokens - cfg.max_tokens, all_names)
        # a retry must change something that takes effect: at temperature 0 it samples at retry_temperature
        dec = cfg.decoding
        temp = dec.temperature if attempt == 0 or dec.temperature > 0 else cfg.retry_temperature
        sp = SamplingParams(max_tokens=cfg.max_tokens, temperature=temp, top_p=dec.top_p,
                            seed=None if seed is None else seed + attempt)
        result = await engine.generate(GenerationRequest(engine.render_chat(msgs), sp, adapter=adapter,
                                                         structured=structured))
        text = strip_control_chars(result.text)  # stored and shown as the raw directive: no NUL/ESC
        decision.raw_attempts.append(text)
        decision.generated_tokens += len(result.token_ids)
        try:
            parsed = parse_directive(text, roster)
            decision.model_choice = parsed.persona_id
            check_decision(parsed, roster, recent, choosable, history, cfg, list(all_names.values()), context)
        except DirectiveError as e:
            decision.parse_errors.append(str(e))
            decision.rejection_reasons.append(e.reason)
            # an answer refused for its content is not shown back: shown, SmolLM2-135M wrote the same answer again
            # at every retry (temperature 0.7, new seeds); only the reason is given
            failed.append(("" if e.reason in CONTENT_REASONS else text, str(e)))
            continue
        decision.directive = parsed
        decision.source = MODEL if attempt == 0 else RETRY
        decision.delivered_tokens = len(result.token_ids)
        return decision
    card = fallback_persona(roster, history, cfg.max_consecutive_turns) or fallback_persona(roster, history, 10**9)
    decision.directive = fallback_directive(card)
    decision.source = FALLBACK
    return decision
