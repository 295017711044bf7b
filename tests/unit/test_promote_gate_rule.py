"""The evaluation gate's decision rule (mascot.gateway.promote_gate.decide) at its boundaries."""

import pytest

from mascot.core.errors import FailedPrecondition
from mascot.gateway.promote_gate import decide


def test_equal_or_better_passes_and_worse_fails_with_no_allowed_drop():
    assert decide([3.0, 4.0], [3.0, 4.0], 0.0) == (3.5, 3.5, True)
    assert decide([3.2, 4.0], [3.0, 4.0], 0.0)[2] is True
    assert decide([2.9, 4.0], [3.0, 4.0], 0.0) == (pytest.approx(3.45), 3.5, False)


def test_the_allowed_drop_is_inclusive():
    assert decide([2.5], [3.0], 0.5)[2] is True
    assert decide([2.49], [3.0], 0.5)[2] is False


def test_no_pair_cannot_decide_and_bad_input_is_refused():
    with pytest.raises(FailedPrecondition, match="none of 4 situations"):
        decide([], [], 0.0, asked=4)
    with pytest.raises(ValueError, match="differ in length"):
        decide([1.0], [], 0.0)
    with pytest.raises(ValueError, match="max_drop"):
        decide([1.0], [1.0], -0.1)


def test_both_rules_must_pass_and_a_card_without_moves_is_judged_on_the_score_alone():
    from mascot.gateway.promote_gate import GateResult

    ok = GateResult("anchor--v2", "base", 3.5, 3.4, 10, True, 0.0, 0.40, 0.20, 10, 0.0)
    assert ok.score_passed and ok.compliance_passed
    fewer_moves = GateResult("anchor--v2", "base", 3.6, 3.4, 10, False, 0.0, 0.10, 0.20, 10, 0.05)
    assert fewer_moves.score_passed and not fewer_moves.compliance_passed
    allowed = GateResult("anchor--v2", "base", 3.6, 3.4, 10, True, 0.0, 0.15, 0.20, 10, 0.05)
    assert allowed.compliance_passed  # the allowed drop is inclusive
    no_moves = GateResult("critic--v1", "base", 3.6, 3.4, 10, True, 0.0, None, None, 10, 0.0)
    assert no_moves.compliance_passed


class _ScriptedSpeaker:
    """A SpeakerService stub answering each pinned version with a fixed text (the gate's only use of it)."""

    def __init__(self, texts: dict[str, str]) -> None:
        self.texts, self.seeds = texts, []

    def GenerateReply(self, req):
        from mascot.api.speaker.v1 import speaker_pb2 as spb

        self.seeds.append((req.adapter_version, req.seed))
        text = self.texts[req.adapter_version]

        async def stream():
            yield spb.GenerateReplyResponse(final=spb.ReplyFinal(text=text))

        return stream()


class _EqualJudge:
    """A JudgeService stub scoring every candidate 3.0."""

    async def JudgeCandidates(self, req, timeout=None):
        from mascot.api.judge.v1 import judge_pb2 as jpb

        return jpb.JudgeCandidatesResponse(judgements=[
            jpb.Judgement(candidate_id=c.candidate_id, status=jpb.JUDGEMENT_STATUS_OK, mean_score=3.0)
            for c in req.candidates])


async def test_the_gate_counts_move_compliance_over_situations_and_seeds():
    from mascot.core.personas import PersonaCatalog
    from mascot.core.situations import Situation
    from mascot.gateway.promote_gate import evaluate_promotion

    cat = PersonaCatalog.load()
    sits = [Situation(id=f"s{i}", split="negative", opening=f"I lost my job {i}.", situation="x") for i in range(3)]
    step = "I'm sorry. Update your CV tonight and call a friend tomorrow."
    speaker = _ScriptedSpeaker({"action_guide--v2": step, "base": "I'm so sorry to hear that."})
    r = await evaluate_promotion(speaker, _EqualJudge(), cat, "action_guide", "action_guide--v2", "base", sits,
                                 max_drop=0.0, seeds=2)
    assert r.passed and r.replies == 6 and r.situations == 6
    assert (r.candidate_compliance, r.baseline_compliance) == (1.0, 0.0)
    # the same seeds for both versions, a new one per reply
    seeds = sorted({s for _, s in speaker.seeds})
    assert seeds == [1000, 1001, 1002, 2009, 2010, 2011]
    assert sorted(s for v, s in speaker.seeds if v == "base") == seeds
    # the reverse: equal judge scores, fewer moves -> refused
    back = await evaluate_promotion(_ScriptedSpeaker({"action_guide--v3": "I'm so sorry to hear that.",
                                                      "action_guide--v2": step}), _EqualJudge(), cat,
                                    "action_guide", "action_guide--v3", "action_guide--v2", sits, max_drop=0.0)
    assert back.score_passed and not back.compliance_passed and not back.passed
