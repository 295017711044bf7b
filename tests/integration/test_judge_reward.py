"""JudgeService and RewardService over real gRPC on 127.0.0.1:0."""

from __future__ import annotations

import grpc
import pytest

from mascot.api.dialogue.v1 import dialogue_pb2 as dpb
from mascot.api.judge.v1 import judge_pb2 as jpb
from mascot.api.judge.v1 import judge_pb2_grpc as jpb_grpc
from mascot.api.reward.v1 import reward_pb2 as rpb
from mascot.api.reward.v1 import reward_pb2_grpc as rpb_grpc
from mascot.core.server import channel
from mascot.app.stack import start_stack
from tests.helpers.config import make_config
from tests.helpers.openai_judge import AGENT_KEYS, ScriptedOpenAIJudge, scripted_scores

pytestmark = pytest.mark.integration

HISTORY = [dpb.Turn(role=dpb.ROLE_USER, text="I failed my driving test again and I feel stupid."),
           dpb.Turn(role=dpb.ROLE_AGENT, persona_id="anchor", text="That sounds really discouraging.")]


@pytest.fixture(scope="module")
def scripted_judge():
    j = ScriptedOpenAIJudge(api_key="sk-test").start()
    yield j
    j.stop()


@pytest.fixture(scope="module")
def tiny_reward_dir(tmp_path_factory):
    from mascot.reward.scorer import build_tiny_reward_model

    return build_tiny_reward_model(tmp_path_factory.mktemp("rm") / "rm")


async def _stack(tmp_path, engine, scripted_judge, tiny_reward_dir, monkeypatch, components=("judge", "reward")):
    monkeypatch.setenv("SCRIPTED_JUDGE_KEY", "sk-test")
    cfg = make_config(tmp_path, judge={"cache_url": f"sqlite:///{tmp_path}/judge.db", "judges": [
        {"name": "local"},
        {"name": "gpt", "kind": "openai", "model": "gpt-4o", "endpoint": scripted_judge.url,
         "api_key_env": "SCRIPTED_JUDGE_KEY"}]}, reward={"model": str(tiny_reward_dir)})
    return await start_stack(cfg, components, engine=engine)


async def test_openai_judge_scores_retries_drops_and_caches(tmp_path, engine, scripted_judge, tiny_reward_dir,
                                                            monkeypatch):
    stack = await _stack(tmp_path, engine, scripted_judge, tiny_reward_dir, monkeypatch)
    try:
        async with channel(stack.target("judge")) as ch:
            stub = jpb_grpc.JudgeServiceStub(ch)
            req = jpb.JudgeCandidatesRequest(rubric=jpb.RUBRIC_AGENT, history=HISTORY, judge="gpt", candidates=[
                jpb.Candidate(candidate_id="ok", persona_id="catalyst", text="What made this attempt different?"),
                jpb.Candidate(candidate_id="range", persona_id="catalyst", text="[[range]] try again"),
                jpb.Candidate(candidate_id="bad", persona_id="catalyst", text="[[garbage]] whatever")])
            n0 = len(scripted_judge.calls)
            resp = await stub.JudgeCandidates(req)
            by = {j.candidate_id: j for j in resp.judgements}
            assert [j.candidate_id for j in resp.judgements] == ["ok", "range", "bad"]
            assert resp.model == "gpt-4o" and resp.judge == "gpt" and resp.rubric_version
            ok = by["ok"]
            assert ok.status == jpb.JUDGEMENT_STATUS_OK and ok.attempts == 1 and not ok.cached
            assert dict(ok.scores) == scripted_scores("What made this attempt different?", AGENT_KEYS)
            assert ok.mean_score == pytest.approx(sum(ok.scores.values()) / 5)
            assert by["range"].status == jpb.JUDGEMENT_STATUS_OK and by["range"].attempts == 2
            assert by["bad"].status == jpb.JUDGEMENT_STATUS_UNPARSEABLE and by["bad"].attempts == 3
            assert "JSON" in by["bad"].error and not by["bad"].scores
            assert len(scripted_judge.calls) - n0 == 1 + 2 + 3
            # A rerun repeats no call: every judgement (the dropped one too) comes from the cache.
            again = await stub.JudgeCandidates(req)
            assert len(scripted_judge.calls) - n0 == 6
            assert all(j.cached and j.attempts == 0 for j in again.judgements)
            assert [dict(j.scores) for j in again.judgements] == [dict(j.scores) for j in resp.judgements]
            assert stack.metrics.registry.get_sample_value("mascot_judge_unparseable_total", {"judge": "gpt"}) == 1
    finally:
        await stack.stop(0)


async def test_local_judge_collective_rubric_and_bad_requests(tmp_path, engine, scripted_judge, tiny_reward_dir,
                                                              monkeypatch):
    stack = await _stack(tmp_path, engine, scripted_judge, tiny_reward_dir, monkeypatch)
    try:
        async with channel(stack.target("judge")) as ch:
            stub = jpb_grpc.JudgeServiceStub(ch)
            block = [dpb.Turn(role=dpb.ROLE_AGENT, persona_id="catalyst", text="What felt hardest?"),
                     dpb.Turn(role=dpb.ROLE_AGENT, persona_id="action_guide", text="Book one more lesson.")]
            resp = await stub.JudgeCandidates(jpb.JudgeCandidatesRequest(
                rubric=jpb.RUBRIC_COLLECTIVE, history=HISTORY, candidates=[jpb.Candidate(block=block)]))
            j = resp.judgements[0]
            assert resp.judge == "local"
            # The tiny random model is forced into the schema: a valid judgement on the first attempt.
            assert j.status == jpb.JUDGEMENT_STATUS_OK, j.error
            assert set(j.scores) == {"fidelity", "originality_specificity", "relevance_coherence",
                                     "engagement_contribution"}
            assert all(1 <= s <= 5 for s in j.scores.values())
            bad = [
                (jpb.JudgeCandidatesRequest(candidates=[jpb.Candidate(persona_id="anchor", text="x")]), "rubric"),
                (jpb.JudgeCandidatesRequest(rubric=jpb.RUBRIC_AGENT), "candidates is empty"),
                (jpb.JudgeCandidatesRequest(rubric=jpb.RUBRIC_AGENT, judge="nope",
                                            candidates=[jpb.Candidate(persona_id="anchor", text="x")]),
                 "unknown judge"),
                (jpb.JudgeCandidatesRequest(rubric=jpb.RUBRIC_AGENT,
                                            candidates=[jpb.Candidate(persona_id="ghost", text="x")]), "ghost"),
                (jpb.JudgeCandidatesRequest(rubric=jpb.RUBRIC_AGENT,
                                            candidates=[jpb.Candidate(persona_id="anchor", text="  ")]), "empty"),
                (jpb.JudgeCandidatesRequest(rubric=jpb.RUBRIC_COLLECTIVE, candidates=[jpb.Candidate(
                    block=[dpb.Turn(role=dpb.ROLE_USER, text="hi")])]), "no agent turn"),
                (jpb.JudgeCandidatesRequest(rubric=jpb.RUBRIC_AGENT, candidates=[
                    jpb.Candidate(persona_id="anchor", text="x")] * 65), "batch limit"),
            ]
            for req, words in bad:
                with pytest.raises(grpc.aio.AioRpcError) as e:
                    await stub.JudgeCandidates(req)
                assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                assert words in e.value.details()
    finally:
        await stack.stop(0)


async def test_wrong_api_key_is_failed_precondition(tmp_path, engine, scripted_judge, tiny_reward_dir, monkeypatch):
    stack = await _stack(tmp_path, engine, scripted_judge, tiny_reward_dir, monkeypatch, components=("judge",))
    monkeypatch.setenv("SCRIPTED_JUDGE_KEY", "wrong")
    try:
        # The key is read at start; restart the judges with the wrong one.
        from mascot.judge.servicer import build_judges

        judges = build_judges(stack.cfg.judge, engine, "tiny")
        with pytest.raises(Exception) as e:
            await judges["gpt"].backend.complete([{"role": "system", "content": "s"},
                                                  {"role": "user", "content": "u"}], {})
        assert getattr(e.value, "code", None) == grpc.StatusCode.FAILED_PRECONDITION
        assert "API key" in e.value.message
    finally:
        await stack.stop(0)


async def test_reward_scores_match_training_formatting_and_padding(tmp_path, engine, scripted_judge, tiny_reward_dir,
                                                                   monkeypatch):
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from mascot.core import formatting
    from mascot.core.dialogue import HistoryTurn
    from mascot.core.personas import PersonaCatalog
    from mascot.reward.scorer import RewardScorer

    stack = await _stack(tmp_path, engine, scripted_judge, tiny_reward_dir, monkeypatch, components=("reward",))
    replies = ["That sounds so hard.", "Everyone fails sometimes, and what matters is what you try next time.", "ok"]
    try:
        async with channel(stack.target("reward")) as ch:
            stub = rpb_grpc.RewardServiceStub(ch)
            resp = await stub.ScoreCandidates(rpb.ScoreCandidatesRequest(persona_id="anchor", history=HISTORY,
                                                                         candidates=replies))
            assert resp.model == "tiny-random-rm" and not resp.trained and resp.sigma > 0
            # What a training import builds: the same formatter + EOS, tokenized as TRL does, one at a time.
            tok = AutoTokenizer.from_pretrained(tiny_reward_dir)
            model = AutoModelForSequenceClassification.from_pretrained(tiny_reward_dir).eval()
            catalog = PersonaCatalog.load()
            hist = [HistoryTurn("user", HISTORY[0].text), HistoryTurn("agent", HISTORY[1].text, "anchor")]
            names = {pid: c.name for pid, c in catalog.cards.items()}
            for r, s in zip(replies, resp.scores):
                text, cut = formatting.reward_text(catalog.get("anchor"), hist, r, names=names)
                with torch.no_grad():
                    ref = model(**tok(formatting.with_eos(text, tok.eos_token), return_tensors="pt")).logits[0, 0]
                assert s.raw == pytest.approx(float(ref), abs=1e-5)
                assert s.standardized == pytest.approx((s.raw - resp.mu) / resp.sigma)
                assert not s.truncated and not cut
            # Padding invariance: alone == in a padded batch, left or right.
            texts = [formatting.with_eos(formatting.reward_text(catalog.get("anchor"), hist, r, names=names)[0],
                                         tok.eos_token) for r in replies]
            for side in ("left", "right"):
                sc = RewardScorer(tiny_reward_dir, padding_side=side, batch_size=8)
                assert (sc.tokenizer.pad_token_id is not None
                        and sc.model.config.pad_token_id == sc.tokenizer.pad_token_id)
                batch = sc.score_texts(texts)
                alone = [sc.score_texts([t])[0] for t in texts]
                assert batch == pytest.approx(alone, abs=1e-5)
                assert batch == pytest.approx([s.raw for s in resp.scores], abs=1e-5)
            for req, code in [(rpb.ScoreCandidatesRequest(persona_id="ghost", candidates=["x"]), "INVALID_ARGUMENT"),
                              (rpb.ScoreCandidatesRequest(persona_id="anchor"), "INVALID_ARGUMENT"),
                              (rpb.ScoreCandidatesRequest(persona_id="anchor", candidates=["x"] * 65),
                               "INVALID_ARGUMENT")]:
                with pytest.raises(grpc.aio.AioRpcError) as e:
                    await stub.ScoreCandidates(req)
                assert e.value.code().name == code
    finally:
        await stack.stop(0)


async def test_long_context_is_truncated_oldest_first(tiny_reward_dir):
    from mascot.core.dialogue import HistoryTurn
    from mascot.core.personas import PersonaCatalog
    from mascot.reward.scorer import RewardScorer

    sc = RewardScorer(tiny_reward_dir, max_length=128)
    hist = [HistoryTurn("user", f"old message number {i} " * 5) for i in range(30)] + [HistoryTurn("user", "newest")]
    (text, cut), = sc.build_inputs(PersonaCatalog.load().get("anchor"), hist, ["short reply"])
    assert cut and "newest" in text and "old message number 0 " not in text
    assert len(sc.tokenizer(text)["input_ids"]) <= 128


async def test_a_judge_re_prompt_that_would_overflow_the_window_leaves_the_item_unparseable(engine):
    """A bad answer is re-prompted with the answer and the reason appended; when that re-prompt would not fit the
    local engine's window the item is recorded unparseable (the eval goes on) instead of failing the whole run."""
    from mascot.judge import rubric as rb
    from mascot.judge.judging import UNPARSEABLE, Judge

    class Rambling:  # answers prose instead of JSON, at the length of its answer bound
        model, max_tokens = "rambling", 256

        def __init__(self, eng):
            self.engine, self.calls = eng, 0

        async def complete(self, messages, schema, seed=0):
            self.calls += 1
            return "I think the helpers did well " * 60

    backend = Rambling(engine)
    per_word = engine.count_tokens("word " * 100) / 100
    first = [{"role": "system", "content": "Score the dialogue."},
             {"role": "user", "content": "word " * int((engine.max_context_tokens - 400) / per_word)}]
    assert engine.count_tokens(engine.render_chat(first)) + backend.max_tokens <= engine.max_context_tokens
    assert engine.count_tokens(engine.render_chat(rb.retry_messages(first, "I think " * 150, "not JSON",
                                                                    "collective"))) > engine.max_context_tokens - 256
    verdict = await Judge("j", backend, max_retries=2).judge("collective", first)
    assert verdict.status == UNPARSEABLE and backend.calls == 1 and "does not fit" in verdict.error
    # a prompt with room for the re-prompt is retried as before
    short = [first[0], {"role": "user", "content": "A short dialogue."}]
    backend.calls = 0
    verdict = await Judge("j", backend, max_retries=2).judge("collective", short)
    assert verdict.status == UNPARSEABLE and backend.calls == 3
