"""The Helm chart helm/mascot, rendered offline with helm-python-sdk for every
helm/mascot/ci/*.yaml: the kinds rendered per file, strict lint (Kubernetes 1.33), every object valid (core kinds with
kubernetes-validate strict 1.33; InferenceService, ServiceMonitor and PrometheusRule against their CRD schemas),
values.schema.json rejections (the MascotConfig overrides by a schema generated from the model), the cross-field
checks of the templates, secure defaults, and the contracts the chart keeps with the code: the MascotConfig each
component reads, the CLI commands it runs, the Alembic hook, the `helm test` health check and the training Job
templates; the control plane apart from the public gateway (the admin services, the Job Role, the admin token, its
NetworkPolicy, Secrets read as files). Operations: which value change restarts which pods, the pod extension points,
PodDisruptionBudgets, the monitoring objects only where the cluster serves their API, the metrics scrape sources.
Monitoring content: test_helm_monitoring.py; checkov: test_helm_checkov.py."""

from __future__ import annotations

import copy
import json
import re
import shutil
import socket
import subprocess
import sys
from concurrent import futures
from pathlib import Path

import pytest
import yaml

from tests.helpers import chart as chart_helpers
from tests.helpers.chart import (
    CHART, CI_IDS, CLUSTER_APIS, CRD_KINDS, KUBE_VERSION, LABELS, MODEL_COMPONENTS, NAMESPACE, RELEASE, cli_accepts,
    component_config, crd_errors, load_ci, model_services, pod_specs, rejected, render, training_templates,
)
from tests.helpers.paths import need

# The objects each ci file renders, hooks and test hooks included (a template change that adds or drops an object
# must update this table on purpose). full.yaml runs one service per component (generation.enabled false); the others
# the default generation service (director, speaker and judge on one engine) beside the reward service.
EXPECTED_KINDS = {
    "minimal.yaml": {  # the generation service only (director and speaker; no judge, no reward)
        "ConfigMap": 2, "Deployment": 1, "InferenceService": 1, "NetworkPolicy": 3, "PersistentVolumeClaim": 1,
        "Pod": 1, "PodDisruptionBudget": 1, "Service": 2, "ServiceAccount": 3,  # Services: gateway + 1 headless
    },
    "full.yaml": {  # Deployments: the gateway and the control plane (training and an adapter store)
        "ConfigMap": 7, "CronJob": 1, "Deployment": 2, "HorizontalPodAutoscaler": 1, "InferenceService": 4,
        "Ingress": 1, "Job": 1, "NetworkPolicy": 4, "PersistentVolumeClaim": 1, "Pod": 1,
        "PodDisruptionBudget": 2,  # the gateway's, and the speaker's (2 to 4 replicas)
        "PrometheusRule": 1, "Role": 1, "RoleBinding": 1, "Service": 6, "ServiceAccount": 6, "ServiceMonitor": 3,
    },
    "external-postgresql.yaml": {  # generation and reward; the control plane (an adapter store, no training)
        "ConfigMap": 3, "Deployment": 2, "InferenceService": 2, "Job": 1, "NetworkPolicy": 4,
        "PersistentVolumeClaim": 1, "Pod": 1, "PodDisruptionBudget": 1, "Service": 4, "ServiceAccount": 5,
        "ServiceMonitor": 3,
    },
    "cpu-without-kserve.yaml": {  # generation and reward as Deployments
        "ConfigMap": 2, "Deployment": 3, "NetworkPolicy": 3, "PersistentVolumeClaim": 1, "Pod": 1,
        "PodDisruptionBudget": 1, "Service": 5, "ServiceAccount": 3,  # Services: gateway, 2 ClusterIP, 2 headless
    },
}
#: The model services each ci file renders, in the chart's order.
EXPECTED_SERVICES = {
    "minimal.yaml": ["generation"],
    "full.yaml": ["director", "speaker", "judge", "reward"],
    "external-postgresql.yaml": ["generation", "reward"],
    "cpu-without-kserve.yaml": ["generation", "reward"],
}



def _control_plane(r) -> bool:
    """Whether the control plane renders: it has an adapter store to manage or training runs to start."""
    v = r.effective
    return bool(v["adapters"]["store"] or v["training"]["enabled"])


# ----------------------------------------------------------------------------------------------- render, lint, validate
@pytest.mark.parametrize("ci", CI_IDS)
def test_kinds_rendered_per_ci_file(rendered, ci):
    assert ci in EXPECTED_KINDS, f"add {ci} to EXPECTED_KINDS"
    counts: dict[str, int] = {}
    for _, obj in rendered[ci].objects:
        counts[obj["kind"]] = counts.get(obj["kind"], 0) + 1
    assert counts == EXPECTED_KINDS[ci]
    # one workload per model service, named after it
    r = rendered[ci]
    assert r.services == EXPECTED_SERVICES[ci]
    workloads = r.of_kind("InferenceService") or [d for d in r.of_kind("Deployment")
                                                  if not d["metadata"]["name"].endswith(("-gateway", "-control"))]
    assert sorted(o["metadata"]["name"] for o in workloads) == sorted(f"{RELEASE}-mascot-{s}" for s in r.services)


def test_every_ci_file_is_covered():
    assert set(CI_IDS) == set(EXPECTED_KINDS)
    assert {"minimal.yaml", "full.yaml", "external-postgresql.yaml"} <= set(CI_IDS)


@pytest.mark.parametrize("ci", CI_IDS)
def test_lint_is_clean_in_strict_mode_for_kubernetes_1_33(ci):
    import helm_python as helm

    report = helm.lint(CHART, load_ci(ci), strict=True, namespace=NAMESPACE, kube_version=f"v{KUBE_VERSION}")
    problems = [m for m in report["messages"] if m["severity"] >= 2]  # 2 warning, 3 error; 1 is info (icon)
    assert not problems and not report["errors"], problems or report["errors"]


@pytest.mark.parametrize("ci", CI_IDS)
def test_core_objects_validate_strictly_against_kubernetes_1_33(rendered, ci):
    import kubernetes_validate

    checked = 0
    for template, obj in rendered[ci].objects:
        if obj["kind"] in CRD_KINDS:
            continue
        kubernetes_validate.validate(obj, KUBE_VERSION, strict=True)
        checked += 1
    if "training" in rendered[ci].values and rendered[ci].values["training"].get("enabled"):
        for phase, job in training_templates(rendered[ci]).items():
            kubernetes_validate.validate(job, KUBE_VERSION, strict=True)
            checked += 1
    assert checked >= 10


@pytest.mark.parametrize("ci", CI_IDS)
def test_custom_resources_validate_strictly_against_their_crds(rendered, crd_validators, ci):
    custom = [obj for _, obj in rendered[ci].objects if obj["kind"] in CRD_KINDS]
    for obj in custom:
        assert obj["apiVersion"] == {"InferenceService": "serving.kserve.io/v1beta1"}.get(
            obj["kind"], "monitoring.coreos.com/v1")
        assert crd_errors(crd_validators, obj) == [], f"{obj['kind']}/{obj['metadata']['name']}"


def test_crd_validation_catches_what_the_api_server_would_reject_or_prune(rendered, crd_validators):
    isvc = rendered["full.yaml"].one("InferenceService", "-speaker")
    assert crd_errors(crd_validators, isvc) == []
    bad = copy.deepcopy(isvc)
    bad["spec"]["predictor"]["minReplicas"] = "one"
    assert crd_errors(crd_validators, bad)
    bad = copy.deepcopy(isvc)
    del bad["spec"]["predictor"]["containers"][0]["name"]
    bad["spec"]["predictor"]["containers"][0]["imagePullPolcy"] = "Always"  # a typo the API server would prune
    assert any("imagePullPolcy" in e for e in crd_errors(crd_validators, bad))
    bad = copy.deepcopy(isvc)
    bad["spec"]["predictor"]["storageUrl"] = "s3://x"
    assert crd_errors(crd_validators, bad)
    sm = copy.deepcopy(rendered["full.yaml"].one("ServiceMonitor", "-models"))
    sm["spec"]["endpoints"][0]["intervall"] = "30s"
    assert crd_errors(crd_validators, sm)
    rule = copy.deepcopy(rendered["full.yaml"].of_kind("PrometheusRule")[0])
    rule["spec"]["groups"][0]["rules"][0]["for"] = 10
    assert crd_errors(crd_validators, rule)


# ----------------------------------------------------------------------------------------------- values.schema.json
def test_schema_rejects_sqlite_with_more_than_one_gateway_replica():
    rejected({"gateway": {"replicaCount": 2}}, "/gateway/replicaCount", "maximum")


def test_schema_rejects_sqlite_with_gateway_autoscaling():
    rejected({"gateway": {"autoscaling": {"enabled": True}}}, "/gateway/autoscaling/enabled", "false")


def test_schema_rejects_a_port_out_of_range():
    rejected({"director": {"grpcPort": 70000}}, "/director/grpcPort", "65,535")


def test_schema_rejects_postgresql_without_its_url_secret():
    rejected({"store": {"type": "postgresql"}}, "/store/postgresql/existingSecret", "minLength")


def test_schema_rejects_unknown_keys_and_root_containers():
    rejected({"gateway": {"replicas": 2}}, "/gateway", "replicas")
    rejected({"podSecurityContext": {"runAsNonRoot": False}}, "/podSecurityContext/runAsNonRoot", "true")


def test_schema_accepts_what_postgresql_allows():
    r = render({"store": {"type": "postgresql", "postgresql": {"existingSecret": "pg"}},
                "gateway": {"replicaCount": 3, "autoscaling": {"enabled": True}}})
    assert r.one("HorizontalPodAutoscaler", "-gateway")["spec"]["minReplicas"] == 2
    assert "replicas" not in r.one("Deployment", "-gateway")["spec"]  # the HPA owns the count


# ----------------------------------------------------------------------------------------------- secure defaults
@pytest.mark.parametrize("ci", CI_IDS)
def test_every_pod_runs_non_root_read_only_without_privileges(rendered, ci):
    specs = [s for _, obj in rendered[ci].objects for s in pod_specs(obj)]
    assert len(specs) >= 2 + len(rendered[ci].services)  # the gateway, the test Pod, each model service
    for where, spec in specs:
        psc = spec["securityContext"]
        assert psc["runAsNonRoot"] is True and psc["seccompProfile"]["type"] == "RuntimeDefault", where
        assert spec.get("automountServiceAccountToken") in (True, False), where
        assert spec["serviceAccountName"].startswith(f"{RELEASE}-mascot-"), where
        for c in spec["containers"] + spec.get("initContainers", []):
            sc = c["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False and sc["readOnlyRootFilesystem"] is True, where
            assert sc["capabilities"]["drop"] == ["ALL"] and sc.get("privileged") is False, where
            assert c["resources"]["limits"]["memory"] and c["resources"]["requests"]["cpu"], where
            mounts = {m["mountPath"] for m in c.get("volumeMounts", [])}
            assert {"/tmp", "/home/mascot"} <= mounts, f"{where}: writable scratch for a read-only root"
            assert not any("value" in e and any(w in e["name"] for w in ("TOKEN", "PASSWORD", "SECRET", "URL"))
                           and not e["name"].endswith("_FILE")  # the path of a mounted Secret file
                           for e in c.get("env", [])), f"{where}: a secret-looking env var from a literal value"


@pytest.mark.parametrize("ci", CI_IDS)
def test_every_object_has_the_standard_labels_and_the_release_namespace(rendered, ci):
    for _, obj in rendered[ci].objects:
        labels = obj["metadata"].get("labels", {})
        assert all(k in labels for k in LABELS), (obj["kind"], obj["metadata"]["name"], labels)
        assert labels["app.kubernetes.io/instance"] == RELEASE
        assert obj["metadata"]["namespace"] == NAMESPACE


def test_only_the_control_plane_may_touch_the_api_and_only_jobs(rendered):
    full = rendered["full.yaml"]
    (role,) = full.of_kind("Role")
    assert role["metadata"]["name"] == f"{RELEASE}-mascot-control-jobs"
    assert role["rules"] == [{"apiGroups": ["batch"], "resources": ["jobs"],
                              "verbs": ["create", "get", "list", "watch", "delete"]}]
    (binding,) = full.of_kind("RoleBinding")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": f"{RELEASE}-mascot-control",
                                    "namespace": NAMESPACE}]
    for ci, r in rendered.items():
        assert not r.of_kind("ClusterRole") and not r.of_kind("ClusterRoleBinding")
        assert all(sa["automountServiceAccountToken"] is False for sa in r.of_kind("ServiceAccount"))
        for _, obj in r.objects:
            for where, spec in pod_specs(obj):
                mounts_token = spec["automountServiceAccountToken"]
                control_with_training = where.endswith("-control") and obj["kind"] == "Deployment" and bool(
                    r.values.get("training", {}).get("enabled"))
                assert mounts_token is control_with_training, (ci, where)


def test_network_policies_deny_ingress_except_the_listed_paths(rendered):
    full = rendered["full.yaml"]
    deny = full.one("NetworkPolicy", "-default-deny")
    assert deny["spec"]["podSelector"]["matchLabels"] == {"app.kubernetes.io/name": "mascot",
                                                          "app.kubernetes.io/instance": RELEASE}
    assert "ingress" not in deny["spec"] and deny["spec"]["policyTypes"] == ["Ingress", "Egress"]
    models = full.one("NetworkPolicy", "-models")
    grpc_rule, metrics_rule = models["spec"]["ingress"]
    assert sorted(p["port"] for p in grpc_rule["ports"]) == [50061, 50062, 50063, 50064]
    (peer,) = grpc_rule["from"]
    # the gateway, the control plane (its promote gate calls the speaker), training Jobs and the test pod
    assert peer["podSelector"]["matchExpressions"][0]["values"] == ["gateway", "control", "training", "test"]
    assert metrics_rule["ports"] == [{"protocol": "TCP", "port": 8080}]
    assert "namespaceSelector" in metrics_rule["from"][0]
    gateway = full.one("NetworkPolicy", "-gateway")
    clients = gateway["spec"]["ingress"][0]["from"]
    assert clients[0]["namespaceSelector"]["matchLabels"] == {"kubernetes.io/metadata.name": "ingress-nginx"}
    assert clients[1]["podSelector"]["matchExpressions"][0]["values"] == ["test"]  # Jobs publish to the control plane
    minimal = rendered["minimal.yaml"]
    assert "from" not in minimal.one("NetworkPolicy", "-gateway")["spec"]["ingress"][0]  # the public API
    assert minimal.one("NetworkPolicy", "-default-deny")["spec"]["policyTypes"] == ["Ingress"]


# ----------------------------------------------------------------------------------------------- the control plane
#: What only the admin plane needs: the admin token, the run directories and the training Job templates.
ADMIN_VOLUMES = {"admin-token", "runs", "training-templates"}
ADMIN_PATHS = {"/etc/mascot/admin-token", "/runs", "/etc/mascot/training"}
CONTROL = f"{RELEASE}-mascot-control"


@pytest.mark.parametrize("ci", CI_IDS)
def test_the_public_gateway_holds_no_admin_power(rendered, ci):
    """The internet-facing gateway: no Role or RoleBinding names its account, no service account token, none of the
    admin plane's volumes or checksums, a read-only adapter store, and a config without the admin keys."""
    from mascot.core.config import MascotConfig

    r = rendered[ci]
    gateway_sa = f"{RELEASE}-mascot-gateway"
    for binding in r.of_kind("RoleBinding"):
        assert gateway_sa not in {s["name"] for s in binding["subjects"]}, binding["metadata"]["name"]
    assert not [o for o in r.of_kind("Role") if "gateway" in o["metadata"]["name"]]
    dep = r.one("Deployment", "-gateway")
    spec = dep["spec"]["template"]["spec"]
    assert spec["serviceAccountName"] == gateway_sa and spec["automountServiceAccountToken"] is False
    (c,) = spec["containers"]
    assert c["command"] + c["args"] == ["mascot", "serve", "--component", "gateway"]
    assert not ADMIN_VOLUMES & ({v["name"] for v in spec["volumes"]} | {m["name"] for m in c["volumeMounts"]})
    assert not ADMIN_PATHS & {m["mountPath"] for m in c["volumeMounts"]}
    assert "checksum/training-templates" not in dep["spec"]["template"]["metadata"]["annotations"]
    assert all(m["readOnly"] is True for m in c["volumeMounts"] if m["name"] == "adapter-store")
    raw = component_config(r, "gateway")
    assert "training" not in raw and "control" not in raw and "admin_token_file" not in raw.get("adapters", {})
    assert raw["server"]["reflection"] is True  # gateway.reflection: the public API may list itself
    cfg = MascotConfig.model_validate(raw)
    assert not cfg.training.templates_dir and not cfg.adapters.admin_token_file


@pytest.mark.parametrize("training", [True, False], ids=["training", "adapters-only"])
def test_the_control_plane_runs_the_admin_services_and_holds_the_job_role_only_with_training(training):
    import kubernetes_validate

    from mascot.core.config import MascotConfig

    r = render({"adminToken": {"existingSecret": "mascot-admin-token"}, "adapters": {"store": "pvc://adapters/store"},
                "training": {"enabled": training}})
    for _, obj in r.objects:
        if obj["kind"] not in CRD_KINDS:
            kubernetes_validate.validate(obj, KUBE_VERSION, strict=True)
    dep, sa, svc = r.one("Deployment", "-control"), r.one("ServiceAccount", "-control"), r.one("Service", "-control")
    assert dep["metadata"]["name"] == sa["metadata"]["name"] == svc["metadata"]["name"] == CONTROL
    assert dep["spec"]["replicas"] == 1 and dep["spec"]["strategy"] == {"type": "Recreate"}  # SQLite
    spec = dep["spec"]["template"]["spec"]
    assert sa["automountServiceAccountToken"] is False
    assert spec["serviceAccountName"] == CONTROL and spec["automountServiceAccountToken"] is training
    (c,) = spec["containers"]
    assert c["command"] + c["args"] == ["mascot", "serve", "--component", "control"]
    cli_accepts(c["command"][1:] + c["args"])
    assert {e["name"]: e.get("value") for e in c["env"]}["MASCOT_CONFIG"] == "/etc/mascot/config/control.yaml"
    assert {p["name"]: p["containerPort"] for p in c["ports"]} == {"control": 50061, "metrics": 9465}
    assert [c[p]["grpc"]["port"] for p in ("startupProbe", "readinessProbe", "livenessProbe")] == [50061] * 3
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert mounts["admin-token"]["mountPath"] == "/etc/mascot/admin-token" and "subPath" not in mounts["admin-token"]
    assert volumes["admin-token"]["secret"]["items"] == [{"key": "token", "path": "token"}]
    assert mounts["adapter-store"]["readOnly"] is False  # the registry's only writer
    assert (ADMIN_VOLUMES <= set(mounts)) is training and (ADMIN_VOLUMES <= set(volumes)) is training
    annotations = dep["spec"]["template"]["metadata"]["annotations"]
    assert ("checksum/training-templates" in annotations) is training and "checksum/config" in annotations
    # its own SQLite file for the audit trail, on its own volume
    pvc = r.one("PersistentVolumeClaim", "-control-data")
    assert volumes["data"]["persistentVolumeClaim"]["claimName"] == pvc["metadata"]["name"]
    assert pvc["spec"]["resources"]["requests"]["storage"] == "1Gi"
    assert mounts["data"]["mountPath"] == "/var/lib/mascot"
    # a ClusterIP Service of the control and metrics ports, selecting the control pods only
    assert svc["spec"]["type"] == "ClusterIP"
    assert [(p["name"], p["port"], p["targetPort"]) for p in svc["spec"]["ports"]] == [
        ("control", 50061, "control"), ("metrics", 9465, "metrics")]
    assert svc["spec"]["selector"].items() <= dep["spec"]["template"]["metadata"]["labels"].items()
    gw_labels = r.one("Deployment", "-gateway")["spec"]["template"]["metadata"]["labels"]
    assert not svc["spec"]["selector"].items() <= gw_labels.items()
    # the Job Role exists with training only, bound to the control plane's account alone
    if training:
        (role,), (binding,) = r.of_kind("Role"), r.of_kind("RoleBinding")
        assert role["metadata"]["name"] == binding["roleRef"]["name"] == f"{CONTROL}-jobs"
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": CONTROL, "namespace": NAMESPACE}]
    else:
        assert not r.of_kind("Role") and not r.of_kind("RoleBinding")
    raw = component_config(r, "control")
    cfg = MascotConfig.model_validate(raw)
    assert raw["control"] == {"host": "0.0.0.0", "port": 50061, "reflection": False}
    assert raw["store"] == {"url": "sqlite:////var/lib/mascot/control.db"}
    assert raw["server"]["metrics_port"] == 9465
    assert raw["server"]["speaker_target"] == component_config(r, "gateway")["server"]["speaker_target"]
    assert cfg.adapters.admin_token_file == f"{mounts['admin-token']['mountPath']}/token"
    assert cfg.adapters.store == "pvc://adapters/store"
    assert cfg.adapters.pvc_root == mounts["adapter-store"]["mountPath"]
    assert cfg.training.templates_dir == ("/etc/mascot/training" if training else "")
    # an existing claim instead of the chart's
    own = render({"adapters": {"store": "s3://bucket/prefix"}, "training": {"enabled": training},
                  "controlPlane": {"persistence": {"existingClaim": "audit"}}})
    assert not [p for p in own.of_kind("PersistentVolumeClaim") if p["metadata"]["name"].endswith("-control-data")]
    (data,) = [v for v in own.one("Deployment", "-control")["spec"]["template"]["spec"]["volumes"]
               if v["name"] == "data"]
    assert data["persistentVolumeClaim"]["claimName"] == "audit"


def test_nothing_of_the_control_plane_renders_without_anything_to_administer(rendered):
    for ci in ("minimal.yaml", "cpu-without-kserve.yaml"):
        r = rendered[ci]
        assert not _control_plane(r)
        assert not [o for _, o in r.objects if o["metadata"]["name"].startswith(CONTROL)], ci
        assert "control.yaml" not in r.one("ConfigMap", "-config")["data"]
        assert "-control" not in r.notes


def test_the_ingress_targets_only_the_gateways_public_port(rendered):
    ingresses = [(ci, ing) for ci, r in rendered.items() for ing in r.of_kind("Ingress")]
    assert ingresses
    for ci, ing in ingresses:
        backends = [path["backend"] for rule in ing["spec"]["rules"] for path in rule["http"]["paths"]]
        backends += [ing["spec"]["defaultBackend"]] if "defaultBackend" in ing["spec"] else []
        assert backends and all(b == {"service": {"name": f"{RELEASE}-mascot-gateway", "port": {"name": "grpc"}}}
                                for b in backends), ci
        ports = {p["name"]: p["port"] for p in rendered[ci].one("Service", "-gateway")["spec"]["ports"]}
        assert ports["grpc"] == 50051  # ConversationService; metrics and the control plane stay inside


def test_the_control_plane_is_reached_only_from_its_clients_or_the_namespace(rendered):
    import kubernetes_validate

    full = rendered["full.yaml"]
    policy = full.one("NetworkPolicy", "-control")
    labels = full.one("Deployment", "-control")["spec"]["template"]["metadata"]["labels"]
    selector = policy["spec"]["podSelector"]["matchLabels"]
    assert selector.items() <= labels.items()
    assert not selector.items() <= full.one("Deployment", "-gateway")["spec"]["template"]["metadata"]["labels"].items()
    control_rule, metrics_rule = policy["spec"]["ingress"]
    assert control_rule["ports"] == [{"protocol": "TCP", "port": 50061}]
    release_pods = {"podSelector": {"matchLabels": {"app.kubernetes.io/name": "mascot",
                                                    "app.kubernetes.io/instance": RELEASE},
                                    "matchExpressions": [{"key": "app.kubernetes.io/component", "operator": "In",
                                                          "values": ["training", "test"]}]}}
    clients = load_ci("full.yaml")["controlPlane"]["clients"]
    assert clients and control_rule["from"] == [*clients, release_pods]
    assert metrics_rule == {"ports": [{"protocol": "TCP", "port": 9465}], "from": [
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]}
    # no clients: the release namespace only, never any source
    for values in ({"training": {"enabled": True}}, {"adapters": {"store": "s3://bucket/prefix"},
                                                      "networkPolicy": {"metricsFrom": []}}):
        r = render(values)
        policy = r.one("NetworkPolicy", "-control")
        kubernetes_validate.validate(policy, KUBE_VERSION, strict=True)
        control_rule = policy["spec"]["ingress"][0]
        assert control_rule["from"] == [{"podSelector": {}}]
    # the model services admit the control plane (its promote gate calls the speaker)
    models_rule = full.one("NetworkPolicy", "-models")["spec"]["ingress"][0]
    assert "control" in models_rule["from"][0]["podSelector"]["matchExpressions"][0]["values"]


def test_control_config_names_its_listener_tokens_file_and_jwt(rendered):
    from mascot.core.config import MascotConfig

    r, values = rendered["full.yaml"], load_ci("full.yaml")["controlPlane"]
    spec = r.one("Deployment", "-control")["spec"]["template"]["spec"]
    (vol,) = [v for v in spec["volumes"] if v["name"] == "control-tokens"]
    (mount,) = [m for m in spec["containers"][0]["volumeMounts"] if m["name"] == "control-tokens"]
    # a directory volume, no subPath: an updated Secret reaches the file, which the process re-reads
    assert "subPath" not in mount and mount["readOnly"] is True and mount["mountPath"] == "/etc/mascot/control-tokens"
    assert vol["secret"] == {"secretName": values["tokens"]["existingSecret"], "defaultMode": 0o440,
                             "items": [{"key": "tokens", "path": "tokens"}]}
    raw = component_config(r, "control")
    cfg = MascotConfig.model_validate(raw)
    assert (cfg.control.host, cfg.control.port, cfg.control.reflection) == ("0.0.0.0", 50061, False)
    assert cfg.control.tokens_file == f"{mount['mountPath']}/tokens"
    assert raw["control"]["jwt"] == {"issuer": values["jwt"]["issuer"], "audience": values["jwt"]["audience"],
                                     "jwks_url": values["jwt"]["jwksUrl"], "role_claim": "roles"}
    assert cfg.store.url_file == "/etc/mascot/store/url" and cfg.training.templates_dir == "/etc/mascot/training"
    assert raw["server"]["metrics_port"] == 9465 and "gateway_port" not in raw["server"]
    gateway = component_config(r, "gateway")
    assert "control" not in gateway and "training" not in gateway
    # the listeners' reflection follows their values; controlPlane.config wins over the chart's keys
    r = render({"training": {"enabled": True}, "gateway": {"reflection": False},
                "controlPlane": {"reflection": True, "config": {"control": {"reload_s": 5}}}})
    assert component_config(r, "gateway")["server"]["reflection"] is False
    control = MascotConfig.model_validate(component_config(r, "control")).control
    assert control.reflection is True and control.reload_s == 5 and not control.tokens_file and not control.jwt.issuer
    assert "jwt" not in component_config(r, "control")["control"]


def test_control_plane_values_that_cannot_work_are_refused():
    rejected({"controlPlane": {"jwt": {"issuer": "https://idp.example.com/", "jwksUrl": "https://idp/jwks"}}},
             "/controlPlane/jwt/audience", "minLength")
    rejected({"controlPlane": {"jwt": {"issuer": "https://idp.example.com/", "audience": "mascot"}}},
             "/controlPlane/jwt/jwksUrl", "minLength")
    rejected({"controlPlane": {"replicaCount": 2}}, "/controlPlane/replicaCount", "maximum")  # SQLite
    rejected({"controlPlane": {"tokens": {"existingSecret": "t", "tokens": "ops:admin=secret"}}},
             "/controlPlane/tokens", "tokens")
    rejected({"controlPlane": {"tokens": {"existingSecret": "Bad_Name!"}}}, "/controlPlane/tokens/existingSecret",
             "pattern")
    r = render({"store": {"type": "postgresql", "postgresql": {"existingSecret": "pg"}}, "training": {"enabled": True},
                "controlPlane": {"replicaCount": 2}})
    dep = r.one("Deployment", "-control")
    assert dep["spec"]["replicas"] == 2 and dep["spec"]["strategy"]["type"] == "RollingUpdate"
    assert not [p for p in r.of_kind("PersistentVolumeClaim") if p["metadata"]["name"].endswith("-control-data")]


@pytest.mark.parametrize("ci", CI_IDS)
def test_no_secret_reaches_a_container_as_an_env_var(rendered, ci):
    """The PostgreSQL URL, the admin token and every other Secret are mounted files, never env vars."""
    for _, obj in rendered[ci].objects:
        for where, spec in pod_specs(obj):
            for c in spec["containers"] + spec.get("initContainers", []):
                env = {e["name"]: e for e in c.get("env", [])}
                assert not {"MASCOT_STORE__URL", "MASCOT_ADMIN_TOKEN"} & set(env), where
                assert not [e for e in env.values() if "secretKeyRef" in e.get("valueFrom", {})], where
                assert not [e for e in c.get("envFrom", []) if "secretRef" in e], where


def test_model_rest_inference_reads_its_token_from_a_mounted_secret(rendered):
    full = rendered["full.yaml"]
    secret = load_ci("full.yaml")["models"]["restAuth"]["existingSecret"]
    for comp in full.services:
        predictor = full.one("InferenceService", f"-{comp}")["spec"]["predictor"]
        (vol,) = [v for v in predictor["volumes"] if v["name"] == "rest-token"]
        (mount,) = [m for m in predictor["containers"][0]["volumeMounts"] if m["name"] == "rest-token"]
        assert vol["secret"] == {"secretName": secret, "defaultMode": 0o440, "items": [{"key": "token",
                                                                                     "path": "token"}]}
        assert component_config(full, comp)["server"]["rest_token_file"] == f"{mount['mountPath']}/token"
    for comp in ("gateway", "control"):
        assert "rest_token_file" not in component_config(full, comp)["server"]
    # off by default: REST inference is admitted from networkPolicy.metricsFrom only
    minimal = rendered["minimal.yaml"]
    assert "rest_token_file" not in component_config(minimal, "generation")["server"]
    predictor = minimal.one("InferenceService", "-generation")["spec"]["predictor"]
    assert "rest-token" not in {v["name"] for v in predictor["volumes"]}
    # the Deployment form mounts it the same way
    r = render({"kserve": {"enabled": False}, "model": {"storageUri": ""}, "reward": {"storageUri": ""},
                "models": {"restAuth": {"existingSecret": "rest", "key": "bearer"}}})
    for comp in r.services:
        spec = r.one("Deployment", f"-{comp}")["spec"]["template"]["spec"]
        (vol,) = [v for v in spec["volumes"] if v["name"] == "rest-token"]
        assert vol["secret"]["items"] == [{"key": "bearer", "path": "token"}]


def test_notes_send_admin_commands_to_the_control_plane(rendered):
    notes = rendered["full.yaml"].notes
    assert f"port-forward svc/{CONTROL} 50061" in notes
    admin = [line.strip() for line in notes.splitlines() if "mascot adapters" in line or "mascot retrain" in line]
    assert len(admin) == 2 and all("--target 127.0.0.1:50061" in line for line in admin), admin
    plain = rendered["external-postgresql.yaml"].notes  # no TLS: the commands as the CLI takes them
    (line,) = [line.strip() for line in plain.splitlines() if "mascot adapters" in line]
    cli_accepts(line.replace("<your control token>", "token").split()[1:])
    assert f"Control plane (AdapterService, TrainingService; ClusterIP only, never behind the Ingress): " \
           f"{CONTROL}:50061" in notes
    assert "mascot retrain" not in rendered["external-postgresql.yaml"].notes  # adapters only, no training


# ----------------------------------------------------------------------------------------------- the gateway
def test_sqlite_gateway_is_one_replica_recreated_on_its_own_volume(rendered):
    r = rendered["minimal.yaml"]
    dep = r.one("Deployment", "-gateway")
    assert dep["spec"]["replicas"] == 1 and dep["spec"]["strategy"] == {"type": "Recreate"}
    pvc = r.one("PersistentVolumeClaim", "-gateway-data")
    volumes = {v["name"]: v for v in dep["spec"]["template"]["spec"]["volumes"]}
    assert volumes["data"]["persistentVolumeClaim"]["claimName"] == pvc["metadata"]["name"]
    assert pvc["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    assert component_config(r, "gateway")["store"]["url"] == "sqlite:////var/lib/mascot/mascot.db"
    assert r.one("PodDisruptionBudget", "-gateway")["spec"]["maxUnavailable"] == 1
    assert not r.of_kind("Job")  # SQLite: the gateway migrates its own file


def test_postgresql_gateway_scales_and_reads_its_url_from_the_secret(rendered):
    r = rendered["external-postgresql.yaml"]
    dep = r.one("Deployment", "-gateway")
    assert dep["spec"]["replicas"] == 3 and dep["spec"]["strategy"]["type"] == "RollingUpdate"
    (c,) = dep["spec"]["template"]["spec"]["containers"]
    assert not {"MASCOT_STORE__URL", "MASCOT_STORE__URL_FILE"} & {e["name"] for e in c["env"]}
    # the URL (it holds the password) is a file of the Secret, named by store.url_file; never in the ConfigMap
    for workload in ("gateway", "control"):
        spec = r.one("Deployment", f"-{workload}")["spec"]["template"]["spec"]
        (vol,) = [v for v in spec["volumes"] if v["name"] == "store-url"]
        (mount,) = [m for m in spec["containers"][0]["volumeMounts"] if m["name"] == "store-url"]
        assert vol["secret"] == {"secretName": "mascot-postgresql", "defaultMode": 0o440,
                                 "items": [{"key": "url", "path": "url"}]}
        assert mount["readOnly"] is True and "subPath" not in mount
        assert component_config(r, workload)["store"] == {"url_file": f"{mount['mountPath']}/url"}
    assert not [p for p in r.of_kind("PersistentVolumeClaim") if p["metadata"]["name"].endswith("-gateway-data")]
    assert c["command"] + c["args"] == ["mascot", "serve", "--component", "gateway"]
    probes = [c[p]["grpc"]["port"] for p in ("startupProbe", "readinessProbe", "livenessProbe")]
    assert probes == [50051] * 3
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports == {"grpc": 50051, "metrics": 9464}


def test_admin_token_and_tls_are_secrets_referenced_by_name(rendered):
    r = rendered["full.yaml"]
    spec = r.one("Deployment", "-control")["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["admin-token"]["secret"]["secretName"] == "mascot-admin-token"
    assert volumes["tls"]["secret"]["secretName"] == "mascot-tls"
    mounts = {m["name"]: m["mountPath"] for m in spec["containers"][0]["volumeMounts"]}
    assert component_config(r, "control")["adapters"]["admin_token_file"] == mounts["admin-token"] + "/token"
    gateway = r.one("Deployment", "-gateway")["spec"]["template"]["spec"]
    assert volumes["tls"] == {v["name"]: v for v in gateway["volumes"]}["tls"]
    for isvc in r.of_kind("InferenceService"):
        assert {v["name"] for v in isvc["spec"]["predictor"]["volumes"]} >= {"tls"}
    ingress = r.one("Ingress", "-gateway")
    assert ingress["spec"]["tls"] == [{"hosts": ["mascot.example.com"], "secretName": "mascot-ingress-tls"}]
    assert not r.of_kind("Secret") and not any(r2.of_kind("Secret") for r2 in [rendered["minimal.yaml"]])


# ----------------------------------------------------------------------------------------------- model services
def test_model_services_are_raw_kserve_inference_services_on_a100s(rendered):
    r = rendered["full.yaml"]
    isvcs = {o["metadata"]["name"].rsplit("-", 1)[1]: o for o in r.of_kind("InferenceService")}
    assert set(isvcs) == set(MODEL_COMPONENTS)
    for comp, isvc in isvcs.items():
        assert isvc["metadata"]["annotations"]["serving.kserve.io/deploymentMode"] == "RawDeployment"
        p = isvc["spec"]["predictor"]
        (c,) = p["containers"]
        assert c["name"] == "kserve-container"  # KServe's storage initializer targets this name
        port = load_ci("full.yaml").get(comp, {}).get("grpcPort") or {"director": 50061, "speaker": 50062,
                                                                        "judge": 50063, "reward": 50064}[comp]
        assert c["command"] + c["args"] == ["mascot", "serve-model", comp, "--port", str(port),
                                            "--rest-port", "8080", "--host", "0.0.0.0"]
        assert [(x["name"], x["containerPort"]) for x in c["ports"]] == [("http", 8080), ("grpc", port)]
        env = {e["name"]: e.get("value") for e in c["env"]}
        assert env["STORAGE_URI"].startswith("s3://mascot-models/") and env["PROTOCOL"] == "v2"
        assert env["MASCOT_CONFIG"] == f"/etc/mascot/config/{comp}.yaml"
        assert c["resources"]["limits"]["nvidia.com/gpu"] == "1" == c["resources"]["requests"]["nvidia.com/gpu"]
        assert p["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}
        assert p["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
        sp = c["startupProbe"]
        assert sp["httpGet"]["path"] == "/v2/health/live"
        assert sp["periodSeconds"] * sp["failureThreshold"] >= 15 * 60, "8B models: download, load, CUDA graphs"
        # TLS is on in full.yaml: kubelet grpc probes cannot do TLS (test_helm_tls.py)
        assert c["readinessProbe"]["exec"]["command"][:4] == ["mascot", "health", "--port", str(port)]
        assert p["automountServiceAccountToken"] is False
        assert {m["mountPath"] for m in c["volumeMounts"]} >= {"/dev/shm", "/etc/mascot/config"}
        cfg = component_config(r, comp)
        if comp == "reward":
            assert cfg["reward"]["model"] == "/mnt/models"
        else:
            assert cfg["engine"] == {"kind": "vllm", "dtype": "bfloat16", "model": "/mnt/models",
                                     "tensor_parallel_size": 1}  # gpu.count 1
    speaker = isvcs["speaker"]
    assert speaker["metadata"]["annotations"]["serving.kserve.io/autoscalerClass"] == "hpa"
    assert (speaker["spec"]["predictor"]["minReplicas"], speaker["spec"]["predictor"]["maxReplicas"]) == (2, 4)
    assert isvcs["director"]["metadata"]["annotations"]["serving.kserve.io/autoscalerClass"] == "none"
    assert component_config(r, "director")["director"] == {"max_retries": 1}  # a component's own config
    assert "director" not in component_config(r, "speaker")


def test_without_kserve_model_services_are_deployments_with_services_on_cpu(rendered):
    r = rendered["cpu-without-kserve.yaml"]
    assert not r.of_kind("InferenceService")
    assert r.services == ["generation", "reward"]
    for comp in r.services:
        dep, svc = r.one("Deployment", f"-{comp}"), r.one("Service", f"-{comp}")
        assert dep["spec"]["selector"]["matchLabels"] == svc["spec"]["selector"]
        (c,) = dep["spec"]["template"]["spec"]["containers"]
        assert c["image"].endswith("-cpu") and "nvidia.com/gpu" not in c["resources"]["limits"]
        assert "nodeSelector" not in dep["spec"]["template"]["spec"]
        assert "STORAGE_URI" not in {e["name"] for e in c["env"]}
        assert ("engine" not in component_config(r, comp)
                or "model" not in component_config(r, comp)["engine"])  # the tiny model
    gw = component_config(r, "gateway")["server"]
    generation = f"dns:///{RELEASE}-mascot-generation-headless.{NAMESPACE}.svc.cluster.local:50060"
    assert gw["director_target"] == gw["speaker_target"] == generation
    per_component = render({**load_ci("cpu-without-kserve.yaml"), "generation": {"enabled": False}})
    assert not per_component.of_kind("InferenceService")
    gw = component_config(per_component, "gateway")["server"]
    assert gw["director_target"] == f"dns:///{RELEASE}-mascot-director-headless.{NAMESPACE}.svc.cluster.local:50061"
    assert gw["speaker_target"] == f"dns:///{RELEASE}-mascot-speaker-headless.{NAMESPACE}.svc.cluster.local:50062"
    # the model storage of the service that serves the speaker, mounted from its PVC
    for generation_on, serving in ((True, "generation"), (False, "speaker")):
        r2 = render({"kserve": {"enabled": False}, "model": {"storageUri": "pvc://models/qwen3-8b"},
                     "reward": {"storageUri": "pvc://models/reward"}, "generation": {"enabled": generation_on}})
        assert r2.service_of("speaker") == serving
        spec = r2.one("Deployment", f"-{serving}")["spec"]["template"]["spec"]
        (mount,) = [m for m in spec["containers"][0]["volumeMounts"] if m["name"] == "model"]
        (vol,) = [v for v in spec["volumes"] if v["name"] == "model"]
        assert (mount["mountPath"], mount["subPath"], vol["persistentVolumeClaim"]["claimName"]) == (
            "/mnt/models", "qwen3-8b", "models")


@pytest.mark.parametrize("ci", CI_IDS)
def test_gateway_targets_the_model_services_the_chart_renders(rendered, ci):
    r = rendered[ci]
    server = component_config(r, "gateway")["server"]
    for comp in ("director", "speaker"):
        # the headless Service of the model service that serves the component (the generation service when it hosts
        # it; tests/contract/test_helm_balancing.py: its selector and port)
        svc = r.service_of(comp)
        assert svc == ("director" if ci == "full.yaml" and comp == "director" else
                       "speaker" if ci == "full.yaml" else "generation")
        host, port = server[f"{comp}_target"].removeprefix("dns:///").rsplit(":", 1)
        headless = r.one("Service", f"-{svc}-headless")
        assert headless["spec"]["clusterIP"] == "None"
        assert host == f"{headless['metadata']['name']}.{NAMESPACE}.svc.cluster.local"
        if r.of_kind("InferenceService"):
            (c,) = r.one("InferenceService", f"-{svc}")["spec"]["predictor"]["containers"]
        else:
            (c,) = r.one("Deployment", f"-{svc}")["spec"]["template"]["spec"]["containers"]
        assert ("grpc", int(port)) in [(p["name"], p["containerPort"]) for p in c["ports"]]
        assert int(port) == r.effective[svc]["grpcPort"]
        assert comp in c["args"][0].split(","), "the service the target names serves the component"


# ---------------------------------------------------------------------------------------------- contracts with the code
@pytest.mark.parametrize("ci", CI_IDS)
def test_every_component_config_is_a_valid_mascot_config(rendered, ci):
    from mascot.core.config import MascotConfig

    cm = rendered[ci].one("ConfigMap", "-config")
    # one file per workload: the gateway's, the control plane's (when it renders) and each model service's (none for
    # a component the generation service hosts: its config is merged into generation.yaml)
    control = ["control"] if _control_plane(rendered[ci]) else []
    assert sorted(cm["data"]) == sorted(f"{s}.yaml" for s in ("gateway", *control, *rendered[ci].services))
    for key, text in cm["data"].items():
        cfg = MascotConfig.model_validate(yaml.safe_load(text) or {})
        assert cfg.server.host == "0.0.0.0", key
        if cfg.adapters.store.startswith("pvc://"):
            assert cfg.adapters.pvc_root == "/mnt/adapter-store"
    # each pod reads the file of its own component
    for _, obj in rendered[ci].objects:
        for where, spec in pod_specs(obj):
            for c in spec["containers"]:
                env = {e["name"]: e.get("value") for e in c.get("env", [])}
                if "MASCOT_CONFIG" in env:
                    assert env["MASCOT_CONFIG"].removeprefix("/etc/mascot/config/") in cm["data"], where


def test_personas_configmap_holds_valid_cards_the_config_names(rendered, tmp_path):
    from mascot.core.personas import load_persona_file

    r = rendered["full.yaml"]
    cm = r.one("ConfigMap", "-personas")
    for name, text in cm["data"].items():
        (tmp_path / name).write_text(text)
        assert [c.id for c in load_persona_file(tmp_path / name)] == ["night_owl"]
    assert component_config(r, "speaker")["personas"] == {"extra_files": ["/etc/mascot/personas/night-owl.yaml"],
                                                  "active_support": ["anchor", "catalyst", "beacon"]}
    assert rendered["minimal.yaml"].one("ConfigMap", "-personas")["data"] == {}


def test_cli_check_rejects_what_the_cli_rejects():
    with pytest.raises(Exception, match="No such option"):
        cli_accepts(["serve", "--component", "gateway", "--no-such-flag"])
    with pytest.raises(AssertionError, match="no command"):
        cli_accepts(["serve-models", "director"])
    cli_accepts(["train", "collaborative", "--config", "x.yaml", "--out", "runs/x"])


@pytest.mark.parametrize("ci", CI_IDS)
def test_the_chart_runs_commands_the_cli_has(rendered, ci):
    seen = set()
    for _, obj in rendered[ci].objects:
        for where, spec in pod_specs(obj):
            for c in spec["containers"]:
                argv = c.get("command", []) + c.get("args", [])
                if argv[:1] == ["mascot"]:
                    argv = argv[1:]
                elif argv[:1] in (["torchrun"], ["accelerate"]):
                    argv = argv[argv.index("mascot.cli") + 1:]
                else:
                    continue
                cli_accepts([a.replace("$(MASCOT_RUN_ID)", "run-1") for a in argv])
                seen.add(argv[0])
    assert {"serve", "serve-model"} <= seen


def test_migrations_hook_runs_alembic_to_head(rendered, tmp_path):
    r = rendered["external-postgresql.yaml"]
    job = r.one("Job", "-migrations")
    for obj in (job, r.one("ConfigMap", "-migrations"), r.one("ServiceAccount", "-migrations")):
        assert obj["metadata"]["annotations"]["helm.sh/hook"] == "pre-install,pre-upgrade"
    weights = [int(o["metadata"]["annotations"]["helm.sh/hook-weight"])
               for o in (r.one("ServiceAccount", "-migrations"), r.one("ConfigMap", "-migrations"), job)]
    assert weights == sorted(weights), "the account and the config exist before the Job"
    spec = job["spec"]["template"]["spec"]
    (c,) = spec["containers"]
    env = {e["name"]: e for e in c["env"]}
    assert "MASCOT_STORE__URL" not in env  # the URL holds the password: a Secret file, never an env var
    (vol,) = [v for v in spec["volumes"] if v["name"] == "store-url"]
    (url_mount,) = [m for m in c["volumeMounts"] if m["name"] == "store-url"]
    assert vol["secret"]["secretName"] == "mascot-postgresql" and vol["secret"]["items"] == [{"key": "url",
                                                                                              "path": "url"}]
    assert env["MASCOT_STORE__URL_FILE"]["value"] == f"{url_mount['mountPath']}/url"
    # run the hook's command with its alembic.ini against a SQLite file (PostgreSQL: tests/integration), the URL
    # read from a file as the pod reads the mounted Secret
    ini = r.one("ConfigMap", "-migrations")["data"]["alembic.ini"]
    (mount,) = [m["mountPath"] for m in c["volumeMounts"] if m["name"] == "alembic"]
    argv = [a.replace(mount, str(tmp_path)) for a in c["command"]]
    (tmp_path / "alembic.ini").write_text(ini)
    db = tmp_path / "store.db"
    (tmp_path / "url").write_text(f"sqlite:///{db}\n")
    alembic = Path(sys.executable).parent / argv[0]
    need(alembic.exists(), "alembic is installed with the package")
    p = subprocess.run([str(alembic), *argv[1:]], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                       env={"MASCOT_STORE__URL_FILE": str(tmp_path / "url"), "PATH": str(alembic.parent),
                            "PYTHONDONTWRITEBYTECODE": "1", "HOME": str(tmp_path)})
    assert p.returncode == 0, p.stderr[-2000:]
    import sqlite3

    with sqlite3.connect(db) as conn:
        tables = {t for (t,) in conn.execute("select name from sqlite_master where type = 'table'")}
    assert {"alembic_version", "conversations", "turns", "rounds"} <= tables
    assert not rendered["minimal.yaml"].of_kind("Job")


# ----------------------------------------------------------------------------------------------- helm test
def _health_server(status_by_service: dict):
    import grpc
    from grpc_health.v1 import health, health_pb2_grpc

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    servicer = health.HealthServicer()
    for service, status in status_by_service.items():
        servicer.set(service, status)
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return server, f"127.0.0.1:{port}"


@pytest.mark.parametrize("ci", CI_IDS)
def test_helm_test_pod_checks_the_grpc_health_of_every_component(rendered, ci):
    r = rendered[ci]
    pod = r.one("Pod", "-test-health")
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    (c,) = pod["spec"]["containers"]
    assert c["command"] == ["mascot", "health"]
    cli_accepts(c["command"][1:] + c["args"])
    assert c["args"][:2] == ["--timeout", str(r.values.get("tests", {}).get("timeoutSeconds", 10))]
    flags, targets = c["args"][2::2], c["args"][3::2]
    assert set(flags) == {"--target"}
    # the gateway, the control plane when it renders, then each model service once, through its headless Service
    expected = [f"{RELEASE}-mascot-gateway:50051"] + ([f"{RELEASE}-mascot-control:50061"] if _control_plane(r) else [])
    for svc in r.services:
        host = r.one("Service", f"-{svc}-headless")["metadata"]["name"]
        port = {"generation": 50060, "director": 50061, "speaker": 50062, "judge": 50063, "reward": 50064}[svc]
        expected.append(f"dns:///{host}.{NAMESPACE}.svc.cluster.local:{port}")
    assert targets == expected
    assert len(targets) == len(set(targets))
    server = component_config(r, "gateway")["server"]
    for comp in ("director", "speaker"):  # the gateway's clients are among the checked targets
        assert server[f"{comp}_target"] == expected[-len(r.services) + r.services.index(r.service_of(comp))]


def test_helm_test_command_passes_only_when_every_target_is_serving(rendered, tmp_path):
    """The Pod's own command and arguments (`mascot health --timeout T --target ...`), run as a subprocess with its
    targets pointed at local servers and its MASCOT_CONFIG at the rendered gateway.yaml (plaintext here; TLS and
    mutual TLS: test_helm_tls.py)."""
    from grpc_health.v1 import health_pb2

    r = rendered["minimal.yaml"]
    (c,) = r.one("Pod", "-test-health")["spec"]["containers"]
    env = {e["name"]: e["value"] for e in c["env"]}
    assert env["MASCOT_CONFIG"] == "/etc/mascot/config/gateway.yaml"
    serving, ok = _health_server({"": health_pb2.HealthCheckResponse.SERVING})
    starting, not_yet = _health_server({"": health_pb2.HealthCheckResponse.NOT_SERVING})
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        closed = f"127.0.0.1:{s.getsockname()[1]}"
    config = tmp_path / "gateway.yaml"
    config.write_text(r.one("ConfigMap", "-config")["data"]["gateway.yaml"])

    def run(*targets: str) -> subprocess.CompletedProcess:
        args = c["args"][:2] + [a for t in targets for a in ("--target", t)]
        return subprocess.run([sys.executable, "-m", "mascot.cli", *c["command"][1:], *args], capture_output=True,
                              text=True, timeout=60, env={"PATH": "/usr/bin:/bin", "MASCOT_CONFIG": str(config)})

    try:
        good = run(ok, ok)
        assert good.returncode == 0 and good.stdout.count("SERVING") == 2, good.stdout + good.stderr
        bad = run(ok, not_yet, closed)
        assert bad.returncode == 1
        assert f"{not_yet} NOT_SERVING" in bad.stdout and f"{closed} UNAVAILABLE" in bad.stdout
        assert len(bad.stderr.strip().splitlines()) == 1 and "not serving" in bad.stderr
    finally:
        serving.stop(0)
        starting.stop(0)


# ----------------------------------------------------------------------------------------------- training
def test_training_job_templates_run_each_phase_with_the_run_id_as_job_name(rendered):
    from mascot_training.collaborative.config import CollaborativeConfig
    from mascot_training.persona.config import PersonaAlignmentConfig

    r = rendered["full.yaml"]
    jobs = training_templates(r)
    assert set(jobs) == {"persona-alignment", "collaborative"}
    for phase, job in jobs.items():
        assert job["metadata"]["name"] == f"{RELEASE}-mascot-{phase}"  # the prefix; jobs.py appends the run id
        spec = job["spec"]["template"]["spec"]
        (c,) = spec["containers"]
        assert c["command"] == ["torchrun"]
        assert c["args"][:5] == ["--standalone", "--nnodes=1", "--nproc-per-node=4", "-m", "mascot.cli"]
        assert c["args"][5:] == ["train", phase, "--config", "/etc/mascot/run/run.yaml",
                                 "--out", f"/runs/{phase}/$(MASCOT_RUN_ID)"]
        env = {e["name"]: e for e in c["env"]}
        assert env["MASCOT_RUN_ID"]["valueFrom"]["fieldRef"]["fieldPath"] == \
            "metadata.labels['batch.kubernetes.io/job-name']"
        assert "MASCOT_ADMIN_TOKEN" not in env  # the admin token is a file of the Secret (publish.token_file)
        (token,) = [v for v in spec["volumes"] if v["name"] == "admin-token"]
        (token_mount,) = [m for m in c["volumeMounts"] if m["name"] == "admin-token"]
        assert token["secret"]["secretName"] == "mascot-admin-token" and token_mount["readOnly"] is True
        assert c["resources"]["limits"]["nvidia.com/gpu"] == "4"
        assert spec["restartPolicy"] == "OnFailure" and spec["serviceAccountName"] == f"{RELEASE}-mascot-training"
        volumes = {v["name"]: v for v in spec["volumes"]}
        assert volumes["run-config"]["configMap"]["name"] == f"{RELEASE}-mascot-training-{phase}"
        assert volumes["runs"]["persistentVolumeClaim"]["claimName"] == f"{RELEASE}-mascot-training-runs"
        run_cfg = yaml.safe_load(r.one("ConfigMap", f"-training-{phase}")["data"]["run.yaml"])
        model = PersonaAlignmentConfig if phase == "persona-alignment" else CollaborativeConfig
        # training runs publish to the control plane, never to the public gateway, with the mounted admin token
        assert run_cfg["publish"] == {"gateway": f"{RELEASE}-mascot-control:50061",
                                      "token_file": f"{token_mount['mountPath']}/token"}
        cfg = model.model_validate(run_cfg)
        assert cfg.publish.gateway == f"{RELEASE}-mascot-control:50061"
        assert cfg.model.startswith("/models/") and str(cfg.data.situations).startswith("/data/")
    # the CronJob runs the same Job spec as the template
    (cron,) = r.of_kind("CronJob")
    assert cron["spec"]["concurrencyPolicy"] == "Forbid" and cron["spec"]["schedule"] == "0 3 * * 0"
    assert cron["spec"]["jobTemplate"]["spec"] == jobs["persona-alignment"]["spec"]
    assert len(cron["metadata"]["name"]) <= 52
    # the control plane mounts the templates and the run volume (read-only); the gateway neither
    control = r.one("Deployment", "-control")["spec"]["template"]["spec"]
    mounts = {m["name"]: m for m in control["containers"][0]["volumeMounts"]}
    assert mounts["training-templates"]["mountPath"] == "/etc/mascot/training" and mounts["runs"]["readOnly"]
    assert component_config(r, "control")["training"] == {"templates_dir": "/etc/mascot/training"}
    gw = r.one("Deployment", "-gateway")["spec"]["template"]["spec"]
    assert not {"training-templates", "runs", "admin-token"} & {v["name"] for v in gw["volumes"]}


@pytest.mark.parametrize("launcher,command,head", [
    ("none", ["mascot", "train", "collaborative"], ["--config"]),
    ("accelerate", ["accelerate"], ["launch", "--num_processes=2", "--num_machines=1", "--multi_gpu", "-m",
                                    "mascot.cli", "train", "collaborative", "--config"]),
])
def test_training_launchers(launcher, command, head):
    r = render({"training": {"enabled": True, "launcher": launcher, "gpu": {"enabled": True, "count": 2}}})
    (c,) = training_templates(r)["collaborative"]["spec"]["template"]["spec"]["containers"]
    assert c["command"] == command and c["args"][:len(head)] == head
    assert not r.of_kind("CronJob")


# ----------------------------------------------------------------------------------------------- restarts on change
def _merged(values: dict, extra: dict) -> dict:
    from mascot.core.config import deep_merge

    return deep_merge(copy.deepcopy(values), extra)


def _pod_templates(r) -> dict[str, dict]:
    """component -> {"metadata": labels and annotations, "spec": ...} of the pods of the gateway, the control plane
    and every model service (an InferenceService predictor, whose labels and annotations KServe puts on its pods, or
    a Deployment)."""
    out = {}
    for _, obj in r.objects:
        comp = obj["metadata"]["labels"]["app.kubernetes.io/component"]
        if obj["kind"] == "Deployment":
            out[comp] = obj["spec"]["template"]
        elif obj["kind"] == "InferenceService":
            p = obj["spec"]["predictor"]
            out[comp] = {"metadata": {"labels": p["labels"], "annotations": p["annotations"]},
                         "spec": {k: v for k, v in p.items() if k not in ("labels", "annotations")}}
    return out


@pytest.mark.parametrize("ci", ["full.yaml", "cpu-without-kserve.yaml", "minimal.yaml"])
@pytest.mark.parametrize("changed", ["gateway", "director"])
def test_a_components_config_change_restarts_only_that_component(rendered, ci, changed):
    """checksum/config covers only the file of the workload that reads it: a gateway-only change leaves the GPU
    services' pods as they were; a director-only change restarts the director alone (full.yaml: one service per
    component), or, where the generation service hosts the director, the generation service alone (its
    generation.yaml merges director.config)."""
    before_r = rendered[ci]
    restarted = "gateway" if changed == "gateway" else before_r.service_of(changed)
    if changed == "director":
        assert restarted == ("director" if ci == "full.yaml" else "generation")
    after_r = render(_merged(load_ci(ci), {changed: {"config": {"server": {"call_timeout_s": 42}}}}))
    assert component_config(after_r, restarted)["server"]["call_timeout_s"] == 42
    others = [f for f in after_r.one("ConfigMap", "-config")["data"] if f != f"{restarted}.yaml"]
    assert others and all(component_config(after_r, f.removesuffix(".yaml"))
                          == component_config(before_r, f.removesuffix(".yaml"))
                          for f in others), "only the file of the restarted workload changes"
    before, after = _pod_templates(before_r), _pod_templates(after_r)
    control = {"control"} if _control_plane(before_r) else set()
    assert set(before) == set(after) == {"gateway", *control, *before_r.services}
    for comp, template in before.items():
        annotations = template["metadata"]["annotations"]
        assert {"checksum/config", "checksum/personas"} <= set(annotations), comp
        if comp == restarted:
            new = after[comp]["metadata"]["annotations"]
            assert new["checksum/config"] != annotations["checksum/config"]
            assert new["checksum/personas"] == annotations["checksum/personas"]
        else:
            assert after[comp] == template, f"a {changed}-only config change would restart {comp}"
    if before_r.values.get("training", {}).get("enabled"):
        assert training_templates(after_r) == training_templates(before_r)


def test_a_persona_change_restarts_every_component_that_reads_personas(rendered):
    """The gateway, the control plane and the four model services load the persona catalog once at start (training
    Jobs do not mount it): a card's change restarts exactly those pods, through checksum/personas only."""
    values = copy.deepcopy(load_ci("full.yaml"))
    values["personas"]["sets"]["night-owl.yaml"]["personas"][0]["goal"] = "Keep the user company, one question a time."
    before_r, after_r = rendered["full.yaml"], render(values)
    assert before_r.one("ConfigMap", "-personas")["data"] != after_r.one("ConfigMap", "-personas")["data"]
    before, after = _pod_templates(before_r), _pod_templates(after_r)
    reads_personas = {"gateway", "control", *before_r.services}
    assert set(before) == reads_personas == {"gateway", "control", *MODEL_COMPONENTS}  # full.yaml: per component
    for comp, template in before.items():
        old, new = template["metadata"]["annotations"], after[comp]["metadata"]["annotations"]
        assert new["checksum/personas"] != old["checksum/personas"], comp
        assert new["checksum/config"] == old["checksum/config"], comp
        same = copy.deepcopy(after[comp])
        same["metadata"]["annotations"]["checksum/personas"] = old["checksum/personas"]
        assert same == template, f"{comp}: only checksum/personas may change"
    assert training_templates(after_r) == training_templates(before_r)
    assert after_r.of_kind("CronJob") == before_r.of_kind("CronJob")


def test_job_template_changes_restart_the_control_plane_and_phase_config_changes_restart_nothing(rendered):
    """The control plane's TrainingService loads the Job templates once at start (checksum/training-templates); a
    Job reads its phase config from its own ConfigMap when it starts, so a phase config change restarts no running
    pod. The gateway has nothing to do with training: it never restarts for it."""
    values, before_r = load_ci("full.yaml"), rendered["full.yaml"]
    before = _pod_templates(before_r)
    assert "checksum/training-templates" in before["control"]["metadata"]["annotations"]
    assert "checksum/training-templates" not in before["gateway"]["metadata"]["annotations"]
    no_training = _pod_templates(rendered["external-postgresql.yaml"])  # a control plane for adapters only
    assert "checksum/training-templates" not in no_training["control"]["metadata"]["annotations"]
    resized = render(_merged(values, {"training": {"resources": {"limits": {"memory": "128Gi"}}}}))
    after = _pod_templates(resized)
    assert training_templates(resized) != training_templates(before_r)
    old, new = before["control"]["metadata"]["annotations"], after["control"]["metadata"]["annotations"]
    assert new["checksum/training-templates"] != old["checksum/training-templates"]
    assert {k: v for k, v in new.items() if k != "checksum/training-templates"} == {
        k: v for k, v in old.items() if k != "checksum/training-templates"}
    assert set(after) == set(before) == {"gateway", "control", *before_r.services}
    assert all(after[comp] == before[comp] for comp in ("gateway", *before_r.services))
    phase = render(_merged(values, {"training": {"phases": {"collaborative": {"config": {"max_model_len": 2048}}}}}))
    assert _pod_templates(phase) == before
    jobs, old_jobs = training_templates(phase), training_templates(before_r)
    run_config = {name: job["spec"]["template"]["metadata"]["annotations"]["checksum/run-config"]
                  for name, job in jobs.items()}
    assert run_config["collaborative"] != old_jobs["collaborative"]["spec"]["template"]["metadata"]["annotations"][
        "checksum/run-config"]
    assert jobs["persona-alignment"] == old_jobs["persona-alignment"]


# ----------------------------------------------------------------------------------------------- extension points
EXTENSIONS = {
    "extraEnv": [{"name": "EXTRA_FLAG", "value": "1"},
                 {"name": "EXTRA_SECRET", "valueFrom": {"secretKeyRef": {"name": "extra", "key": "token"}}}],
    "extraVolumes": [{"name": "extra", "configMap": {"name": "extra-files"}}],
    "extraVolumeMounts": [{"name": "extra", "mountPath": "/etc/extra", "readOnly": True}],
    # the chart's own labels win over podLabels (selectors and budgets keep matching)
    "podLabels": {"example.com/team": "ml", "app.kubernetes.io/component": "not-mine"},
    "podAnnotations": {"example.com/owner": "ml-platform"},
    "priorityClassName": "mascot-critical",
    "runtimeClassName": "nvidia",
    "topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone",
                                   "whenUnsatisfiable": "ScheduleAnyway"}],
}
#: Workloads with the extension points ("models": every model service rendered, the generation service or each
#: component's; training: its Job templates and CronJob, one pod per Job, so no spread).
EXTENDED = {field: ("gateway", "control", "models") + (() if field == "topologySpreadConstraints" else ("training",))
            for field in EXTENSIONS}
#: The values key of a workload whose key is not its component name.
VALUES_KEY = {"control": "controlPlane"}


def _extended_pods(r) -> list[tuple[str, str, dict, dict]]:
    """(component, where, pod metadata, pod spec) of every workload with extension points."""
    pods = [(comp, f"pods of {comp}", t["metadata"], t["spec"]) for comp, t in _pod_templates(r).items()]
    for phase, job in training_templates(r).items():
        t = job["spec"]["template"]
        pods.append(("training", f"Job template {phase}", t["metadata"], t["spec"]))
    for cron in r.of_kind("CronJob"):
        t = cron["spec"]["jobTemplate"]["spec"]["template"]
        pods.append(("training", "CronJob", t["metadata"], t["spec"]))
    return pods


@pytest.mark.parametrize("generation", [True, False], ids=["generation", "per-component"])
@pytest.mark.parametrize("kserve", [True, False], ids=["kserve", "without-kserve"])
@pytest.mark.parametrize("field", sorted(EXTENSIONS))
def test_extension_points_render_in_every_pod_they_are_set_for(crd_validators, field, kserve, generation):
    import kubernetes_validate

    value = EXTENSIONS[field]
    services = model_services({"generation": {"enabled": generation}})
    assert services == (["generation", "reward"] if generation else list(MODEL_COMPONENTS))
    owners = [w for o in EXTENDED[field] for w in (services if o == "models" else [o])]
    values = {VALUES_KEY.get(comp, comp): {field: value} for comp in owners}
    values["training"] = {**values.get("training", {}), "enabled": True, "cronJob": {"enabled": True}}
    values["kserve"] = {"enabled": kserve}
    values["generation"] = {**values.get("generation", {}), "enabled": generation}
    r = render(values)
    pods = _extended_pods(r)
    assert {comp for comp, *_ in pods} == {"gateway", "control", *services, "training"}
    for comp, where, meta, spec in pods:
        if comp not in owners:
            assert field not in spec, where
            continue
        (c,) = spec["containers"]
        if field == "extraEnv":
            assert c["env"][-len(value):] == value, where
        elif field == "extraVolumes":
            assert spec["volumes"][-len(value):] == value, where
        elif field == "extraVolumeMounts":
            assert c["volumeMounts"][-len(value):] == value, where
        elif field == "podLabels":
            assert meta["labels"]["example.com/team"] == "ml", where
            assert meta["labels"]["app.kubernetes.io/component"] == comp, where
        elif field == "podAnnotations":
            assert meta["annotations"]["example.com/owner"] == "ml-platform", where
            assert any(k.startswith("checksum/") for k in meta["annotations"]), where
        else:
            assert spec[field] == value, where
    # the objects stay valid where the field landed (strict: a misplaced key would be pruned or refused)
    for _, obj in r.objects:
        if obj["kind"] == "InferenceService":
            assert crd_errors(crd_validators, obj) == [], obj["metadata"]["name"]
        elif obj["kind"] in ("Deployment", "CronJob"):
            kubernetes_validate.validate(obj, KUBE_VERSION, strict=True)
    for job in training_templates(r).values():
        kubernetes_validate.validate(job, KUBE_VERSION, strict=True)


@pytest.mark.parametrize("ci", CI_IDS)
def test_extension_points_are_off_by_default(rendered, ci):
    values = rendered[ci].values
    for _, obj in rendered[ci].objects:
        for where, spec in pod_specs(obj):
            comp = obj["metadata"]["labels"]["app.kubernetes.io/component"]
            own = values.get(VALUES_KEY.get(comp, comp)) or {}
            for field in ("priorityClassName", "runtimeClassName", "topologySpreadConstraints"):
                assert (field in spec) == bool(own.get(field)), (where, field)
            names = {e["name"] for c in spec["containers"] for e in c.get("env", [])}
            assert not names & {"EXTRA_FLAG", "EXTRA_SECRET"}, where


def test_image_pull_secrets_accept_kubernetes_objects_and_plain_names(rendered):
    values = {"imagePullSecrets": [{"name": "ghcr-pull"}, "mirror-pull"],
              "store": {"type": "postgresql", "postgresql": {"existingSecret": "pg"}},
              "training": {"enabled": True, "cronJob": {"enabled": True}}}
    for r in (render(values), render({**values, "kserve": {"enabled": False}}), rendered["full.yaml"]):
        specs = [(where, spec) for _, obj in r.objects for where, spec in pod_specs(obj)]
        # the gateway, the model services, the migrations hook, the test Pod, the Job templates and the CronJob
        assert {where.split("/")[0] for where, _ in specs} >= {"Deployment", "Job", "Pod", "ConfigMap", "CronJob"}
        for where, spec in specs:
            assert spec["imagePullSecrets"] == [{"name": "ghcr-pull"}, {"name": "mirror-pull"}], where
    rejected({"imagePullSecrets": [{"nam": "ghcr-pull"}]}, "/imagePullSecrets/0", "name")
    rejected({"imagePullSecrets": [""]}, "/imagePullSecrets/0", "")


# ----------------------------------------------------------------------------------------------- disruption budgets
def _budgets(r) -> dict[str, dict]:
    return {p["metadata"]["labels"]["app.kubernetes.io/component"]: p["spec"] for p in r.of_kind("PodDisruptionBudget")}


def test_model_services_get_a_disruption_budget_only_when_they_can_run_more_than_one_pod(rendered):
    # one pod each: no budget (it would protect nothing); the gateway's allows one eviction, so a drain never waits
    assert set(_budgets(rendered["minimal.yaml"])) == set(_budgets(rendered["cpu-without-kserve.yaml"])) == {"gateway"}
    # KServe: the speaker autoscales from 2 to 4; its budget selects the labels the predictor puts on its pods
    full = rendered["full.yaml"]
    budgets = _budgets(full)
    assert set(budgets) == {"gateway", "speaker"}
    assert budgets["speaker"]["maxUnavailable"] == 1 and "minAvailable" not in budgets["speaker"]
    selector = budgets["speaker"]["selector"]["matchLabels"]
    for comp, template in _pod_templates(full).items():
        selected = selector.items() <= template["metadata"]["labels"].items()
        assert selected == (comp == "speaker"), comp
    # a single replica that may scale out under KServe's HPA (maxReplicas > 1) gets one too: the judge's own service,
    # or the generation service that hosts it (whose replica range applies; the judge's is then unused)
    per_component = render({"generation": {"enabled": False}, "judge": {"maxReplicas": 3}})
    assert set(_budgets(per_component)) == {"gateway", "judge"}
    generation = render({"generation": {"maxReplicas": 3}})
    budgets = _budgets(generation)
    assert set(budgets) == {"gateway", "generation"}
    assert budgets["generation"]["selector"]["matchLabels"].items() <= \
        _pod_templates(generation)["generation"]["metadata"]["labels"].items()
    assert set(_budgets(render({"judge": {"maxReplicas": 3}}))) == {"gateway"}


def test_disruption_budgets_without_kserve_select_the_deployments_pods():
    r = render({"kserve": {"enabled": False}, "generation": {"enabled": False},  # one service per component
                "judge": {"minReplicas": 2, "maxReplicas": 2},  # two pods: auto
                "director": {"pdb": {"enabled": True}},  # one pod, asked for: maxUnavailable 1 cannot block a drain
                "speaker": {"minReplicas": 1, "maxReplicas": 3},  # a Deployment runs minReplicas: one pod, none
                "reward": {"minReplicas": 2, "maxReplicas": 2, "pdb": {"enabled": False}}})
    budgets = _budgets(r)
    assert set(budgets) == {"gateway", "judge", "director"}
    for comp in ("judge", "director"):
        dep = r.one("Deployment", f"-{comp}")
        assert budgets[comp] == {"maxUnavailable": 1, "selector": dep["spec"]["selector"]}
        assert dep["spec"]["selector"]["matchLabels"].items() <= dep["spec"]["template"]["metadata"]["labels"].items()
    # the generation service: two pods of its Deployment, auto; the reward's one pod, none
    r = render({"kserve": {"enabled": False}, "generation": {"minReplicas": 2, "maxReplicas": 2},
                "judge": {"minReplicas": 2, "maxReplicas": 2, "pdb": {"enabled": True}}})  # hosted: unused
    budgets = _budgets(r)
    assert set(budgets) == {"gateway", "generation"}
    dep = r.one("Deployment", "-generation")
    assert budgets["generation"] == {"maxUnavailable": 1, "selector": dep["spec"]["selector"]}
    assert dep["spec"]["replicas"] == 2


def test_min_available_replaces_max_unavailable_and_may_not_block_drains():
    import helm_python as helm

    for serving in ("speaker", "generation"):  # the speaker's own service, or the generation service hosting it
        r = render({"generation": {"enabled": serving == "generation"},
                    serving: {"minReplicas": 2, "maxReplicas": 4, "pdb": {"minAvailable": "50%"}},
                    "reward": {"minReplicas": 3, "maxReplicas": 3, "pdb": {"minAvailable": 2}}})
        budgets = _budgets(r)
        assert set(budgets) == {"gateway", serving, "reward"}
        assert budgets[serving]["minAvailable"] == "50%" and "maxUnavailable" not in budgets[serving]
        assert budgets["reward"]["minAvailable"] == 2
    for values, message in [
        ({"generation": {"enabled": False}, "director": {"pdb": {"enabled": True, "minAvailable": 1}}},
         "director.pdb.minAvailable (1) leaves no pod evictable when director.minReplicas (1) pods run: node drains "
         "would block; lower it, or clear it to use director.pdb.maxUnavailable"),
        ({"generation": {"pdb": {"enabled": True, "minAvailable": 1}}},
         "generation.pdb.minAvailable (1) leaves no pod evictable when generation.minReplicas (1) pods run: node "
         "drains would block; lower it, or clear it to use generation.pdb.maxUnavailable"),
        ({"gateway": {"pdb": {"minAvailable": 1}}},
         "gateway.pdb.minAvailable (1) leaves no pod evictable when gateway.replicaCount (1) pods run"),
    ]:
        with pytest.raises(helm.HelmRenderError, match=re.escape(message)):
            render(values)
    rejected({"speaker": {"pdb": {"enabled": "yes"}}}, "/speaker/pdb/enabled", "")


def test_min_available_is_checked_against_the_fewest_pods_a_service_runs():
    import helm_python as helm

    postgres = {"store": {"type": "postgresql", "postgresql": {"existingSecret": "pg"}}}
    per_component = {"generation": {"enabled": False}}
    for values, message in [
        # KServe's HPA scales the judge down to one pod, which a budget keeping one would never let go
        ({**per_component, "judge": {"minReplicas": 1, "maxReplicas": 3, "pdb": {"minAvailable": 1}}},
         "judge.pdb.minAvailable (1) leaves no pod evictable when judge.minReplicas (1) pods run"),
        ({"generation": {"minReplicas": 1, "maxReplicas": 3, "pdb": {"minAvailable": 1}}},
         "generation.pdb.minAvailable (1) leaves no pod evictable when generation.minReplicas (1) pods run"),
        # as a Deployment, minReplicas is the fixed count
        ({**per_component, "kserve": {"enabled": False},
          "judge": {"minReplicas": 2, "maxReplicas": 2, "pdb": {"minAvailable": 2}}},
         "judge.pdb.minAvailable (2) leaves no pod evictable when judge.minReplicas (2) pods run"),
        ({"kserve": {"enabled": False}, "generation": {"minReplicas": 2, "maxReplicas": 2, "pdb": {"minAvailable": 2}}},
         "generation.pdb.minAvailable (2) leaves no pod evictable when generation.minReplicas (2) pods run"),
        # the gateway's HPA scales down to autoscaling.minReplicas
        ({**postgres, "gateway": {"autoscaling": {"enabled": True, "minReplicas": 2, "maxReplicas": 6},
                                  "pdb": {"minAvailable": 2}}},
         "gateway.pdb.minAvailable (2) leaves no pod evictable when gateway.autoscaling.minReplicas (2) pods run"),
    ]:
        with pytest.raises(helm.HelmRenderError, match=re.escape(message)):
            render(values)
    # below the fewest pods, a budget keeps some and lets the rest go
    r = render({**postgres, **per_component, "judge": {"minReplicas": 2, "maxReplicas": 4, "pdb": {"minAvailable": 1}},
                "gateway": {"autoscaling": {"enabled": True, "minReplicas": 2, "maxReplicas": 6},
                            "pdb": {"minAvailable": 1}}})
    budgets = _budgets(r)
    assert budgets["judge"]["minAvailable"] == budgets["gateway"]["minAvailable"] == 1
    r = render({"generation": {"minReplicas": 2, "maxReplicas": 4, "pdb": {"minAvailable": 1}}})
    assert _budgets(r)["generation"]["minAvailable"] == 1
    # a hosted component's budget keys are unused: its range and budget are the generation service's
    render({"judge": {"minReplicas": 1, "maxReplicas": 3, "pdb": {"minAvailable": 1}}})


def test_an_explicit_zero_min_available_is_kept_not_taken_for_unset(tmp_path, monkeypatch):
    # the schema refuses an integer 0 (pdb.enabled false is the way to have no budget); "0%" is a percentage it takes
    rejected({"speaker": {"maxReplicas": 3, "pdb": {"minAvailable": 0}}}, "/speaker/pdb/minAvailable", "minimum")
    rejected({"generation": {"maxReplicas": 3, "pdb": {"minAvailable": 0}}}, "/generation/pdb/minAvailable",
             "minimum")
    budget = _budgets(render({"generation": {"enabled": False},
                              "speaker": {"maxReplicas": 3, "pdb": {"minAvailable": "0%"}}}))["speaker"]
    assert budget["minAvailable"] == "0%" and "maxUnavailable" not in budget
    budget = _budgets(render({"generation": {"maxReplicas": 3, "pdb": {"minAvailable": "0%"}}}))["generation"]
    assert budget["minAvailable"] == "0%" and "maxUnavailable" not in budget
    # past the schema (`helm install --skip-schema-validation`: here a copy of the chart without it), the templates
    # keep the 0 rather than reading it as unset and falling back to maxUnavailable
    chart = tmp_path / "mascot"
    shutil.copytree(CHART, chart)
    (chart / "values.schema.json").unlink()
    monkeypatch.setattr(chart_helpers, "CHART", chart)
    budgets = _budgets(render({"generation": {"enabled": False},
                               "speaker": {"maxReplicas": 3, "pdb": {"minAvailable": 0}},
                               "gateway": {"pdb": {"minAvailable": 0}}}))
    for comp in ("speaker", "gateway"):
        assert budgets[comp]["minAvailable"] == 0 and "maxUnavailable" not in budgets[comp], comp
    budgets = _budgets(render({"generation": {"maxReplicas": 3, "pdb": {"minAvailable": 0}}}))
    assert budgets["generation"]["minAvailable"] == 0 and "maxUnavailable" not in budgets["generation"]


# ----------------------------------------------------------------------------------------------- cross-field checks
@pytest.mark.parametrize("values,message", [
    ({"generation": {"enabled": False}, "director": {"minReplicas": 3, "maxReplicas": 2}},
     "director.minReplicas (3) is greater than director.maxReplicas (2)"),
    ({"generation": {"minReplicas": 3, "maxReplicas": 2}},
     "generation.minReplicas (3) is greater than generation.maxReplicas (2)"),
    ({"store": {"type": "postgresql", "postgresql": {"existingSecret": "pg"}},
      "gateway": {"autoscaling": {"enabled": True, "minReplicas": 5, "maxReplicas": 3}}},
     "gateway.autoscaling.minReplicas (5) is greater than gateway.autoscaling.maxReplicas (3)"),
], ids=["model-service", "generation-service", "gateway-autoscaling"])
def test_min_replicas_above_max_replicas_is_refused_at_install(values, message):
    """values.schema.json cannot compare two fields: the templates `fail` the install, upgrade and `helm template`,
    naming the values. (`helm lint` renders in lint mode, where Helm only logs a `fail`.)"""
    import helm_python as helm

    with pytest.raises(helm.HelmRenderError) as e:
        render(values)
    assert "invalid values" in str(e.value) and message in str(e.value), str(e.value)
    assert "templates/validate.yaml" in str(e.value)


@pytest.mark.parametrize("component", ["director", "speaker"])
def test_a_gateway_without_its_director_or_speaker_is_refused_at_install(component):
    import helm_python as helm

    for values in ({component: {"enabled": False}}, {"generation": {"enabled": False}, component: {"enabled": False}}):
        with pytest.raises(helm.HelmRenderError) as e:
            render(values)
        assert f"{component}.enabled is false, but the gateway sends every turn through a {component}" in str(e.value)


def test_cross_field_checks_report_every_broken_rule_and_skip_disabled_services():
    import helm_python as helm

    with pytest.raises(helm.HelmRenderError) as e:
        render({"generation": {"enabled": False}, "speaker": {"minReplicas": 4, "maxReplicas": 1},
                "reward": {"minReplicas": 2, "maxReplicas": 1}})
    assert "speaker.minReplicas (4)" in str(e.value) and "reward.minReplicas (2)" in str(e.value)
    with pytest.raises(helm.HelmRenderError) as e:
        render({"generation": {"minReplicas": 4, "maxReplicas": 1}, "reward": {"minReplicas": 2, "maxReplicas": 1}})
    assert "generation.minReplicas (4)" in str(e.value) and "reward.minReplicas (2)" in str(e.value)
    render({"generation": {"enabled": False}, "judge": {"enabled": False, "minReplicas": 3, "maxReplicas": 1},
            "director": {"minReplicas": 2, "maxReplicas": 2}})
    # a component the generation service hosts runs no service of its own: its replica range is unused
    render({"judge": {"minReplicas": 3, "maxReplicas": 1}, "director": {"minReplicas": 5, "maxReplicas": 2}})


# ----------------------------------------------------------------------------------------------- config schema
def test_the_config_schema_is_generated_from_mascot_config():
    from mascot.core.config import MascotConfig
    from mascot.core.config_schema import COMMAND, DEFINITION, dumps, updated_values_schema

    text = (CHART / "values.schema.json").read_text(encoding="utf-8")
    schema = json.loads(text)
    if dumps(updated_values_schema(schema)) != text:
        pytest.fail(f"helm/mascot/values.schema.json does not match MascotConfig: run `{COMMAND}`")
    generated = schema["definitions"][DEFINITION]
    assert set(generated["properties"]) == set(MascotConfig.model_fields)
    for path in (("config",), *((comp, "config") for comp in ("gateway", "generation", *MODEL_COMPONENTS))):
        node = schema
        for key in path:
            node = node["properties"][key]
        assert node == {"$ref": f"#/definitions/{DEFINITION}"}, path

    def walk(node, where="config"):
        if isinstance(node, dict):
            assert "$ref" not in node and "required" not in node and "default" not in node, where
            if "properties" in node:
                assert node["additionalProperties"] is False, where
            for key, sub in node.items():
                walk(sub, f"{where}/{key}")
        elif isinstance(node, list):
            for i, sub in enumerate(node):
                walk(sub, f"{where}/{i}")

    walk(generated)
    # a free-form map of the model stays a map
    assert generated["properties"]["engine"]["properties"]["adapters"] == {
        "additionalProperties": {"type": "string"}, "type": "object"}


def test_the_config_schema_generator_rewrites_a_stale_schema(tmp_path, capsys):
    from mascot.core.config_schema import DEFINITION, main

    current = (CHART / "values.schema.json").read_text(encoding="utf-8")
    stale = json.loads(current)
    stale["definitions"][DEFINITION]["properties"].pop("engine")
    stale["properties"]["gateway"]["properties"]["config"] = {"type": "object"}
    path = tmp_path / "values.schema.json"
    path.write_text(json.dumps(stale, indent=2) + "\n", encoding="utf-8")
    assert main(["--check", "--schema", str(path)]) == 1
    assert "python -m mascot.core.config_schema" in capsys.readouterr().err
    assert main(["--schema", str(path)]) == 0
    assert path.read_text(encoding="utf-8") == current
    assert main(["--check", "--schema", str(path)]) == 0


def test_config_overrides_with_a_typo_or_out_of_range_are_refused_at_install():
    rejected({"config": {"engine": {"max_model_lenn": 4096}}}, "/config/engine", "max_model_lenn")
    rejected({"speaker": {"config": {"speaker": {"temperatur": 0.5}}}}, "/speaker/config/speaker", "temperatur")
    rejected({"config": {"engine": {"max_model_len": 16}}}, "/config/engine/max_model_len", "minimum")
    rejected({"gateway": {"config": {"servers": {}}}}, "/gateway/config", "servers")
    rejected({"config": {"judge": {"judges": [{"name": "gpt", "kind": "open-ai"}]}}},
             "/config/judge/judges/0/kind", "")


def test_valid_config_overrides_render_into_each_components_file():
    from mascot.core.config import MascotConfig

    for generation in (False, True):
        r = render({"config": {"engine": {"max_model_len": 4096,
                                          "adapters": {"night_owl": "/mnt/adapters/night-owl"}},
                               "judge": {"judges": [{"name": "gpt", "kind": "openai", "model": "gpt-4o-mini",
                                                     "endpoint": "https://api.openai.com/v1"}]}},
                    "director": {"config": {"director": {"max_retries": 2}}}, "generation": {"enabled": generation}})
        assert sorted(r.one("ConfigMap", "-config")["data"]) == sorted(f"{c}.yaml" for c in ("gateway", *r.services))
        for comp in ("gateway", *r.services):
            cfg = component_config(r, comp)
            assert cfg["engine"]["max_model_len"] == 4096, comp
            MascotConfig.model_validate(cfg)
        # the director's own config reaches the file of the service that serves it, and no other
        director = r.service_of("director")
        assert director == ("generation" if generation else "director")
        assert component_config(r, director)["director"] == {"max_retries": 2}
        assert all("director" not in component_config(r, c) for c in ("gateway", *r.services) if c != director)


# ----------------------------------------------------------------------------------------------- monitoring APIs
MONITORING_KINDS = ("ServiceMonitor", "PrometheusRule")


def _without_monitoring(r) -> list:
    return [(t, o) for t, o in r.objects if o["kind"] not in MONITORING_KINDS]


def test_monitoring_objects_render_only_where_the_cluster_serves_their_api():
    values = load_ci("full.yaml")
    served = render(values)  # CLUSTER_APIS: KServe and prometheus-operator
    assert len(served.of_kind("ServiceMonitor")) == 3 and len(served.of_kind("PrometheusRule")) == 1  # + control
    assert "WARNING" not in served.notes and "Monitoring: ServiceMonitors, PrometheusRule" in served.notes
    bare = render(values, api_versions=tuple(a for a in CLUSTER_APIS if not a.startswith("monitoring.coreos.com")))
    assert not any(bare.of_kind(k) for k in MONITORING_KINDS)
    assert _without_monitoring(bare) == _without_monitoring(served)  # the rest, the dashboard included, is the same
    for kind, key in (("ServiceMonitor", "serviceMonitor"), ("PrometheusRule", "prometheusRule")):
        assert (f"WARNING: monitoring.{key}.enabled is true, but the cluster does not serve "
                f"monitoring.coreos.com/v1/{kind}") in bare.notes
        assert f"set monitoring.{key}.enabled=false" in bare.notes
    assert "Install the prometheus-operator" in bare.notes and "Grafana dashboard ConfigMap" in bare.notes
    # one API of the two: that object renders, the other is reported
    only_sm = render(values, api_versions=tuple(a for a in CLUSTER_APIS if not a.endswith("/PrometheusRule")))
    assert len(only_sm.of_kind("ServiceMonitor")) == 3 and not only_sm.of_kind("PrometheusRule")
    assert "monitoring.prometheusRule.enabled is true" in only_sm.notes
    assert "monitoring.serviceMonitor.enabled is true" not in only_sm.notes
    # switched off: nothing to report
    off = render(_merged(values, {"monitoring": {"serviceMonitor": {"enabled": False},
                                                 "prometheusRule": {"enabled": False}}}), api_versions=())
    assert "WARNING" not in off.notes and not any(off.of_kind(k) for k in MONITORING_KINDS)


# ----------------------------------------------------------------------------------------------- metrics sources
def _metrics_rules(r) -> list[dict]:
    """The ingress rules of the metrics ports: the gateway's metricsPort, the model services' httpPort and, when it
    renders, the control plane's metricsPort."""
    gateway = r.one("NetworkPolicy", "-gateway")["spec"]["ingress"][1]
    models = r.one("NetworkPolicy", "-models")["spec"]["ingress"][1]
    assert gateway["ports"] == [{"protocol": "TCP", "port": 9464}]
    assert models["ports"] == [{"protocol": "TCP", "port": 8080}]
    if not _control_plane(r):
        return [gateway, models]
    control = r.one("NetworkPolicy", "-control")["spec"]["ingress"][1]
    assert control["ports"] == [{"protocol": "TCP", "port": 9465}]
    return [gateway, models, control]


def test_metrics_scrapes_are_admitted_from_the_configured_peers(rendered):
    import kubernetes_validate

    default = [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]
    for rule in _metrics_rules(rendered["full.yaml"]):
        assert rule["from"] == default
    peer = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "observability"}},
            "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}}
    custom = render({"networkPolicy": {"metricsFrom": [peer, {"ipBlock": {"cidr": "10.0.0.0/8"}}]},
                     "training": {"enabled": True}})  # the control plane's metrics port too
    for rule in _metrics_rules(custom):
        assert rule["from"] == [peer, {"ipBlock": {"cidr": "10.0.0.0/8"}}]
    for np in custom.of_kind("NetworkPolicy"):
        kubernetes_validate.validate(np, KUBE_VERSION, strict=True)
    for rule in _metrics_rules(render({"networkPolicy": {"metricsFrom": []}})):
        assert "from" not in rule  # [] = any source
    legacy = render({"networkPolicy": {"metricsNamespaceSelector": {"matchLabels": {"team": "sre"}}}})
    for rule in _metrics_rules(legacy):
        assert rule["from"] == [{"namespaceSelector": {"matchLabels": {"team": "sre"}}}]


def test_the_chart_readme_documents_operations():
    import helm_python as helm

    readme = helm.show(str(CHART), output_format="readme")
    for topic in ("## Prerequisites", "## Install", "### Extension points", "### PodDisruptionBudgets",
                  "## Configuration overrides", "python -m mascot.core.config_schema", "## Monitoring",
                  "## Upgrades: what restarts", "kserve.enabled=false", "networkPolicy.metricsFrom",
                  "--api-versions monitoring.coreos.com/v1/ServiceMonitor", *EXTENSIONS):
        assert topic in readme, topic
