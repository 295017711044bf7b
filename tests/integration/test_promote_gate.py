"""The evaluation gate of PromoteAdapter: a staged persona version is scored against the stable
one (here the base model) with the judge on held-out situations; the test computes every score itself, from the
speaker's replies and the scripted judge's scoring rule, and checks the gate's decisions against them."""

from __future__ import annotations

import asyncio
import json
import statistics

import grpc
import pytest

from mascot.api.adapter.v1 import adapter_pb2 as apb
from mascot.api.adapter.v1 import adapter_pb2_grpc
from mascot.api.dialogue.v1 import dialogue_pb2 as dpb
from mascot.api.speaker.v1 import speaker_pb2 as spb
from mascot.api.speaker.v1 import speaker_pb2_grpc
from mascot.core.personas import PersonaCatalog
from mascot.core.server import channel
from mascot.director.directive import FALLBACK_ACTION
from mascot.app.stack import start_stack
from tests.helpers.config import make_config
from tests.helpers.lora import make_lora
from tests.helpers.openai_judge import AGENT_KEYS, ScriptedOpenAIJudge, scripted_scores

pytestmark = [pytest.mark.integration, pytest.mark.slow]
TOKEN = "gate-token"
AUTH = (("authorization", f"Bearer {TOKEN}"),)
SEEDS = (11, 13, 21, 23, 29, 31)
N_SITUATIONS = 3


@pytest.fixture
def scripted_judge():
    j = ScriptedOpenAIJudge(api_key="sk-test").start()
    yield j
    j.stop()


def gate_config(tmp_path, tiny_model_dir, situations, judge_url, **gate):
    return make_config(
        tmp_path, engine={"model": str(tiny_model_dir)}, speaker={"temperature": 0.0, "max_tokens": 12},
        judge={"cache_url": f"sqlite:///{tmp_path}/judge.db", "judges": [
            {"name": "gpt", "kind": "openai", "model": "gpt-4o", "endpoint": judge_url,
             "api_key_env": "SCRIPTED_JUDGE_KEY"}]},
        adapters={"store": str(tmp_path / "store"), "poll_s": 0.2, "promote_gate": {
            "enabled": True, "situations": str(situations) if situations else "", "limit": N_SITUATIONS,
            "max_drop": 0.0, "judge": "gpt", "max_tokens": 12, **gate}})


async def expected_score(speaker, version, openings):
    """Mean over situations of the scripted judge's mean score for the reply ``version`` gives."""
    card = PersonaCatalog.load().get("anchor")
    roster = [c.id for c in PersonaCatalog.load().in_set("support")]
    means = []
    for i, opening in enumerate(openings):
        text = ""
        async for r in speaker.GenerateReply(spb.GenerateReplyRequest(
                persona_id="anchor", directive=dpb.Directive(persona_id="anchor", action=FALLBACK_ACTION,
                                                             tone=card.default_tone,
                                                             source=dpb.DIRECTIVE_SOURCE_FALLBACK),
                history=[dpb.Turn(index=0, role=dpb.ROLE_USER, text=opening)], roster_persona_ids=roster,
                max_tokens=12, seed=1000 + i, adapter_version=version)):
            if r.HasField("final"):
                text = r.final.text
        # an empty reply scores the rubric's minimum without a judge call
        means.append(statistics.fmean(scripted_scores(text, AGENT_KEYS).values()) if text.strip() else 1.0)
    return statistics.fmean(means)


async def test_gate_refuses_worse_versions_and_promotes_the_others(tmp_path, tiny_model_dir, shared_data,
                                                                   scripted_judge, monkeypatch):
    monkeypatch.setenv("MASCOT_ADMIN_TOKEN", TOKEN)
    monkeypatch.setenv("SCRIPTED_JUDGE_KEY", "sk-test")
    src = shared_data / "empathetic_dialogues" / "test_situations.jsonl"
    openings = [json.loads(x)["first_utterance"] for x in src.read_text().splitlines()[:N_SITUATIONS]]
    cfg = gate_config(tmp_path, tiny_model_dir, src, scripted_judge.url)
    stack = await start_stack(cfg, ("gateway", "director", "speaker", "judge"))
    ch, sch = channel(stack.target("control")), channel(stack.target("speaker"))
    admin, speaker = adapter_pb2_grpc.AdapterServiceStub(ch), speaker_pb2_grpc.SpeakerServiceStub(sch)
    try:
        for k, seed in enumerate(SEEDS, start=1):
            lora = make_lora(tiny_model_dir, tmp_path / f"lora{k}", r=4, seed=seed)
            await admin.PublishAdapter(apb.PublishAdapterRequest(persona_id="anchor", source_path=str(lora)),
                                       metadata=AUTH)
        base = await expected_score(speaker, "base", openings)
        want = {k: await expected_score(speaker, f"anchor--v{k}", openings) for k in range(1, len(SEEDS) + 1)}
        # the stable baseline: the lower median of the versions the base model does not beat (its first promotion is
        # gated against the base model), so that both a worse and a better version remain
        above = sorted((k for k in want if want[k] >= base), key=want.get)
        assert len(above) >= 2, (base, want)
        b = above[(len(above) - 1) // 2]

        # no stable version yet: the gate compares with the base model, and passes
        r = await admin.PromoteAdapter(apb.PromoteAdapterRequest(persona_id="anchor", version=b), metadata=AUTH)
        g = r.eval_gate
        assert g.ran and g.passed and g.candidate == f"anchor--v{b}" and g.baseline == "base"
        assert g.situations == N_SITUATIONS
        assert g.candidate_score == pytest.approx(want[b], abs=1e-3)
        assert g.baseline_score == pytest.approx(base, abs=1e-3)
        assert r.persona.stable == b

        worse = [k for k in want if k != b and want[k] < want[b]]
        better = [k for k in want if k != b and want[k] >= want[b]]
        assert worse and better, (b, want)  # both outcomes occur with these seeds, so both paths are exercised
        for k in worse:  # refused: FAILED_PRECONDITION naming both scores; the registry is untouched
            before = await admin.ListAdapters(apb.ListAdaptersRequest(), metadata=AUTH)
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await admin.PromoteAdapter(apb.PromoteAdapterRequest(persona_id="anchor", version=k), metadata=AUTH)
            assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert f"{want[k]:.3f} vs {want[b]:.3f} for anchor--v{b} " in err.value.details()
            assert await admin.ListAdapters(apb.ListAdaptersRequest(), metadata=AUTH) == before

        k = better[0]
        # a caller that gives up while the gate is judging leaves the registry as it was: the gateway stops the gate
        # with the call instead of promoting after the caller has gone
        before = await admin.ListAdapters(apb.ListAdaptersRequest(), metadata=AUTH)
        calls = len(scripted_judge.calls)
        call = admin.PromoteAdapter(apb.PromoteAdapterRequest(persona_id="anchor", version=k, canary_weight=0.5),
                                    metadata=AUTH)
        for _ in range(600):  # until the gate's first judge request has arrived: the gate is running
            if len(scripted_judge.calls) > calls or call.done():
                break
            await asyncio.sleep(0.05)
        assert not call.done() and len(scripted_judge.calls) > calls
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        await asyncio.sleep(3.0)  # longer than a whole gate run here
        assert await admin.ListAdapters(apb.ListAdaptersRequest(), metadata=AUTH) == before

        # as good as the stable one or better: promoted, with the scores the test computed
        r = await admin.PromoteAdapter(apb.PromoteAdapterRequest(persona_id="anchor", version=k, canary_weight=0.5),
                                       metadata=AUTH)
        g = r.eval_gate
        assert g.ran and g.passed and g.baseline == f"anchor--v{b}"
        assert (g.candidate_score, g.baseline_score) == (pytest.approx(want[k], abs=1e-3),
                                                         pytest.approx(want[b], abs=1e-3))
        assert r.persona.canary == k and r.persona.stable == b

        # the operator override promotes a refused version without running the gate
        r = await admin.PromoteAdapter(apb.PromoteAdapterRequest(persona_id="anchor", version=worse[0],
                                                                 skip_eval_gate=True), metadata=AUTH)
        assert not r.eval_gate.ran and r.persona.stable == worse[0]
        # a request that would fail anyway fails before the gate runs (no judge call)
        calls = len(scripted_judge.calls)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await admin.PromoteAdapter(apb.PromoteAdapterRequest(persona_id="anchor", version=99), metadata=AUTH)
        assert err.value.code() == grpc.StatusCode.NOT_FOUND and len(scripted_judge.calls) == calls
    finally:
        await ch.close()
        await sch.close()
        await stack.stop(0)


async def test_gate_without_a_judge_or_situations_refuses_to_start(tmp_path, tiny_model_dir, shared_data, engine):
    src = shared_data / "empathetic_dialogues" / "test_situations.jsonl"
    cfg = gate_config(tmp_path, tiny_model_dir, src, "http://127.0.0.1:9/v1")
    with pytest.raises(ValueError, match="needs a judge"):
        await start_stack(cfg, ("gateway", "director", "speaker"), engine=engine)
    # a missing situations file is refused when the config is read, before anything starts
    with pytest.raises(ValueError, match="promote_gate.situations .*missing.jsonl is not a file"):
        gate_config(tmp_path, tiny_model_dir, tmp_path / "missing.jsonl", "http://127.0.0.1:9/v1",
                    judge_target="127.0.0.1:9")
    with pytest.raises(ValueError, match="needs adapters.promote_gate.situations"):
        gate_config(tmp_path, tiny_model_dir, "", "http://127.0.0.1:9/v1")
