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


def test_load_bench_small_size_loses_nothing_and_refuses_the_overload(tiny_model_dir):
    """bench/load.py at its CI size: 0 errors, 0 lost turns within capacity; at 4x capacity the excess is
    RESOURCE_EXHAUSTED and no conversation holds half a round (issue 8, item 4)."""
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
