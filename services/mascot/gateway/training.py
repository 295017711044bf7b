"""TrainingService: trigger and follow retraining runs (Kubernetes Jobs) from the control plane.

The servicer translates proto <-> :mod:`mascot.gateway.jobs` and checks the caller's role with the same guard as
AdapterService (:class:`mascot.gateway.audit.ControlGuard`: viewer reads runs, operator starts and cancels them; both
changes are recorded in the audit trail). Kubernetes calls are synchronous and run in
threads; their failures are UNAVAILABLE with the API's reason.

``mascot_training_runs_total{phase, result}`` counts each run once, when the gateway first sees it finished
(:class:`FinishedRuns`): ``result`` is ``succeeded``, ``failed`` or ``cancelled``. Runs are seen by every
TriggerRetraining, GetRun, ListRuns and CancelRun answer and by a background poll of the Jobs every
``training.poll_s`` seconds (:func:`watch_runs`), so a run nobody asks about is counted too. Runs that finished before
the gateway started are not counted (the counter restarts at 0 with the process; counting them again would show
phantom increases), and a run the poll saw unfinished whose Job then disappears without CancelRun (``kubectl
delete``) counts as ``cancelled``. The count lives in one gateway process: with several replicas, sum over them.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from collections import OrderedDict
from dataclasses import replace
from typing import Any

from google.protobuf.timestamp_pb2 import Timestamp

from mascot.api.training.v1 import training_pb2 as pb
from mascot.api.training.v1 import training_pb2_grpc as pb_grpc
from mascot.gateway import jobs
from mascot.core.enums import enum_names, enum_value
from mascot.core.errors import InvalidArgument
from mascot.gateway.audit import ControlGuard

log = logging.getLogger(__name__)

PHASE_VALUES = {n: enum_value(pb.TrainingPhase, n, sep="-") for n in enum_names(pb.TrainingPhase, sep="-")}
PHASE_NAMES = {v: k for k, v in PHASE_VALUES.items()}
STATE_VALUES = {n: enum_value(pb.RunState, n) for n in enum_names(pb.RunState)}
MAX_LIST = 1000
_SEEN_KEPT = 10000


def _ts(t: dt.datetime | None) -> Timestamp | None:
    if t is None:
        return None
    out = Timestamp()
    out.FromDatetime(t.astimezone(dt.timezone.utc))
    return out


def run_to_proto(run: jobs.RunStatus) -> pb.TrainingRun:
    """A :class:`~mascot.gateway.jobs.RunStatus` as :class:`TrainingRun` (unknown times stay unset)."""
    return pb.TrainingRun(run_id=run.run_id, phase=PHASE_VALUES.get(run.phase, pb.TRAINING_PHASE_UNSPECIFIED),
                          state=STATE_VALUES.get(run.state, pb.RUN_STATE_UNSPECIFIED), job_name=run.job_name,
                          namespace=run.namespace, create_time=_ts(run.create_time), start_time=_ts(run.start_time),
                          finish_time=_ts(run.finish_time), message=run.message, active_pods=run.active_pods,
                          failed_pods=run.failed_pods)


class FinishedRuns:
    """Counts each finished run once in ``mascot_training_runs_total{phase, result}``.

    Args:
        metrics: :class:`~mascot.core.metrics.Metrics` holding ``training_runs``.
        since: Runs that finished before this time (the gateway's start) are marked seen without being counted;
            runs whose finish time is unknown are counted.
    """

    def __init__(self, metrics: Any, since: dt.datetime) -> None:
        self.metrics, self.since = metrics, since
        self._seen: OrderedDict[tuple, None] = OrderedDict()
        self._active: dict[tuple, jobs.RunStatus] = {}

    def observe(self, run: jobs.RunStatus) -> None:
        """Record one observation of ``run``; count it if it is finished and was not counted before."""
        if not run.finished:
            self._active[run.key] = run
            return
        self._active.pop(run.key, None)
        if run.key in self._seen:
            return
        self._seen[run.key] = None
        while len(self._seen) > _SEEN_KEPT:
            self._seen.popitem(last=False)
        if run.finish_time is None or run.finish_time >= self.since:
            self.metrics.training_runs.labels(run.phase or "unknown", run.state).inc()

    def observe_all(self, runs: list[jobs.RunStatus]) -> None:
        """Record a complete listing: like :meth:`observe` for each run, and runs seen unfinished before that are
        gone now (deleted without CancelRun) count as ``cancelled``."""
        for r in runs:
            self.observe(r)
        present = {r.key for r in runs}
        for key, r in list(self._active.items()):
            if key not in present:
                self.observe(replace(r, state="cancelled", finish_time=None))


class TrainingServicer(pb_grpc.TrainingServiceServicer):
    """Serves TrainingService on a :class:`~mascot.gateway.jobs.JobManager`.

    Args:
        manager: The Job manager (its blocking calls run in threads).
        token: The :class:`~mascot.gateway.audit.ControlGuard`, or a single admin token ("" refuses every call).
        metrics: Metrics holding ``training_runs``.
        counter: The finished-run counter shared with :func:`watch_runs`; a new one (since now) by default.
    """


    def __init__(self, manager: jobs.JobManager, token: "ControlGuard | str", metrics: Any,
                 counter: FinishedRuns | None = None) -> None:
        self.manager, self.guard = manager, ControlGuard.of(token)
        self.counter = counter or FinishedRuns(metrics, manager.clock())

    @staticmethod
    def _phase(value: int, *, required: bool) -> str:
        if value == pb.TRAINING_PHASE_UNSPECIFIED and not required:
            return ""
        if value not in PHASE_NAMES:
            raise InvalidArgument(f"phase must be TRAINING_PHASE_PERSONA_ALIGNMENT or TRAINING_PHASE_COLLABORATIVE, "
                                  f"got {pb.TrainingPhase.Name(value) if value in pb.TrainingPhase.values() else value}"
                                  )
        return PHASE_NAMES[value]

    async def TriggerRetraining(self, request: pb.TriggerRetrainingRequest,
                                context: Any) -> pb.TriggerRetrainingResponse:
        async def trigger(_who: Any) -> pb.TriggerRetrainingResponse:
            phase = self._phase(request.phase, required=True)
            res = await asyncio.to_thread(self.manager.trigger, phase, request.run_id)
            self.counter.observe(res.run)
            return pb.TriggerRetrainingResponse(run=run_to_proto(res.run), already_existed=res.already_existed)

        name = PHASE_NAMES.get(request.phase, str(request.phase))
        return await self.guard.change(context, "TriggerRetraining", f"phase/{name}",
                                       {"run_id": request.run_id[:128]}, trigger)

    async def GetRun(self, request: pb.GetRunRequest, context: Any) -> pb.GetRunResponse:
        self.guard.read(context, "GetRun")
        run = await asyncio.to_thread(self.manager.get, request.run_id)
        self.counter.observe(run)
        return pb.GetRunResponse(run=run_to_proto(run))

    async def ListRuns(self, request: pb.ListRunsRequest, context: Any) -> pb.ListRunsResponse:
        self.guard.read(context, "ListRuns")
        phase = self._phase(request.phase, required=False)
        if not 0 <= request.limit <= MAX_LIST:
            raise InvalidArgument(f"limit must be in [0, {MAX_LIST}], got {request.limit}")
        runs = await asyncio.to_thread(self.manager.list, phase, request.limit or 50)
        for r in runs:
            self.counter.observe(r)
        return pb.ListRunsResponse(runs=[run_to_proto(r) for r in runs])

    async def CancelRun(self, request: pb.CancelRunRequest, context: Any) -> pb.CancelRunResponse:
        async def cancel(_who: Any) -> pb.CancelRunResponse:
            run, already = await asyncio.to_thread(self.manager.cancel, request.run_id)
            self.counter.observe(run)
            return pb.CancelRunResponse(run=run_to_proto(run), already_cancelled=already)

        return await self.guard.change(context, "CancelRun", f"run/{request.run_id[:128]}", {}, cancel)


async def watch_runs(manager: jobs.JobManager, counter: FinishedRuns, poll_s: float) -> None:
    """Every ``poll_s`` seconds list every run and feed :meth:`FinishedRuns.observe_all`, until cancelled; then close
    the manager's API client. ``poll_s`` 0 only waits for the cancel. API failures are logged (once per distinct
    message) and the poll goes on."""
    last_error = ""
    try:
        if poll_s <= 0:
            await asyncio.Event().wait()
        while True:
            try:
                runs = await asyncio.to_thread(manager.list, "", 0)
                counter.observe_all(runs)
                last_error = ""
            except Exception as e:  # noqa: BLE001 - keep polling through API trouble
                msg = getattr(e, "message", None) or str(e)
                if msg != last_error:
                    log.warning("training run poll failed: %s", msg)
                last_error = msg
            await asyncio.sleep(poll_s)
    finally:
        await asyncio.to_thread(manager.close)
