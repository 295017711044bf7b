"""The evaluation gate of PromoteAdapter: a staged persona version is scored against the
persona's stable version (or the base model when there is none) with the judge on held-out situations, and promoted
only when it is not worse by more than a set margin.

Per situation and seed (``seeds`` per situation), both versions answer the same opening (the situation's first
utterance) with the persona's fallback directive and the same seed, through the SpeakerService with
``adapter_version`` pinned; the JudgeService scores each reply with the agent rubric (the docs: five criteria, 1-5,
mean ``s(y)``). Two rules, both must pass:

* **judge score**: the mean of the paired per-reply means over the replies where both judgements parsed must not
  fall more than ``max_drop`` below the baseline's;
* **move compliance** (a persona card with moves): the share of replies that do the card's moves (a required move,
  no forbidden one: :func:`mascot.core.moves.assess`) must not fall more than ``max_compliance_drop`` below the
  baseline's. The judge alone cannot tell an adapter that does its moves from the base model when its persona
  criterion is weak; the moves are what the card asks.

An empty reply is not sent to the judge: it scores the rubric's minimum, 1.0, and does no move.
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
        situations: Replies (situation x seed) where both judgements parsed (the others are left out of both
            means).
        passed: Both rules passed (module docstring).
        max_drop: The allowed drop the decision used.
        candidate_compliance: Share of the candidate's replies doing the card's moves (None: a card without moves).
        baseline_compliance: The same for the baseline.
        replies: Replies each version gave.
        max_compliance_drop: The allowed compliance drop.
    """

    candidate: str
    baseline: str
    candidate_score: float
    baseline_score: float
    situations: int
    passed: bool
    max_drop: float = 0.0
    candidate_compliance: float | None = None
    baseline_compliance: float | None = None
    replies: int = 0
    max_compliance_drop: float = 0.0

    @property
    def score_passed(self) -> bool:
        """The judge-score rule alone."""
        return self.candidate_score >= self.baseline_score - self.max_drop

    @property
    def compliance_passed(self) -> bool:
        """The move-compliance rule alone (True for a card without moves)."""
        if self.candidate_compliance is None or self.baseline_compliance is None:
            return True
        return self.candidate_compliance >= self.baseline_compliance - self.max_compliance_drop - 1e-9


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
                             max_tokens: int = 96, timeout_s: float = 120.0, seeds: int = 1,
                             max_compliance_drop: float = 0.0) -> GateResult:
    """Score ``candidate`` against ``baseline`` on ``situations`` (see the module docstring).

    Args:
        speaker: A ``SpeakerServiceStub``; judge: a ``JudgeServiceStub``; catalog: the persona catalog.
        max_drop: How far (on the 1-5 scale) the candidate's mean may fall below the baseline's, >= 0.
        seeds: Replies per situation and version (seed ``1000 + i + 1009·k`` for situation i, reply k; the same
            for both versions).
        max_compliance_drop: How far the candidate's move compliance (0-1) may fall below the baseline's.

    Raises:
        FailedPrecondition: no situation gave two parsable judgements (the gate cannot decide).
        Unavailable: the speaker or judge service failed (the message names which).
    """
    import grpc

    from mascot.api.dialogue.v1 import dialogue_pb2 as dpb
    from mascot.api.judge.v1 import judge_pb2 as jpb

    from mascot.core.moves import assess

    persona = catalog.get(persona_id)
    roster = [c.id for c in catalog.in_set(persona.persona_set)]
    cand, base = [], []
    complied = {"candidate": 0, "baseline": 0}
    replies = 0
    runs = [(sit, 1000 + i + 1009 * k) for i, sit in enumerate(situations) for k in range(seeds)]
    for sit, seed in runs:
        opening = sit.opening
        try:
            a, b = await asyncio.wait_for(asyncio.gather(
                _reply(speaker, persona, roster, opening, candidate, seed, max_tokens),
                _reply(speaker, persona, roster, opening, baseline, seed, max_tokens)), timeout_s)
        except (grpc.aio.AioRpcError, asyncio.TimeoutError) as e:
            raise Unavailable(f"evaluation gate: the speaker service failed ({_why(e)}); retry the promote") from None
        texts = {"candidate": a, "baseline": b}
        replies += 1
        if persona.moves is not None:
            for k, t in texts.items():
                complied[k] += bool(t.strip()) and assess(persona.moves, t, opening).compliant
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
    c, b, _ = decide(cand, base, max_drop, what=f"{candidate} and {baseline}", asked=len(runs))
    cc = round(complied["candidate"] / replies, 4) if persona.moves is not None and replies else None
    bc = round(complied["baseline"] / replies, 4) if persona.moves is not None and replies else None
    r = GateResult(candidate, baseline, round(c, 4), round(b, 4), len(cand), False, max_drop, cc, bc, replies,
                   max_compliance_drop)
    return GateResult(**{**r.__dict__, "passed": r.score_passed and r.compliance_passed})


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
