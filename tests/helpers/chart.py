"""The Helm chart helm/mascot rendered offline (helm-python-sdk, no helm binary), release ``demo`` in namespace
``mascot``, as on a Kubernetes 1.33 cluster that serves the KServe and prometheus-operator APIs (``CLUSTER_APIS``; a
test passes others to :func:`render`), and the checks the chart tests share: values.schema.json refusals, the CLI
commands the chart runs, strict validation of every rendered object (kubernetes-validate; custom resources against
their CRD schemas)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from tests.helpers.paths import ROOT

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
MODEL_COMPONENTS = ("director", "speaker", "judge", "reward")
CRD_KINDS = {  # kind -> (CRD file under the shared CRD directory, served version)
    "InferenceService": ("kserve/serving.kserve.io_inferenceservices.yaml", "v1beta1"),
    "ServiceMonitor": ("prometheus-operator/crd-servicemonitors.yaml", "v1"),
    "PrometheusRule": ("prometheus-operator/crd-prometheusrules.yaml", "v1"),
}
#: The standard labels every object of the chart carries.
LABELS = ("app.kubernetes.io/name", "app.kubernetes.io/instance", "app.kubernetes.io/component",
          "app.kubernetes.io/managed-by", "app.kubernetes.io/part-of", "helm.sh/chart")


@dataclass(frozen=True)
class Rendered:
    """One ci values file rendered: its values, every object (hooks and test hooks included) with the template it
    came from, and NOTES.txt."""

    values: dict
    objects: list[tuple[str, dict]]
    notes: str

    def of_kind(self, kind: str) -> list[dict]:
        """Every object of ``kind``."""
        return [o for _, o in self.objects if o["kind"] == kind]

    def one(self, kind: str, name_suffix: str) -> dict:
        """The one object of ``kind`` whose name ends with ``name_suffix`` (ValueError when not exactly one)."""
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
    """The values of ``helm/mascot/ci/<name>`` ({} for an empty file)."""
    return yaml.safe_load((CHART / "ci" / name).read_text()) or {}


def component_config(r: Rendered, component: str) -> dict:
    """The MascotConfig file ``<component>.yaml`` of the rendered config ConfigMap, as a dict ({} when empty)."""
    return yaml.safe_load(r.one("ConfigMap", "-config")["data"][f"{component}.yaml"]) or {}


def rejected(values: dict, pointer: str, want: str) -> None:
    """``values`` fails the schema at ``pointer`` in render (which enforces it) and in lint (an error message)."""
    import helm_python as helm

    with pytest.raises(helm.HelmValuesError) as e:
        render(values)
    assert pointer in str(e.value) and want in str(e.value), str(e.value)
    report = helm.lint(CHART, values, strict=True, kube_version=f"v{KUBE_VERSION}")
    assert any(m["severity"] == 3 and pointer in m["error"] for m in report["messages"]), report


def cli_accepts(argv: list[str]) -> None:
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


def load_crd_validators(crds: Path) -> dict:
    """kind -> a strict Draft7Validator of its CRD (``CRD_KINDS``), read from the CRD directory ``crds``."""
    import jsonschema

    validators = {}
    for kind, (rel, version) in CRD_KINDS.items():
        with open(crds / rel, encoding="utf-8") as f:
            crd = yaml.load(f, Loader=yaml.CSafeLoader)
        assert crd["spec"]["names"]["kind"] == kind
        (served,) = [v for v in crd["spec"]["versions"] if v["name"] == version and v["served"]]
        validators[kind] = jsonschema.Draft7Validator(crd_to_jsonschema(served["schema"]["openAPIV3Schema"]))
    return validators


def crd_errors(validators: dict, obj: dict) -> list[str]:
    """``path: message`` of every error of custom resource ``obj`` against its CRD's validator ([] when valid)."""
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message[:200]}"
            for e in validators[obj["kind"]].iter_errors(obj)]


def all_valid(r: Rendered, validators: dict) -> None:
    """Every object of ``r`` is valid: custom resources against their CRD, the rest with kubernetes-validate
    (strict, ``KUBE_VERSION``; raises its ValidationError)."""
    import kubernetes_validate

    for _, obj in r.objects:
        if obj["kind"] in CRD_KINDS:
            assert crd_errors(validators, obj) == [], f"{obj['kind']}/{obj['metadata']['name']}"
        else:
            kubernetes_validate.validate(obj, KUBE_VERSION, strict=True)
