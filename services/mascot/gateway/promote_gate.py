"""The evaluation gate of PromoteAdapter: a staged persona version is scored against the
persona's stable version (or the base model when there is none) with the judge on held-out situations, and promoted
only when it is not worse by more than a set margin.

Per situation, both versions answer the same opening (the situation's first utterance) with the persona's fallback
directive and the same seed, through the SpeakerService with ``adapter_version`` pinned; the JudgeService scores
each reply with the agent rubric (the docs: five criteria, 1-5, mean ``s(y)``). The gate compares
the mean of the per-situation means over the situations where both judgements parsed (paired comparison). An empty
reply is not sent to the judge: it scores the rubric's minimum, 1.0.
"""

from __future__ import annotations

import asyncio
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mascot.core.dialogue import FALLBACK_ACTION
from mascot.core.errors import FailedPrecondition, Unavailable
from mascot.core.situations import Situation, load_situations

#: The score of an empty reply: the rubric's minimum on every criterion (nothing to judge, nothing said).
EMPTY_REPLY_SCORE = 1.0


@dataclass(frozen=True)
class GateResult:
    """Outcome of one gate run.

    Attributes:
        candidate: The version under test, ``<persona>--v<N>``.
        baseline: The version it is compared with (the stable one, or ``"base"``).
        candidate_score: Mean judge score of the candidate, 1.0-5.0, over ``situations`` paired situations.
        baseline_score: Same for the baseline.
        situations: Situations where both judgements parsed (the others are left out of both means).
        passed: ``candidate_score >= baseline_score - max_drop``.
        max_drop: The allowed drop the decision used.
    """

    candidate: str
    baseline: str
    candidate_score: float
    baseline_score: float
    situations: int
    passed: bool
    max_drop: float = 0.0


def read_gate_situations(path: str | Path, limit: int) -> list[Situation]:
    """Held-out situations for the gate, the first ``limit``: support situations (our JSONL with ``id``,
    ``situation``, ``first_utterance``, or an EmpatheticDialogues CSV), texts as written.

    Raises:
        FileNotFoundError / ValueError: as :func:`mascot.core.situations.load_situations`.
    """
    return load_situations(path, "support", limit, require_labels=False, verbatim=True)


async def _reply(speaker: Any, persona: Any, roster: list[str], opening: str, version: str, seed: int,
                 max_tokens: int) -> str:
    from mascot.api.dialogue.v1 import dialogue_pb2 as dpb
    from mascot.api.speaker.v1 import speaker_pb2 as spb

    req = spb.GenerateReplyRequest(
        persona_id=persona.id, directive=dpb.Directive(persona_id=persona.id, action=FALLBACK_ACTION,
                                                       tone=persona.default_tone,
                                                       source=dpb.DIRECTIVE_SOURCE_FALLBACK),
        history=[dpb.Turn(index=0, role=dpb.ROLE_USER, text=opening)], roster_persona_ids=roster,
        max_tokens=max_tokens, seed=seed, adapter_version=version)
    text = ""
    async for r in speaker.GenerateReply(req):
        if r.HasField("final"):
            text = r.final.text
    return text


async def evaluate_promotion(speaker: Any, judge: Any, catalog: Any, persona_id: str, candidate: str,
                             baseline: str, situations: list[Situation], *, max_drop: float, judge_name: str = "",
                             max_tokens: int = 96, timeout_s: float = 120.0) -> GateResult:
    """Score ``candidate`` against ``baseline`` on ``situations`` (see the module docstring).

    Args:
        speaker: A ``SpeakerServiceStub``; judge: a ``JudgeServiceStub``; catalog: the persona catalog.
        max_drop: How far (on the 1-5 scale) the candidate's mean may fall below the baseline's, >= 0.

    Raises:
        FailedPrecondition: no situation gave two parsable judgements (the gate cannot decide).
        Unavailable: the speaker or judge service failed (the message names which).
    """
    import grpc

    from mascot.api.dialogue.v1 import dialogue_pb2 as dpb
    from mascot.api.judge.v1 import judge_pb2 as jpb

    persona = catalog.get(persona_id)
    roster = [c.id for c in catalog.in_set(persona.persona_set)]
    cand, base = [], []
    for i, sit in enumerate(situations):
        opening = sit.opening
        try:
            a, b = await asyncio.wait_for(asyncio.gather(
                _reply(speaker, persona, roster, opening, candidate, 1000 + i, max_tokens),
                _reply(speaker, persona, roster, opening, baseline, 1000 + i, max_tokens)), timeout_s)
        except (grpc.aio.AioRpcError, asyncio.TimeoutError) as e:
            raise Unavailable(f"evaluation gate: the speaker service failed ({_why(e)}); retry the promote") from None
        texts = {"candidate": a, "baseline": b}
        scores = {k: EMPTY_REPLY_SCORE for k, t in texts.items() if not t.strip()}
        todo = [k for k in texts if k not in scores]
        if todo:
            try:
                resp = await judge.JudgeCandidates(jpb.JudgeCandidatesRequest(
                    rubric=jpb.RUBRIC_AGENT, history=[dpb.Turn(index=0, role=dpb.ROLE_USER, text=opening)],
                    candidates=[jpb.Candidate(candidate_id=k, persona_id=persona_id, text=texts[k]) for k in todo],
                    judge=judge_name, roster_persona_ids=roster), timeout=timeout_s)
            except grpc.aio.AioRpcError as e:
                raise Unavailable(f"evaluation gate: the judge service failed ({_why(e)}); retry the promote") from None
            for j in resp.judgements:
                if j.status == jpb.JUDGEMENT_STATUS_OK:
                    scores[j.candidate_id] = j.mean_score
        if len(scores) == 2:  # paired: a situation counts only when both sides have a score
            cand.append(scores["candidate"])
            base.append(scores["baseline"])
    c, b, passed = decide(cand, base, max_drop, what=f"{candidate} and {baseline}", asked=len(situations))
    return GateResult(candidate, baseline, round(c, 4), round(b, 4), len(cand), passed, max_drop)


def decide(candidate: list[float], baseline: list[float], max_drop: float, *, what: str = "the two versions",
           asked: int = 0) -> tuple[float, float, bool]:
    """The gate's rule on paired per-situation scores (1-5): ``(mean_c, mean_b, mean_c >= mean_b - max_drop)``.

    Raises:
        FailedPrecondition: no pair (no situation gave a score for both sides).
        ValueError: the lists differ in length, or ``max_drop`` < 0.
    """
    if len(candidate) != len(baseline):
        raise ValueError(f"paired scores differ in length: {len(candidate)} vs {len(baseline)}")
    if max_drop < 0:
        raise ValueError(f"max_drop must be >= 0, got {max_drop}")
    if not candidate:
        raise FailedPrecondition(f"evaluation gate: none of {asked} situations gave parsable judgements for both "
                                 f"{what}; check the judge, or promote with skip_eval_gate")
    c, b = statistics.fmean(candidate), statistics.fmean(baseline)
    return c, b, c >= b - max_drop


def _why(e: BaseException) -> str:
    if hasattr(e, "code") and callable(e.code):
        return f"{e.code().name}: {e.details()}"
    return type(e).__name__
