"""The main job over real situations (../shared/data): transcripts.jsonl and summary.json in their documented schema."""

import json
import os
import subprocess
import sys

import pytest

from tests.helpers.paths import ROOT
from tests.helpers.runjob import check_outputs

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def run(args, tiny_model_dir, tmp_path):
    env = {"MASCOT_ENGINE__MODEL": str(tiny_model_dir), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path),
           # the tiny random model fails every reply check: structure only here (test_real_dialogue checks language);
           # the safety gate's rules only: the simulated user's tiny-model text is noise to the crisis detector
           "MASCOT_GUARD__ENABLED": "false", "MASCOT_DIRECTOR__CHECK_CONTENT": "false",
           "MASCOT_SAFETY__CLASSIFIER": "none"}
    out = subprocess.run([sys.executable, "-m", "mascot.cli", "run", *args], capture_output=True, text=True,
                         timeout=900, env=env, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    return out


def test_support_situations(shared_data, tiny_model_dir, tmp_path):
    src = shared_data / "empathetic_dialogues" / "test_situations.jsonl"
    run(["--situations", str(src), "--limit", "4", "--out", str(tmp_path / "s"), "--seed", "1"], tiny_model_dir,
        tmp_path)
    lines = check_outputs(tmp_path / "s", "support", 4,
                          {"empathetic_listener", "anchor", "catalyst", "action_guide", "beacon"})
    records = [json.loads(x) for x in src.read_text().splitlines()[:4]]
    assert [ln["source_id"] for ln in lines] == [r["id"] for r in records]
    assert [ln["turns"][0]["text"] for ln in lines] == [r["first_utterance"] for r in records]


def test_meeting_excerpts(shared_data, tiny_model_dir, tmp_path):
    src = shared_data / "qmsum" / "meeting_excerpts.jsonl"
    run(["--situations", str(src), "--limit", "5", "--mode", "meeting", "--out", str(tmp_path / "m")],
        tiny_model_dir, tmp_path)
    lines = check_outputs(tmp_path / "m", "meeting", 5, {"minutes_scribe", "decision_logger",
                                                          "action_item_captain", "critic"})
    records = [json.loads(x) for x in src.read_text().splitlines()[:5]]
    assert [ln["turns"][0]["text"] for ln in lines] == [r["query"] for r in records]


def test_bad_situations_file_is_refused(tmp_path, tiny_model_dir):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": 1, "situation": "x"}\n')
    env = {"MASCOT_ENGINE__MODEL": str(tiny_model_dir), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path),
           # the tiny random model fails every reply check: structure only here (test_real_dialogue checks language);
           # the safety gate's rules only: the simulated user's tiny-model text is noise to the crisis detector
           "MASCOT_GUARD__ENABLED": "false", "MASCOT_DIRECTOR__CHECK_CONTENT": "false",
           "MASCOT_SAFETY__CLASSIFIER": "none"}
    out = subprocess.run([sys.executable, "-m", "mascot.cli", "run", "--situations", str(bad), "--out",
                          str(tmp_path / "o")], capture_output=True, text=True, timeout=120, env=env, cwd=ROOT)
    assert out.returncode == 2 and "bad.jsonl:1" in out.stderr and "first_utterance" in out.stderr
    assert not (tmp_path / "o" / "transcripts.jsonl").exists()


GOOD = {"id": "a", "emotion": "sad", "situation": "It rained.", "first_utterance": "My picnic was rained out."}
#: (line 2 of the file, the message after "FILE:2: "): each is refused before any server starts (no model needed).
UNUSABLE = {
    "nested-100000-deep": ("[" * 100_000 + "]" * 100_000, "arrays and objects nested more than 64 levels deep"),
    "not-an-object": ('["a", "sad", "It rained."]', "not a JSON object (a record is {...}), got an array"),
    "wrong-type": (json.dumps({**GOOD, "situation": ["It rained."]}), "situation must be a string, got an array"),
    "control-character": (json.dumps({**GOOD, "first_utterance": "hi\x1b[2J"}),
                          "first_utterance contains the control character U+001B; only tab, newline and carriage "
                          "return are allowed"),
}


@pytest.mark.parametrize("line, message", list(UNUSABLE.values()), ids=list(UNUSABLE))
def test_an_unusable_situations_file_is_refused_on_one_line_before_any_server_starts(tmp_path, line, message):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(GOOD) + "\n" + line + "\n", encoding="utf-8")
    env = {**os.environ, "COLUMNS": "80", "OMP_NUM_THREADS": "1", "HOME": str(tmp_path),
           "PYTHONPATH": os.pathsep.join(str(ROOT / d) for d in ("services", "training-jobs", "."))}
    out = subprocess.run([sys.executable, "-m", "mascot.cli", "run", "--situations", str(bad), "--out",
                          str(tmp_path / "o")], capture_output=True, text=True, timeout=120, env=env, cwd=ROOT)
    assert out.returncode == 2, out.stderr[-3000:]
    assert out.stderr.splitlines() == [f"cannot read --situations: {bad}:2: {message}"], out.stderr[-3000:]
    assert out.stdout == "" and not (tmp_path / "o").exists()  # no config, store or stack
