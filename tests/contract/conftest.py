"""Fixtures of the Helm chart tests: the chart rendered offline (helm-python-sdk, no helm binary) once per session for
every ``helm/mascot/ci/*.yaml``, release ``demo`` in namespace ``mascot``."""

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


def render(values: dict) -> Rendered:
    """Render the chart with ``values`` (install; schema enforced by the renderer).

    Raises:
        helm_python.HelmValuesError: the values break values.schema.json.
    """
    import helm_python as helm

    out = helm.Chart.load(CHART).render(values, name=RELEASE, namespace=NAMESPACE, is_install=True)
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
