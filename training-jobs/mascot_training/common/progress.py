"""Progress of a training stage that a person can follow: steps done, seconds per step, ETA, and curves.

On a terminal a stage shows a live bar (rich) with its ETA; otherwise (a Kubernetes Job's log, a file) it writes one
line per step, e.g. ``persona_grpo anchor: step 3/30 (10%) 4.1 s/step, ETA 1m51s, reward 0.412, loss 0.0123``.
The lines go to the sink a pipeline installs with :func:`reporting` (the ``mascot train`` console); without one they
go to this module's logger. Trainer stages feed it through :func:`trainer_progress` (a ``transformers``
``TrainerCallback``) and plot their logged curves with :func:`write_curves`.
"""

from __future__ import annotations

import contextlib
import logging
import math
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from mascot.core.files import write_jsonl

log = logging.getLogger(__name__)

#: The sink and live choice of :func:`reporting`: process-wide, as stages run in worker threads and in an event loop
#: of their own thread (one pipeline runs at a time in a process).
_REPORTING: dict[str, Any] = {"sink": None, "live": None}

#: Logged values shown on step lines and plotted by :func:`write_curves`, in this order (the first present win the
#: line; every present one is plotted).
CURVE_KEYS = ("reward", "reward_std", "loss", "accuracy", "eval_accuracy", "eval_loss", "mean_token_accuracy",
              "kl", "learning_rate")


@contextlib.contextmanager
def reporting(sink: Callable[[str], None], live: bool | None = None) -> Iterator[None]:
    """Send progress lines of the stages run inside the block to ``sink``, from any thread of the process.
    ``live``: True draws a live bar on the terminal, False writes lines, None decides by whether stderr is a
    terminal. The previous setting is restored on exit."""
    before = dict(_REPORTING)
    _REPORTING.update(sink=sink, live=live)
    try:
        yield
    finally:
        _REPORTING.update(before)


def report(text: str) -> None:
    """Write one line (a stage's result, e.g. a persona's reward before and after) where progress lines go: the
    sink of :func:`reporting`, else this module's logger (INFO)."""
    (_REPORTING["sink"] or log.info)(text)


def fmt_value(v: Any) -> str:
    """A logged value as a person reads it: floats to 3 significant digits (``1.4699`` -> ``1.47``), None as
    ``-``, anything else as ``str``."""
    return "-" if v is None else _fmt(float(v)) if isinstance(v, (int, float)) and not isinstance(v, bool) else str(v)


def stage_started(stage: str) -> str:
    """``"stage <stage>: starting at HH:MM:SS"`` (local time): the line a pipeline writes before a stage."""
    return f"stage {stage}: starting at {time.strftime('%H:%M:%S')}"


def stage_finished(stage: str, timings_before: Any, manifest: dict | None) -> str:
    """The line a pipeline writes after a stage: ``"stage X: up to date, skipped"`` when the manifest's ``timings``
    are the ones it had before the stage ran (resumed), ``"stage X: disabled"`` without a manifest, else
    ``"stage X: done at HH:MM:SS, 3m01s"`` (the stage's own ``timings.seconds``)."""
    if manifest is None:
        return f"stage {stage}: disabled"
    after = manifest.get("timings")
    if timings_before is not None and after == timings_before:
        return f"stage {stage}: up to date, skipped"
    return f"stage {stage}: done at {time.strftime('%H:%M:%S')}, {format_duration((after or {}).get('seconds', 0))}"


def format_duration(seconds: float) -> str:
    """``75.2`` -> ``"1m15s"``, ``3720`` -> ``"1h02m"``, ``8.4`` -> ``"8s"``; ``"?"`` for a non-finite value."""
    if not math.isfinite(seconds):
        return "?"
    s = int(round(max(seconds, 0.0)))
    if s >= 3600:
        return f"{s // 3600}h{(s % 3600) // 60:02d}m"
    if s >= 60:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s}s"


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) >= 1e-3 or v == 0 else f"{v:.2e}"
    return str(v)


class StepProgress:
    """Steps of one stage (or of one persona inside a stage) with the mean seconds per step and the ETA.

    ETA = mean seconds per step so far x steps left (the first step, which loads models, counts too, so early
    ETAs run high). ``total`` may be set later (:meth:`set_total`) when a trainer learns its step count.

    Args:
        label: What runs, e.g. ``"persona_grpo anchor"``.
        total: Steps expected (>= 0; 0 = unknown yet).
        unit: What a step is on the line (``"step"``, ``"group"``, ...).
        sink: Where lines go; default: the sink of :func:`reporting`, else this module's logger (INFO).
        live: Live terminal bar instead of lines; default: :func:`reporting`'s choice, else whether stderr is a tty.
        clock: Seconds (injected by tests).
    """

    def __init__(self, label: str, total: int = 0, *, unit: str = "step", sink: Callable[[str], None] | None = None,
                 live: bool | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.label, self.total, self.unit, self.clock = label, max(int(total), 0), unit, clock
        self.sink = sink or _REPORTING["sink"] or log.info
        chosen = live if live is not None else _REPORTING["live"]
        self.live = sys.stderr.isatty() if chosen is None else chosen
        self.done = 0
        self.t0 = clock()
        self.t_last = self.t0  # when the last step ended
        self.last_s = 0.0  # how long the last step (or batch of ``n``) took
        self.lines: list[str] = []
        self._bar: Any = None
        self._task: Any = None
        if self.live:
            from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn,
                                       TimeRemainingColumn)

            self._bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(),
                                 TextColumn("{task.fields[values]}"), transient=False)
            self._bar.start()
            self._task = self._bar.add_task(label, total=self.total or None, values="")

    def set_total(self, total: int) -> None:
        """Set the number of steps expected (a trainer's ``max_steps``)."""
        self.total = max(int(total), 0)
        if self._bar is not None:
            self._bar.update(self._task, total=self.total or None)

    def eta_s(self) -> float:
        """Seconds left by the mean step time so far; ``nan`` before the first step or without a total."""
        if not self.done or not self.total:
            return math.nan
        return (self.clock() - self.t0) / self.done * max(self.total - self.done, 0)

    def line(self, values: dict[str, Any] | None = None) -> str:
        """The progress line of the current state (what :meth:`step` writes)."""
        elapsed = self.clock() - self.t0
        of = f"/{self.total} ({100 * self.done / self.total:.0f}%)" if self.total else ""
        per = f" {elapsed / self.done:.1f} s/{self.unit} (last {self.last_s:.1f} s)" if self.done else ""
        eta = f", ETA {format_duration(self.eta_s())}" if self.total and self.done else ""
        shown = [(k, v) for k, v in (values or {}).items() if v is not None]
        extra = "".join(f", {k} {_fmt(v)}" for k, v in shown)
        return f"{self.label}: {self.unit} {self.done}{of}{per}{eta}{extra}"

    def step(self, n: int = 1, **values: Any) -> None:
        """Count ``n`` steps done and report them with ``values`` (e.g. ``reward=0.41``). The line gives the mean
        seconds per step so far (which the ETA uses) and the seconds of this step (for ``n`` > 1, of the ``n``)."""
        now = self.clock()
        self.last_s, self.t_last = now - self.t_last, now
        self.done += n
        text = self.line(values)
        self.lines.append(text)
        if self._bar is not None:
            self._bar.update(self._task, completed=self.done,
                             values=" ".join(f"{k} {_fmt(v)}" for k, v in values.items() if v is not None))
        else:
            self.sink(text)

    def close(self) -> None:
        """End the live bar (lines need nothing); writes the total time as a last line."""
        if self._bar is not None:
            self._bar.stop()
            self._bar = None
        units = self.unit + ("es" if self.unit.endswith(("s", "x")) else "s")  # steps, groups, prefixes
        self.sink(f"{self.label}: {self.done} {units} in {format_duration(self.clock() - self.t0)}")


def trainer_progress(label: str, **kwargs: Any) -> Any:
    """A ``transformers.TrainerCallback`` that reports each optimiser step of a trainer through a
    :class:`StepProgress` (total = the trainer's ``max_steps``), with the last logged values of
    :data:`CURVE_KEYS`. Needs ``logging_steps=1`` for a value on every line. ``kwargs`` go to StepProgress."""
    from transformers import TrainerCallback

    class _Progress(TrainerCallback):
        def __init__(self) -> None:
            self.progress: StepProgress | None = None
            self.values: dict[str, Any] = {}

        def on_train_begin(self, args, state, control, **kw):
            self.progress = StepProgress(label, state.max_steps, **kwargs)

        def on_log(self, args, state, control, logs=None, **kw):
            # A trainer logs a step after its on_step_end, so the line is written here, with that step's values.
            for k in CURVE_KEYS[:4]:
                if isinstance((logs or {}).get(k), (int, float)):
                    self.values[k] = logs[k]
            self._catch_up(state)

        def on_train_end(self, args, state, control, **kw):
            self._catch_up(state)
            if self.progress is not None:
                self.progress.close()

        def _catch_up(self, state) -> None:
            if self.progress is not None and state.global_step > self.progress.done:
                self.progress.step(state.global_step - self.progress.done, **self.values)

    return _Progress()


def write_curves(history: Sequence[dict], path: str | Path, title: str) -> list[str]:
    """Plot the logged curves of a trainer (``trainer.state.log_history``: one dict per log with ``step``) as a PNG,
    one panel per key of :data:`CURVE_KEYS` present with a finite value, and write the history beside it as
    ``<path stem>.jsonl``. Returns the keys plotted (empty: nothing was logged, and no file is written).

    Raises:
        OSError: the directory cannot be written.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series: dict[str, list[tuple[float, float]]] = {}
    for e in history:
        for k in CURVE_KEYS:
            v = e.get(k)
            if isinstance(v, (int, float)) and math.isfinite(v) and "step" in e:
                series.setdefault(k, []).append((e["step"], float(v)))
    keys = [k for k in CURVE_KEYS if k in series]
    if not keys:
        return []
    path = Path(path)
    fig, axes = plt.subplots(len(keys), 1, figsize=(6, 2.2 * len(keys)), sharex=True, squeeze=False)
    for ax, k in zip(axes[:, 0], keys):
        xs, ys = zip(*series[k])
        ax.plot(xs, ys, marker="o", markersize=3)
        ax.set_ylabel(k)
        ax.grid(alpha=0.3)
    axes[-1, 0].set_xlabel("step")
    axes[0, 0].set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    write_jsonl(path.with_suffix(".jsonl"), history, default=str)
    return keys
