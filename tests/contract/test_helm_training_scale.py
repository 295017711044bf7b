"""The chart's training runs on several nodes (training.nodes, phases.<phase>.nodes, training.multiNode), rendered
offline like every chart test (tests/helpers/chart.py): the Indexed Job template with its torchrun rendezvous,
validated strictly as Kubernetes 1.33 objects; the PyTorchJob when the cluster serves kubeflow.org/v1 PyTorchJob
(checked by structure, each replica's pod strictly as a Pod); the CronJob's Indexed Job with its own headless
Service; the Role and NetworkPolicy they need; the install-time refusals; the values schema."""

from __future__ import annotations

import copy

import pytest
import yaml

from tests.helpers.chart import (
    CHART, CLUSTER_APIS, KUBE_VERSION, NAMESPACE, RELEASE, rejected, render, training_templates,
)

PYTORCH_API = ("kubeflow.org/v1/PyTorchJob",)
MULTI = {"training": {"enabled": True, "launcher": "torchrun", "nodes": 3, "gpu": {"enabled": True, "count": 8}}}
TAIL = ["-m", "mascot.cli", "train"]


def _values(**training) -> dict:
    v = copy.deepcopy(MULTI)
    v["training"].update(training)
    return v


def _validate_all(r) -> int:
    import kubernetes_validate

    n = 0
    for _, obj in r.objects:
        if obj["kind"] in ("InferenceService", "ServiceMonitor", "PrometheusRule"):
            continue  # custom resources: test_helm_chart.py checks them against their CRDs
        kubernetes_validate.validate(obj, KUBE_VERSION, strict=True)
        n += 1
    return n


def _container(pod_spec: dict) -> dict:
    (c,) = pod_spec["containers"]
    return c


def test_several_nodes_render_an_indexed_job_meeting_at_pod_0():
    import kubernetes_validate

    r = render(MULTI)
    jobs = training_templates(r)
    for phase, job in jobs.items():
        kubernetes_validate.validate(job, KUBE_VERSION, strict=True)
        assert (job["apiVersion"], job["kind"]) == ("batch/v1", "Job")
        spec = job["spec"]
        assert (spec["completionMode"], spec["completions"], spec["parallelism"]) == ("Indexed", 3, 3)
        pod = spec["template"]["spec"]
        assert pod["subdomain"] == job["metadata"]["name"] == f"{RELEASE}-mascot-{phase}"  # the gateway renames it
        assert pod["restartPolicy"] == "OnFailure"
        c = _container(pod)
        assert c["command"] == ["torchrun"]
        assert c["args"] == ["--nnodes=3", "--nproc-per-node=8", "--node-rank=$(MASCOT_NODE_RANK)",
                             "--rdzv-backend=c10d",
                             "--rdzv-endpoint=$(MASCOT_RUN_ID)-0.$(MASCOT_RUN_ID).mascot.svc.cluster.local:29500",
                             "--rdzv-id=$(MASCOT_RUN_ID)", *TAIL, phase, "--config", "/etc/mascot/run/run.yaml",
                             "--out", f"/runs/{phase}/$(MASCOT_RUN_ID)"]
        env = {e["name"]: e for e in c["env"]}
        assert env["MASCOT_RUN_ID"]["valueFrom"]["fieldRef"]["fieldPath"] == \
            "metadata.labels['batch.kubernetes.io/job-name']"
        assert env["MASCOT_NODE_RANK"]["valueFrom"]["fieldRef"]["fieldPath"] == \
            "metadata.annotations['batch.kubernetes.io/job-completion-index']"
        assert c["ports"] == [{"name": "rendezvous", "containerPort": 29500, "protocol": "TCP"}]
        assert c["resources"]["limits"]["nvidia.com/gpu"] == "8"
    assert _validate_all(r) >= 10
    # the gateway creates each run's Service: the chart renders none for the templates
    assert [s for s in r.of_kind("Service") if s["metadata"]["labels"]["app.kubernetes.io/component"] == "training"] \
        == []
    # the gateway may create, read and delete those Services, nothing more
    (role,) = r.of_kind("Role")
    assert role["rules"][1:] == [{"apiGroups": [""], "resources": ["services"], "verbs": ["create", "delete"]}]
    # the pods of a run reach each other (rendezvous, then NCCL on ports of its own)
    np = r.one("NetworkPolicy", "-training")
    sel = {"app.kubernetes.io/name": "mascot", "app.kubernetes.io/instance": RELEASE,
           "app.kubernetes.io/component": "training"}
    assert np["spec"]["podSelector"]["matchLabels"] == sel
    assert np["spec"]["ingress"] == [{"from": [{"podSelector": {"matchLabels": sel}}]}]


def test_one_node_stays_a_plain_job_without_extra_rights_or_policies():
    r = render({"training": {"enabled": True, "launcher": "torchrun", "nodes": 1, "gpu": {"enabled": True,
                                                                                        "count": 4}}},
               CLUSTER_APIS + PYTORCH_API)
    for job in training_templates(r).values():
        assert job["kind"] == "Job" and "completionMode" not in job["spec"]
        assert "subdomain" not in job["spec"]["template"]["spec"]
        c = _container(job["spec"]["template"]["spec"])
        assert c["args"][:3] == ["--standalone", "--nnodes=1", "--nproc-per-node=4"] and "ports" not in c
    (role,) = r.of_kind("Role")
    assert [rule["resources"] for rule in role["rules"]] == [["jobs"]]
    assert not [n for n in r.of_kind("NetworkPolicy") if n["metadata"]["name"].endswith("-training")]


def test_a_phase_may_set_its_own_nodes():
    v = _values(nodes=1)
    v["training"]["phases"] = {"personaAlignment": {"config": {"run_id": "p1"}},
                               "collaborative": {"config": {"run_id": "p2"}, "nodes": 2}}
    jobs = training_templates(render(v))
    assert "completionMode" not in jobs["persona-alignment"]["spec"]
    assert jobs["collaborative"]["spec"]["completions"] == 2
    assert _container(jobs["collaborative"]["spec"]["template"]["spec"])["args"][0] == "--nnodes=2"


def test_with_the_kubeflow_crd_a_run_is_a_pytorchjob():
    import kubernetes_validate

    r = render(MULTI, CLUSTER_APIS + PYTORCH_API)
    for phase, pj in training_templates(r).items():
        assert (pj["apiVersion"], pj["kind"]) == ("kubeflow.org/v1", "PyTorchJob")
        assert pj["metadata"]["name"] == f"{RELEASE}-mascot-{phase}" and pj["metadata"]["namespace"] == NAMESPACE
        run = pj["spec"]["runPolicy"]
        assert run == {"cleanPodPolicy": "Running", "backoffLimit": 3, "activeDeadlineSeconds": 172800,
                       "ttlSecondsAfterFinished": 86400}
        replicas = pj["spec"]["pytorchReplicaSpecs"]
        assert set(replicas) == {"Master", "Worker"}
        assert (replicas["Master"]["replicas"], replicas["Worker"]["replicas"]) == (1, 2)
        for kind, rs in replicas.items():
            assert rs["restartPolicy"] == "OnFailure"
            pod = rs["template"]["spec"]
            assert "restartPolicy" not in pod and "subdomain" not in pod  # the operator sets both
            c = _container(pod)
            assert c["name"] == "pytorch"  # the operator finds its container by this name
            assert c["command"] == ["torchrun"]
            assert c["args"] == ["--nnodes=3", "--nproc-per-node=8", "--node-rank=$(RANK)",
                                 "--master-addr=$(MASTER_ADDR)", "--master-port=$(MASTER_PORT)", *TAIL, phase,
                                 "--config", "/etc/mascot/run/run.yaml", "--out", f"/runs/{phase}/$(MASCOT_RUN_ID)"]
            assert c["ports"] == [{"name": "pytorchjob-port", "containerPort": 29500, "protocol": "TCP"}]
            env = {e["name"]: e for e in c["env"]}
            assert env["MASCOT_RUN_ID"]["valueFrom"]["fieldRef"]["fieldPath"] == \
                "metadata.labels['training.kubeflow.org/job-name']"
            assert "MASCOT_NODE_RANK" not in env
            kubernetes_validate.validate({"apiVersion": "v1", "kind": "Pod",
                                          "metadata": {"name": f"{phase}-{kind}".lower(),
                                                       **rs["template"]["metadata"]},
                                          "spec": pod}, KUBE_VERSION, strict=True)
        assert replicas["Master"]["template"] == replicas["Worker"]["template"]
    (role,) = r.of_kind("Role")
    assert role["rules"][1:] == [{"apiGroups": ["kubeflow.org"], "resources": ["pytorchjobs"],
                                  "verbs": ["create", "get", "list", "watch", "delete"]}]
    assert r.one("NetworkPolicy", "-training")
    # kind indexed keeps the Indexed Job on such a cluster
    indexed = training_templates(render(_values(multiNode={"kind": "indexed"}), CLUSTER_APIS + PYTORCH_API))
    assert {j["kind"] for j in indexed.values()} == {"Job"}


def test_a_multi_node_cronjob_runs_an_indexed_job_with_a_headless_service_of_its_own():
    r = render(_values(cronJob={"enabled": True, "phase": "collaborative"}), CLUSTER_APIS + PYTORCH_API)
    (cron,) = r.of_kind("CronJob")
    name = cron["metadata"]["name"]
    assert name == f"{RELEASE}-mascot-collaborative" and len(name) <= 41  # + 11 for the Job: within 52
    spec = cron["spec"]["jobTemplate"]["spec"]
    assert (spec["completionMode"], spec["completions"], spec["parallelism"]) == ("Indexed", 3, 3)
    pod = spec["template"]
    assert pod["spec"]["subdomain"] == name
    assert (f"--rdzv-endpoint=$(MASCOT_RUN_ID)-0.{name}.mascot.svc.cluster.local:29500"
            in _container(pod["spec"])["args"])
    svc = r.one("Service", "-collaborative")
    assert svc["metadata"]["name"] == name and svc["spec"]["clusterIP"] == "None"
    assert svc["spec"]["publishNotReadyAddresses"] is True
    assert svc["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    assert svc["spec"]["selector"]["mascot.ai/rendezvous"] == name  # not the gateway's runs of the phase
    assert svc["spec"]["ports"] == [{"name": "rendezvous", "port": 29500, "targetPort": "rendezvous",
                                     "protocol": "TCP"}]
    assert _validate_all(r) >= 10  # the CronJob and the Service, strictly
    # a long release name: the CronJob (and its Service) name is cut to 41 characters
    v = _values(nodes=1, cronJob={"enabled": True, "phase": "collaborative"})
    v["training"]["phases"] = {"personaAlignment": {"config": {}}, "collaborative": {"config": {}, "nodes": 3}}
    long = render({**v, "fullnameOverride": "r" * 30})  # r...r-collaborative: 44 characters, 47 allowed
    (cron,) = long.of_kind("CronJob")
    cut = "r" * 30 + "-collaborat"
    assert cron["metadata"]["name"] == cut and len(cut) == 41
    assert cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]["subdomain"] == cut
    assert long.one("Service", "-collaborat")["spec"]["selector"]["mascot.ai/rendezvous"] == cut


def test_lint_is_clean_for_multi_node_values():
    import helm_python as helm

    for values in (MULTI, _values(cronJob={"enabled": True})):
        report = helm.lint(CHART, values, strict=True, namespace=NAMESPACE, kube_version=f"v{KUBE_VERSION}")
        problems = [m for m in report["messages"] if m["severity"] >= 2]
        assert not problems and not report["errors"], problems or report["errors"]


@pytest.mark.parametrize("values,apis,message", [
    (_values(launcher="accelerate"), (), "runs on 3 nodes, which needs training.launcher torchrun (got accelerate)"),
    (_values(launcher="none"), (), "needs training.launcher torchrun (got none)"),
    (_values(multiNode={"kind": "pytorchjob"}), (),
     "training.multiNode.kind is pytorchjob but the cluster does not serve kubeflow.org/v1 PyTorchJob"),
    ({**_values(), "fullnameOverride": "a-release-name-long-enough-to-hit"}, (),
     "a run on several nodes allows 47"),
])
def test_what_cannot_run_on_several_nodes_is_refused_at_install(values, apis, message):
    import helm_python as helm

    with pytest.raises(helm.HelmRenderError) as e:
        render(values, CLUSTER_APIS + apis)
    assert message in str(e.value)


def test_schema_rejects_bad_multi_node_values():
    rejected(_values(nodes=0), "/training/nodes", "minimum")
    rejected(_values(multiNode={"kind": "mpi"}), "/training/multiNode/kind", "must be one of")
    rejected(_values(multiNode={"ports": 1}), "/training/multiNode", "ports")
    rejected(_values(multiNode={"port": 70000}), "/training/multiNode/port", "65,535")
    v = _values()
    v["training"]["phases"] = {"personaAlignment": {"config": {}, "nodes": 0}, "collaborative": {"config": {}}}
    rejected(v, "/training/phases/personaAlignment/nodes", "minimum")


def test_the_values_file_documents_the_multi_node_settings():
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["training"]["nodes"] == 1
    assert values["training"]["multiNode"] == {"kind": "auto", "port": 29500}
