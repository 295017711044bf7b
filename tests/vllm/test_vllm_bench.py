"""The vLLM benchmarks and the GPU check run at a small size on CPU so they never rot (full-size figures go in the
issue note). Each starts its own engine in a subprocess; the session engine idles meanwhile."""

import re
import subprocess
import sys

import pytest

from tests.helpers.paths import ROOT

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


def test_vllm_serving_bench_prints_its_ratios(tiny_model_dir, vllm_session_engine):
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "vllm_serving.py"), "--size", "small", "--model",
                          str(tiny_model_dir)], capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    text = out.stdout

    def figure(pattern: str) -> float:
        m = re.search(pattern, text)
        assert m, f"{pattern!r} not in:\n{text}"
        return float(m.group(1))

    # every figure against its goal: a red figure fails the test
    assert figure(r"ratio 16 concurrent / 1 = ([\d.]+) \(goal >= 4\)") >= 4
    assert figure(r"ratio recomputed with / without prefix caching = ([\d.]+) \(goal <= 0.25\)") <= 0.25
    assert figure(r"swap time = ([\d.]+) s \(goal <= 1\)") <= 1
    # no request may fail during a promote, at any size (the client waits as a refused round's retry-after says)
    assert figure(r"promote under load: (\d+) failed of \d+ requests \(goal 0\)") == 0, text + out.stderr[-2000:]
    assert "first reply from anchor--v2" in text


def test_gpu_check_runs_its_path_on_cpu_with_a_tiny_shape(vllm_session_engine):
    import json

    out = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu_check.py"), "--shape", "tiny", "--skip-tests"],
                         capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    figures = json.loads(out.stdout.strip().splitlines()[-1])
    assert figures["platform"] == "cpu"
    assert figures["tensor_parallel_size"] == 1  # no visible GPU: one shard
    # the GPU-only checks say why they did not run, instead of failing or vanishing
    assert "CUDA" in figures["shared_engine"]["skipped"] and "CUDA" in figures["grpo_vllm_colocate"]["skipped"]
    assert figures["single_tok_s"] > 0 and figures["concurrent16_mixed_lora_tok_s"] > figures["single_tok_s"]
