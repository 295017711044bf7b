"""`mascot train director-probe`: the director's first decisions on held-out situations, as served, with Wilson
intervals (mascot_training.collaborative.probe)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest
import yaml

from tests.helpers.paths import ROOT

ROSTER = ["anchor", "catalyst", "beacon"]


def _wilson(k: int, n: int, z: float = 1.959964) -> tuple[float, float]:
    """The Wilson score interval, written out (Wilson, 1927)."""
    p = k / n
    mid = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return mid - half, mid + half


def test_decision_table_counts_shares_intervals_and_tones():
    from mascot_training.collaborative.probe import decision_table

    rows = ([{"persona": "beacon", "tone": "Warm and upbeat"}] * 6 + [{"persona": "catalyst", "tone": "Curious"}] * 3
            + [{"persona": "", "tone": ""}])
    t = decision_table(rows, ROSTER)
    assert t["n"] == 10
    assert {p: e["count"] for p, e in t["personas"].items()} == {"anchor": 0, "catalyst": 3, "beacon": 6}
    assert t["personas"]["beacon"]["share"] == 0.6 and t["refused"]["count"] == 1
    for p, k in (("beacon", 6), ("catalyst", 3), ("anchor", 0)):
        assert t["personas"][p]["ci95"] == pytest.approx(_wilson(k, 10), abs=1e-4)
    assert t["tones"] == {"distinct": 2, "top": "Warm and upbeat", "top_share": round(6 / 9, 4)}
    assert decision_table([], ROSTER)["n"] == 0


@pytest.mark.slow
def test_probe_cli_on_the_tiny_model(tmp_path, tiny_model_dir, shared_data):
    cfg = yaml.safe_load((ROOT / "training-jobs" / "configs" / "collaborative_smoke.yaml").read_text())
    situations = shared_data / "empathetic_dialogues" / "test_situations.jsonl"
    cfg["model"], cfg["data"]["situations"] = str(tiny_model_dir), str(situations)
    config = tmp_path / "p2.yaml"
    config.write_text(yaml.safe_dump(cfg))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "2"}

    def cli(*args):
        return subprocess.run([sys.executable, "-m", "mascot.cli", "train", "director-probe", "--config", str(config),
                               "--situations", str(situations), *args], cwd=tmp_path, env=env, capture_output=True,
                              text=True, timeout=600)

    out = tmp_path / "probe.json"
    r = cli("--limit", "3", "--samples", "2", "--out", str(out))
    assert r.returncode == 0, r.stderr
    rep = json.loads(out.read_text())
    assert rep["n"] == 6 and len(rep["rows"]) == 6 and rep["adapter"] == ""
    assert sum(e["count"] for e in rep["personas"].values()) + rep["refused"]["count"] == 6
    assert set(rep["personas"]) == set(ROSTER) and rep["decoding"] == {"temperature": 0.7, "top_p": 0.9}
    ids = [row["prefix_id"] for row in rep["rows"]]
    assert len(set(ids)) == 3 and all(i.endswith("#probe") for i in ids) and sorted(ids) == sorted([*set(ids)] * 2)
    assert "first decisions (3 situations x 2)" in r.stderr
    assert cli("--limit", "3", "--samples", "2", "--out", str(tmp_path / "again.json")).returncode == 0
    assert json.loads((tmp_path / "again.json").read_text())["rows"] == rep["rows"]  # seeded: the same decisions
    bad = cli("--limit", "1", "--adapter", str(tmp_path))
    assert bad.returncode == 1 and "is not a LoRA adapter directory" in bad.stderr
