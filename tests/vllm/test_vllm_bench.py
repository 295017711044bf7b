"""The vLLM benchmarks and the GPU check run at a small size on CPU so they never rot (full-size figures go in the
issue note). Each starts its own engine in a subprocess; the session engine idles meanwhile."""

import subprocess
import sys

import pytest

from tests.conftest import ROOT

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


def test_vllm_serving_bench_prints_its_ratios(tiny_model_dir, vllm_session_engine):
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "vllm_serving.py"), "--size", "small", "--model",
                          str(tiny_model_dir)], capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    for line in ("ratio 16 concurrent / 1 = ", "ratio recomputed with / without prefix caching = ",
                 "swap time = "):
        assert line in out.stdout, out.stdout
    # no request may fail during a promote, at any size
    assert "promote under load: 0 failed of " in out.stdout, out.stdout + out.stderr[-2000:]
    assert "first reply from anchor--v2" in out.stdout


def test_gpu_check_runs_its_path_on_cpu_with_a_tiny_shape(vllm_session_engine):
    import json

    out = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu_check.py"), "--shape", "tiny", "--skip-tests"],
                         capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    figures = json.loads(out.stdout.strip().splitlines()[-1])
    assert figures["platform"] == "cpu"
    assert figures["single_tok_s"] > 0 and figures["concurrent16_mixed_lora_tok_s"] > figures["single_tok_s"]
