"""Scaling the model services on load (``<component>.autoscaling``, ``models.autoscaling``), rendered offline like
test_helm_chart.py: off by default (KServe's CPU/memory HPA path unchanged); ``hpa.enabled`` renders an
autoscaling/v2 HorizontalPodAutoscaler on the Pods metric ``mascot_rpc_in_flight`` that validates strictly against
Kubernetes 1.33 and targets the predictor Deployment KServe creates (``<isvc>-predictor``, with the
InferenceService's autoscalerClass handed over to ``external``) or the chart's own Deployment (then without a
``replicas`` field); ``keda.enabled`` renders a KEDA ScaledObject (checked against the fields of KEDA's CRD) whose
prometheus trigger sums the gauge over the service's pods by the labels the models ServiceMonitor writes; the
refusals name the values; the documented Prometheus adapter rule matches the chart and the queries parse as PromQL.
The gauge itself, on the model server's /metrics: tests/integration/test_rpc_in_flight.py."""

from __future__ import annotations

import copy
import re
import subprocess

import pytest
import yaml

from tests.helpers.chart import (
    CHART, CI_IDS, CLUSTER_APIS, CRD_KINDS, KUBE_VERSION, LABELS, MODEL_COMPONENTS, NAMESPACE, RELEASE, crd_errors,
    rejected, render,
)
from tests.helpers.promql import catalog_series, metric_names, promtool_path

FULLNAME = f"{RELEASE}-mascot"
METRIC = "mascot_rpc_in_flight"
KEDA_APIS = (*CLUSTER_APIS, "keda.sh/v1alpha1", "keda.sh/v1alpha1/ScaledObject")
WITHOUT_KSERVE = {"kserve": {"enabled": False}, "model": {"storageUri": ""}, "reward": {"storageUri": ""}}
#: The fields of a ScaledObject's spec and of a trigger in KEDA's CRD (keda.sh_scaledobjects.yaml, v1alpha1).
KEDA_SPEC_FIELDS = {"scaleTargetRef", "minReplicaCount", "maxReplicaCount", "idleReplicaCount", "pollingInterval",
                    "cooldownPeriod", "advanced", "fallback", "triggers", "initialCooldownPeriod"}
KEDA_TRIGGER_FIELDS = {"type", "name", "metadata", "metricType", "authenticationRef", "useCachedMetrics"}


#: The model services scaled on load here, one of each form: the generation service (the default; it serves the
#: speaker with the director and the judge) and the speaker's own service (generation.enabled false).
SERVICES = ("generation", "speaker")


def _scaled(kserve: bool, min_replicas: int = 2, max_replicas: int = 5, service: str = "speaker",
            **autoscaling) -> dict:
    """Values scaling the model service ``service`` (one of :data:`SERVICES`) on load between ``min_replicas`` and
    ``max_replicas``, with or without KServe; "speaker" turns the generation service off so that the speaker runs its
    own."""
    values = {} if kserve else copy.deepcopy(WITHOUT_KSERVE)
    values["generation"] = {"enabled": service == "generation"}
    values[service] = {**values.get(service, {}), "minReplicas": min_replicas, "maxReplicas": max_replicas,
                       "autoscaling": autoscaling}
    return values


def _deployment_name(r, kserve: bool, component: str) -> str:
    """The Deployment of a model service: the one KServe creates for the predictor (``<isvc>-predictor``, like its
    ClusterIP Service; the gateway dials the headless Service, tests/contract/test_helm_balancing.py) or the chart's
    own."""
    if kserve:
        isvc = r.one("InferenceService", f"-{component}")["metadata"]["name"]
        return f"{isvc}-predictor"
    return r.one("Deployment", f"-{component}")["metadata"]["name"]


def _render_error(values: dict, api_versions=CLUSTER_APIS) -> str:
    import helm_python as helm

    with pytest.raises(helm.HelmRenderError) as e:
        render(values, api_versions)
    return str(e.value)


# ----------------------------------------------------------------------------------------------- off by default
@pytest.mark.parametrize("ci", CI_IDS)
def test_load_autoscaling_is_off_by_default_and_kserves_cpu_path_is_unchanged(rendered, ci):
    r = rendered[ci]
    assert not r.of_kind("ScaledObject")
    assert all(h["metadata"]["name"] == f"{FULLNAME}-gateway" for h in r.of_kind("HorizontalPodAutoscaler"))
    for isvc in r.of_kind("InferenceService"):
        p = isvc["spec"]["predictor"]
        scales = p["maxReplicas"] > p["minReplicas"]
        assert isvc["metadata"]["annotations"]["serving.kserve.io/autoscalerClass"] == ("hpa" if scales else "none")
        assert ("scaleMetric" in p and "scaleTarget" in p) == scales
    assert r.services
    for comp in r.services:
        if not r.of_kind("InferenceService"):
            assert r.one("Deployment", f"-{comp}")["spec"]["replicas"] >= 1
    defaults = yaml.safe_load((CHART / "values.yaml").read_text())
    for comp in ("generation", *MODEL_COMPONENTS):
        a = defaults[comp]["autoscaling"]
        assert a["hpa"]["enabled"] is False and a["keda"]["enabled"] is False and a["targetInFlight"] > 0
    if ci == "full.yaml":  # KServe's CPU HPA on the speaker, 2 to 4 replicas
        speaker = r.one("InferenceService", "-speaker")["spec"]["predictor"]
        want = r.values["speaker"]
        assert (speaker["scaleMetric"], speaker["scaleTarget"]) == (want.get("scaleMetric", "cpu"), want["scaleTarget"])


# ----------------------------------------------------------------------------------------------- the HPA
@pytest.mark.parametrize("service", SERVICES)
@pytest.mark.parametrize(("kserve", "target", "quantity"), [(True, 3, "3"), (False, 2.5, "2.5")],
                         ids=["kserve", "deployment"])
def test_hpa_scales_the_services_deployment_on_in_flight_rpcs_per_pod(crd_validators, kserve, target, quantity,
                                                                      service):
    import kubernetes_validate

    r = render(_scaled(kserve, service=service, hpa={"enabled": True}, targetInFlight=target))
    assert r.service_of("speaker") == service
    (hpa,) = [h for h in r.of_kind("HorizontalPodAutoscaler")]
    kubernetes_validate.validate(hpa, KUBE_VERSION, strict=True)
    assert (hpa["apiVersion"], hpa["metadata"]["name"], hpa["metadata"]["namespace"]) == (
        "autoscaling/v2", f"{FULLNAME}-{service}", NAMESPACE)
    assert set(LABELS) <= set(hpa["metadata"]["labels"])
    assert hpa["metadata"]["labels"]["app.kubernetes.io/component"] == service
    spec = hpa["spec"]
    name = _deployment_name(r, kserve, service)
    assert name == f"{FULLNAME}-{service}" + ("-predictor" if kserve else "")
    assert spec["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": name}
    assert (spec["minReplicas"], spec["maxReplicas"]) == (2, 5)
    assert spec["metrics"] == [{"type": "Pods", "pods": {
        "metric": {"name": METRIC}, "target": {"type": "AverageValue", "averageValue": quantity}}}]
    assert "behavior" not in spec  # {} = Kubernetes' defaults
    other = "reward" if service == "generation" else "director"  # a service left unscaled
    if kserve:  # KServe hands the predictor Deployment's replicas over and creates no HPA of its own
        isvc = r.one("InferenceService", f"-{service}")
        p = isvc["spec"]["predictor"]
        assert isvc["metadata"]["annotations"]["serving.kserve.io/autoscalerClass"] == "external"
        assert "scaleMetric" not in p and "scaleTarget" not in p
        assert (p["minReplicas"], p["maxReplicas"]) == (2, 5)
        assert crd_errors(crd_validators, isvc) == []
        unscaled = r.one("InferenceService", f"-{other}")
        assert unscaled["metadata"]["annotations"]["serving.kserve.io/autoscalerClass"] == "none"
    else:  # the HPA owns the count: an upgrade must not reset it
        assert "replicas" not in r.one("Deployment", f"-{service}")["spec"]
        assert r.one("Deployment", f"-{other}")["spec"]["replicas"] == 1
    # pdb auto: the service may now run several pods
    assert [p["metadata"]["name"] for p in r.of_kind("PodDisruptionBudget")] == [
        f"{FULLNAME}-gateway", f"{FULLNAME}-{service}"]
    for _, obj in r.objects:
        if obj["kind"] not in CRD_KINDS:
            kubernetes_validate.validate(obj, KUBE_VERSION, strict=True)
    bad = copy.deepcopy(hpa)  # the validator would catch a misspelt field the API server would drop
    bad["spec"]["metrics"][0]["pods"]["target"]["averageValu"] = bad["spec"]["metrics"][0]["pods"]["target"].pop(
        "averageValue")
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, KUBE_VERSION, strict=True)


def test_the_hpa_metric_is_the_catalogs_gauge_on_the_scraped_port():
    """The Pods metric is a gauge of mascot.core.metrics with the labels the docs name, and the models
    ServiceMonitor scrapes /metrics on the port the model server serves it on, with KServe and without."""
    from mascot.core.metrics import Metrics

    assert catalog_series()[METRIC] == METRIC
    (family,) = [f for f in Metrics().registry.collect() if f.name == METRIC]
    assert family.type == "gauge"
    m = Metrics()
    m.declare(rpcs={"speaker": ["GenerateReply"]})
    assert m.registry.get_sample_value(METRIC, {"component": "speaker", "rpc": "GenerateReply"}) == 0
    for kserve, service in [(kserve, service) for kserve in (True, False) for service in SERVICES]:
        r = render(_scaled(kserve, service=service, hpa={"enabled": True}))
        sm = r.one("ServiceMonitor", "-models")
        (ep,) = sm["spec"]["endpoints"]
        assert (ep["port"], ep["path"]) == ("http", "/metrics")
        if kserve:
            (expr,) = sm["spec"]["selector"]["matchExpressions"]
            assert f"{FULLNAME}-{service}" in expr["values"]
            (c,) = r.one("InferenceService", f"-{service}")["spec"]["predictor"]["containers"]
        else:
            svc = r.one("Service", f"-{service}")
            assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
            assert "http" in {p["name"] for p in svc["spec"]["ports"]}
            (c,) = r.one("Deployment", f"-{service}")["spec"]["template"]["spec"]["containers"]
        # `mascot serve-model --rest-port` serves /metrics on the container port named http
        (http,) = [p for p in c["ports"] if p["name"] == "http"]
        assert c["args"][c["args"].index("--rest-port") + 1] == str(http["containerPort"])


def test_shared_settings_reach_the_hpa_and_the_scaled_object(crd_validators):
    import kubernetes_validate

    behavior = {"scaleDown": {"stabilizationWindowSeconds": 600,
                              "policies": [{"type": "Pods", "value": 1, "periodSeconds": 120}]}}
    shared = {"models": {"autoscaling": {"hpa": {"metric": "mascot_load_per_pod"},
                                         "keda": {"serverAddress": "http://prom.observability:9090", "window": "5m"},
                                         "behavior": behavior}}}
    # (generation.enabled, the service scaled by an HPA, the one scaled by KEDA, autoscalerClass of each service)
    for generation, by_hpa, by_keda, classes in [
        (False, "speaker", "director", {"director": "external", "speaker": "external", "judge": "none",
                                        "reward": "none"}),
        (True, "generation", "reward", {"generation": "external", "reward": "external"}),
    ]:
        r = render({**shared, "generation": {"enabled": generation},
                    by_hpa: {"maxReplicas": 3, "autoscaling": {"hpa": {"enabled": True}}},
                    by_keda: {"maxReplicas": 2, "autoscaling": {"keda": {"enabled": True}, "targetInFlight": 4}}},
                   KEDA_APIS)
        (hpa,) = r.of_kind("HorizontalPodAutoscaler")
        kubernetes_validate.validate(hpa, KUBE_VERSION, strict=True)
        assert hpa["metadata"]["name"] == f"{FULLNAME}-{by_hpa}"
        assert hpa["spec"]["metrics"][0]["pods"]["metric"]["name"] == "mascot_load_per_pod"
        assert hpa["spec"]["behavior"] == behavior
        (so,) = r.of_kind("ScaledObject")
        assert so["metadata"]["name"] == f"{FULLNAME}-{by_keda}"
        assert so["spec"]["advanced"] == {"horizontalPodAutoscalerConfig": {"behavior": behavior}}
        (trigger,) = so["spec"]["triggers"]
        assert trigger["metadata"]["serverAddress"] == "http://prom.observability:9090"
        assert trigger["metadata"]["query"].endswith("[5m]))") and trigger["metadata"]["threshold"] == "4"
        annotations = {o["metadata"]["name"].removeprefix(f"{FULLNAME}-"):
                       o["metadata"]["annotations"]["serving.kserve.io/autoscalerClass"]
                       for o in r.of_kind("InferenceService")}
        assert annotations == classes


# ----------------------------------------------------------------------------------------------- KEDA
@pytest.mark.parametrize("service", SERVICES)
@pytest.mark.parametrize("kserve", [True, False], ids=["kserve", "deployment"])
def test_keda_scaled_object_sums_the_services_in_flight_rpcs(kserve, service):
    r = render(_scaled(kserve, service=service, keda={"enabled": True}, targetInFlight=6), KEDA_APIS)
    assert not r.of_kind("HorizontalPodAutoscaler")  # KEDA makes its own (keda-hpa-<name>)
    (so,) = r.of_kind("ScaledObject")
    assert (so["apiVersion"], so["kind"]) == ("keda.sh/v1alpha1", "ScaledObject")
    assert (so["metadata"]["name"], so["metadata"]["namespace"]) == (f"{FULLNAME}-{service}", NAMESPACE)
    assert set(LABELS) <= set(so["metadata"]["labels"])
    assert so["metadata"]["labels"]["app.kubernetes.io/component"] == service
    spec = so["spec"]
    assert set(spec) <= KEDA_SPEC_FIELDS, set(spec) - KEDA_SPEC_FIELDS
    name = _deployment_name(r, kserve, service)
    assert spec["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": name}
    assert (spec["minReplicaCount"], spec["maxReplicaCount"]) == (2, 5)
    assert "advanced" not in spec
    (trigger,) = spec["triggers"]
    assert set(trigger) <= KEDA_TRIGGER_FIELDS and trigger["type"] == "prometheus"
    md = trigger["metadata"]
    assert all(isinstance(v, str) for v in md.values()), md  # the CRD: a map of strings
    assert md["serverAddress"] == "http://prometheus-operated.monitoring.svc:9090"
    assert md["threshold"] == "6"
    query = md["query"]
    assert metric_names(query) == [METRIC]
    # the Service the pods are scraped through: the one KServe creates for the predictor, or ours
    scraped = f"{FULLNAME}-{service}-predictor" if kserve else r.one("Service", f"-{service}")["metadata"]["name"]
    assert query == f'sum(avg_over_time({METRIC}{{namespace="{NAMESPACE}", service="{scraped}"}}[2m]))'
    # ... and the labels it selects on are the ones the models ServiceMonitor writes on those series
    sm = r.one("ServiceMonitor", "-models")
    (ep,) = sm["spec"]["endpoints"]
    assert {"sourceLabels": ["__meta_kubernetes_service_name"], "targetLabel": "service"} in ep["relabelings"]
    assert sm["metadata"]["namespace"] == NAMESPACE and sm["spec"]["namespaceSelector"]["matchNames"] == [NAMESPACE]
    if kserve:
        isvc = r.one("InferenceService", f"-{service}")
        assert isvc["metadata"]["annotations"]["serving.kserve.io/autoscalerClass"] == "external"
        assert "scaleMetric" not in isvc["spec"]["predictor"]
    else:
        assert "replicas" not in r.one("Deployment", f"-{service}")["spec"]


def test_keda_needs_its_api_on_the_cluster():
    for service in SERVICES:
        message = _render_error(_scaled(True, service=service, keda={"enabled": True}))
        assert f"{service}.autoscaling.keda.enabled needs KEDA's ScaledObject API (keda.sh/v1alpha1)" in message
        assert "--api-versions keda.sh/v1alpha1/ScaledObject" in message


def test_a_hosted_components_load_scaling_is_unused():
    """A component the generation service hosts runs no service of its own: its autoscaling keys render nothing and
    are not checked (the generation section's apply)."""
    hosted = {"minReplicas": 2, "maxReplicas": 5, "autoscaling": {"hpa": {"enabled": True}, "keda": {"enabled": True}}}
    r = render({"speaker": hosted, "judge": {**hosted, "minReplicas": 0}}, KEDA_APIS)
    assert r.hosted == ["director", "speaker", "judge"]
    assert not r.of_kind("HorizontalPodAutoscaler") and not r.of_kind("ScaledObject")
    assert r.one("InferenceService", "-generation")["metadata"]["annotations"][
        "serving.kserve.io/autoscalerClass"] == "none"


# ----------------------------------------------------------------------------------------------- refusals
def test_hpa_and_keda_at_once_are_refused_with_a_clear_message():
    for kserve, service in [(kserve, service) for kserve in (True, False) for service in SERVICES]:
        message = _render_error(_scaled(kserve, service=service, hpa={"enabled": True}, keda={"enabled": True}),
                                KEDA_APIS)
        assert (f"{service}.autoscaling.hpa.enabled and {service}.autoscaling.keda.enabled are both true: choose one"
                in message), message
    render({"generation": {"enabled": False},
            "judge": {"enabled": False, "autoscaling": {"hpa": {"enabled": True}, "keda": {"enabled": True}}}})


@pytest.mark.parametrize("service", SERVICES)
@pytest.mark.parametrize(("replicas", "kind", "message"), [
    ((0, 3), "hpa", "{s}.autoscaling.hpa.enabled needs {s}.minReplicas >= 1 (got 0)"),
    ((0, 3), "keda", "{s}.autoscaling.keda.enabled needs {s}.minReplicas >= 1 (got 0)"),
    ((2, 2), "hpa", "{s}.autoscaling.hpa.enabled needs {s}.maxReplicas (2) above {s}.minReplicas (2)"),
], ids=["hpa-from-zero", "keda-from-zero", "nothing-to-scale"])
def test_replica_ranges_load_cannot_scale_are_refused(replicas, kind, message, service):
    values = _scaled(True, *replicas, service=service, **{kind: {"enabled": True}})
    assert message.format(s=service) in _render_error(values, KEDA_APIS)


def test_schema_refuses_malformed_autoscaling_values():
    rejected({"speaker": {"autoscaling": {"kind": "hpa"}}}, "/speaker/autoscaling", "kind")
    rejected({"generation": {"autoscaling": {"kind": "hpa"}}}, "/generation/autoscaling", "kind")
    rejected({"generation": {"autoscaling": {"targetInFlight": -1}}}, "/generation/autoscaling/targetInFlight", "0")
    rejected({"speaker": {"autoscaling": {"targetInFlight": 0}}}, "/speaker/autoscaling/targetInFlight", "0")
    rejected({"models": {"autoscaling": {"keda": {"window": "2 minutes"}}}}, "/models/autoscaling/keda/window",
             "pattern")
    rejected({"models": {"autoscaling": {"keda": {"serverAddress": "prometheus:9090"}}}},
             "/models/autoscaling/keda/serverAddress", "pattern")


# ----------------------------------------------------------------------------------------------- the documented rule
def _adapter_rule() -> dict:
    """The Prometheus adapter rule of the chart README (its only YAML block with a ``seriesQuery``)."""
    readme = (CHART / "README.md").read_text()
    (block,) = [b for b in re.findall(r"```yaml\n(.*?)```", readme, re.S) if "seriesQuery" in b]
    (rule,) = yaml.safe_load(block)["rules"]["custom"]
    return rule


def test_the_documented_adapter_rule_serves_the_metric_the_hpa_reads():
    rule = _adapter_rule()
    defaults = yaml.safe_load((CHART / "values.yaml").read_text())["models"]["autoscaling"]
    assert metric_names(rule["seriesQuery"]) == [METRIC]
    assert re.fullmatch(rule["name"]["matches"], METRIC) and rule["name"]["as"] == defaults["hpa"]["metric"]
    # per pod: the HPA asks for the pods of the target Deployment in the release namespace
    assert rule["resources"]["overrides"] == {"namespace": {"resource": "namespace"}, "pod": {"resource": "pod"}}
    assert "<<.LabelMatchers>>" in rule["metricsQuery"] and "by (<<.GroupBy>>)" in rule["metricsQuery"]
    assert f"[{defaults['keda']['window']}]" in rule["metricsQuery"]  # the same smoothing as the KEDA query


def test_the_load_queries_parse_as_promql(tmp_path):
    promtool = promtool_path()
    r = render(_scaled(True, service="generation", keda={"enabled": True}), KEDA_APIS)
    keda_query = r.one("ScaledObject", "-generation")["spec"]["triggers"][0]["metadata"]["query"]
    rule = _adapter_rule()
    adapter_query = (rule["metricsQuery"].replace("<<.Series>>", METRIC)
                     .replace("<<.LabelMatchers>>", f'namespace="{NAMESPACE}",pod=~"a|b"')
                     .replace("<<.GroupBy>>", "pod"))
    rules = [{"record": "keda:query", "expr": keda_query}, {"record": "adapter:query", "expr": adapter_query},
             {"record": "adapter:series", "expr": rule["seriesQuery"]}]
    (tmp_path / "q.yaml").write_text(yaml.safe_dump({"groups": [{"name": "load", "rules": rules}]}))
    p = subprocess.run([promtool, "check", "rules", str(tmp_path / "q.yaml")], capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 0 and "SUCCESS: 3 rules found" in p.stdout, p.stdout + p.stderr
