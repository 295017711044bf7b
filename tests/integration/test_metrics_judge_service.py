"""JudgeService with a `kind: metrics` judge: the same RPC, status, cache and report fields as the model judges,
no engine in the process."""

from __future__ import annotations

import grpc
import pytest

from mascot.api.dialogue.v1 import dialogue_pb2 as dpb
from mascot.api.judge.v1 import judge_pb2 as jpb
from mascot.api.judge.v1 import judge_pb2_grpc
from mascot.core.server import channel
from mascot.app.stack import start_stack
from tests.helpers.config import make_config


async def test_judge_service_serves_the_metrics_judge_with_cache(tmp_path):
    cfg = make_config(tmp_path, judge={"cache_url": f"sqlite:///{tmp_path}/judge-cache.db",
                                       "judges": [{"name": "cpu-metrics", "kind": "metrics"}]})
    stack = await start_stack(cfg, ("judge",))
    ch = channel(stack.target("judge"))
    try:
        assert stack.engine is None  # a metrics judge needs no generation engine
        stub = judge_pb2_grpc.JudgeServiceStub(ch)
        history = [dpb.Turn(role=dpb.ROLE_USER, text="I failed my driving test again and I feel stupid.")]
        req = jpb.JudgeCandidatesRequest(rubric=jpb.RUBRIC_AGENT, history=history, candidates=[
            jpb.Candidate(candidate_id="on", persona_id="anchor",
                          text="Failing it twice hurts. It makes sense that you feel low about the test."),
            jpb.Candidate(candidate_id="off", persona_id="anchor",
                          text="The stock market closed higher today after strong earnings.")])
        first = await stub.JudgeCandidates(req)
        assert (first.judge, first.model) == ("cpu-metrics", "metrics:all-MiniLM-L6-v2") and first.rubric_version
        on, off = first.judgements
        assert on.status == off.status == jpb.JUDGEMENT_STATUS_OK and not on.cached
        assert on.scores["response_relevance"] > off.scores["response_relevance"]
        assert "persona margin" in on.rationale and 1 <= on.mean_score <= 5
        again = await stub.JudgeCandidates(req)
        assert [j.cached for j in again.judgements] == [True, True]
        assert [dict(j.scores) for j in again.judgements] == [dict(j.scores) for j in first.judgements]
        block = [dpb.Turn(role=dpb.ROLE_AGENT, persona_id="anchor", text="That sounds painful; I'm here with you."),
                 dpb.Turn(role=dpb.ROLE_AGENT, persona_id="catalyst", text="What would you try differently next time?")]
        coll = await stub.JudgeCandidates(jpb.JudgeCandidatesRequest(
            rubric=jpb.RUBRIC_COLLECTIVE, history=history, candidates=[jpb.Candidate(candidate_id="b", block=block)]))
        assert set(coll.judgements[0].scores) == {"fidelity", "originality_specificity", "relevance_coherence",
                                                  "engagement_contribution"}
        with pytest.raises(grpc.aio.AioRpcError) as e:  # a speaker the roster leaves out
            await stub.JudgeCandidates(jpb.JudgeCandidatesRequest(
                rubric=jpb.RUBRIC_COLLECTIVE, history=history, roster_persona_ids=["anchor"],
                candidates=[jpb.Candidate(candidate_id="b", block=block)]))
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "catalyst" in e.value.details()
    finally:
        await ch.close()
        await stack.stop(0)
