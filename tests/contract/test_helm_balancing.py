"""Load balancing in the Helm chart (chart README "Load balancing"): a headless Service per enabled model service, in
the KServe (InferenceService) and the plain Deployment form, selecting exactly that service's pods and exposing their
gRPC port; every client the chart configures (the gateway's director_target / speaker_target, the `helm test` Pod,
NOTES) dials ``dns:///<headless>.<namespace>.svc.<clusterDomain>:<port>``, computed in one named template; the
NetworkPolicy admits that pod-to-pod traffic. The components the generation service hosts are dialled at its headless
Service; with generation.enabled false each component has its own. The round_robin behaviour behind the target:
tests/integration/test_grpc_balancing.py."""

from __future__ import annotations

import re

import pytest
import yaml

from tests.helpers.chart import CHART, CI_IDS, KUBE_VERSION, NAMESPACE, RELEASE, render

MODEL_COMPONENTS = ("director", "speaker", "judge", "reward")
GRPC_PORTS = {"generation": 50060, "director": 50061, "speaker": 50062, "judge": 50063, "reward": 50064}
SELECTOR_KEYS = ("app.kubernetes.io/name", "app.kubernetes.io/instance", "app.kubernetes.io/component")


def _enabled(r) -> list[str]:
    """The model services rendered (the generation service and each enabled component it does not host)."""
    return r.services


def _pod(r, comp: str) -> tuple[dict, dict]:
    """(labels, the one container) of a model service's pods, as KServe or the Deployment creates them."""
    if r.of_kind("InferenceService"):
        predictor = r.one("InferenceService", f"-{comp}")["spec"]["predictor"]
        return predictor["labels"], predictor["containers"][0]
    template = r.one("Deployment", f"-{comp}")["spec"]["template"]
    return template["metadata"]["labels"], template["spec"]["containers"][0]


def _gateway_server(r) -> dict:
    return yaml.safe_load(r.one("ConfigMap", "-config")["data"]["gateway.yaml"])["server"]


def _target(service: str, domain: str = "cluster.local") -> str:
    """The gRPC target of a model service (its headless Service)."""
    return f"dns:///{RELEASE}-mascot-{service}-headless.{NAMESPACE}.svc.{domain}:{GRPC_PORTS[service]}"


def _notes_line(r, service: str) -> str:
    """The NOTES line of a model service: the generation service names the components it serves."""
    name = f"generation ({','.join(r.hosted)} on one engine)" if service == "generation" else service
    return f"{name}: {_target(service)}"


@pytest.mark.parametrize("ci", CI_IDS)
def test_a_headless_service_selects_each_enabled_model_services_pods_on_its_grpc_port(rendered, ci):
    import kubernetes_validate

    r = rendered[ci]
    headless = {s["metadata"]["name"]: s for s in r.of_kind("Service") if s["spec"].get("clusterIP") == "None"}
    assert sorted(headless) == sorted(f"{RELEASE}-mascot-{c}-headless" for c in _enabled(r))
    for comp in _enabled(r):
        svc = headless[f"{RELEASE}-mascot-{comp}-headless"]
        kubernetes_validate.validate(svc, KUBE_VERSION, strict=True)
        assert svc["metadata"]["namespace"] == NAMESPACE
        assert svc["metadata"]["labels"]["app.kubernetes.io/component"] == comp
        spec = svc["spec"]
        assert spec.get("type", "ClusterIP") == "ClusterIP" and not spec.get("publishNotReadyAddresses")
        # exactly this component's pods: its selector labels, which its pods carry and no other component's do
        assert spec["selector"] == {"app.kubernetes.io/name": "mascot", "app.kubernetes.io/instance": RELEASE,
                                    "app.kubernetes.io/component": comp}
        labels, container = _pod(r, comp)
        assert spec["selector"].items() <= labels.items()
        for other in _enabled(r):
            if other != comp:
                assert not spec["selector"].items() <= _pod(r, other)[0].items()
        (port,) = spec["ports"]
        assert (port["name"], port["port"], port["protocol"], port.get("appProtocol")) == (
            "grpc", GRPC_PORTS[comp], "TCP", "grpc")
        named = {p["name"]: p["containerPort"] for p in container["ports"]}
        assert named[port["targetPort"]] == GRPC_PORTS[comp]  # the port `serve-model --port` binds
        assert container["args"][container["args"].index("--port") + 1] == str(GRPC_PORTS[comp])


@pytest.mark.parametrize("ci", CI_IDS)
def test_every_client_the_chart_configures_dials_the_headless_services(rendered, ci):
    r = rendered[ci]
    server = _gateway_server(r)
    per_component = ci == "full.yaml"  # generation.enabled false; the other ci files keep the generation service
    assert server["director_target"] == _target("director" if per_component else "generation")
    assert server["speaker_target"] == _target("speaker" if per_component else "generation")
    (c,) = r.one("Pod", "-test-health")["spec"]["containers"]
    control = [f"{RELEASE}-mascot-control:50061"] if [d for d in r.of_kind("Deployment")
                                                      if d["metadata"]["name"].endswith("-control")] else []
    assert c["args"][3::2] == [f"{RELEASE}-mascot-gateway:50051", *control, *(_target(comp) for comp in _enabled(r))]
    for comp in _enabled(r):
        assert f"\n  {_notes_line(r, comp)}\n" in r.notes
    for comp in r.hosted:  # a hosted component has no target of its own anywhere
        assert f"-{comp}-headless" not in r.notes and all(f"-{comp}-headless" not in a for a in c["args"])


@pytest.mark.parametrize("generation", [True, False], ids=["generation", "per-component"])
def test_kserve_and_deployment_forms_get_the_same_headless_services_and_targets(generation):
    base = {"model": {"storageUri": ""}, "reward": {"storageUri": ""}, "generation": {"enabled": generation}}
    kserve = render({**base, "kserve": {"enabled": True}})
    plain = render({**base, "kserve": {"enabled": False}})
    assert kserve.of_kind("InferenceService") and not plain.of_kind("InferenceService")
    services = ["generation", "reward"] if generation else list(MODEL_COMPONENTS)
    for r in (kserve, plain):
        assert r.services == services
        server = _gateway_server(r)
        assert server["director_target"] == _target(r.service_of("director"))
        assert server["speaker_target"] == _target(r.service_of("speaker"))
        headless = sorted(s["metadata"]["name"] for s in r.of_kind("Service") if s["spec"].get("clusterIP") == "None")
        assert headless == sorted(f"{RELEASE}-mascot-{s}-headless" for s in services)
    # without KServe the ClusterIP Service stays (REST, metrics) and selects the same pods as the headless one
    for comp in services:
        assert plain.one("Service", f"-{comp}")["spec"]["selector"] == \
            plain.one("Service", f"-{comp}-headless")["spec"]["selector"]


def test_the_cluster_domain_value_names_the_targets_and_a_bad_one_is_refused():
    import helm_python as helm

    for generation in (True, False):
        r = render({"clusterDomain": "corp.example", "generation": {"enabled": generation}})
        assert _gateway_server(r)["speaker_target"] == _target(r.service_of("speaker"), "corp.example")
        assert r.service_of("speaker") == ("generation" if generation else "speaker")
    with pytest.raises(helm.HelmValuesError, match="clusterDomain"):
        render({"clusterDomain": "Cluster.Local."})


def test_the_target_is_computed_in_one_named_template():
    templates = {p.name: p.read_text() for p in (CHART / "templates").rglob("*") if p.is_file()}
    assert [n for n, t in templates.items() if "dns:///" in t] == ["_helpers.tpl"]
    assert [n for n, t in templates.items() if re.search(r'"%s-%s-headless"', t)] == ["_helpers.tpl"]
    helpers = templates["_helpers.tpl"]
    assert helpers.count('define "mascot.modelTarget"') == 1 and helpers.count("dns:///") == 2  # comment + printf
    # the Service names and targets come from mascot.modelHeadlessName / mascot.modelTarget only
    assert "mascot.modelHeadlessName" in templates["models-headless.yaml"]
    assert 'include "mascot.modelTarget"' in helpers  # the gateway's config


@pytest.mark.parametrize("ci", ["full.yaml", "external-postgresql.yaml"])  # per component; the generation service
def test_the_network_policy_admits_gateway_jobs_and_test_pod_to_the_pods_grpc_ports(rendered, ci):
    """Headless targets connect pod to pod (no Service IP): the models policy must admit the gRPC container port."""
    r = rendered[ci]
    models = r.one("NetworkPolicy", "-models")["spec"]
    grpc_rule = models["ingress"][0]
    ports = {p["port"] for p in grpc_rule["ports"]}
    assert ports == {GRPC_PORTS[s] for s in _enabled(r)}
    assert sorted(models["podSelector"]["matchExpressions"][0]["values"]) == sorted(_enabled(r))
    for comp in _enabled(r):
        labels, _ = _pod(r, comp)
        selected = models["podSelector"]
        assert selected["matchLabels"].items() <= labels.items()
        assert labels["app.kubernetes.io/component"] in selected["matchExpressions"][0]["values"]
        assert r.one("Service", f"-{comp}-headless")["spec"]["ports"][0]["port"] in ports
    (peer,) = grpc_rule["from"]
    assert "gateway" in peer["podSelector"]["matchExpressions"][0]["values"]

