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
