"""The vLLM benchmarks and the GPU check run at a small size on CPU so they never rot (full-size figures go in the
issue note). bench/vllm_serving.py measures on the session engine (its engine start is most of its run time); the
GPU check starts its own engine in a subprocess, its whole CPU path, while the session engine idles."""

import importlib.util
import re
import subprocess
import sys

import pytest

from tests.helpers.paths import ROOT

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.serial]


def load_bench(name: str):
    """``bench/<name>.py`` as a module (``sys.path`` as it was: a bench puts ``services`` in front)."""
    saved = list(sys.path)
    spec = importlib.util.spec_from_file_location(f"bench_{name}", ROOT / "bench" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path[:] = saved
    return module


async def test_vllm_serving_bench_prints_its_ratios(vllm_engine, tiny_model_dir, tmp_path, capsys, monkeypatch):
    """bench/vllm_serving.py's three figures at its small size, measured by the bench's own code on the session's
    vLLM engine (32-token KV blocks, as the bench builds its own) through a real gateway stack."""
    cli = subprocess.run([sys.executable, str(ROOT / "bench" / "vllm_serving.py"), "--help"], capture_output=True,
                         text=True, timeout=60, cwd=ROOT)
    assert cli.returncode == 0 and "--size {full,small}" in cli.stdout, cli.stdout + cli.stderr
    assert vllm_engine.vllm_args.block_size == 32  # the prefix-caching figure depends on it
    bench = load_bench("vllm_serving")
    monkeypatch.setenv("MASCOT_ADMIN_TOKEN", "bench-token")  # the bench sets it for its gateway; restored after
    await bench.figures(vllm_engine, str(tiny_model_dir), bench.SIZES["small"], tmp_path)
    out = capsys.readouterr()
    text = out.out

    def figure(pattern: str) -> float:
        m = re.search(pattern, text)
        assert m, f"{pattern!r} not in:\n{text}"
        return float(m.group(1))

    # every figure against its goal: a red figure fails the test
    assert figure(r"ratio 16 concurrent / 1 = ([\d.]+) \(goal >= 4\)") >= 4, text
    assert figure(r"ratio recomputed with / without prefix caching = ([\d.]+) \(goal <= 0.25\)") <= 0.25, text
    assert figure(r"swap time = ([\d.]+) s \(goal <= 1\)") <= 1, text
    # no request may fail during a promote, at any size (the client waits as a refused round's retry-after says)
    assert figure(r"promote under load: (\d+) failed of \d+ requests \(goal 0\)") == 0, text + out.err[-2000:]
    assert "first reply from anchor--v2" in text


def test_gpu_check_runs_its_path_on_cpu_with_a_tiny_shape(vllm_session_engine):
    import json

    from mascot.core.engine.vllm import cpu_memory_share

    # 1.5 GiB as the session engine has: the engine's CPU default (0.3 of the node's memory) is a KV cache of GiBs,
    # and allocating it was a third of this test's time
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu_check.py"), "--shape", "tiny", "--skip-tests",
                          "--memory-share", str(cpu_memory_share(1.5))],
                         capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    figures = json.loads(out.stdout.strip().splitlines()[-1])
    assert figures["platform"] == "cpu"
    assert figures["tensor_parallel_size"] == 1  # no visible GPU: one shard
    # the GPU-only checks say why they did not run, instead of failing or vanishing
    assert "CUDA" in figures["shared_engine"]["skipped"] and "CUDA" in figures["grpo_vllm_colocate"]["skipped"]
    assert figures["single_tok_s"] > 0 and figures["concurrent16_mixed_lora_tok_s"] > figures["single_tok_s"]
