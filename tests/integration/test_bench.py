"""Benchmarks run at a small size in CI so they never rot (the full-size figure goes in the issue note)."""

import subprocess
import sys

import pytest

from tests.conftest import ROOT

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_turn_overhead_bench_prints_ratio(tiny_model_dir):
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "turn_overhead.py"), "--rounds", "1", "--model",
                          str(tiny_model_dir)], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "ratio gRPC / in-process = " in out.stdout
    assert "identical outputs in 1/1 rounds" in out.stdout
