"""checkov (its own virtual environment, .venv-checkov, built by `make setup`) on the chart
rendered for every helm/mascot/ci/*.yaml. checkov knows only built-in kinds, so each InferenceService predictor is
also scanned as the Deployment KServe makes of it (RawDeployment), and each training Job template (a ConfigMap
entry the gateway instantiates) as the Job it becomes. Zero failed checks apart from the reviewed skip list
tests/contract/checkov_skips.yaml: every finding must match a listed check and "<ci file>:<resource>" pattern, and
every listed pattern must still match a finding (a fixed finding leaves the list)."""

from __future__ import annotations

import fnmatch
import json
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.helpers.chart import training_templates
from tests.helpers.paths import ROOT, need

CHECKOV = ROOT / ".venv-checkov" / "bin" / "checkov"
SKIPS = Path(__file__).parent / "checkov_skips.yaml"
COMPONENT_EXTENSION = {"minReplicas", "maxReplicas", "scaleMetric", "scaleTarget", "autoScaling", "labels",
                       "annotations", "containerConcurrency", "timeout", "canaryTrafficPercent", "batcher", "logger",
                       "deploymentStrategy", "storageUris", "workerSpec", "storageContainerName"}


def as_scanned(obj: dict) -> list[dict]:
    """The objects checkov sees for one rendered object."""
    if obj["kind"] == "InferenceService":
        predictor = obj["spec"]["predictor"]
        meta = {"name": obj["metadata"]["name"] + "-predictor", "namespace": obj["metadata"]["namespace"],
                "labels": predictor["labels"]}
        pod = {k: v for k, v in predictor.items() if k not in COMPONENT_EXTENSION}
        return [{"apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta,
                 "spec": {"replicas": predictor.get("minReplicas", 1), "selector": {"matchLabels": meta["labels"]},
                          "template": {"metadata": {"labels": meta["labels"],
                                                    "annotations": predictor.get("annotations", {})},
                                       "spec": pod}}}]
    return [obj]


def test_checkov_finds_nothing_beyond_the_reviewed_skips(rendered, tmp_path):
    need(CHECKOV.exists(), f"{CHECKOV} not found: `make setup` builds checkov's own virtual environment")
    for ci, r in rendered.items():
        docs = [d for _, obj in r.objects for d in as_scanned(obj)]
        if (r.values.get("training") or {}).get("enabled"):
            docs += list(training_templates(r).values())
        (tmp_path / ci).mkdir()
        (tmp_path / ci / "manifests.yaml").write_text(yaml.safe_dump_all(docs, sort_keys=False))
    p = subprocess.run([str(CHECKOV), "--directory", str(tmp_path), "--framework", "kubernetes", "--output", "json",
                        "--quiet", "--skip-download"],
                       capture_output=True, text=True, timeout=600, env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path),
                                                                         "BC_SKIP_MAPPING": "TRUE"})
    assert p.returncode in (0, 1) and p.stdout.strip(), p.stderr[-3000:]
    report = json.loads(p.stdout)
    reports = report if isinstance(report, list) else [report]
    summary = {k: sum(r["summary"][k] for r in reports) for k in ("passed", "failed", "parsing_errors",
                                                                  "resource_count")}
    assert summary["parsing_errors"] == 0 and summary["passed"] > 500 and summary["resource_count"] > 60, summary
    findings = [(f["check_id"], f"{f['file_path'].strip('/').split('/')[0]}:{f['resource']}")
                for r in reports for f in r["results"]["failed_checks"]]
    skips = yaml.safe_load(SKIPS.read_text())
    for check, entry in skips.items():
        assert entry["reason"].strip() and entry["resources"], f"{check}: a skip needs its reason and resources"
    unreviewed = [f for f in findings
                  if not any(fnmatch.fnmatchcase(f[1], pat) for pat in skips.get(f[0], {}).get("resources", []))]
    assert not unreviewed, "checkov findings not in the reviewed skip list:\n" + "\n".join(map(str, unreviewed))
    stale = [(check, pat) for check, entry in skips.items() for pat in entry["resources"]
             if not any(f[0] == check and fnmatch.fnmatchcase(f[1], pat) for f in findings)]
    assert not stale, f"skips that match no finding any more (remove them): {stale}"


@pytest.mark.parametrize("check", sorted(yaml.safe_load(SKIPS.read_text())))
def test_every_skip_names_a_real_checkov_check(check):
    assert check.startswith(("CKV_K8S_", "CKV2_K8S_"))
