"""Baseline systems of the evaluation, run on the same engine and user simulator.

- Prompting baselines (``zero-shot``, ``zero-shot-cot``, ``few-shot``, ``few-shot-cot``, ``sft``): one call to the
  backbone writes the group's next turn, one labelled reply per active persona, from the same persona cards.
  The ``Name: reply`` layout is enforced with structured output (a regex), so every baseline turn is
  attributable. CoT first asks for step-by-step reasoning, then for the turn with that reasoning shown; Few-Shot
  adds 2 example dialogues; ``sft`` is Zero-Shot through the SFT LoRA adapter.
- ``self-consistency``: 5 samples of the Zero-Shot CoT prompt; the medoid by MiniLM embedding similarity is kept.
- ``multiagentesc``: MultiAgentESC's three stages ported onto our engine, one ``supporter`` reply per step:
  dialogue analysis (emotion → cause → intention agents), strategy deliberation (3 experts in round-robin pick
  among the 8 ESConv strategies, majority vote), response generation (one response per chosen strategy, then a
  vote of 3 judges). No ESConv retrieval (not shipped); the debate/reflect/self-reflection rounds are folded
  into the vote. Meeting mode swaps the strategy list for meeting-answer strategies.

After each system step the simulated user (SpeakerService, the same one MASCOT's self-play uses) speaks with
probability ``user_speak_prob`` (seeded), until ``agent_turns`` agent turns exist.

Like the product's speakers, whose refused reply is generated again up to ``guard.max_attempts`` times, a baseline
step whose every reply the reply checks refuse is generated again (a new seed) up to ``step_attempts`` times before
the user speaks; two steps that deliver nothing after their attempts end the dialogue early. Replies are sampled as
the speakers sample theirs (:class:`ReplySampling`: the ``speaker`` section's top-p, frequency and repetition penalty,
and on a regeneration the ``guard`` section's higher repetition penalty), so a baseline is not refused more often for
want of the decoding MASCOT gets. A prompting baseline's
group turn lists the personas in round-robin order: the first turn starts at a persona drawn from the dialogue's
seed, each later one after the last persona that spoke, so every persona speaks although a dialogue needs fewer
lines than the roster has.
"""

from __future__ import annotations

import random
import re
from collections import Counter
from dataclasses import dataclass
from typing import Any, Sequence

from mascot.api.dialogue.v1 import dialogue_pb2 as dpb
from mascot.api.speaker.v1 import speaker_pb2 as spb
from mascot.core import formatting
from mascot.core.context import fit_history
from mascot.core.dialogue import HistoryTurn, history_from_dicts, history_to_proto
from mascot.core.engine import (
    BASE_ADAPTER,
    GenerationRequest,
    PromptTooLong,
    SamplingParams,
    StructuredOutput,
    regex_escape,
)
from mascot.core.personas import PersonaCard
from mascot.core.situations import Situation

PROMPTING = ("zero-shot", "zero-shot-cot", "few-shot", "few-shot-cot", "sft")
BASELINES = (*PROMPTING, "self-consistency", "multiagentesc")
SC_SAMPLES = 5
LINE_CHARS = 200  # characters of one persona's line in a prompting baseline's group turn (its output constraint)
ESCONV_STRATEGIES = ("Question", "Restatement or Paraphrasing", "Reflection of feelings", "Self-disclosure",
                     "Affirmation and Reassurance", "Providing Suggestions", "Information", "Others")
MEETING_STRATEGIES = ("Summarize the discussion", "Quote the speakers", "Explain the decision", "Compare the options",
                      "Clarify the question", "List the action items", "Give background", "Others")

GROUP_SYSTEM = """You are a group of companion agents talking with a user. The agents are:
{roster}
Write the group's next turn: exactly one reply per agent, in the order listed, each on its own line that starts with
the agent's name and a colon. Each agent stays in its role. Never write the user's lines."""

FEW_SHOT = """Example 1
User: I finally finished my first marathon today!
{a}: That is a huge achievement, you must feel so proud of yourself.
{b}: What kept you going in the last few kilometres?
Example 2
User: My best friend moved abroad and I feel lost.
{a}: It makes sense to feel lost when someone that close is far away.
{b}: Could you set up a regular call so the friendship keeps its rhythm?"""

COT_INSTRUCTION = ("Before the agents answer, think step by step: how does the user feel, what do they need, and what "
                   "should each agent contribute? Write only your reasoning, in a few sentences.")


@dataclass(frozen=True)
class ReplySampling:
    """How a baseline's replies are sampled: the product speakers' settings (``speaker`` and ``guard`` config
    sections), so baselines and MASCOT share the decoding.

    Attributes:
        top_p: Nucleus mass in (0, 1].
        frequency_penalty: Per earlier occurrence in the generated text, in [-2, 2]. In a group turn the text is the
            whole turn, so a line is also pushed away from the words of the lines before it in that turn.
        repetition_penalty: Of the first attempt, in (0, 10].
        penalty_step: Added to the repetition penalty per regeneration (attempt ``k`` gets ``k`` steps, at most 10).
        retry_temperature: Temperature of a regeneration when the reply temperature is 0.

    Raises:
        ValueError: a value outside its range.
    """

    top_p: float = 0.9
    frequency_penalty: float = 0.3
    repetition_penalty: float = 1.0
    penalty_step: float = 0.1
    retry_temperature: float = 0.7

    def __post_init__(self) -> None:
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if not -2 <= self.frequency_penalty <= 2:
            raise ValueError(f"frequency_penalty must be in [-2, 2], got {self.frequency_penalty}")
        if not 0 < self.repetition_penalty <= 10:
            raise ValueError(f"repetition_penalty must be in (0, 10], got {self.repetition_penalty}")
        if self.penalty_step < 0 or self.retry_temperature <= 0:
            raise ValueError("penalty_step must be >= 0 and retry_temperature > 0")

    def params(self, max_tokens: int, temperature: float, seed: int, attempt: int = 0,
               stop: tuple[str, ...] = ()) -> SamplingParams:
        """Sampling of a reply's attempt ``attempt`` (0 = first), as the speakers' retry policy builds it: the
        repetition penalty rises by ``penalty_step`` per regeneration and a greedy regeneration samples at
        ``retry_temperature``. ``seed`` is the attempt's own (the caller varies it)."""
        if attempt > 0 and temperature == 0:
            temperature = self.retry_temperature
        return SamplingParams(max_tokens=max_tokens, temperature=temperature,
                              top_p=self.top_p if temperature > 0 else 1.0, seed=seed, stop=stop,
                              frequency_penalty=self.frequency_penalty,
                              repetition_penalty=min(10.0, self.repetition_penalty + self.penalty_step * attempt))


@dataclass
class BaselineContext:
    """What a baseline needs.

    Attributes:
        engine: The started engine (base model = the backbone).
        speaker: A SpeakerService stub (simulated user).
        roster: Active persona cards (prompting baselines).
        supporter: The single-voice ``supporter`` card (MultiAgentESC).
        agent_turns: Agent turns per dialogue.
        user_speak_prob: Probability that the simulated user speaks after a system step.
        max_tokens: Token budget of one agent reply.
        temperature: Sampling temperature of replies (> 0) and Self-Consistency samples.
        sft_adapter: Loaded adapter name for ``sft``, or None.
        embedder: An :class:`~mascot.eval.automatic.EmbeddingRedundancy` (Self-Consistency medoid).
        mode: ``support`` or ``meeting``.
        timeout_s: Deadline of each SpeakerService call.
        guard: :class:`~mascot.core.guard.GuardSettings` the replies are checked with (None: the defaults).
        max_in_flight: Baseline generations on the engine at once, over all dialogues (0: no bound). The eval sets
            it to its dialogue concurrency, so a system that asks for several samples per step (Self-Consistency:
            five) waits here instead of queueing five times the requests in the engine, where the simulated
            user's calls would wait past their deadline.
        step_attempts: Generations of a step whose every reply the checks refuse (the eval passes
            ``guard.max_attempts``, the product speakers' regenerations per reply), >= 1.
        sampling: How replies are sampled (the eval passes the speakers' settings); reasoning, analysis and vote
            calls keep their own plain sampling.
    """

    def __post_init__(self) -> None:
        if self.guard is None:
            from mascot.core.guard import GuardSettings

            self.guard = GuardSettings()
        if self.max_in_flight < 0:
            raise ValueError(f"max_in_flight must be >= 0, got {self.max_in_flight}")
        if self.step_attempts < 1:
            raise ValueError(f"step_attempts must be >= 1, got {self.step_attempts}")
        self._slots = None

    engine: Any
    speaker: Any
    roster: list[PersonaCard]
    supporter: PersonaCard
    agent_turns: int
    user_speak_prob: float
    max_tokens: int
    temperature: float
    sft_adapter: str | None
    embedder: Any
    mode: str
    timeout_s: float = 120.0
    guard: Any = None
    max_in_flight: int = 0
    step_attempts: int = 3
    sampling: ReplySampling = ReplySampling()

    def slots(self) -> Any:
        """The semaphore bounding generations in flight (created in the running event loop), or None."""
        import asyncio

        if self.max_in_flight and self._slots is None:
            self._slots = asyncio.Semaphore(self.max_in_flight)
        return self._slots


def _turn(index: int, role: str, text: str, persona_id: str | None = None, think: str = "",
          adapter: str = BASE_ADAPTER, source: str = "") -> dict:
    return {"index": index, "role": role, "persona_id": persona_id,
            "directive": {"persona_id": persona_id, "action": "", "tone": "", "source": source, "raw": ""}
            if role == "agent" else None,
            "adapter_version": adapter if role == "agent" else "", "text": text, "think": think, "safety": False}


async def _generate(ctx: BaselineContext, build, history: list[HistoryTurn], context: Sequence[tuple[str, str]],
                    max_tokens: int, temperature: float, seed: int, regex: str | None = None,
                    adapter: str | None = None, stop: tuple[str, ...] = ()) -> str:
    """Fit ``build(history, context)`` into the window (oldest context/history dropped first) and generate."""
    return (await _generate_result(ctx, build, history, context, max_tokens, temperature, seed, regex, adapter,
                                   stop)).text


async def _generate_result(ctx: BaselineContext, build, history: list[HistoryTurn],
                           context: Sequence[tuple[str, str]], max_tokens: int, temperature: float, seed: int,
                           regex: str | None = None, adapter: str | None = None, stop: tuple[str, ...] = (),
                           attempt: int | None = None) -> Any:
    """:func:`_generate` returning the engine's whole result (text and ``finish_reason``). ``attempt``: a reply
    generation's attempt number, sampled with ``ctx.sampling`` (:meth:`ReplySampling.params`); None (reasoning,
    analysis, votes): plain sampling, top-p 0.95 when sampling."""
    eng = ctx.engine
    msgs = fit_history(build, history, context, eng.render_chat, eng.count_tokens, eng.max_context_tokens - max_tokens)
    structured = StructuredOutput(regex=regex) if regex and eng.supports_structured_output else None
    if attempt is None:
        params = SamplingParams(max_tokens=max_tokens, temperature=temperature,
                                top_p=0.95 if temperature > 0 else 1.0, seed=seed, stop=stop)
    else:
        params = ctx.sampling.params(max_tokens, temperature, seed, attempt, stop)
    request = GenerationRequest(eng.render_chat(msgs), params, adapter=adapter, structured=structured)
    slots = ctx.slots()
    try:
        if slots is None:
            res = await eng.generate(request)
        else:
            async with slots:
                res = await eng.generate(request)
    except PromptTooLong:
        raise ValueError("a baseline prompt does not fit the engine's context window; raise engine.max_model_len")
    return res


def _conversation_text(history: Sequence[HistoryTurn], names: dict[str, str],
                       context: Sequence[tuple[str, str]]) -> str:
    head = formatting.meeting_transcript(context) + "\n\n" if context else ""
    return head + "Conversation so far:\n" + formatting.transcript_text(history, names)


def _group_messages(roster: list[PersonaCard], history, context, *, few_shot: bool, reasoning: str | None,
                    ask_reasoning: bool = False) -> list[dict]:
    names = {c.id: c.name for c in roster}
    system = GROUP_SYSTEM.format(roster=formatting.roster_text(roster))
    if few_shot:
        a, b = roster[0].name, roster[min(1, len(roster) - 1)].name
        system += "\n\n" + FEW_SHOT.format(a=a, b=b)
    user = _conversation_text(history, names, context)
    if ask_reasoning:
        user += "\n\n" + COT_INSTRUCTION
    elif reasoning is not None:
        user += f"\n\nYour reasoning: {reasoning.strip()}\nNow write the group's next turn."
    else:
        user += "\n\nNow write the group's next turn."
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def group_regex(roster: Sequence[PersonaCard], max_chars: int = LINE_CHARS, lines: int | None = None) -> str:
    """``Name: text`` lines, one per persona in order (the prompting baselines' output constraint).

    ``lines``: only the first ``lines`` personas' lines are generated, the last one closed by its newline, when the
    dialogue needs fewer turns than the roster has personas (the rest would be thrown away). Up to that newline the
    constraint is the full one, so the lines are the ones the full group turn starts with. None or >= the roster
    size: every line.
    """
    full = r"\n".join(f"{regex_escape(c.name)}: [^\\n]{{1,{max_chars}}}" for c in roster)
    if lines is None or lines >= len(roster):
        return full
    if lines < 1:
        raise ValueError(f"lines must be >= 1, got {lines}")
    return "".join(f"{regex_escape(c.name)}: [^\\n]{{1,{max_chars}}}\\n" for c in roster[:lines])


def parse_group_turn(text: str, roster: Sequence[PersonaCard]) -> list[tuple[str, str]]:
    """``(persona_id, reply)`` for each ``Name: reply`` line naming a roster persona, in text order.

    Lines without a known name continue the previous reply; replies that end up empty are dropped.
    """
    by_name = {c.name: c.id for c in roster}
    pat = _line_pattern(roster)
    out: list[list[str]] = []
    for line in text.splitlines():
        m = pat.match(line)
        if m:
            out.append([by_name[m.group(1)], m.group(2).strip()])
        elif out and line.strip():
            out[-1][1] = (out[-1][1] + " " + line.strip()).strip()
    return [(pid, t) for pid, t in out if t]


def _line_pattern(roster: Sequence[PersonaCard]) -> re.Pattern:
    """``Name: reply`` of a group turn's line, for a roster persona's name (longest names first): groups name, reply."""
    names = "|".join(re.escape(n) for n in sorted((c.name for c in roster), key=len, reverse=True))
    return re.compile(r"^\s*(" + names + r")\s*:\s*(.*)$")


def group_order(roster: Sequence[PersonaCard], start: int) -> list[PersonaCard]:
    """The roster in round-robin order from index ``start`` (taken modulo the roster size)."""
    k = start % len(roster) if roster else 0
    return [*roster[k:], *roster[:k]]


async def _prompting_step(system: str, ctx: BaselineContext, history, context, seed: int,
                          temperature: float | None = None, lines: int | None = None,
                          order: Sequence[PersonaCard] | None = None, attempt: int = 0
                          ) -> tuple[list[tuple[str, str, str]], str]:
    """One group turn: ``([(persona_id, line, finish_reason)], reasoning)``; ``order``: the personas in the order
    their lines are written (default the roster's); ``finish_reason`` as :func:`_line_finish` reads the line;
    ``attempt``: the step's attempt number (the lines' sampling, :class:`ReplySampling`)."""
    roster = list(order) if order else ctx.roster
    temperature = ctx.temperature if temperature is None else temperature
    cot = system in ("zero-shot-cot", "few-shot-cot", "self-consistency")
    few = system in ("few-shot", "few-shot-cot")
    adapter = ctx.sft_adapter if system == "sft" else None
    reasoning = ""
    if cot:
        reasoning = await _generate(ctx, lambda h, c: _group_messages(roster, h, c, few_shot=few, reasoning=None,
                                                                      ask_reasoning=True),
                                    history, context, 64, temperature, seed, adapter=adapter)
    n_lines = len(roster) if lines is None else max(1, min(lines, len(roster)))
    max_tokens = min(ctx.max_tokens * n_lines, 1024)
    res = await _generate_result(ctx, lambda h, c: _group_messages(roster, h, c, few_shot=few,
                                                                   reasoning=reasoning if cot else None),
                                 history, context, max_tokens, temperature, seed + 1,
                                 regex=group_regex(roster, lines=n_lines), adapter=adapter, attempt=attempt)
    replies = parse_group_turn(res.text, roster)
    tail_cut = _tail_cut(res.text, roster, res.finish_reason)
    return [(pid, t, _line_finish(t, tail_cut and k == len(replies) - 1)) for k, (pid, t) in enumerate(replies)], \
        reasoning


def _tail_cut(text: str, roster: Sequence[PersonaCard], finish_reason: str) -> bool:
    """True when a group turn's generation ran out of tokens inside its last reply: ``finish_reason`` is
    ``"length"`` and the text's last line carries reply text (not a bare ``Name:`` the budget cut off, whose
    reply is dropped and leaves the line before it whole)."""
    if finish_reason != "length":
        return False
    last = text.rsplit("\n", 1)[-1].strip()
    bare = _line_pattern(roster).match(last)
    return bool(last) and not (bare and not bare.group(2).strip())


def _line_finish(line: str, out_of_tokens: bool) -> str:
    """How a group turn's line ended, as the reply checks read it: ``"length"`` when it filled the constraint's
    :data:`LINE_CHARS` (the grammar closed it, usually mid-word) or the turn ran out of tokens inside it
    (``out_of_tokens``), else ``"stop"``. A line ended by ``"length"`` loses its unfinished last sentence (and is
    refused whole when it has no finished one), as a speaker's reply cut by its token budget does."""
    return "length" if out_of_tokens or len(line) >= LINE_CHARS - 1 else "stop"


async def _self_consistency_step(ctx: BaselineContext, history, context, seed: int,
                                 lines: int | None = None, order: Sequence[PersonaCard] | None = None,
                                 attempt: int = 0) -> tuple[list, str]:
    import asyncio

    temp = ctx.temperature if ctx.temperature > 0 else 0.7
    samples = await asyncio.gather(*(_prompting_step("self-consistency", ctx, history, context, seed * 10 + k, temp,
                                                     lines, order, attempt) for k in range(SC_SAMPLES)))
    texts = ["\n".join(t for _, t, _ in s) or "(empty)" for s, _ in samples]
    best = ctx.embedder.medoid_index(texts)
    return samples[best][0], f"medoid of {SC_SAMPLES} samples: #{best}"


def _esc_messages(role_prompt: str, history, context, names) -> list[dict]:
    return [{"role": "system", "content": role_prompt},
            {"role": "user", "content": _conversation_text(history, names, context)}]


async def _multiagentesc_step(ctx: BaselineContext, history, context, seed: int, attempt: int = 0
                              ) -> tuple[list, str]:
    names = {ctx.supporter.id: ctx.supporter.name}
    meeting = ctx.mode == "meeting"
    strategies = MEETING_STRATEGIES if meeting else ESCONV_STRATEGIES
    analysis: list[str] = []
    stages = (("topic", "Which part of the meeting does the user ask about? One sentence."),
              ("evidence", "What did the speakers say about it? One sentence."),
              ("intention", "What does the user want to learn? One sentence.")) if meeting else (
        ("emotion", "You are the emotion agent. Which emotion does the user feel, and how strongly? One sentence."),
        ("cause", "You are the cause agent. What caused the user's emotion? One sentence."),
        ("intention", "You are the intention agent. What does the user want from this conversation? One sentence."))
    for k, (label, instr) in enumerate(stages):
        prompt = instr + ("\nAnalysis so far: " + " ".join(analysis) if analysis else "")
        out = await _generate(ctx, lambda h, c, p=prompt: _esc_messages(p, h, c, names), history, context, 48, 0.0,
                              seed + k, stop=("\n",))
        analysis.append(f"{label}: {out.strip()}")
    picks: list[str] = []
    rx = "|".join(regex_escape(s) for s in strategies)
    for e in range(3):
        prompt = (f"You are psychological counselling expert {e + 1} of 3. Analysis: {' '.join(analysis)}\n"
                  f"Earlier experts chose: {', '.join(picks) or 'none yet'}.\nChoose the best strategy for the "
                  f"supporter's next reply from: {'; '.join(strategies)}. Answer with the strategy name only.")
        out = await _generate(ctx, lambda h, c, p=prompt: _esc_messages(p, h, c, names), history, context, 16, 0.0,
                              seed + 10 + e, regex=f"({rx})")
        picks.append(out.strip() if out.strip() in strategies else "Others")
    chosen = [s for s, _ in Counter(picks).most_common()]
    responses = []
    for k, strategy in enumerate(chosen):
        prompt = (f"{formatting.persona_card_text(ctx.supporter)}\nAnalysis: {' '.join(analysis)}\n"
                  f"Write the supporter's next reply using the strategy '{strategy}', in at most "
                  f"{ctx.supporter.max_answer_words} words. Write only the reply.")
        res = await _generate_result(ctx, lambda h, c, p=prompt: _esc_messages(p, h, c, names), history, context,
                                     ctx.max_tokens, ctx.temperature, seed + 20 + k, stop=("\nUser:",),
                                     attempt=attempt)
        responses.append((res.text.strip(), res.finish_reason))
    best = 0
    if len(responses) > 1:
        listing = "\n".join(f"Response {i + 1}: {r}" for i, (r, _) in enumerate(responses))
        votes = []
        for v in range(3):
            prompt = (f"You are judge {v + 1} of 3. Which response supports the user best?\n{listing}\n"
                      "Answer 'Response N'.")
            out = await _generate(ctx, lambda h, c, p=prompt: _esc_messages(p, h, c, names), history, context, 8,
                                  0.0, seed + 30 + v, regex="Response [1-%d]" % len(responses))
            m = re.search(r"(\d+)", out)
            votes.append(int(m.group(1)) - 1 if m and 0 < int(m.group(1)) <= len(responses) else 0)
        best = Counter(votes).most_common(1)[0][0]
    think = "; ".join(analysis) + f"; strategies: {', '.join(picks)}"
    text, finish = responses[best]
    return ([(ctx.supporter.id, text, finish)] if text else []), think


async def _user_turn(ctx: BaselineContext, sit: Situation, turns: list[dict], roster_ids: list[str], seed: int) -> str:
    req = spb.GenerateReplyRequest(
        user_simulation=dpb.UserSimulation(situation=sit.situation, emotion=sit.emotion),
        history=history_to_proto(history_from_dicts(turns)),
        context=[dpb.ContextUtterance(speaker=s, content=c) for s, c in sit.context],
        roster_persona_ids=roster_ids, seed=seed)
    text = ""
    async for ev in ctx.speaker.GenerateReply(req, timeout=ctx.timeout_s):
        if ev.HasField("final"):
            text = ev.final.text
    return text


def _checked(ctx: "BaselineContext", pid: str, text: str, turns: list[dict],
             finish_reason: str = "stop") -> tuple[str, str]:
    """A baseline reply through the same reply checks as the product's speakers (:func:`mascot.core.guard.cut_back`):
    checked against the persona's card and the earlier turns, cut back to its last passing sentence; after
    ``finish_reason="length"`` an unfinished last sentence is dropped."""
    from mascot.core.guard import ReplyContext, cut_back
    from mascot.eval.defects import card_source_text

    card = next((c for c in [*ctx.roster, ctx.supporter] if c is not None and c.id == pid), None)
    names = [c.name for c in ctx.roster] + ([ctx.supporter.name] if ctx.supporter is not None else [])
    rctx = ReplyContext(sources=[card_source_text(card) if card is not None else ""],
                        earlier=[t["text"] for t in turns],
                        tags=["User", "Director", *names])
    return cut_back(text, rctx, ctx.guard, finish_reason)


async def run_baseline(system: str, ctx: BaselineContext, sit: Situation, seed: int) -> dict:
    """One self-play dialogue of a baseline system.

    Returns:
        ``{"personas": [ids], "turns": [turn dicts]}`` in the transcript format of ``mascot run``.

    Raises:
        ValueError: unknown system, ``sft`` without an adapter, or a prompt that cannot fit the window.
    """
    if system not in BASELINES:
        raise ValueError(f"unknown baseline {system!r}")
    if system == "sft" and not ctx.sft_adapter:
        raise ValueError("the sft system needs --sft-adapter")
    rng = random.Random(seed)
    single = system == "multiagentesc"
    roster_ids = [ctx.supporter.id] if single else [c.id for c in ctx.roster]
    turns = [_turn(0, "user", sit.opening)]
    n_agent, step, empty_steps = 0, 0, 0
    first = random.Random(f"{seed}:order").randrange(len(ctx.roster)) if ctx.roster else 0
    ids = [c.id for c in ctx.roster]
    dropped: list[dict] = []
    adapter = ctx.sft_adapter if system == "sft" else BASE_ADAPTER
    while n_agent < ctx.agent_turns and empty_steps < 2:
        history = history_from_dicts(turns)
        s = seed * 1000 + step * 50
        needed = ctx.agent_turns - n_agent  # a group turn's lines past this would be thrown away
        spoke = [t["persona_id"] for t in turns if t["role"] == "agent" and t["persona_id"] in ids]
        order = group_order(ctx.roster, ids.index(spoke[-1]) + 1 if spoke else first)  # after the last speaker
        before = n_agent
        for attempt in range(ctx.step_attempts):  # a step the checks refuse whole is generated again
            s_try = s + 7919 * attempt
            if system == "self-consistency":
                replies, think = await _self_consistency_step(ctx, history, sit.context, s_try, needed, order,
                                                              attempt)
            elif single:
                replies, think = await _multiagentesc_step(ctx, history, sit.context, s_try, attempt)
            else:
                replies, think = await _prompting_step(system, ctx, history, sit.context, s_try, lines=needed,
                                                       order=order, attempt=attempt)
            for k, (pid, text, finish) in enumerate(replies):
                if n_agent >= ctx.agent_turns:
                    break
                delivered, reason = _checked(ctx, pid, text, turns, finish)
                if not delivered:  # refused whole: like a refused persona reply, nothing is shown
                    dropped.append({"persona_id": pid, "attempt": attempt, "reason": reason or "empty",
                                    "text": text[:500]})
                    continue
                turn = _turn(len(turns), "agent", delivered, pid, think if k == 0 else "", adapter, "baseline")
                turn["rejections"], turn["cut_reason"], dropped = dropped, reason, []
                turns.append(turn)
                n_agent += 1
            if n_agent > before:
                break
        step += 1
        # A step that delivers nothing after its attempts counts towards the end: two in a row end the dialogue
        # early, so a model whose replies keep failing the checks cannot loop forever.
        empty_steps = 0 if n_agent > before else empty_steps + 1
        if n_agent < ctx.agent_turns and (n_agent == before or rng.random() < ctx.user_speak_prob):
            text = await _user_turn(ctx, sit, turns, roster_ids, s + 49)
            if text:
                turns.append(_turn(len(turns), "user", text))
    if dropped:  # refused replies after the last delivered turn (an early end): kept with the dialogue
        return {"personas": roster_ids, "turns": turns, "rejections": dropped}
    return {"personas": roster_ids, "turns": turns}
