"""The Helm chart helm/mascot, rendered offline with helm-python-sdk for every
helm/mascot/ci/*.yaml: the kinds rendered per file, strict lint (Kubernetes 1.33), every object valid (core kinds with
kubernetes-validate strict 1.33; InferenceService, ServiceMonitor and PrometheusRule against the CRD schemas in
../shared/crds/), values.schema.json rejections, secure defaults, and the contracts the chart keeps with the code:
the MascotConfig each component reads, the CLI commands it runs, the Alembic hook, the `helm test` health check and
the training Job templates. Monitoring: test_helm_monitoring.py; checkov: test_helm_checkov.py."""

from __future__ import annotations

import copy
import socket
import subprocess
import sys
from concurrent import futures
from pathlib import Path

import pytest
import yaml

from tests.conftest import need
from tests.contract.conftest import (
    CHART, CI_IDS, KUBE_VERSION, NAMESPACE, RELEASE, load_ci, pod_specs, render, shared_path, training_templates,
)

# The objects each ci file renders, hooks and test hooks included (a template change that adds or drops an object
# must update this table on purpose).
EXPECTED_KINDS = {
    "minimal.yaml": {
        "ConfigMap": 2, "Deployment": 1, "InferenceService": 2, "NetworkPolicy": 3, "PersistentVolumeClaim": 1,
        "Pod": 1, "PodDisruptionBudget": 1, "Service": 1, "ServiceAccount": 3,
    },
    "full.yaml": {
        "ConfigMap": 7, "CronJob": 1, "Deployment": 1, "HorizontalPodAutoscaler": 1, "InferenceService": 4,
        "Ingress": 1, "Job": 1, "NetworkPolicy": 3, "PersistentVolumeClaim": 1, "Pod": 1, "PodDisruptionBudget": 1,
        "PrometheusRule": 1, "Role": 1, "RoleBinding": 1, "Service": 1, "ServiceAccount": 5, "ServiceMonitor": 2,
    },
    "external-postgresql.yaml": {
        "ConfigMap": 3, "Deployment": 1, "InferenceService": 4, "Job": 1, "NetworkPolicy": 3,
        "PersistentVolumeClaim": 1, "Pod": 1, "PodDisruptionBudget": 1, "Service": 1, "ServiceAccount": 4,
        "ServiceMonitor": 2,
    },
    "cpu-without-kserve.yaml": {
        "ConfigMap": 2, "Deployment": 5, "NetworkPolicy": 3, "PersistentVolumeClaim": 1, "Pod": 1,
        "PodDisruptionBudget": 1, "Service": 5, "ServiceAccount": 3,
    },
}
CRD_KINDS = {  # kind -> (CRD file under ../shared/crds, served version)
    "InferenceService": ("kserve/serving.kserve.io_inferenceservices.yaml", "v1beta1"),
    "ServiceMonitor": ("prometheus-operator/crd-servicemonitors.yaml", "v1"),
    "PrometheusRule": ("prometheus-operator/crd-prometheusrules.yaml", "v1"),
}
MODEL_COMPONENTS = ("director", "speaker", "judge", "reward")
LABELS = ("app.kubernetes.io/name", "app.kubernetes.io/instance", "app.kubernetes.io/component",
          "app.kubernetes.io/managed-by", "app.kubernetes.io/part-of", "helm.sh/chart")


# ----------------------------------------------------------------------------------------------- CRD schemas
def crd_to_jsonschema(node, strict: bool = True):
    """A CRD openAPIV3Schema as JSON Schema draft 7: ``nullable`` -> a null type,
    ``x-kubernetes-int-or-string`` -> integer or string, and in strict mode objects with ``properties`` accept no
    other key unless ``x-kubernetes-preserve-unknown-fields`` (the API server would prune it silently)."""
    if isinstance(node, list):
        return [crd_to_jsonschema(n, strict) for n in node]
    if not isinstance(node, dict):
        return node
    out = {}
    for key, value in node.items():
        if key == "properties":
            out[key] = {name: crd_to_jsonschema(s, strict) for name, s in value.items()}
        elif key in ("items", "additionalProperties", "not"):
            out[key] = crd_to_jsonschema(value, strict) if isinstance(value, dict) else value
        elif key in ("allOf", "anyOf", "oneOf"):
            out[key] = [crd_to_jsonschema(s, strict) for s in value]
        elif key == "nullable" or key.startswith("x-kubernetes-"):
            continue
        else:
            out[key] = value
    if node.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if node.get("nullable") and "type" in out:
        out["type"] = [out["type"], "null"]
    if (strict and "properties" in node and "additionalProperties" not in node
            and not node.get("x-kubernetes-preserve-unknown-fields")):
        out["additionalProperties"] = False
    return out


@pytest.fixture(scope="session")
def crd_validators() -> dict:
    """kind -> a strict Draft7Validator of its CRD (read from ../shared/crds/ once per session, never copied)."""
    import jsonschema

    crds = shared_path() / "crds"
    need(crds.is_dir(), f"{crds} not found: the shared CRD schemas must sit beside the checkout")
    validators = {}
    for kind, (rel, version) in CRD_KINDS.items():
        with open(crds / rel, encoding="utf-8") as f:
            crd = yaml.load(f, Loader=yaml.CSafeLoader)
        assert crd["spec"]["names"]["kind"] == kind
        (served,) = [v for v in crd["spec"]["versions"] if v["name"] == version and v["served"]]
        validators[kind] = jsonschema.Draft7Validator(crd_to_jsonschema(served["schema"]["openAPIV3Schema"]))
    return validators


def crd_errors(validators: dict, obj: dict) -> list[str]:
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message[:200]}"
            for e in validators[obj["kind"]].iter_errors(obj)]


# ----------------------------------------------------------------------------------------------- render, lint, validate
@pytest.mark.parametrize("ci", CI_IDS)
def test_kinds_rendered_per_ci_file(rendered, ci):
    assert ci in EXPECTED_KINDS, f"add {ci} to EXPECTED_KINDS"
    counts: dict[str, int] = {}
    for _, obj in rendered[ci].objects:
        counts[obj["kind"]] = counts.get(obj["kind"], 0) + 1
    assert counts == EXPECTED_KINDS[ci]


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
def _rejected(values: dict, pointer: str, want: str) -> None:
    """``values`` fails the schema at ``pointer`` in render (which enforces it) and in lint (an error message)."""
    import helm_python as helm

    with pytest.raises(helm.HelmValuesError) as e:
        render(values)
    assert pointer in str(e.value) and want in str(e.value), str(e.value)
    report = helm.lint(CHART, values, strict=True, kube_version=f"v{KUBE_VERSION}")
    assert any(m["severity"] == 3 and pointer in m["error"] for m in report["messages"]), report


def test_schema_rejects_sqlite_with_more_than_one_gateway_replica():
    _rejected({"gateway": {"replicaCount": 2}}, "/gateway/replicaCount", "maximum")


def test_schema_rejects_sqlite_with_gateway_autoscaling():
    _rejected({"gateway": {"autoscaling": {"enabled": True}}}, "/gateway/autoscaling/enabled", "false")


def test_schema_rejects_a_port_out_of_range():
    _rejected({"director": {"grpcPort": 70000}}, "/director/grpcPort", "65,535")


def test_schema_rejects_postgresql_without_its_url_secret():
    _rejected({"store": {"type": "postgresql"}}, "/store/postgresql/existingSecret", "minLength")


def test_schema_rejects_unknown_keys_and_root_containers():
    _rejected({"gateway": {"replicas": 2}}, "/gateway", "replicas")
    _rejected({"podSecurityContext": {"runAsNonRoot": False}}, "/podSecurityContext/runAsNonRoot", "true")


def test_schema_accepts_what_postgresql_allows():
    r = render({"store": {"type": "postgresql", "postgresql": {"existingSecret": "pg"}},
                "gateway": {"replicaCount": 3, "autoscaling": {"enabled": True}}})
    assert r.one("HorizontalPodAutoscaler", "-gateway")["spec"]["minReplicas"] == 2
    assert "replicas" not in r.one("Deployment", "-gateway")["spec"]  # the HPA owns the count


# ----------------------------------------------------------------------------------------------- secure defaults
@pytest.mark.parametrize("ci", CI_IDS)
def test_every_pod_runs_non_root_read_only_without_privileges(rendered, ci):
    specs = [s for _, obj in rendered[ci].objects for s in pod_specs(obj)]
    assert len(specs) >= 4
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
                           for e in c.get("env", [])), f"{where}: a secret-looking env var from a literal value"


@pytest.mark.parametrize("ci", CI_IDS)
def test_every_object_has_the_standard_labels_and_the_release_namespace(rendered, ci):
    for _, obj in rendered[ci].objects:
        labels = obj["metadata"].get("labels", {})
        assert all(k in labels for k in LABELS), (obj["kind"], obj["metadata"]["name"], labels)
        assert labels["app.kubernetes.io/instance"] == RELEASE
        assert obj["metadata"]["namespace"] == NAMESPACE


def test_only_the_gateway_may_touch_the_api_and_only_jobs(rendered):
    full = rendered["full.yaml"]
    (role,) = full.of_kind("Role")
    assert role["rules"] == [{"apiGroups": ["batch"], "resources": ["jobs"],
                              "verbs": ["create", "get", "list", "watch", "delete"]}]
    (binding,) = full.of_kind("RoleBinding")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": f"{RELEASE}-mascot-gateway",
                                    "namespace": NAMESPACE}]
    for ci, r in rendered.items():
        assert not r.of_kind("ClusterRole") and not r.of_kind("ClusterRoleBinding")
        assert all(sa["automountServiceAccountToken"] is False for sa in r.of_kind("ServiceAccount"))
        for _, obj in r.objects:
            for where, spec in pod_specs(obj):
                mounts_token = spec["automountServiceAccountToken"]
                gateway_with_training = where.endswith("-gateway") and obj["kind"] == "Deployment" and bool(
                    r.values.get("training", {}).get("enabled"))
                assert mounts_token is gateway_with_training, (ci, where)


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
    assert peer["podSelector"]["matchExpressions"][0]["values"] == ["gateway", "training", "test"]
    assert metrics_rule["ports"] == [{"protocol": "TCP", "port": 8080}] and "namespaceSelector" in metrics_rule["from"][0]
    gateway = full.one("NetworkPolicy", "-gateway")
    clients = gateway["spec"]["ingress"][0]["from"]
    assert clients[0]["namespaceSelector"]["matchLabels"] == {"kubernetes.io/metadata.name": "ingress-nginx"}
    assert clients[1]["podSelector"]["matchExpressions"][0]["values"] == ["training", "test"]
    minimal = rendered["minimal.yaml"]
    assert "from" not in minimal.one("NetworkPolicy", "-gateway")["spec"]["ingress"][0]  # the public API
    assert minimal.one("NetworkPolicy", "-default-deny")["spec"]["policyTypes"] == ["Ingress"]


# ----------------------------------------------------------------------------------------------- the gateway
def test_sqlite_gateway_is_one_replica_recreated_on_its_own_volume(rendered):
    r = rendered["minimal.yaml"]
    dep = r.one("Deployment", "-gateway")
    assert dep["spec"]["replicas"] == 1 and dep["spec"]["strategy"] == {"type": "Recreate"}
    pvc = r.one("PersistentVolumeClaim", "-gateway-data")
    volumes = {v["name"]: v for v in dep["spec"]["template"]["spec"]["volumes"]}
    assert volumes["data"]["persistentVolumeClaim"]["claimName"] == pvc["metadata"]["name"]
    assert pvc["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    assert _config(r, "gateway")["store"]["url"] == "sqlite:////var/lib/mascot/mascot.db"
    assert r.one("PodDisruptionBudget", "-gateway")["spec"]["maxUnavailable"] == 1
    assert not r.of_kind("Job")  # SQLite: the gateway migrates its own file


def test_postgresql_gateway_scales_and_reads_its_url_from_the_secret(rendered):
    r = rendered["external-postgresql.yaml"]
    dep = r.one("Deployment", "-gateway")
    assert dep["spec"]["replicas"] == 3 and dep["spec"]["strategy"]["type"] == "RollingUpdate"
    (c,) = dep["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e for e in c["env"]}
    assert env["MASCOT_STORE__URL"]["valueFrom"]["secretKeyRef"] == {"name": "mascot-postgresql", "key": "url"}
    assert "store" not in _config(r, "gateway")  # no URL (no password) in the ConfigMap
    assert not [p for p in r.of_kind("PersistentVolumeClaim") if p["metadata"]["name"].endswith("-gateway-data")]
    assert c["command"] + c["args"] == ["mascot", "serve", "--component", "gateway"]
    probes = [c[p]["grpc"]["port"] for p in ("startupProbe", "readinessProbe", "livenessProbe")]
    assert probes == [50051] * 3
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports == {"grpc": 50051, "metrics": 9464}


def test_admin_token_and_tls_are_secrets_referenced_by_name(rendered):
    r = rendered["full.yaml"]
    spec = r.one("Deployment", "-gateway")["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["admin-token"]["secret"]["secretName"] == "mascot-admin-token"
    assert volumes["tls"]["secret"]["secretName"] == "mascot-tls"
    mounts = {m["name"]: m["mountPath"] for m in spec["containers"][0]["volumeMounts"]}
    assert _config(r, "gateway")["adapters"]["admin_token_file"] == mounts["admin-token"] + "/token"
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
        cfg = _config(r, comp)
        if comp == "reward":
            assert cfg["reward"]["model"] == "/mnt/models"
        else:
            assert cfg["engine"] == {"kind": "vllm", "dtype": "bfloat16", "model": "/mnt/models"}
    speaker = isvcs["speaker"]
    assert speaker["metadata"]["annotations"]["serving.kserve.io/autoscalerClass"] == "hpa"
    assert (speaker["spec"]["predictor"]["minReplicas"], speaker["spec"]["predictor"]["maxReplicas"]) == (2, 4)
    assert isvcs["director"]["metadata"]["annotations"]["serving.kserve.io/autoscalerClass"] == "none"
    assert _config(r, "director")["director"] == {"max_retries": 1}  # a component's own config
    assert "director" not in _config(r, "speaker")


def test_without_kserve_model_services_are_deployments_with_services_on_cpu(rendered):
    r = rendered["cpu-without-kserve.yaml"]
    assert not r.of_kind("InferenceService")
    for comp in MODEL_COMPONENTS:
        dep, svc = r.one("Deployment", f"-{comp}"), r.one("Service", f"-{comp}")
        assert dep["spec"]["selector"]["matchLabels"] == svc["spec"]["selector"]
        (c,) = dep["spec"]["template"]["spec"]["containers"]
        assert c["image"].endswith("-cpu") and "nvidia.com/gpu" not in c["resources"]["limits"]
        assert "nodeSelector" not in dep["spec"]["template"]["spec"]
        assert "STORAGE_URI" not in {e["name"] for e in c["env"]}
        assert "engine" not in _config(r, comp) or "model" not in _config(r, comp)["engine"]  # the tiny model
    gw = _config(r, "gateway")["server"]
    assert gw["director_target"] == f"{RELEASE}-mascot-director:50061"
    r2 = render({"kserve": {"enabled": False}, "model": {"storageUri": "pvc://models/qwen3-8b"},
                 "reward": {"storageUri": "pvc://models/reward"}})
    spec = r2.one("Deployment", "-speaker")["spec"]["template"]["spec"]
    (mount,) = [m for m in spec["containers"][0]["volumeMounts"] if m["name"] == "model"]
    (vol,) = [v for v in spec["volumes"] if v["name"] == "model"]
    assert (mount["mountPath"], mount["subPath"], vol["persistentVolumeClaim"]["claimName"]) == (
        "/mnt/models", "qwen3-8b", "models")


@pytest.mark.parametrize("ci", CI_IDS)
def test_gateway_targets_the_model_services_the_chart_renders(rendered, ci):
    r = rendered[ci]
    server = _config(r, "gateway")["server"]
    for comp in ("director", "speaker"):
        host, port = server[f"{comp}_target"].rsplit(":", 1)
        if r.of_kind("InferenceService"):
            isvc = r.one("InferenceService", f"-{comp}")
            assert host == isvc["metadata"]["name"] + "-predictor"  # the Service KServe creates (RawDeployment)
            ports = isvc["spec"]["predictor"]["containers"][0]["ports"]
        else:
            assert host == r.one("Service", f"-{comp}")["metadata"]["name"]
            ports = r.one("Deployment", f"-{comp}")["spec"]["template"]["spec"]["containers"][0]["ports"]
        assert ("grpc", int(port)) in [(p["name"], p["containerPort"]) for p in ports]


# ----------------------------------------------------------------------------------------------- contracts with the code
def _config(r, component: str) -> dict:
    return yaml.safe_load(r.one("ConfigMap", "-config")["data"][f"{component}.yaml"]) or {}


@pytest.mark.parametrize("ci", CI_IDS)
def test_every_component_config_is_a_valid_mascot_config(rendered, ci):
    from mascot.core.config import MascotConfig

    cm = rendered[ci].one("ConfigMap", "-config")
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
    assert _config(r, "speaker")["personas"] == {"extra_files": ["/etc/mascot/personas/night-owl.yaml"],
                                                  "active_support": ["anchor", "catalyst", "beacon"]}
    assert rendered["minimal.yaml"].one("ConfigMap", "-personas")["data"] == {}


def _cli_accepts(argv: list[str]) -> None:
    """Parse ``mascot ARGV`` with the real CLI (typer/click) without running it: the command exists and takes these
    options and values."""
    import typer

    from mascot.cli import app

    cmd, args = typer.main.get_command(app), list(argv)
    while hasattr(cmd, "commands"):  # a group (typer vendors its own click: no isinstance on click.Group)
        assert args and args[0] in cmd.commands, f"mascot has no command {args[:1]} ({argv})"
        cmd = cmd.commands[args.pop(0)]
    assert not hasattr(cmd, "commands")
    cmd.make_context(cmd.name, args, resilient_parsing=False)  # raises a UsageError on a bad option or value


def test_cli_check_rejects_what_the_cli_rejects():
    with pytest.raises(Exception, match="No such option"):
        _cli_accepts(["serve", "--component", "gateway", "--no-such-flag"])
    with pytest.raises(AssertionError, match="no command"):
        _cli_accepts(["serve-models", "director"])
    _cli_accepts(["train", "collaborative", "--config", "x.yaml", "--out", "runs/x"])


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
                _cli_accepts([a.replace("$(MASCOT_RUN_ID)", "run-1") for a in argv])
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
    (c,) = job["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e for e in c["env"]}
    assert env["MASCOT_STORE__URL"]["valueFrom"]["secretKeyRef"]["name"] == "mascot-postgresql"
    # run the hook's command with its alembic.ini against a SQLite file (PostgreSQL: tests/integration)
    ini = r.one("ConfigMap", "-migrations")["data"]["alembic.ini"]
    (mount,) = [m["mountPath"] for m in c["volumeMounts"] if m["name"] == "alembic"]
    argv = [a.replace(mount, str(tmp_path)) for a in c["command"]]
    (tmp_path / "alembic.ini").write_text(ini)
    db = tmp_path / "store.db"
    alembic = Path(sys.executable).parent / argv[0]
    need(alembic.exists(), "alembic is installed with the package")
    p = subprocess.run([str(alembic), *argv[1:]], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                       env={"MASCOT_STORE__URL": f"sqlite:///{db}", "PATH": str(alembic.parent),
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
    _cli_accepts(c["command"][1:] + c["args"])
    assert c["args"][:2] == ["--timeout", str(r.values.get("tests", {}).get("timeoutSeconds", 10))]
    flags, targets = c["args"][2::2], c["args"][3::2]
    assert set(flags) == {"--target"}
    expected = [f"{RELEASE}-mascot-gateway:50051"] + [
        t for t in (_config(r, "gateway")["server"]["director_target"],
                    _config(r, "gateway")["server"]["speaker_target"])]
    for comp in ("judge", "reward"):
        if (r.values.get(comp) or {}).get("enabled", True):
            host = r.one("InferenceService", f"-{comp}")["metadata"]["name"] + "-predictor" \
                if r.of_kind("InferenceService") else r.one("Service", f"-{comp}")["metadata"]["name"]
            expected.append(f"{host}:{ {'judge': 50063, 'reward': 50064}[comp]}")
    assert targets == expected


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
    from mascot_training.collab_config import CollaborativeConfig
    from mascot_training.config import PersonaAlignmentConfig

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
        assert env["MASCOT_ADMIN_TOKEN"]["valueFrom"]["secretKeyRef"]["name"] == "mascot-admin-token"
        assert c["resources"]["limits"]["nvidia.com/gpu"] == "4"
        assert spec["restartPolicy"] == "OnFailure" and spec["serviceAccountName"] == f"{RELEASE}-mascot-training"
        volumes = {v["name"]: v for v in spec["volumes"]}
        assert volumes["run-config"]["configMap"]["name"] == f"{RELEASE}-mascot-training-{phase}"
        assert volumes["runs"]["persistentVolumeClaim"]["claimName"] == f"{RELEASE}-mascot-training-runs"
        run_cfg = yaml.safe_load(r.one("ConfigMap", f"-training-{phase}")["data"]["run.yaml"])
        model = PersonaAlignmentConfig if phase == "persona-alignment" else CollaborativeConfig
        cfg = model.model_validate(run_cfg)
        assert cfg.publish.gateway == f"{RELEASE}-mascot-gateway:50051"
        assert cfg.model.startswith("/models/") and str(cfg.data.situations).startswith("/data/")
    # the CronJob runs the same Job spec as the template
    (cron,) = r.of_kind("CronJob")
    assert cron["spec"]["concurrencyPolicy"] == "Forbid" and cron["spec"]["schedule"] == "0 3 * * 0"
    assert cron["spec"]["jobTemplate"]["spec"] == jobs["persona-alignment"]["spec"]
    assert len(cron["metadata"]["name"]) <= 52
    # the gateway mounts the templates and the run volume (read-only)
    gw = r.one("Deployment", "-gateway")["spec"]["template"]["spec"]
    mounts = {m["name"]: m for m in gw["containers"][0]["volumeMounts"]}
    assert mounts["training-templates"]["mountPath"] == "/etc/mascot/training" and mounts["runs"]["readOnly"]


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
