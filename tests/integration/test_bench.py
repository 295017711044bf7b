"""Benchmarks run at a small size in CI so they never rot (the full-size figure goes in the issue note)."""

import subprocess
import sys

import pytest

from tests.helpers.paths import ROOT

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.serial]


def test_turn_overhead_bench_prints_ratio(tiny_model_dir):
    import re

    out = subprocess.run([sys.executable, str(ROOT / "bench" / "turn_overhead.py"), "--rounds", "4", "--model",
                          str(tiny_model_dir)], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "identical outputs in 4/4 rounds" in out.stdout, out.stdout
    m = re.search(r"ratio gRPC / in-process = ([\d.]+) \(goal <= 1.05", out.stdout)
    assert m, out.stdout
    # A regression bound, not the goal: at 4 rounds on 2 shared cores the ratio spreads by about +-0.1 from run to
    # run (turns of 0.2-0.3 s with the same prompts vary that much), so the goal (<= 1.05) is the full-size figure
    # of `make bench`, reported as measured; a path that adds a fixed cost per turn or per token (one gRPC message
    # per token measured 1.08 and 1.15 at full size) is caught here only when it is large.
    assert float(m.group(1)) <= 1.3, out.stdout


def test_shared_engine_bench_uses_less_memory_than_an_engine_per_component():
    """bench/shared_engine.py at its CI size on the tiny model: real `mascot serve-model` processes, the same
    workload against one shared director+speaker engine and against one engine each."""
    import re

    out = subprocess.run([sys.executable, str(ROOT / "bench" / "shared_engine.py"), "--size", "small", "--model",
                          "tiny"], capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    text = out.stdout
    assert re.search(r"separate: 2 process\(es\) \[director \| speaker\].* 8 turns in", text), text
    assert re.search(r"shared: 1 process\(es\) \[director,speaker\].* 8 turns in", text), text
    mem = float(re.search(r"memory separate / shared = ([\d.]+) \(goal > 1\)", text).group(1))
    thr = float(re.search(r"throughput shared / separate = ([\d.]+)", text).group(1))
    # one process and one engine instead of two: measured 1.96 on the tiny model (the torch runtime and the
    # engine's buffers are paid once); a shared server that built an engine per component would sit near 1
    assert mem > 1.4, text
    # indicative on CPU (measured 1.03); a regression bound: the shared engine must not serialise the components
    assert thr > 0.6, text
    assert "result: PASS" in text


def test_load_bench_small_size_loses_nothing_and_refuses_the_overload(tiny_model_dir):
    """bench/load.py at its CI size: 0 errors, 0 lost turns within capacity; at 4x capacity the excess is
    RESOURCE_EXHAUSTED and no conversation holds half a round."""
    import re

    out = subprocess.run([sys.executable, str(ROOT / "bench" / "load.py"), "--size", "small", "--model",
                          str(tiny_model_dir)], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    text = out.stdout
    assert "rounds: 8 ok of 8, errors 0" in text
    assert re.search(r"lost turns 0, unacknowledged stored turns 0, delta mismatches 0", text)
    assert re.search(r"round latency: p50 [\d.]+ s, p95 [\d.]+ s, p99 [\d.]+ s", text)
    m = re.search(r"overload: 16 offered at 4x capacity: (\d+) admitted, (\d+) RESOURCE_EXHAUSTED \(metric (\d+)\), "
                  r"0 other errors ?; half-stored conversations 0", text)
    assert m, text
    admitted, refused, counted = map(int, m.groups())
    assert refused > 0 and admitted + refused == 16 and counted == refused
    assert "result: PASS" in text


def test_dialogue_quality_bench_small_size_delivers_no_defect(real_model_dir, shared_data, tmp_path):
    """bench/dialogue_quality.py at its CI size on the default real model: the fixed detectors find no echo, loop,
    near-duplicate or empty reply in what users were shown, and the figures it prints are the ones it wrote."""
    import json
    import os
    import re

    env = {k: v for k, v in os.environ.items() if not k.startswith("MASCOT_")}  # the product's own defaults
    env["MASCOT_SHARED_DIR"] = str(shared_data.parent)
    env["OMP_NUM_THREADS"] = "2"
    out_json = tmp_path / "quality.json"
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "dialogue_quality.py"), "--size", "small", "--json",
                          str(out_json)], capture_output=True, text=True, timeout=900, cwd=ROOT, env=env)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    text = out.stdout
    fig = json.loads(out_json.read_text())
    assert "guard=on" in text and fig["model"]["name"] == "SmolLM2-135M-Instruct"
    for k in ("echoes", "loops", "near_duplicates", "empty"):
        assert re.search(rf"^  {k}: (\d+)$", text, re.M).group(1) == str(fig[k]) == "0", (k, fig["examples"])
    assert fig["agent_turns"] >= 4 and fig["conversations"] == 2
    assert fig["clean_endings"] >= 0.75 and fig["median_words"] >= 8
    assert fig["degenerate_directives"] <= 0.5 and fig["max_persona_share"] <= 0.5
    assert float(re.search(r"tokens_per_second: ([\d.]+)", text).group(1)) == fig["tokens_per_second"] > 0
    assert re.search(r"target echoes == 0: 0 PASS", text)
    assert (fig["turn_latency_p50_alone"] is None
            and "turn_latency_p50_alone <= 4.0: not measured at concurrency 2" in text)


def test_engine_cpu_bench_fast_paths_are_faster_and_exact(real_model_dir, tmp_path):
    """bench/engine_cpu.py at a small size: the engine's decode step (grouped key/value heads under the mask, a cache
    that appends into spare room) is faster than transformers' own with the same logits, and ``engine.dtype: auto``
    picks the faster dtype for this CPU; the printed figures are the ones written."""
    import json
    import os
    import re

    out_json = tmp_path / "engine.json"
    env = {**os.environ, "OMP_NUM_THREADS": "2"}
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "engine_cpu.py"), "--rows", "8", "--width", "384",
                          "--steps", "6", "--prompt", "256", "--repeats", "2", "--json", str(out_json)],
                         capture_output=True, text=True, timeout=600, cwd=ROOT, env=env)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    fig = json.loads(out_json.read_text())
    m = re.search(r"transformers ([\d.]+) ms, engine ([\d.]+) ms, ratio engine / transformers = ([\d.]+)", out.stdout)
    assert m, out.stdout
    assert (float(m.group(1)), float(m.group(2)), float(m.group(3))) == (
        fig["decode"]["transformers_step_ms"], fig["decode"]["engine_step_ms"], fig["decode"]["ratio"])
    assert fig["decode"]["ratio"] < 1 and fig["decode"]["max_logit_diff"] == 0
    assert fig["prefill"]["auto_is_faster"] and f"auto picks {fig['prefill']['auto']}" in out.stdout
    assert fig["pass"] and "result: PASS" in out.stdout


def test_crisis_gate_bench_times_both_gates():
    """bench/crisis_gate.py at a small size: the trained gate's per-message latency beside the rules', on the labelled
    messages, on the held-out sets' messages as written and on long ones (the sentence windows, packed in one pass)."""
    import re

    out = subprocess.run([sys.executable, str(ROOT / "bench" / "crisis_gate.py"), "--messages", "60", "--long-every",
                          "5"], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    text = out.stdout
    p95 = {m.group(1): float(m.group(2)) for m in re.finditer(r"(trained|rules|trained long|rules long|trained "
                                                             r"labelled): \d+ messages[^,]*, p50 [\d.]+ ms, "
                                                             r"p95 ([\d.]+) ms", text)}
    assert set(p95) == {"trained", "rules", "trained long", "rules long", "trained labelled"}, text
    # the goal (< 50 ms on 2 threads) is the full-size figure on the labelled messages, measured 31 ms; a regression
    # bound on a shared CI machine: a short message is one encoder pass, a long one too (packed; 100 ms median)
    assert p95["rules"] < p95["trained labelled"] < 150, text
    assert p95["trained labelled"] < p95["trained long"] < 1500, text
    assert re.search(r"trained p95 = [\d.]+ ms on the labelled messages \(goal < 50 ms on 2 threads\): "
                     r"(PASS|MISSED)", text), text
    held = re.search(r"trained p95 = ([\d.]+) ms on the (\d+) held-out messages as written \(p50 ([\d.]+) ms; goal "
                     r"< 50 ms\): (PASS|MISSED)", text)
    assert held and int(held.group(2)) >= 600 and float(held.group(3)) <= float(held.group(1)) < 150, text
    assert re.search(r"trained p95 = [\d.]+ ms with one message in 5 long \(goal < 50 ms\): (PASS|MISSED)", text), text
