"""Faults: the judge service is SIGKILLed while ``mascot train judge`` (``judge.target``) and
``mascot eval --judge-target`` use it. Both resume (by riding the outage out with retries, or on a rerun) and count
nothing twice; a judge that never answers stops them with one clear line and nothing half written; a bad address
is a configuration error (exit 2).

Real parts only: the tiny model, a real JudgeService in a ``mascot serve --component judge`` subprocess (restarted
on the same port, its judgement cache in a SQLite file), the real CLIs. Requests are counted from the judge
service's own access log (one ``rpc judge.JudgeCandidates code=...`` line per RPC).
"""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest
import yaml

from mascot.core.files import read_jsonl
from tests.helpers.net import free_port
from tests.helpers.paths import ROOT

pytestmark = pytest.mark.integration
SMOKE = ROOT / "training-jobs" / "configs" / "persona_alignment_smoke.yaml"
ANSWERED = "rpc judge.JudgeCandidates code=OK"


def base_env(tiny_model_dir: Path) -> dict:
    # rules-only safety gate: the tiny model's simulated-user text is noise to the crisis detector
    return {**os.environ, "MASCOT_ENGINE__MODEL": str(tiny_model_dir), "MASCOT_ENGINE__THREADS": "1",
            "MASCOT_SERVER__METRICS_PORT": "0", "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(ROOT),
            "MASCOT_SAFETY__CLASSIFIER": "none"}


class JudgeProcess:
    """``mascot serve --component judge --port PORT`` in a subprocess; each start logs to its own file."""

    def __init__(self, tiny_model_dir: Path, port: int, workdir: Path) -> None:
        self.port, self.workdir, self.starts = port, workdir, 0
        self.env = {**base_env(tiny_model_dir), "MASCOT_JUDGE__CACHE_URL": f"sqlite:///{workdir / 'judge-cache.db'}"}
        self.proc: subprocess.Popen | None = None
        self.log: Path | None = None

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 180) -> None:
        self.launch()
        self.wait_ready(timeout_s)

    def launch(self) -> None:
        """Start the process (it needs seconds of imports and model loading before it can answer)."""
        self.starts += 1
        self.log = self.workdir / f"judge-{self.starts}.log"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "mascot.cli", "serve", "--component", "judge", "--port", str(self.port)],
            cwd=self.workdir, env=self.env, stdout=subprocess.PIPE, stderr=open(self.log, "ab"))

    def wait_ready(self, timeout_s: float = 180) -> None:
        """Until the process prints its ready line."""
        deadline = time.monotonic() + timeout_s
        while True:  # the ready line: {"judge": PORT}
            ready, _, _ = select.select([self.proc.stdout], [], [], max(0.0, deadline - time.monotonic()))
            assert ready, f"the judge did not start in {timeout_s} s: {self.log.read_text()[-2000:]}"
            line = self.proc.stdout.readline()
            assert line, f"the judge exited before it was ready: {self.log.read_text()[-2000:]}"
            if line.startswith(b"{"):
                assert json.loads(line) == {"judge": self.port}
                return

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def answered(self) -> int:
        """JudgeCandidates calls this start answered (its access log)."""
        return self.log.read_text(errors="replace").count(ANSWERED)


def wait_until(cond, proc: subprocess.Popen, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert proc.poll() is None, f"exited (rc {proc.returncode}) before {what}: {proc.stdout.read()[-3000:]}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def complete_records(path: Path) -> list[dict]:
    """The complete JSON lines of ``path`` now, read-only (:func:`read_jsonl` would cut a line being written)."""
    raw = path.read_bytes() if path.is_file() else b""
    return [json.loads(x) for x in raw[:raw.rfind(b"\n") + 1].splitlines() if x.strip()]


def one_line(text: str) -> str:
    """``text`` with rich's wrapping undone (the training CLI's console wraps at the terminal width)."""
    return " ".join(text.split())


# --- training: ``mascot train judge`` with judge.target -------------------------------------------------------------

@pytest.fixture(scope="module")
def sampled(tiny_model_dir, shared_data, tmp_path_factory) -> tuple[Path, dict]:
    """The smoke config made small (no SFT, 3 situations, one persona, K 2) and its real ``sample`` stage, run once.

    Returns ``(run dir with sample/, config dict)``; tests copy the run dir.
    """
    from mascot_training.persona.config import PersonaAlignmentConfig
    from mascot_training.persona.pipeline import run

    raw = yaml.safe_load(SMOKE.read_text())
    raw.update(model=str(tiny_model_dir), personas=["anchor"])
    raw["data"].update(situations=str(shared_data / "empathetic_dialogues" / "test_situations.jsonl"), limit=3)
    raw["sft"]["enabled"] = False
    raw["sft_data"]["enabled"] = False
    raw["sample"].update(k=2, max_tokens=16)
    out = tmp_path_factory.mktemp("sampled") / "run"
    run(PersonaAlignmentConfig(**raw), out, ("sample",), log=lambda m: None)
    assert len(read_jsonl(out / "sample" / "candidates.jsonl")) == 3
    return out, raw


def train_judge(cfg: dict, out: Path, tmp: Path, env: dict, name: str) -> subprocess.Popen:
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return subprocess.Popen([sys.executable, "-m", "mascot.cli", "train", "judge", "--config", str(path),
                             "--out", str(out)], cwd=tmp, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)


def test_train_judge_stage_resumes_after_the_judge_is_killed(sampled, tiny_model_dir, tmp_path):
    src, raw = sampled
    groups = [g["group_id"] for g in read_jsonl(src / "sample" / "candidates.jsonl")]
    judge = JudgeProcess(tiny_model_dir, free_port(), tmp_path)
    env = base_env(tiny_model_dir)
    # A short budget, so the stage fails while the judge is down and the rerun path is exercised (the eval test
    # below rides an outage out within its budget instead).
    cfg = {**raw, "judge": {**raw["judge"], "target": judge.target, "retry_budget_s": 3.0}}
    out = tmp_path / "run"
    shutil.copytree(src, out)
    progress = out / "judge.partial" / "progress.jsonl"
    p: subprocess.Popen | None = None
    try:
        judge.start()
        p = train_judge(cfg, out, tmp_path, env, "faulted")
        wait_until(lambda: len(complete_records(progress)) >= 2, p, 300, "a group was recorded")
        judge.kill()  # mid-stage: at least one group recorded, at most one answered in flight
        log = p.communicate(timeout=120)[0]
        assert p.returncode == 1, log
        msg = one_line(log)
        assert f"the JudgeService at {judge.target} did not answer within judge.retry_budget_s = 3 s" in msg, log
        assert "rerunning the command resumes" in msg, log
        assert not (out / "judge").exists()  # nothing published under the final name
        recorded = [r["group_id"] for r in read_jsonl(progress)[1:]]
        assert recorded and len(recorded) == len(set(recorded)) and len(recorded) < len(groups)

        judge.start()  # back on the same port, same cache
        p = train_judge(cfg, out, tmp_path, env, "faulted")
        log = p.communicate(timeout=300)[0]
        assert p.returncode == 0, log
        # Only the groups not recorded were sent again (one call per group: one judge).
        assert judge.answered() == len(groups) - len(recorded)
        judged = read_jsonl(out / "judge" / "judgements.jsonl")
        assert [j["group_id"] for j in judged] == groups  # every group once, in order
        rows = read_jsonl(out / "judge" / "progress.jsonl")[1:]
        assert [r["group_id"] for r in rows] == recorded + [g for g in groups if g not in recorded]
        man = json.loads((out / "judge" / "manifest.json").read_text())["metrics"]
        assert man["groups"] == len(groups) and man["target"] == judge.target
        assert man["judge_calls"] == sum(r["judge_calls"] for r in rows)
        assert man["unparseable"] == sum(r["unparseable"] for r in rows)
        # Each group recorded before the kill keeps the calls counted then; the judge answered every candidate.
        assert all(r["judge_calls"] >= 1 for r in rows[:len(recorded)])

        # An uninterrupted run (same judge service) writes the same judgements.
        clean = tmp_path / "clean"
        shutil.copytree(src, clean)
        p = train_judge(cfg, clean, tmp_path, env, "clean")
        log = p.communicate(timeout=300)[0]
        assert p.returncode == 0, log
        assert (clean / "judge" / "judgements.jsonl").read_bytes() == (out / "judge" / "judgements.jsonl").read_bytes()
        assert json.loads((clean / "judge" / "manifest.json").read_text())["metrics"]["judgements_digest"] == \
            man["judgements_digest"]

        # Any other status fails at once with it (an unknown judge name: INVALID_ARGUMENT, asked once).
        other = tmp_path / "other"
        shutil.copytree(src, other)
        p = train_judge({**cfg, "judge": {**cfg["judge"], "judges": [{"name": "nosuch"}]}}, other, tmp_path, env,
                        "other")
        log = p.communicate(timeout=300)[0]
        assert p.returncode == 1, log
        assert f"the JudgeService at {judge.target} refused a request: INVALID_ARGUMENT: unknown judge 'nosuch'" \
            in one_line(log), log
        assert judge.log.read_text().count("code=INVALID_ARGUMENT") == 1 and not (other / "judge").exists()
    finally:
        if p is not None and p.poll() is None:  # a failed assertion left it running
            p.kill()
            p.wait()
        judge.stop()


def test_train_judge_stage_budget_exhausted_and_bad_target(sampled, tiny_model_dir, tmp_path):
    src, raw = sampled
    env = base_env(tiny_model_dir)
    out = tmp_path / "run"
    shutil.copytree(src, out)
    dead = f"127.0.0.1:{free_port()}"  # nothing listens there
    cfg = {**raw, "judge": {**raw["judge"], "target": dead, "retry_budget_s": 0.5}}
    p = train_judge(cfg, out, tmp_path, env, "dead")
    log = p.communicate(timeout=180)[0]
    assert p.returncode == 1, log
    assert f"the JudgeService at {dead} did not answer within judge.retry_budget_s = 0.5 s" in one_line(log), log
    assert "0 of 3 groups are recorded, so rerunning the command resumes" in one_line(log), log
    assert "Traceback" not in log
    assert not (out / "judge").exists() and not (out / "judge.partial" / "judgements.jsonl").exists()
    assert read_jsonl(out / "judge.partial" / "progress.jsonl")[1:] == []

    for bad in ("nope", "127.0.0.1:0", "http://127.0.0.1:50063"):
        cfg = {**raw, "judge": {**raw["judge"], "target": bad}}
        p = train_judge(cfg, tmp_path / "bad", tmp_path, env, "bad")
        log = p.communicate(timeout=120)[0]
        assert p.returncode == 2, log
        assert "judge.target" in one_line(log) and "HOST:PORT" in one_line(log), log
        assert not (tmp_path / "bad").exists()


# --- evaluation: ``mascot eval --judge-target`` ---------------------------------------------------------------------

def eval_args(shared_data: Path) -> list[str]:
    return ["--situations", str(shared_data / "empathetic_dialogues" / "test_situations.jsonl"), "--limit", "1",
            "--systems", "mascot,zero-shot", "--agent-turns", "2", "--concurrency", "1", "--seed", "3"]


def run_eval(args: list[str], cwd: Path, env: dict) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "mascot.cli", "eval", *args], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


@pytest.fixture(scope="module")
def dialogues_judge_down(tiny_model_dir, shared_data, tmp_path_factory) -> tuple[Path, str, int, str]:
    """``mascot eval --judge-target`` at an address where nothing listens, with a 0.5 s retry budget: the dialogues
    are generated and kept, judging stops. Returns ``(out dir, output, exit code, dead target)``."""
    tmp = tmp_path_factory.mktemp("eval-down")
    dead = f"127.0.0.1:{free_port()}"
    p = run_eval([*eval_args(shared_data), "--out", str(tmp / "out"), "--judge-target", dead,
                  "--judge-retry-budget", "0.5"], tmp, base_env(tiny_model_dir))
    log = p.communicate(timeout=600)[0]
    return tmp / "out", log, p.returncode, dead


def test_eval_budget_exhausted_stops_cleanly(dialogues_judge_down):
    out, log, rc, dead = dialogues_judge_down
    assert rc == 1, log
    lines = [x for x in log.splitlines() if "judging stopped" in x]
    assert len(lines) == 1, log  # one line, not wrapped
    assert f"the judge service at {dead} did not answer within the retry budget of 0.5 s" in lines[0]
    assert "rerunning the same command resumes" in lines[0] and "Traceback" not in log
    assert not (out / "report.json").exists() and not (out / "report.md").exists()
    assert read_jsonl(out / "judge-results.jsonl") == []
    assert len(read_jsonl(out / "dialogues.jsonl")) == 2  # kept for the rerun


def test_eval_bad_judge_target_is_refused(tiny_model_dir, shared_data, tmp_path):
    env = base_env(tiny_model_dir)
    for extra, words in [(["--judge-target", "judge"], "--judge-target 'judge' is not HOST:PORT"),
                         (["--judge-target", "127.0.0.1:99999"], "port 99999 is out of range"),
                         (["--judge-target", "127.0.0.1:50063", "--judges", "openai:gpt-4o@https://x/v1"],
                          "--judges lists names of judges configured on that JudgeService")]:
        p = run_eval([*eval_args(shared_data), "--out", str(tmp_path / "o"), *extra], tmp_path, env)
        log = p.communicate(timeout=120)[0]
        assert p.returncode == 2, log
        assert words in log, log
        assert not (tmp_path / "o").exists()


def test_eval_rides_out_a_killed_judge_and_counts_nothing_twice(dialogues_judge_down, tiny_model_dir, shared_data,
                                                              tmp_path):
    src, _, _, _ = dialogues_judge_down
    env = base_env(tiny_model_dir)
    judge = JudgeProcess(tiny_model_dir, free_port(), tmp_path)
    out, clean = tmp_path / "out", tmp_path / "clean"
    shutil.copytree(src, out)  # the dialogues are done; a rerun goes straight to judging
    shutil.copytree(src, clean)
    results = out / "judge-results.jsonl"
    args = eval_args(shared_data)
    p: subprocess.Popen | None = None
    try:
        judge.start()
        p = run_eval([*args, "--out", str(out), "--judge-target", judge.target], tmp_path, env)
        wait_until(lambda: len(complete_records(results)) >= 2, p, 300, "two judge answers were recorded")
        judge.kill()  # mid-judging; the eval retries within its budget (300 s) meanwhile
        judge.launch()  # same port, same cache
        recorded = {r["key"] for r in complete_records(results)}  # answered by the killed judge (the new one loads)
        judge.wait_ready()
        log = p.communicate(timeout=600)[0]
        if p.returncode != 0:  # the budget ran out after all: a rerun resumes
            assert "rerunning the same command resumes" in log, log
            recorded = {r["key"] for r in read_jsonl(results)}
            p = run_eval([*args, "--out", str(out), "--judge-target", judge.target], tmp_path, env)
            log = p.communicate(timeout=600)[0]
        assert p.returncode == 0, log
        rows = read_jsonl(results)
        keys = [r["key"] for r in rows]
        assert len(keys) == len(set(keys))  # every item answered and recorded once
        assert 2 <= len(recorded) < len(keys)  # the kill came mid-judging
        # The restarted judge was asked only what had not been answered before the kill.
        assert judge.answered() == len(keys) - len(recorded)

        # An uninterrupted judging of the same dialogues (same seed) gives the same report.
        p = run_eval([*args, "--out", str(clean), "--judge-target", judge.target], tmp_path, env)
        log = p.communicate(timeout=600)[0]
        assert p.returncode == 0, log
        assert {r["key"] for r in read_jsonl(clean / "judge-results.jsonl")} == set(keys)
        resumed, expected = (json.loads((d / "report.json").read_text()) for d in (out, clean))
        assert resumed == expected
        assert sum(v["all"]["unparseable"] for v in resumed["systems"].values()) == sum(
            j["status"] != "ok" for r in rows for j in r["judgements"])

        # Any other status stops the run at once with it (an unknown judge name: INVALID_ARGUMENT, asked once).
        other = tmp_path / "other"
        shutil.copytree(src, other)
        p = run_eval([*args, "--out", str(other), "--judge-target", judge.target, "--judges", "nosuch"], tmp_path, env)
        log = p.communicate(timeout=600)[0]
        assert p.returncode == 1, log
        assert f"the judge service at {judge.target} refused a request: INVALID_ARGUMENT: unknown judge 'nosuch'" \
            in log, log
        assert judge.log.read_text().count("code=INVALID_ARGUMENT") == 1 and not (other / "report.json").exists()
    finally:
        if p is not None and p.poll() is None:  # a failed assertion left it running
            p.kill()
            p.wait()
        judge.stop()


# --- the retry helper ------------------------------------------------------------------------------------------------

async def test_call_with_retry_backs_off_within_the_budget_and_raises_the_rest():
    from grpc.aio import AioRpcError, Metadata

    from mascot.core.retry import RetryBudgetExhausted, RetryPolicy, call_with_retry

    now, waits = [0.0], []

    async def sleep(s: float) -> None:
        waits.append(s)
        now[0] += s

    def failing(code, n_fail, trailing=()):
        calls = []

        async def call(timeout_s: float) -> str:
            calls.append(timeout_s)
            if len(calls) <= n_fail:
                raise AioRpcError(code, Metadata(), Metadata(*trailing), "down")
            return "ok"
        return call, calls

    policy = RetryPolicy(call_timeout_s=7.0, budget_s=10.0, initial_backoff_s=0.5, max_backoff_s=2.0)
    call, calls = failing(grpc.StatusCode.UNAVAILABLE, 3)
    assert await call_with_retry(call, "h:1", policy, sleep=sleep, clock=lambda: now[0]) == "ok"
    assert calls == [7.0] * 4 and len(waits) == 3 and all(w <= 2.0 for w in waits) and waits[2] >= 1.0

    now[0], waits[:] = 0.0, []
    call, calls = failing(grpc.StatusCode.DEADLINE_EXCEEDED, 1000)
    with pytest.raises(RetryBudgetExhausted, match=r"h:1 did not answer within the retry budget of 10 s") as e:
        await call_with_retry(call, "h:1", policy, sleep=sleep, clock=lambda: now[0])
    assert e.value.code == grpc.StatusCode.DEADLINE_EXCEEDED and now[0] <= 10.0 and e.value.attempts == len(calls)

    for code in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.INTERNAL):
        call, calls = failing(code, 1)
        with pytest.raises(AioRpcError):
            await call_with_retry(call, "h:1", policy, sleep=sleep, clock=lambda: now[0])
        assert len(calls) == 1  # never retried
    now[0], waits[:] = 0.0, []
    call, calls = failing(grpc.StatusCode.RESOURCE_EXHAUSTED, 1, (("retry-after", "3"),))  # marked as overload
    assert await call_with_retry(call, "h:1", policy, sleep=sleep, clock=lambda: now[0]) == "ok"
    assert waits == [3.0]
