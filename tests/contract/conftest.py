"""Fixtures of the Helm chart tests: the chart rendered offline (helm-python-sdk, no helm binary) once per session for
every ``helm/mascot/ci/*.yaml``, release ``demo`` in namespace ``mascot``, as on a Kubernetes 1.33 cluster that serves
the KServe and prometheus-operator APIs (``CLUSTER_APIS``; a test passes others to :func:`render`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT

CHART = ROOT / "helm" / "mascot"
CI_FILES = sorted((CHART / "ci").glob("*.yaml"))
CI_IDS = [p.name for p in CI_FILES]
RELEASE, NAMESPACE = "demo", "mascot"
KUBE_VERSION = "1.33.0"
#: The custom resource APIs of the cluster the chart is rendered for (Helm's .Capabilities.APIVersions, which
#: `helm install` reads from the cluster): KServe and prometheus-operator.
CLUSTER_APIS = (
    "serving.kserve.io/v1beta1", "serving.kserve.io/v1beta1/InferenceService",
    "monitoring.coreos.com/v1", "monitoring.coreos.com/v1/ServiceMonitor", "monitoring.coreos.com/v1/PrometheusRule",
)


@dataclass(frozen=True)
class Rendered:
    """One ci values file rendered: its values, every object (hooks and test hooks included) with the template it
    came from, and NOTES.txt."""

    values: dict
    objects: list[tuple[str, dict]]
    notes: str

    def of_kind(self, kind: str) -> list[dict]:
        return [o for _, o in self.objects if o["kind"] == kind]

    def one(self, kind: str, name_suffix: str) -> dict:
        (obj,) = [o for o in self.of_kind(kind) if o["metadata"]["name"].endswith(name_suffix)]
        return obj

    @property
    def effective(self) -> dict:
        """The chart's values.yaml with this rendering's values merged over it (as Helm merges them)."""
        return effective_values(self.values)

    @property
    def hosted(self) -> list[str]:
        """The components the generation service hosts here (see :func:`hosted_components`)."""
        return hosted_components(self.values)

    @property
    def services(self) -> list[str]:
        """The model services rendered here (see :func:`model_services`)."""
        return model_services(self.values)

    def service_of(self, component: str) -> str:
        """The model service that serves ``component`` here."""
        return "generation" if component in self.hosted else component


MODEL_COMPONENTS = ("director", "speaker", "judge", "reward")


def _merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def effective_values(values: dict) -> dict:
    """values.yaml with ``values`` merged over it, maps merged key by key and everything else replaced (Helm's
    coalescing)."""
    return _merge(yaml.safe_load((CHART / "values.yaml").read_text()), values or {})


def hosted_components(values: dict) -> list[str]:
    """The components the generation service hosts for ``values``: ``generation.components`` whose own section is
    enabled, in that order; none when ``generation.enabled`` is false (the chart's mascot.generationComponents)."""
    v = effective_values(values)
    if not v["generation"]["enabled"]:
        return []
    return [c for c in v["generation"]["components"] if v[c]["enabled"]]


def model_services(values: dict) -> list[str]:
    """The enabled model services the chart renders for ``values``, in its order: ``generation`` when it hosts any
    component, then each enabled component it does not host (the chart's mascot.modelServices)."""
    v, hosted = effective_values(values), hosted_components(values)
    return (["generation"] if hosted else []) + [c for c in MODEL_COMPONENTS if c not in hosted and v[c]["enabled"]]


def render(values: dict, api_versions: tuple[str, ...] = CLUSTER_APIS) -> Rendered:
    """Render the chart with ``values`` (install; schema enforced by the renderer) for a Kubernetes ``KUBE_VERSION``
    cluster serving ``api_versions`` besides the built-in APIs.

    Raises:
        helm_python.HelmValuesError: the values break values.schema.json.
        helm_python.HelmRenderError: a template fails (the chart's cross-field checks call `fail`).
    """
    import json

    import helm_python as helm
    from helm_python import _native

    # Chart.render does not take the cluster's API versions; the library's render options do (as `helm template
    # --api-versions`), so they are passed to it directly.
    opts = {"name": RELEASE, "namespace": NAMESPACE, "is_install": True, "kube_version": f"v{KUBE_VERSION}",
            "api_versions": list(api_versions)}
    with helm.Chart.load(CHART) as chart:
        out = json.loads(_native.call_string("helm_render", chart._raw(), json.dumps(values), json.dumps(opts)))
    objects = []
    for template, text in sorted(out.items()):
        if template.endswith("NOTES.txt"):
            continue
        objects += [(template, doc) for doc in yaml.safe_load_all(text) if doc]
    return Rendered(values, objects, next((t for k, t in out.items() if k.endswith("NOTES.txt")), ""))


@pytest.fixture(scope="session")
def rendered() -> dict[str, Rendered]:
    """ci file name -> its rendering."""
    return {p.name: render(yaml.safe_load(p.read_text()) or {}) for p in CI_FILES}


def pod_specs(obj: dict) -> list[tuple[str, dict]]:
    """(where, pod spec) of every pod an object runs: workloads, Jobs, CronJobs, Pods, InferenceService predictors,
    and the training Job templates a ConfigMap carries."""
    kind, spec = obj["kind"], obj.get("spec") or {}
    where = f"{kind}/{obj['metadata']['name']}"
    if kind in ("Deployment", "StatefulSet", "DaemonSet", "Job"):
        return [(where, spec["template"]["spec"])]
    if kind == "CronJob":
        return [(where, spec["jobTemplate"]["spec"]["template"]["spec"])]
    if kind == "Pod":
        return [(where, spec)]
    if kind == "InferenceService":
        return [(where, spec["predictor"])]
    if kind == "ConfigMap" and obj["metadata"]["name"].endswith("-training-templates"):
        return [(f"{where}:{key}", yaml.safe_load(text)["spec"]["template"]["spec"])
                for key, text in obj["data"].items()]
    return []


def training_templates(r: Rendered) -> dict[str, dict]:
    """phase -> the Job template of the training-templates ConfigMap."""
    cm = r.one("ConfigMap", "-training-templates")
    return {key.removesuffix(".yaml"): yaml.safe_load(text) for key, text in cm["data"].items()}


def load_ci(name: str) -> dict:
    return yaml.safe_load((CHART / "ci" / name).read_text()) or {}


def shared_path() -> Path:
    from tests.conftest import SHARED

    return SHARED
