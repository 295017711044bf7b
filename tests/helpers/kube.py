"""TrainingService against kmock (a stateful Kubernetes API emulator, no controllers): the admin token, a kubeconfig
for kmock, and a running gateway whose helpers play the Job controller."""

from __future__ import annotations

import asyncio
import datetime as dt
import json

import yaml

from mascot.api.training.v1 import training_pb2 as pb

#: The admin token the gateways are started with (``MASCOT_TEST_ADMIN``) and the call metadata that carries it.
TOKEN = "s3cret-training-token"
AUTH = (("authorization", f"Bearer {TOKEN}"),)
NS = "mascot"  # the chart renders its templates into the release namespace


def write_kubeconfig(path, server: str, namespace: str = "default"):
    """A kubeconfig at ``path`` (returned) for the API server at ``server`` with a bearer token, in ``namespace``."""
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "kmock",
        "clusters": [{"name": "kmock", "cluster": {"server": server}}],
        "users": [{"name": "tester", "user": {"token": "kube-token"}}],
        "contexts": [{"name": "kmock", "context": {"cluster": "kmock", "user": "tester", "namespace": namespace}}]}))
    return path


class Env:
    """A running gateway with TrainingService on kmock, a stub, and helpers playing the Job controller."""

    def __init__(self, stack, stub, batch, kmock):
        self.stack, self.stub, self.batch, self.kmock = stack, stub, batch, kmock

    async def trigger(self, run_id="", phase=pb.TRAINING_PHASE_PERSONA_ALIGNMENT):
        """TriggerRetraining as the admin; returns the response."""
        return await self.stub.TriggerRetraining(pb.TriggerRetrainingRequest(phase=phase, run_id=run_id),
                                                 metadata=AUTH)

    async def get(self, run_id):
        """GetRun as the admin; returns the run."""
        return (await self.stub.GetRun(pb.GetRunRequest(run_id=run_id), metadata=AUTH)).run

    async def set_status(self, job_name: str, state: str, namespace: str = NS):
        """Patch the Job's status as the Job controller would for ``state``."""
        now = dt.datetime.now(dt.timezone.utc).isoformat().replace("+00:00", "Z")
        status = {"pending": {"active": 1, "ready": 0},
                  "running": {"active": 1, "ready": 1, "startTime": now},
                  "succeeded": {"active": 0, "ready": 0, "succeeded": 1, "completionTime": now,
                                "conditions": [{"type": "SuccessCriteriaMet", "status": "True"},
                                               {"type": "Complete", "status": "True", "lastTransitionTime": now}]},
                  "failed": {"active": 0, "ready": 0, "failed": 4, "conditions": [
                      {"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded",
                       "message": "Job has reached the specified backoff limit", "lastTransitionTime": now}]}}[state]
        await asyncio.to_thread(self.batch.patch_namespaced_job_status, job_name, namespace, {"status": status})

    async def jobs(self, namespace: str = NS) -> list[dict]:
        """Every Job of ``namespace`` on kmock, as dicts."""
        r = await asyncio.to_thread(self.batch.list_namespaced_job, namespace, _preload_content=False)
        return json.loads(r.data)["items"]

    def runs_total(self, result: str, phase: str = "persona-alignment") -> float:
        """``mascot_training_runs_total{phase, result}`` of the gateway (0 when never counted)."""
        return self.stack.metrics.registry.get_sample_value(
            "mascot_training_runs_total", {"phase": phase, "result": result}) or 0.0
