"""``mascot retrain``: trigger, follow, list and cancel retraining runs through the control plane's TrainingService
(each run is a Kubernetes Job, ``mascot.gateway.jobs``). The admin token comes from ``MASCOT_ADMIN_TOKEN`` (or
``--token-file``), never from a flag value, as for ``mascot adapters``.

``mascot retrain persona-alignment|collaborative [--run-id ID] [--wait]`` prints the run id on stdout (progress on
stderr); with ``--wait`` it polls GetRun until the run finishes and exits 0 when it succeeded, 1 when it failed or was
cancelled (2 for bad usage, 1 for an RPC error, as ``mascot adapters``).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
from pathlib import Path
from typing import Any, Awaitable, Callable, Optional

import typer
from rich.console import Console
from rich.table import Table

from mascot.api.training.v1 import training_pb2 as pb
from mascot.cli.common import (CONTROL_TARGET, TLS_CA, TLS_CERT, TLS_KEY, TOKEN_FILE, PhaseName, admin_session, console,
                               export_tls)
from mascot.core.enums import enum_name, enum_names, enum_value

retrain_app = typer.Typer(
    help="Retraining runs (TrainingService): persona-alignment | collaborative | status | list | cancel.",
    no_args_is_help=True, add_completion=False)
#: The training phases by their CLI names (``persona-alignment``, ``collaborative``: TrainingPhase, words joined by -).
PHASES = enum_names(pb.TrainingPhase, sep="-")
FINISHED = frozenset({pb.RUN_STATE_SUCCEEDED, pb.RUN_STATE_FAILED, pb.RUN_STATE_CANCELLED})


def _phase(number: int) -> str:
    return enum_name(pb.TrainingPhase, number, sep="-", default="?")


def _state(number: int) -> str:
    return enum_name(pb.RunState, number, default="?")


@retrain_app.callback()
def _options(tls_ca: Optional[Path] = TLS_CA, tls_cert: Optional[Path] = TLS_CERT,
             tls_key: Optional[Path] = TLS_KEY) -> None:
    """Retraining runs (TrainingService): persona-alignment | collaborative | status | list | cancel. TLS:
    ``mascot retrain --tls-ca CA ...`` or ``MASCOT_TLS_*`` (docs/security.md)."""
    export_tls(tls_ca, tls_cert, tls_key)


def _session(target: str, token_file: Optional[Path], body: Callable[[Any, tuple], Awaitable[Any]]) -> Any:
    """Run ``body(stub, metadata)`` on a TrainingService stub (:func:`mascot.cli.common.admin_session`)."""
    from mascot.api.training.v1 import training_pb2_grpc

    return admin_session(target, token_file, training_pb2_grpc.TrainingServiceStub, "TrainingService",
                         "start it with training.templates_dir set (docs/training.md)", body)


def _time(ts: Any, present: bool) -> str:
    return ts.ToDatetime(tzinfo=dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%SZ") if present else ""


def _describe(run: Any) -> str:
    return (f"run {run.run_id} ({_phase(run.phase)}, Job {run.namespace}/{run.job_name}): "
            f"{_state(run.state)}{' - ' + run.message if run.message else ''}")


def _table(runs: Any) -> None:
    t = Table("run id", "phase", "state", "created", "started", "finished", "job", "message")
    for r in runs:
        t.add_row(r.run_id, _phase(r.phase), _state(r.state),
                  _time(r.create_time, r.HasField("create_time")), _time(r.start_time, r.HasField("start_time")),
                  _time(r.finish_time, r.HasField("finish_time")), r.job_name, r.message[:60])
    Console().print(t)


def _json(msg: Any) -> None:
    from google.protobuf.json_format import MessageToDict

    print(json.dumps(MessageToDict(msg, preserving_proto_field_name=True), indent=2))


async def _wait(stub: Any, md: tuple, run: Any, poll_s: float) -> Any:
    """Poll GetRun every ``poll_s`` seconds until the run is finished; print each state change on stderr.
    UNAVAILABLE (the gateway or the Kubernetes API briefly down) is reported and polling goes on."""
    import grpc

    last = None
    while True:
        key = (run.state, run.message)
        if key != last:
            console.print(_describe(run))
            last = key
        if run.state in FINISHED:
            return run
        await asyncio.sleep(poll_s)
        try:
            run = (await stub.GetRun(pb.GetRunRequest(run_id=run.run_id), metadata=md, timeout=60)).run
        except grpc.aio.AioRpcError as e:
            if e.code() != grpc.StatusCode.UNAVAILABLE:
                raise
            console.print(f"[yellow]UNAVAILABLE (still waiting):[/yellow] {e.details()}")


def _trigger(phase: str, run_id: str, wait: bool, poll_s: float, target: str, token_file: Optional[Path]) -> None:
    if poll_s <= 0:
        console.print("[red]--poll-s must be > 0[/red]")
        raise typer.Exit(2)

    async def body(stub: Any, md: tuple) -> Any:
        req = pb.TriggerRetrainingRequest(phase=enum_value(pb.TrainingPhase, phase, sep="-"), run_id=run_id)
        r = await stub.TriggerRetraining(req, metadata=md, timeout=120)
        console.print(("already triggered: " if r.already_existed else "triggered: ") + _describe(r.run))
        print(r.run.run_id, flush=True)
        return await _wait(stub, md, r.run, poll_s) if wait else r.run

    run = _session(target, token_file, body)
    if wait:
        if run.state == pb.RUN_STATE_SUCCEEDED:
            console.print("its adapters are published as staged: promote them with `mascot adapters promote` after "
                          "checking them")
        raise typer.Exit(0 if run.state == pb.RUN_STATE_SUCCEEDED else 1)


def _phase_command(phase: str) -> None:
    def command(run_id: str = typer.Option("", "--run-id", help="Run id (DNS-1123 label); default: generated. "
                                                                "The same id again returns the same run."),
                wait: bool = typer.Option(False, "--wait", help="Wait until the run finishes; exit 0 if it "
                                                                "succeeded, 1 if it failed or was cancelled."),
                poll_s: float = typer.Option(10.0, "--poll-s", help="Seconds between status polls with --wait."),
                target: str = CONTROL_TARGET, token_file: Optional[Path] = TOKEN_FILE) -> None:
        _trigger(phase, run_id, wait, poll_s, target, token_file)

    command.__doc__ = (f"Trigger a {phase} run: a Kubernetes Job made from the chart's template (at most "
                       "training.max_active_runs unfinished per phase). Its adapters arrive staged.")
    retrain_app.command(phase)(command)


for _p in PHASES:
    _phase_command(_p)


@retrain_app.command("status")
def status(run_id: str = typer.Argument(..., help="The run id."), target: str = CONTROL_TARGET,
           token_file: Optional[Path] = TOKEN_FILE,
           as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a line.")) -> None:
    """Show a run's state (from its Job's status)."""
    async def body(stub: Any, md: tuple) -> Any:
        return await stub.GetRun(pb.GetRunRequest(run_id=run_id), metadata=md, timeout=60)

    r = _session(target, token_file, body)
    if as_json:
        _json(r.run)
    else:
        _table([r.run])


@retrain_app.command("list")
def list_(phase: Optional[PhaseName] = typer.Option(None, "--phase",
                                                  help="Only persona-alignment or collaborative runs."),
          limit: int = typer.Option(50, "--limit", min=1, max=1000, help="At most this many runs, newest first."),
          target: str = CONTROL_TARGET, token_file: Optional[Path] = TOKEN_FILE,
          as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table.")) -> None:
    """List the runs whose Jobs still exist, newest first."""

    async def body(stub: Any, md: tuple) -> Any:
        req = pb.ListRunsRequest(phase=enum_value(pb.TrainingPhase, phase or "", sep="-", default=0), limit=limit)
        return await stub.ListRuns(req, metadata=md, timeout=60)

    r = _session(target, token_file, body)
    if as_json:
        _json(r)
    else:
        _table(r.runs)


@retrain_app.command("cancel")
def cancel(run_id: str = typer.Argument(..., help="The run id."), target: str = CONTROL_TARGET,
           token_file: Optional[Path] = TOKEN_FILE) -> None:
    """Cancel a pending or running run (its Job and pods are deleted)."""
    async def body(stub: Any, md: tuple) -> Any:
        return await stub.CancelRun(pb.CancelRunRequest(run_id=run_id), metadata=md, timeout=60)

    r = _session(target, token_file, body)
    console.print(("already cancelled: " if r.already_cancelled else "cancelled: ") + _describe(r.run))
