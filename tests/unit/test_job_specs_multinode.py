"""Training runs on several nodes, without an API server: the chart's Indexed Job and PyTorchJob templates (real helm
renders) loaded by mascot.gateway.job_specs, the run's Job and its headless rendezvous Service built from them and read
back through the kubernetes client's models (V1Job, V1Service) and kubernetes-validate, name limits, and the status
of a PyTorchJob."""

from __future__ import annotations

import datetime as dt
import json

import pytest
import yaml

from mascot.gateway import job_specs as js
from mascot.core.errors import InvalidArgument

T0 = dt.datetime(2025, 5, 1, 12, 0, 0, tzinfo=dt.timezone.utc)
KUBE_VERSION = "1.33.0"
MULTI = {"training": {"enabled": True, "launcher": "torchrun", "nodes": 3, "gpu": {"enabled": True, "count": 8}}}


def _templates(tmp_path, values: dict, api_versions: tuple[str, ...] = ()) -> dict[str, dict]:
    """phase -> the chart's Job template as the gateway loads it (written out, then job_specs.load_template)."""
    from tests.helpers.chart import CLUSTER_APIS, render, training_templates

    out = {}
    for phase, doc in training_templates(render(values, CLUSTER_APIS + api_versions)).items():
        (tmp_path / f"{phase}.yaml").write_text(yaml.safe_dump(doc))
        out[phase] = js.load_template(js.template_path(tmp_path, phase))
    return out


def _model(obj: dict, klass: str):
    """``obj`` deserialized into the kubernetes client model ``klass`` (raises on a missing required field)."""
    from kubernetes import client

    return client.ApiClient().deserialize(json.dumps(obj), klass, "application/json")


def _round_trip(obj: dict, klass: str) -> dict:
    from kubernetes import client

    return client.ApiClient().sanitize_for_serialization(_model(obj, klass))


def test_an_indexed_run_and_its_rendezvous_service_are_valid_kubernetes_objects(tmp_path):
    import kubernetes_validate

    template = _templates(tmp_path, MULTI)["persona-alignment"]
    assert js.template_kind(template) == "indexed" and js.name_limit(template) == 52
    job = js.job_from_template(template, "persona-alignment", "nightly-7", "mascot", T0)
    name = "demo-mascot-persona-alignment-nightly-7"
    assert job["metadata"]["name"] == name
    pod = job["spec"]["template"]
    assert pod["spec"]["subdomain"] == name  # the template's placeholder becomes the Job's own Service
    assert template["spec"]["template"]["spec"]["subdomain"] == "demo-mascot-persona-alignment"  # untouched

    svc = js.rendezvous_service(job, owner_uid="6f1d0c1e-0000-4000-8000-000000000001")
    assert svc["metadata"]["name"] == name and svc["metadata"]["namespace"] == "mascot"
    assert svc["spec"]["clusterIP"] == "None" and svc["spec"]["publishNotReadyAddresses"] is True
    assert svc["spec"]["selector"] == {"mascot.ai/phase": "persona-alignment", "mascot.ai/run-id": "nightly-7"}
    assert svc["spec"]["selector"].items() <= pod["metadata"]["labels"].items()  # it selects the run's pods
    assert svc["spec"]["ports"] == [{"name": "rendezvous", "port": 29500, "targetPort": "rendezvous",
                                     "protocol": "TCP"}]
    assert svc["metadata"]["ownerReferences"] == [{"apiVersion": "batch/v1", "kind": "Job", "name": name,
                                                   "uid": "6f1d0c1e-0000-4000-8000-000000000001"}]

    # through the kubernetes client's models: every field is one the API knows (nothing dropped on the way)
    v1job = _model(job, "V1Job")
    assert v1job.spec.completion_mode == "Indexed" and v1job.spec.completions == 3 and v1job.spec.parallelism == 3
    assert v1job.spec.template.spec.subdomain == name
    (c,) = v1job.spec.template.spec.containers
    assert c.command == ["torchrun"]
    assert c.args[:6] == ["--nnodes=3", "--nproc-per-node=8", "--node-rank=$(MASCOT_NODE_RANK)",
                          "--rdzv-backend=c10d",
                          "--rdzv-endpoint=$(MASCOT_RUN_ID)-0.$(MASCOT_RUN_ID).mascot.svc.cluster.local:29500",
                          "--rdzv-id=$(MASCOT_RUN_ID)"]
    env = {e.name: e for e in c.env}
    assert env["MASCOT_RUN_ID"].value_from.field_ref.field_path == "metadata.labels['batch.kubernetes.io/job-name']"
    assert env["MASCOT_NODE_RANK"].value_from.field_ref.field_path == \
        "metadata.annotations['batch.kubernetes.io/job-completion-index']"
    assert _round_trip(job, "V1Job") == job
    v1svc = _model(svc, "V1Service")
    assert v1svc.metadata.owner_references[0].uid.startswith("6f1d0c1e") and v1svc.spec.cluster_ip == "None"
    assert _round_trip(svc, "V1Service") == svc
    kubernetes_validate.validate(job, KUBE_VERSION, strict=True)
    kubernetes_validate.validate(svc, KUBE_VERSION, strict=True)
    # and what the API would refuse is caught the same way
    bad = json.loads(json.dumps(svc))
    bad["spec"]["clusterIp"] = "None"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, KUBE_VERSION, strict=True)


def test_a_job_of_one_pod_needs_no_service_and_keeps_the_63_character_limit(tmp_path):
    template = _templates(tmp_path, {"training": {"enabled": True}})["collaborative"]
    assert js.template_kind(template) == "job" and js.name_limit(template) == 63
    job = js.job_from_template(template, "collaborative", "r1", "mascot", T0)
    assert js.rendezvous_service(job) is None and "subdomain" not in job["spec"]["template"]["spec"]


def test_multi_node_names_leave_room_for_the_pod_index(tmp_path):
    template = _templates(tmp_path, MULTI)["collaborative"]
    prefix = template["metadata"]["name"]  # demo-mascot-collaborative: 25 characters
    room = js.max_run_id_len(prefix, js.name_limit(template))
    assert room == 52 - len(prefix) - 1 == 26
    assert js.validate_run_id("x" * room, prefix, js.name_limit(template))
    with pytest.raises(InvalidArgument, match="at most 26 fit in the Job name .* \\(52 characters\\)"):
        js.validate_run_id("x" * (room + 1), prefix, js.name_limit(template))
    rid = js.generate_run_id(prefix, T0, js.name_limit(template))
    assert len(f"{prefix}-{rid}") <= 52 and rid.startswith("20250501-120000-")
    long_template = dict(template, metadata={**template["metadata"], "name": "p" * 48})
    (tmp_path / "long.yaml").write_text(yaml.safe_dump(long_template))
    with pytest.raises(ValueError, match="at most 47 characters"):
        js.load_template(tmp_path / "long.yaml")


def test_a_pytorchjob_template_is_labelled_per_replica(tmp_path):
    import kubernetes_validate

    template = _templates(tmp_path, MULTI, ("kubeflow.org/v1/PyTorchJob",))["collaborative"]
    assert (template["apiVersion"], template["kind"]) == js.PYTORCH_JOB and js.template_kind(template) == "pytorchjob"
    job = js.job_from_template(template, "collaborative", "w1", "mascot", T0)
    replicas = job["spec"]["pytorchReplicaSpecs"]
    assert {k: r["replicas"] for k, r in replicas.items()} == {"Master": 1, "Worker": 2}
    for r in replicas.values():
        labels = r["template"]["metadata"]["labels"]
        assert labels["mascot.ai/run-id"] == "w1" and labels["mascot.ai/phase"] == "collaborative"
        # each replica's pod template is a valid pod (the operator adds RANK, MASTER_ADDR, MASTER_PORT to its env)
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", **r["template"]["metadata"]},
               "spec": r["template"]["spec"]}
        kubernetes_validate.validate(pod, KUBE_VERSION, strict=True)
    assert js.rendezvous_service(job) is None  # the operator makes the master's Service
    bad = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": "x"},
           "spec": {"pytorchReplicaSpecs": {"Worker": {"replicas": 1, "template": {}}}}}
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(bad))
    with pytest.raises(ValueError, match="no spec.pytorchReplicaSpecs.Master.template"):
        js.load_template(tmp_path / "bad.yaml")


def _pytorch_job(status=None, **meta):
    return {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
            "metadata": {"name": "p-w1", "namespace": "ns", "labels": {js.LABEL_RUN_ID: "w1",
                                                                       js.LABEL_PHASE: "collaborative"},
                         "creationTimestamp": "2025-05-01T12:00:00Z", **meta}, "status": status or {}}


def _cond(kind, status="True", **kw):
    return {"type": kind, "status": status, **kw}


@pytest.mark.parametrize("status,meta,state,fragment", [
    ({}, {}, "pending", "waiting for the training operator"),
    ({"conditions": [_cond("Created")]}, {}, "pending", "waiting"),
    ({"conditions": [_cond("Created"), _cond("Running")], "startTime": "2025-05-01T12:00:05Z",
      "replicaStatuses": {"Master": {"active": 1}, "Worker": {"active": 2}}}, {}, "running", "3 pod(s) running"),
    ({"conditions": [_cond("Running", "False"), _cond("Restarting", reason="PyTorchJobRestarting")]}, {}, "running",
     "restarting: PyTorchJobRestarting"),
    ({"conditions": [_cond("Suspended", reason="PyTorchJobSuspended")]}, {}, "pending", "suspended"),
    ({"conditions": [_cond("Running", "False"), _cond("Succeeded", reason="PyTorchJobSucceeded")],
      "completionTime": "2025-05-01T13:00:00Z"}, {}, "succeeded", "PyTorchJobSucceeded"),
    ({"conditions": [_cond("Failed", reason="PyTorchJobFailed", message="master exited 1",
                           lastTransitionTime="2025-05-01T14:00:00Z")],
      "replicaStatuses": {"Master": {"failed": 1}}}, {}, "failed", "PyTorchJobFailed: master exited 1"),
    ({"conditions": [_cond("Running")]}, {"deletionTimestamp": "2025-05-01T12:30:00Z"}, "cancelled", "being deleted"),
])
def test_pytorchjob_status_follows_the_operator(status, meta, state, fragment):
    run = js.run_status(_pytorch_job(status, **meta))
    assert (run.state, run.run_id, run.phase, run.job_name, run.kind) == (state, "w1", "collaborative", "p-w1",
                                                                          "PyTorchJob")
    assert fragment in run.message
    if state in ("succeeded", "failed", "cancelled"):
        assert run.finish_time is not None and run.finish_time > run.create_time
    if state == "failed":
        assert run.failed_pods == 1
