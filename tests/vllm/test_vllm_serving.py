"""Serving on the vllm engine: hot-load through the gateway's AdapterService with greedy output equal to
the transformers engine with the same version, and the main job (`mascot run --engine vllm`) end to end."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from mascot.core.engine.transformers import TransformersEngine
from tests.helpers.hot_load import check_hot_load
from tests.helpers.paths import ROOT
from tests.helpers.runjob import check_outputs

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.integration]


async def test_hot_load_on_vllm_matches_the_transformers_engine(vllm_engine, tiny_model_dir, tmp_path, monkeypatch):
    reference = TransformersEngine(str(tiny_model_dir), max_model_len=1024)
    await reference.start()
    try:
        await check_hot_load(tmp_path, tiny_model_dir, monkeypatch, engine=vllm_engine, reference=reference)
    finally:
        await reference.close()
    # the versions were loaded into the vLLM engine under their own names, never over another name
    assert {"anchor--v1", "anchor--v2", "anchor--v3"} <= set(vllm_engine.adapters())


def test_main_job_runs_on_the_vllm_engine(shared_data, tiny_model_dir, tmp_path, vllm_session_engine):
    """`mascot run --engine vllm` in its own process (its own engine: the session's stays idle meanwhile)."""
    src = shared_data / "empathetic_dialogues" / "test_situations.jsonl"
    env = {"MASCOT_ENGINE__MODEL": str(tiny_model_dir), "MASCOT_ENGINE__GPU_MEMORY_UTILIZATION": "0.08",
           "MASCOT_ENGINE__MAX_MODEL_LEN": "2048", "PATH": "/usr/bin:/bin", "HOME": str(tmp_path),
           "MASCOT_GUARD__ENABLED": "false", "MASCOT_DIRECTOR__CHECK_CONTENT": "false",
           # rules only: the tiny model's simulated-user text is noise to the crisis detector
           "MASCOT_SAFETY__CLASSIFIER": "none",
           # short replies and user messages (48 and 40 tokens by default): the tiny model's text is noise, and the
           # job's shape (turns, directives, summary) is what is checked; halves the conversations' time
           "MASCOT_SPEAKER__MAX_TOKENS": "16", "MASCOT_SELFPLAY__USER_MAX_TOKENS": "16"}
    out = subprocess.run([sys.executable, "-m", "mascot.cli", "run", "--engine", "vllm", "--situations", str(src),
                          "--limit", "2", "--out", str(tmp_path / "v"), "--seed", "1"],
                         capture_output=True, text=True, timeout=900, env=env, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = check_outputs(tmp_path / "v", "support", 2,
                          {"empathetic_listener", "anchor", "catalyst", "action_guide", "beacon"})
    records = [json.loads(x) for x in src.read_text().splitlines()[:2]]
    assert [ln["turns"][0]["text"] for ln in lines] == [r["first_utterance"] for r in records]
    assert all(t["adapter_version"] == "base" for ln in lines for t in ln["turns"] if t["role"] == "agent")
