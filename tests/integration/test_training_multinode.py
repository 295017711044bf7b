"""TrainingService with runs on several nodes, over real gRPC against kmock (see test_training_service.py for what
kmock does and does not emulate; the ``envs`` and ``kube`` fixtures: tests/integration/conftest.py): the chart's
Indexed Job template gets its headless rendezvous Service with each run, owned by the Job, removed on cancel, and a
run whose Service cannot be made is not left behind; the chart's PyTorchJob template is created, followed and
cancelled as a kubeflow.org/v1 custom resource."""

from __future__ import annotations

import asyncio
import json

import grpc
import pytest
import yaml

from mascot.api.training.v1 import training_pb2 as pb
from tests.helpers.chart import CLUSTER_APIS, render, training_templates
from tests.helpers.kube import AUTH, NS
from tests.helpers.rpc import code_of

pytestmark = pytest.mark.integration
PA, COLLAB = pb.TRAINING_PHASE_PERSONA_ALIGNMENT, pb.TRAINING_PHASE_COLLABORATIVE
MULTI = {"training": {"enabled": True, "launcher": "torchrun", "nodes": 2, "gpu": {"enabled": True, "count": 4}}}
UID = "0b7e4d52-3f0a-4c1e-9d1a-5a0c2b9e7f11"


def _write_templates(d, api_versions: tuple[str, ...] = ()):
    for phase, job in training_templates(render(MULTI, CLUSTER_APIS + api_versions)).items():
        (d / f"{phase}.yaml").write_text(yaml.safe_dump(job))
    return d


@pytest.fixture(scope="module")
def chart_templates(tmp_path_factory):
    """The chart's Indexed Job templates (2 nodes of 4 GPUs), as the gateway mounts them."""
    return _write_templates(tmp_path_factory.mktemp("indexed-templates"))


@pytest.fixture
def apis(kube):
    """CoreV1Api and CustomObjectsApi on kmock, beside the fixture's BatchV1Api."""
    import kubernetes

    batch, _ = kube
    return kubernetes.client.CoreV1Api(batch.api_client), kubernetes.client.CustomObjectsApi(batch.api_client)


def _with_uid(request):
    """What a real API server answers to a create: the object with its uid (kmock sets none)."""
    return {**request.data, "metadata": {**request.data["metadata"], "uid": UID}}


async def _services(core) -> list[dict]:
    r = await asyncio.to_thread(core.list_namespaced_service, NS, _preload_content=False)
    return json.loads(r.data)["items"]


async def test_an_indexed_run_gets_a_rendezvous_service_owned_by_its_job(envs, kmock, apis):
    core, _ = apis
    kmock.resources["v1/services"].namespaced = True
    kmock["create jobs"] << _with_uid
    env = await envs(max_active_runs=2)
    r = await env.trigger("mn-1")
    assert not r.already_existed and r.run.job_name == "demo-mascot-persona-alignment-mn-1"
    (job,) = await env.jobs()
    name = job["metadata"]["name"]
    assert job["spec"]["completionMode"] == "Indexed" and job["spec"]["completions"] == 2
    assert job["spec"]["template"]["spec"]["subdomain"] == name
    (svc,) = await _services(core)
    assert svc["metadata"]["name"] == name and svc["spec"]["clusterIP"] == "None"
    assert svc["spec"]["selector"] == {"mascot.ai/phase": "persona-alignment", "mascot.ai/run-id": "mn-1"}
    assert svc["metadata"]["ownerReferences"] == [{"apiVersion": "batch/v1", "kind": "Job", "name": name,
                                                   "uid": UID}]
    assert svc["metadata"]["labels"]["mascot.ai/run-id"] == "mn-1"

    # the same run id again: the run and its one Service, nothing new
    again = await env.trigger("mn-1")
    assert again.already_existed and len(await env.jobs()) == 1 and len(await _services(core)) == 1

    # a run id too long for an Indexed Job name (52 characters) is refused before anything is made
    code, msg = await code_of(env.trigger("x" * 23))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "(52 characters)" in msg
    assert len(await env.jobs()) == 1

    # cancel: the Job goes, and the Service with it (the garbage collector would; the gateway does not wait)
    await env.stub.CancelRun(pb.CancelRunRequest(run_id="mn-1"), metadata=AUTH)
    assert await env.jobs() == [] and await _services(core) == []


async def test_a_run_whose_service_is_refused_is_not_left_behind(envs, kmock, apis):
    # (a 422: kmock stores a created object even when a reaction refuses it, so a retried UNAVAILABLE would pass)
    kmock.resources["v1/services"].namespaced = True
    kmock["create services"] << 422 << {"apiVersion": "v1", "kind": "Status", "code": 422, "reason": "Invalid",
                                        "message": 'Service "demo-mascot-persona-alignment-mn-2" is invalid: '
                                                   'spec.ports[0].port: Invalid value: 0'}
    env = await envs()
    code, msg = await code_of(env.trigger("mn-2"))
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "spec.ports[0].port: Invalid value" in msg
    assert "create Service demo-mascot-persona-alignment-mn-2" in msg and "deleted again" in msg
    assert await env.jobs() == []


async def test_a_pytorchjob_run_is_created_followed_and_cancelled(envs, kmock, apis, tmp_path):
    _, custom = apis
    (tmp_path / "pytorchjob").mkdir()
    env = await envs(templates_dir=_write_templates(tmp_path / "pytorchjob", ("kubeflow.org/v1/PyTorchJob",)))
    r = (await env.trigger("pt-1", phase=COLLAB)).run
    assert (r.job_name, r.state) == ("demo-mascot-collaborative-pt-1", pb.RUN_STATE_PENDING)
    assert await env.jobs() == []  # no batch Job: the training operator makes the pods

    def pytorchjobs():
        body = custom.list_namespaced_custom_object("kubeflow.org", "v1", NS, "pytorchjobs", _preload_content=False)
        return json.loads(body.data)["items"]

    (pj,) = await asyncio.to_thread(pytorchjobs)
    assert pj["kind"] == "PyTorchJob" and pj["metadata"]["labels"]["mascot.ai/run-id"] == "pt-1"
    assert {k: v["replicas"] for k, v in pj["spec"]["pytorchReplicaSpecs"].items()} == {"Master": 1, "Worker": 1}
    assert (await env.trigger("pt-1", phase=COLLAB)).already_existed

    # the operator's status: Running with both replicas' pods
    await asyncio.to_thread(custom.patch_namespaced_custom_object_status, "kubeflow.org", "v1", NS, "pytorchjobs",
                            r.job_name, {"status": {"conditions": [{"type": "Running", "status": "True"}],
                                                    "replicaStatuses": {"Master": {"active": 1},
                                                                        "Worker": {"active": 1}}}})
    run = (await env.stub.GetRun(pb.GetRunRequest(run_id="pt-1"), metadata=AUTH)).run
    assert run.state == pb.RUN_STATE_RUNNING and "2 pod(s) running" in run.message
    listed = (await env.stub.ListRuns(pb.ListRunsRequest(), metadata=AUTH)).runs
    assert [x.run_id for x in listed] == ["pt-1"]

    await env.stub.CancelRun(pb.CancelRunRequest(run_id="pt-1"), metadata=AUTH)
    assert await asyncio.to_thread(pytorchjobs) == []
    run = (await env.stub.GetRun(pb.GetRunRequest(run_id="pt-1"), metadata=AUTH)).run
    assert run.state == pb.RUN_STATE_CANCELLED and "PyTorchJob deleted" in run.message
