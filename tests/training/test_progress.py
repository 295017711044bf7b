"""Stage progress: lines with the ETA from the mean step time, the process-wide sink, and the curves plot."""

from __future__ import annotations

import json
import math
import re
import threading

import pytest

from mascot_training.common.progress import (
    StepProgress,
    fmt_value,
    format_duration,
    report,
    reporting,
    stage_finished,
    stage_started,
    write_curves,
)


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


@pytest.mark.parametrize("seconds, text", [(8.4, "8s"), (59.6, "1m00s"), (75.2, "1m15s"), (3720, "1h02m"),
                                           (-3, "0s"), (math.nan, "?"), (math.inf, "?")])
def test_durations_read_as_a_person_writes_them(seconds, text):
    assert format_duration(seconds) == text


def test_eta_is_the_mean_step_time_times_the_steps_left():
    clock, lines = Clock(), []
    bar = StepProgress("persona_grpo anchor", 10, sink=lines.append, live=False, clock=clock)
    assert math.isnan(bar.eta_s())
    for _ in range(3):
        clock.t += 2.0
        bar.step(reward=0.41234, loss=0.0000123)
    assert bar.eta_s() == pytest.approx(14.0)
    assert lines[-1] == ("persona_grpo anchor: step 3/10 (30%) 2.0 s/step (last 2.0 s), ETA 14s, reward 0.412, "
                         "loss 1.23e-05")
    clock.t += 100.0  # a slow step pulls the mean up
    bar.step(reward=None)
    assert bar.eta_s() == pytest.approx(106.0 / 4 * 6)
    assert lines[-1] == "persona_grpo anchor: step 4/10 (40%) 26.5 s/step (last 100.0 s), ETA 2m39s"
    bar.close()
    assert lines[-1] == "persona_grpo anchor: 4 steps in 1m46s" and len(lines) == 5
    for unit, total in (("prefix", "2 prefixes"), ("group", "2 groups")):
        done: list[str] = []
        bar = StepProgress("x", 2, unit=unit, sink=done.append, live=False, clock=clock)
        bar.step()
        bar.step()
        bar.close()
        assert done[-1] == f"x: {total} in 0s"


def test_without_a_total_the_line_has_no_eta_until_one_is_set():
    clock, lines = Clock(), []
    bar = StepProgress("rollouts", sink=lines.append, live=False, clock=clock, unit="prefix")
    clock.t += 5
    bar.step()
    assert lines[-1] == "rollouts: prefix 1 5.0 s/prefix (last 5.0 s)" and math.isnan(bar.eta_s())
    bar.set_total(3)
    clock.t += 7
    bar.step(prefix="p-1")
    assert lines[-1] == "rollouts: prefix 2/3 (67%) 6.0 s/prefix (last 7.0 s), ETA 6s, prefix p-1"


def test_reporting_reaches_progress_made_in_other_threads_and_is_restored():
    got: list[str] = []

    def stage() -> None:
        bar = StepProgress("judge", 2, unit="group")
        bar.step()
        bar.step()

    with reporting(got.append, live=False):
        t = threading.Thread(target=stage)
        t.start()
        t.join()
    assert [x.split(" (")[0] for x in got] == ["judge: group 1/2", "judge: group 2/2"]
    outside: list[str] = []
    StepProgress("after", 1, sink=outside.append, live=False).step()
    assert len(got) == 2 and len(outside) == 1


def test_stage_lines_say_started_done_skipped_or_disabled():
    assert re.fullmatch(r"stage sample: starting at \d\d:\d\d:\d\d", stage_started("sample"))
    t = {"started": "2026-12-03T10:00:00Z", "seconds": 181.4}
    assert re.fullmatch(r"stage judge: done at \d\d:\d\d:\d\d, 3m01s", stage_finished("judge", None, {"timings": t}))
    assert re.fullmatch(r"stage judge: done at .*, 3m01s", stage_finished("judge", {"seconds": 5}, {"timings": t}))
    assert stage_finished("judge", dict(t), {"timings": t}) == "stage judge: up to date, skipped"
    assert stage_finished("sft", None, None) == "stage sft: disabled"


def test_values_read_as_a_person_writes_them():
    assert [fmt_value(v) for v in (1.4699773788452148, -0.00012, 0.0, 3, None, "x", True)] == [
        "1.47", "-1.20e-04", "0", "3", "-", "x", "True"]


def test_a_result_line_goes_where_progress_goes():
    got: list[str] = []
    with reporting(got.append, live=False):
        report("persona_grpo anchor: 6 steps, reward 0.1 -> 0.8")
    report("outside the block goes to the logger")
    assert got == ["persona_grpo anchor: 6 steps, reward 0.1 -> 0.8"]


def test_a_live_bar_writes_no_lines_until_it_closes():
    lines: list[str] = []
    bar = StepProgress("sft", 2, sink=lines.append, live=True)
    bar.step(loss=1.0)
    bar.step(loss=0.5)
    assert lines == [] and bar.done == 2
    bar.close()
    assert len(lines) == 1 and lines[0].startswith("sft: 2 steps in ")


def test_curves_plot_every_logged_key_and_keep_the_history(tmp_path):
    history = [{"step": 1, "loss": 0.9, "reward": 0.1, "reward_std": 0.3, "learning_rate": 1e-5},
               {"step": 2, "loss": 0.7, "reward": float("nan")},
               {"step": 3, "loss": 0.5, "reward": 0.4},
               {"train_runtime": 12.0, "step": 3}]
    keys = write_curves(history, tmp_path / "curves.png", "persona_grpo anchor")
    assert keys == ["reward", "reward_std", "loss", "learning_rate"]
    assert (tmp_path / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    kept = [json.loads(x) for x in (tmp_path / "curves.jsonl").read_text().splitlines()]
    assert kept[0] == history[0] and len(kept) == 4
    assert write_curves([{"step": 1, "train_runtime": 3.0}], tmp_path / "none.png", "x") == []
    assert not (tmp_path / "none.png").exists()
