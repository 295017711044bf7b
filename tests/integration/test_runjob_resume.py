"""The main job keeps finished work: with one conversation forced past its deadline, `mascot run` writes the others'
transcripts and a summary naming the failure, exits 1 with the fix in its message, and the same command again runs
only the missing conversation (real gateway, director and speaker servers on loopback; a scripted engine)."""

from __future__ import annotations

import asyncio
import json
import os
import sys

import pytest

from mascot.app.stack import start_stack
from tests.helpers.config import make_config
from tests.helpers.engine import ScriptedEngine
from tests.helpers.paths import ROOT

pytestmark = pytest.mark.integration
DIRECTOR = '{"agent": "anchor", "action": "Acknowledge how heavy this feels.", "tone": "Warm"}'


class SlowOnce(ScriptedEngine):
    """Speaker calls whose prompt holds ``SLOWPOKE`` take ``delay_s`` while ``slow`` is set (a planted deadline)."""

    def __init__(self, delay_s: float) -> None:
        super().__init__(lambda p: DIRECTOR, lambda p: "That sounds hard. What would help most right now?")
        self.delay_s, self.slow = delay_s, True

    async def stream(self, request):
        if self.slow and "SLOWPOKE" in request.prompt and "You are the director" not in request.prompt:
            await asyncio.sleep(self.delay_s)
        async for item in super().stream(request):
            yield item


def _situations(path):
    rows = [{"id": f"sit-{i}", "situation": f"Situation {i}.", "emotion": "sad",
             "first_utterance": ("SLOWPOKE " if i == 1 else "") + f"Something went wrong today, number {i}."}
            for i in range(3)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return rows


async def _run(target, situations, out, *extra):
    env = {**os.environ, "COLUMNS": "200", "MASCOT_TLS": "", "MASCOT_CALLER_TOKEN": ""}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "mascot.cli", "run", "--target", target, "--situations", str(situations), "--out",
        str(out), "--agent-turns", "1", "--concurrency", "3", *extra, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, env=env, cwd=ROOT)
    stdout, stderr = await asyncio.wait_for(proc.communicate(), 300)
    return proc.returncode, stdout.decode(), stderr.decode()


async def test_a_failed_conversation_keeps_the_others_and_a_rerun_runs_only_it(tmp_path):
    engine = SlowOnce(delay_s=4.0)
    cfg = make_config(tmp_path, server={"call_timeout_s": 1.0, "max_connection_age_grace_s": 600},
                      guard={"enabled": False}, director={"check_content": False})
    stack = await start_stack(cfg, engine=engine)
    src, out = tmp_path / "situations.jsonl", tmp_path / "out"
    rows = _situations(src)
    try:
        rc, stdout, stderr = await _run(stack.target("gateway"), src, out)
        assert rc == 1, stderr[-2000:]
        summary = json.loads((out / "summary.json").read_text())
        assert summary["conversations"] == 2 and summary["resumed"] == 0
        [failed] = summary["failed"]
        assert failed["index"] == 1 and failed["source_id"] == "sit-1" and failed["conversation_id"]
        assert failed["code"] in ("DEADLINE_EXCEEDED", "UNAVAILABLE")
        lines = [json.loads(x) for x in (out / "transcripts.jsonl").read_text().splitlines()]
        assert [ln["source_id"] for ln in lines] == ["sit-0", "sit-2"]
        assert [ln["situation_index"] for ln in lines] == [0, 2]
        assert "--concurrency" in stderr and "server.call_timeout_s" in stderr and "sit-1" in stderr
        assert "Traceback" not in stderr
        first_ids = {ln["source_id"]: ln["conversation_id"] for ln in lines}

        engine.slow = False
        starts = len(stack.store.inactive_conversations(cutoff=_far_future()))
        rc, stdout, stderr = await _run(stack.target("gateway"), src, out)
        assert rc == 0, stderr[-2000:]
        assert "resuming" in stderr and "2 finished conversation(s) kept, 1 to run" in stderr
        summary = json.loads((out / "summary.json").read_text())
        assert summary["conversations"] == 3 and summary["resumed"] == 2 and summary["failed"] == []
        lines = [json.loads(x) for x in (out / "transcripts.jsonl").read_text().splitlines()]
        assert [ln["source_id"] for ln in lines] == [r["id"] for r in rows]
        assert {ln["source_id"]: ln["conversation_id"] for ln in lines if ln["source_id"] != "sit-1"} == first_ids
        assert lines[1]["turns"][0]["text"].startswith("SLOWPOKE") and lines[1]["end_reason"] == "completed"
        # only the missing conversation was started again
        assert len(stack.store.inactive_conversations(cutoff=_far_future())) == starts + 1

        # a complete run is not resumed: the same command starts over (as `make demo` does each time)
        rc, _, stderr = await _run(stack.target("gateway"), src, out)
        assert rc == 0 and "resuming" not in stderr
        assert json.loads((out / "summary.json").read_text())["resumed"] == 0
    finally:
        await stack.stop(0)


async def test_a_run_killed_outright_resumes_from_its_journal(tmp_path):
    """SIGKILL while one conversation is still running: no transcripts.jsonl or summary.json, but the journal holds
    the two finished conversations, and the same command keeps them and runs only the third."""
    import signal

    from mascot.app.runjob import JOURNAL

    engine = SlowOnce(delay_s=120.0)
    cfg = make_config(tmp_path, server={"call_timeout_s": 300.0, "max_connection_age_grace_s": 600},
                      guard={"enabled": False}, director={"check_content": False})
    stack = await start_stack(cfg, engine=engine)
    src, out = tmp_path / "situations.jsonl", tmp_path / "out"
    _situations(src)
    env = {**os.environ, "COLUMNS": "200", "MASCOT_TLS": "", "MASCOT_CALLER_TOKEN": ""}
    try:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "mascot.cli", "run", "--target", stack.target("gateway"), "--situations", str(src),
            "--out", str(out), "--agent-turns", "1", "--concurrency", "3", stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL, env=env, cwd=ROOT)
        journal = out / JOURNAL
        for _ in range(600):
            if journal.exists() and len(journal.read_text().splitlines()) == 2:
                break
            await asyncio.sleep(0.1)
        proc.send_signal(signal.SIGKILL)
        await proc.wait()
        assert not (out / "transcripts.jsonl").exists() and not (out / "summary.json").exists()
        done = [json.loads(x) for x in journal.read_text().splitlines()]
        assert sorted(ln["source_id"] for ln in done) == ["sit-0", "sit-2"]
        with journal.open("a") as f:  # a line torn by the kill is skipped, not fatal
            f.write('{"source_id": "sit-1", "turns": [')

        engine.slow = False
        rc, _, stderr = await _run(stack.target("gateway"), src, out)
        assert rc == 0, stderr[-2000:]
        assert "2 finished conversation(s) kept, 1 to run" in stderr
        summary = json.loads((out / "summary.json").read_text())
        assert summary["conversations"] == 3 and summary["resumed"] == 2
        lines = [json.loads(x) for x in (out / "transcripts.jsonl").read_text().splitlines()]
        assert [ln["source_id"] for ln in lines] == ["sit-0", "sit-1", "sit-2"]
        assert {ln["conversation_id"] for ln in lines if ln["source_id"] != "sit-1"} == {
            ln["conversation_id"] for ln in done}
        assert not journal.exists()  # a finished run leaves no journal
    finally:
        await stack.stop(0)


def _far_future():
    from datetime import datetime, timedelta, timezone

    return datetime.now(timezone.utc) + timedelta(days=1)
