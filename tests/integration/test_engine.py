"""The transformers engine on the tiny Qwen3: batching, mixed adapters, streaming, structured output, loading."""

import asyncio
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from mascot.core.engine import GenerationRequest, SamplingParams, StreamDelta, StructuredOutput
from mascot.core.engine.transformers import TransformersEngine
from mascot.core.metrics import Metrics

pytestmark = pytest.mark.integration


def _lora(base_dir: Path, out: Path, seed: int) -> Path:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    m = get_peft_model(AutoModelForCausalLM.from_pretrained(base_dir),
                       LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    m.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def adapter_engine(tiny_model_dir, tmp_path_factory):
    d = tmp_path_factory.mktemp("loras")
    metrics = Metrics()
    eng = TransformersEngine(str(tiny_model_dir), batch_wait_ms=50, metrics=metrics, component="speaker", adapters={
        "anchor--v1": str(_lora(tiny_model_dir, d / "a", 1)), "beacon--v1": str(_lora(tiny_model_dir, d / "b", 2))})
    asyncio.run(eng.start())
    yield eng, metrics
    asyncio.run(eng.close())


async def test_concurrent_calls_batch_with_mixed_adapters_and_match_sequential(adapter_engine):
    eng, metrics = adapter_engine
    prompts = [eng.render_chat([{"role": "user", "content": f"message {i} " * (i + 1)}]) for i in range(8)]
    adapters = [None, "anchor--v1", "beacon--v1", None, "anchor--v1", "beacon--v1", "anchor--v1", None]
    reqs = [GenerationRequest(p, SamplingParams(max_tokens=16), adapter=a) for p, a in zip(prompts, adapters)]
    sequential = [await eng.generate(r) for r in reqs]
    assert all(r.batch_size == 1 for r in sequential)
    concurrent = await asyncio.gather(*(eng.generate(r) for r in reqs))
    assert max(r.batch_size for r in concurrent) > 1
    assert [r.token_ids for r in concurrent] == [r.token_ids for r in sequential]
    # the adapters change the output, so the mix is real
    same_prompt = [GenerationRequest(prompts[0], SamplingParams(max_tokens=16), adapter=a)
                   for a in (None, "anchor--v1", "beacon--v1")]
    outs = await asyncio.gather(*(eng.generate(r) for r in same_prompt))
    assert len({o.token_ids for o in outs}) == 3
    assert [o.adapter for o in outs] == ["base", "anchor--v1", "beacon--v1"]
    text = metrics.registry.get_sample_value("mascot_engine_batch_size_count", {"component": "speaker"})
    assert text and text >= 9
    assert metrics.registry.get_sample_value("mascot_engine_batch_size_sum", {"component": "speaker"}) > text


async def test_requests_join_a_running_batch_match_their_solo_output_and_the_cache_shrinks_after_rows_leave(
        tiny_model_dir):
    """Continuous batching: a short-prompt request admitted while a long-prompt one decodes gets exactly its solo
    (greedy) tokens, and once the long row has left, the batch's cache is as wide as the short row alone (not as
    wide as every step since the batch began)."""
    eng = TransformersEngine(str(tiny_model_dir), batch_wait_ms=1)
    await eng.start()
    try:
        long_req = GenerationRequest(eng.render_chat([{"role": "user", "content": "a long message " * 60}]),
                                     SamplingParams(max_tokens=24))
        short_req = GenerationRequest(eng.render_chat([{"role": "user", "content": "hi"}]),
                                      SamplingParams(max_tokens=120))
        solo_long, solo_short = await eng.generate(long_req), await eng.generate(short_req)
        assert solo_short.finish_reason == "length", "the tiny model must decode to max_tokens for this test"

        async def long_then_short():
            joined = None
            result = None
            async for it in eng.stream(long_req):
                if isinstance(it, StreamDelta) and joined is None:
                    joined = asyncio.create_task(eng.generate(short_req))  # arrives while the long row decodes
                elif not isinstance(it, StreamDelta):
                    result = it
            return result, await joined

        got_long, got_short = await long_then_short()
        assert got_long.token_ids == solo_long.token_ids
        assert got_short.token_ids == solo_short.token_ids and list(eng.batch_sizes)[-1] == 2  # it joined the batch
        # the short row outlived the long one by ~100 steps: its cache is prompt + output, not long prompt + steps
        assert eng.cache_width <= solo_short.prompt_tokens + len(solo_short.token_ids)
        assert eng.cache_width < solo_long.prompt_tokens
    finally:
        await eng.close()


async def test_prefix_cache_serves_an_extended_prompt_with_the_same_tokens_as_a_cold_prefill(tiny_model_dir):
    """A prompt that extends a finished request's prompt + output reuses its key/value tensors (cached_tokens > 0)
    and decodes exactly what the cache-less engine decodes; the cache stays within its token budget."""
    metrics = Metrics()
    eng = TransformersEngine(str(tiny_model_dir), batch_wait_ms=1, prefix_cache_tokens=600, metrics=metrics,
                             component="speaker")
    engine = TransformersEngine(str(tiny_model_dir), batch_wait_ms=1)  # the same model without a cache
    await eng.start()
    await engine.start()
    try:
        chat = [{"role": "system", "content": "You are a helper. " * 20}, {"role": "user", "content": "first"}]
        first = GenerationRequest(eng.render_chat(chat), SamplingParams(max_tokens=12))
        a = await eng.generate(first)
        assert a.cached_tokens == 0
        longer = chat + [{"role": "assistant", "content": a.text}, {"role": "user", "content": "and then?"}]
        second = GenerationRequest(eng.render_chat(longer), SamplingParams(max_tokens=16))
        b = await eng.generate(second)
        cold = await engine.generate(second)
        assert cold.cached_tokens == 0 and b.cached_tokens >= a.prompt_tokens
        assert b.token_ids == cold.token_ids

        def prompt_tokens(source):
            return metrics.registry.get_sample_value("mascot_engine_prompt_tokens_total",
                                                     {"component": "speaker", "source": source})
        assert prompt_tokens("cached") == b.cached_tokens
        assert prompt_tokens("computed") == a.prompt_tokens + b.prompt_tokens - b.cached_tokens
        # concurrent requests with a shared system text: still the cold engine's tokens
        others = [GenerationRequest(eng.render_chat(chat[:1] + [{"role": "user", "content": f"message {i}"}]),
                                    SamplingParams(max_tokens=8)) for i in range(4)]
        got = await asyncio.gather(*(eng.generate(r) for r in others))
        ref = [await engine.generate(r) for r in others]
        assert [g.token_ids for g in got] == [r.token_ids for r in ref]
        assert any(g.cached_tokens for g in got)
        assert 0 < eng.prefix_cache.tokens <= 600
    finally:
        await eng.close()
        await engine.close()


async def test_stream_first_delta_before_end_and_deltas_join(engine):
    prompt = engine.render_chat([{"role": "user", "content": "tell me something long"}])
    items = []
    async for it in engine.stream(GenerationRequest(prompt, SamplingParams(max_tokens=48, temperature=1.0, seed=5))):
        items.append((asyncio.get_running_loop().time(), it))
    deltas = [it for _, it in items if isinstance(it, StreamDelta)]
    result = items[-1][1]
    assert len(deltas) >= 2, "expected several deltas"
    assert items[0][0] < items[-1][0]
    assert "".join(d.text for d in deltas) == result.text


async def test_multibyte_characters_stream_whole(engine):
    """Byte-level tokens split characters; a delta must never carry half a character. A grammar forces a
    text whose emoji and CJK characters take several byte tokens each (decoded token by token: jump forward would
    feed the whole forced text in one step)."""
    engine.jump_forward = False
    try:
        await _multibyte(engine)
    finally:
        engine.jump_forward = True


async def _multibyte(engine):
    target = "日本語 ü é ✓ 😊 done"
    assert len(engine.tokenizer(target, add_special_tokens=False)["input_ids"]) > len(target.split())
    assert len(engine.tokenizer("😊", add_special_tokens=False)["input_ids"]) > 1
    prompt = engine.render_chat([{"role": "user", "content": "say it"}])
    deltas, result = [], None
    async for it in engine.stream(GenerationRequest(prompt, SamplingParams(max_tokens=64),
                                                    structured=StructuredOutput(regex=target))):
        if isinstance(it, StreamDelta):
            deltas.append(it.text)
        else:
            result = it
    assert result.text == target
    assert "".join(deltas) == target
    assert all("\ufffd" not in d for d in deltas)
    assert len(deltas) > 3


async def test_stop_strings_cut_text(engine):
    prompt = engine.render_chat([{"role": "user", "content": "x"}])
    full = await engine.generate(GenerationRequest(prompt, SamplingParams(max_tokens=30)))
    assert len(full.text) > 6
    stop = full.text[4:7]
    cut = await engine.generate(GenerationRequest(prompt, SamplingParams(max_tokens=30, stop=(stop,))))
    assert cut.text == full.text[:full.text.find(stop)] and cut.finish_reason == "stop"


async def test_structured_output_regex_and_json_schema(engine):
    prompt = engine.render_chat([{"role": "user", "content": "pick"}])
    rx = r"Agent: (The Anchor|The Beacon)\nAction: [a-z ]{1,20}\nTone: [a-z]{1,8}"
    import re

    for seed in range(3):
        r = await engine.generate(GenerationRequest(prompt, SamplingParams(max_tokens=80, temperature=1.0, seed=seed),
                                                    structured=StructuredOutput(regex=rx)))
        assert re.fullmatch(rx, r.text), r.text
    schema = ('{"type":"object","properties":{"score":{"type":"integer","minimum":1,"maximum":5}},'
              '"required":["score"],"additionalProperties":false}')
    r = await engine.generate(GenerationRequest(prompt, SamplingParams(max_tokens=40),
                                                structured=StructuredOutput(json_schema=schema)))
    import json

    assert set(json.loads(r.text)) == {"score"}


async def test_errors(engine):
    from mascot.core.engine import PromptTooLong, UnknownAdapter

    with pytest.raises(UnknownAdapter):
        await engine.generate(GenerationRequest("hi", adapter="nope"))
    with pytest.raises(PromptTooLong):
        await engine.generate(GenerationRequest("word " * 3000, SamplingParams(max_tokens=10)))


def test_loads_hub_id_from_offline_cache(tiny_model_dir, tmp_path):
    """A hub id resolves through a Hugging Face cache folder with HF_HUB_OFFLINE=1 (no network)."""
    cache = tmp_path / "hub"
    snap = cache / "models--acme--tiny-qwen3" / "snapshots" / ("0" * 40)
    shutil.copytree(tiny_model_dir, snap)
    (cache / "models--acme--tiny-qwen3" / "refs").mkdir()
    (cache / "models--acme--tiny-qwen3" / "refs" / "main").write_text("0" * 40)
    code = ("import asyncio; from mascot.core.engine.transformers import TransformersEngine as E;"
            "from mascot.core.engine import GenerationRequest, SamplingParams;"
            "e=E('acme/tiny-qwen3'); asyncio.run(e.start());"
            "r=asyncio.run(e.generate(GenerationRequest('hello', SamplingParams(max_tokens=4))));"
            "print(len(r.token_ids), e.max_context_tokens)")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(cache), "HF_HOME": str(tmp_path / "home")}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split()[-2:] == ["4", "2048"]


def test_prefix_cache_keeps_the_longest_prefix_per_adapter_within_its_budget():
    import torch

    from mascot.core.engine.transformers import _PrefixCache

    def kv(n):
        return [(torch.arange(n, dtype=torch.float32).view(1, 1, n, 1), torch.zeros(1, 1, n, 1))]

    c = _PrefixCache(max_tokens=100, min_tokens=4)
    c.store("base", list(range(40)), kv(40))
    c.store("base", list(range(50)), kv(50))  # covers the first: it replaces it
    assert c.tokens == 50
    m, layers = c.lookup("base", list(range(45)) + [999])
    assert m == 45 and layers[0][0].shape[2] == 45 and layers[0][0][0, 0, -1, 0] == 44
    assert c.lookup("anchor--v1", list(range(45))) is None  # another adapter's tensors never serve
    assert c.lookup("base", [7, 8, 9, 10, 11]) is None  # too short a shared prefix
    assert c.lookup("base", list(range(50)))[0] == 49  # at least one prompt token is left to prefill
    c.store("anchor--v1", list(range(100, 160)), kv(60))  # over budget: the least recently used goes
    assert c.tokens == 60 and c.lookup("base", list(range(45))) is None
    c.drop("anchor--v1")
    assert c.tokens == 0


# A grammar with long forced stretches: the rest of a name once its first letters are chosen, and the field labels.
_FORCED_RX = (r"Agent: (The Anchor of the Group|The Beacon of Hope)\nAction: Acknowledge [a-z ]{4,24}\n"
              r"Tone: (warm|calm) and steady")


async def test_jump_forward_feeds_forced_text_in_fewer_steps_and_keeps_the_grammar(tiny_model_dir):
    """Under a grammar the forced text is fed in one forward step (fewer decode steps than tokens); without jump
    forward every token takes a step. Both outputs match the grammar."""
    import re

    on = TransformersEngine(str(tiny_model_dir), batch_wait_ms=1)
    off = TransformersEngine(str(tiny_model_dir), batch_wait_ms=1, jump_forward=False)
    await on.start()
    await off.start()
    try:
        prompt = on.render_chat([{"role": "user", "content": "who speaks next?"}])
        req = GenerationRequest(prompt, SamplingParams(max_tokens=80), structured=StructuredOutput(regex=_FORCED_RX))
        a, b = await on.generate(req), await off.generate(req)
        assert re.fullmatch(_FORCED_RX, a.text) and re.fullmatch(_FORCED_RX, b.text), (a.text, b.text)
        # every token but the last (nothing follows it) is fed; jump forward feeds several per step
        assert off.decode_tokens == off.decode_steps == len(b.token_ids) - 1
        assert on.decode_tokens == len(a.token_ids) - 1
        assert on.decode_steps < on.decode_tokens - 8, (on.decode_steps, on.decode_tokens)
        # without a grammar nothing is forced
        plain = GenerationRequest(prompt, SamplingParams(max_tokens=20))
        s0, t0 = on.decode_steps, on.decode_tokens
        r = await on.generate(plain)
        assert on.decode_steps - s0 == on.decode_tokens - t0 == len(r.token_ids) - 1
    finally:
        await on.close()
        await off.close()


async def test_a_row_batched_with_a_jumping_row_keeps_its_solo_tokens(tiny_model_dir):
    """A plain request decoded beside a row that jumps forward (its steps then hold padding for the plain row) gets
    its solo greedy tokens, and the jumping row its solo text."""
    eng = TransformersEngine(str(tiny_model_dir), batch_wait_ms=200)
    await eng.start()
    try:
        plain = GenerationRequest(eng.render_chat([{"role": "user", "content": "tell me"}]),
                                  SamplingParams(max_tokens=12))
        ruled = GenerationRequest(eng.render_chat([{"role": "user", "content": "pick"}]),
                                  SamplingParams(max_tokens=80), structured=StructuredOutput(regex=_FORCED_RX))
        solo_plain, solo_ruled = await eng.generate(plain), await eng.generate(ruled)
        steps = eng.decode_steps
        got_plain, got_ruled = await asyncio.gather(eng.generate(plain), eng.generate(ruled))
        assert list(eng.batch_sizes)[-1] == 2  # decoded together from the first step
        assert eng.decode_steps - steps < len(got_ruled.token_ids) - 1  # the longer, ruled row jumped
        assert got_plain.token_ids == solo_plain.token_ids and got_ruled.text == solo_ruled.text
    finally:
        await eng.close()


def test_a_jump_forward_step_leaves_holes_no_row_attends_to_and_the_prefix_cache_drops_them(tiny_model_dir):
    """Numerically, on float32: in one step where row 1 feeds four tokens and row 0 one (three padding columns in
    row 0), each row's next-token logits equal those of the same tokens fed alone, one step per token; the next
    step (no jump) still agrees, and the key/value tensors the prefix cache keeps for row 0 are its solo ones, holes
    dropped."""
    import torch

    from mascot.core.engine.transformers import _Job

    eng = TransformersEngine(str(tiny_model_dir), prefix_cache_tokens=10_000)
    eng._load()
    loop = asyncio.new_event_loop()

    def job(text: str) -> _Job:
        ids = eng.tokenizer(eng.render_chat([{"role": "user", "content": text}]), add_special_tokens=False)["input_ids"]
        return _Job(request=GenerationRequest("x", SamplingParams(max_tokens=40)), prompt_ids=ids, loop=loop,
                    out=asyncio.Queue())

    a, b = job("a short one " * 8), job("a somewhat longer message to decode")
    feed_a, feed_b = [[11]], [[12, 13, 14, 15]]
    with torch.inference_mode():
        both = eng._prefill([a, b])
        both = eng._step(both, [feed_a[0], feed_b[0]])
        assert both["mask"][0, -4:].tolist() == [0, 0, 0, 1]  # the holes
        both = eng._step(both, [[21], [22]])
        alone = []
        for j, feeds in ((job("a short one " * 8), feed_a + [[21]]), (job("a somewhat longer message to decode"),
                                                                  [[t] for t in feed_b[0]] + [[22]])):
            st = eng._prefill([j])
            for f in feeds:
                st = eng._step(st, [f])
            alone.append(st)
        for row in (0, 1):
            assert torch.allclose(both["logits"][row], alone[row]["logits"][0], atol=1e-4)
            assert int(both["pos"][row]) == int(alone[row]["pos"][0])
        a.ids = [11, 21, 30]
        eng._remember(both, 0)
    (m, layers), = [eng.prefix_cache.lookup("base", a.prompt_ids + [11, 21, 99, 98])]
    assert m == len(a.prompt_ids) + 2
    for (k, v), solo in zip(layers, alone[0]["cache"].layers):
        assert torch.allclose(k, solo.keys[:, :, :m, :], atol=1e-5) and torch.allclose(v, solo.values[:, :, :m, :],
                                                                                          atol=1e-5)
    loop.close()


async def test_close_ends_the_running_batch_and_fails_its_callers(tiny_model_dir):
    """close() does not decode the running batch to its end: its requests are cancelled at the next step and their
    callers get RuntimeError (a worker left inside torch at interpreter exit aborts the process)."""
    eng = TransformersEngine(str(tiny_model_dir), batch_wait_ms=1)
    await eng.start()
    req = GenerationRequest(eng.render_chat([{"role": "user", "content": "hello"}]),
                            SamplingParams(max_tokens=1000, temperature=1.0, seed=1))
    got: list = []

    async def consume() -> None:
        async for item in eng.stream(req):
            got.append(item)

    task = asyncio.create_task(consume())
    while not got:
        await asyncio.sleep(0.01)
    await eng.close()
    with pytest.raises(RuntimeError, match="engine closed"):
        await asyncio.wait_for(task, 30)
    assert eng._worker is None and eng.decode_steps < 1000
    assert not any(not isinstance(i, StreamDelta) for i in got)  # no result: the request did not run to its end
