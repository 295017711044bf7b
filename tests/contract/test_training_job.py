"""The images (services/Dockerfile, training-jobs/Dockerfile) and the training Job manifests the requirements:
the same image and command run as a Kubernetes Job).
No Docker engine or cluster exists here, so this checks what can be checked: the Dockerfile's bases are pinned, it
runs as a non-root user and its entrypoint is our CLI; each Job validates strictly against the Kubernetes 1.33
schema, runs the CLI command it names (it exists and accepts the flags), reads its config from a mounted ConfigMap
and writes its run directory to a PVC (so a restarted pod resumes), runs non-root, and takes the admin token from a
Secret."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
import yaml

from tests.helpers.paths import ROOT

DOCKERFILE = ROOT / "training-jobs" / "Dockerfile"
JOBS = sorted((ROOT / "training-jobs" / "k8s").glob("*-job.yaml"))


def test_dockerfile_is_pinned_multi_stage_non_root_with_our_entrypoint():
    text = DOCKERFILE.read_text()
    froms = re.findall(r"^FROM\s+(\S+)(?:\s+AS\s+(\S+))?", text, flags=re.M)
    assert len(froms) >= 2, "multi-stage: a builder and a runtime"
    for image, _ in froms:
        assert ":" in image or "@sha256:" in image, f"{image} is not pinned"
        assert not image.endswith(":latest"), image
    users = re.findall(r"^USER\s+(\S+)", text, flags=re.M)
    assert users and users[-1].split(":")[0] not in ("root", "0")
    entry = re.search(r"^ENTRYPOINT\s+(\[.*\])", text, flags=re.M)
    assert entry and yaml.safe_load(entry.group(1))[:2] == ["mascot", "train"]
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert 'mascot = "mascot.cli:app"' in pyproject  # the console script the entrypoint calls
    assert "constraints.txt" in text and "torch==2.13.0" in text  # the pinned dependency set


@pytest.mark.parametrize("path", JOBS, ids=[p.name for p in JOBS])
def test_job_manifest_is_valid_and_runs_our_command(path):
    import kubernetes_validate

    job = yaml.safe_load(path.read_text())
    kubernetes_validate.validate(job, "1.33.0", strict=True)
    assert job["kind"] == "Job" and job["apiVersion"] == "batch/v1"
    pod = job["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["restartPolicy"] in ("OnFailure", "Never")
    (c,) = pod["containers"]
    argv = c["command"] + c["args"]
    assert argv[:2] == ["mascot", "train"] and argv[2] in ("persona-alignment", "collaborative")
    assert c["securityContext"]["allowPrivilegeEscalation"] is False
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    config, out = argv[argv.index("--config") + 1], argv[argv.index("--out") + 1]
    assert "configMap" in volumes[mounts[config.rsplit("/", 1)[0]]]
    assert "persistentVolumeClaim" in volumes[mounts["/" + out.strip("/").split("/")[0]]]
    token = {e["name"]: e for e in c["env"]}["MASCOT_ADMIN_TOKEN"]
    assert "secretKeyRef" in token["valueFrom"]
    # the command exists and takes exactly these flags
    p = subprocess.run([sys.executable, "-m", "mascot.cli", "train", argv[2], "--help"], capture_output=True,
                       text=True, timeout=120, cwd=ROOT)
    assert p.returncode == 0 and "--config" in p.stdout and "--out" in p.stdout


def test_both_phases_have_a_job():
    assert {p.name for p in JOBS} == {"persona-alignment-job.yaml", "collaborative-job.yaml"}


def test_service_dockerfile_has_pinned_non_root_gpu_and_cpu_targets():
    text = (ROOT / "services" / "Dockerfile").read_text()
    args = dict(re.findall(r"^ARG\s+(\w+)=(\S+)", text, flags=re.M))
    stages = {}
    for block in re.split(r"^(?=FROM\s)", text, flags=re.M)[1:]:
        m = re.match(r"FROM\s+(\S+)\s+AS\s+(\S+)", block)
        image = re.sub(r"\$\{(\w+)\}", lambda v: args[v.group(1)], m.group(1))
        assert ":" in image and not image.endswith(":latest"), f"{image} is not pinned"
        stages[m.group(2)] = block
    assert {"cpu", "gpu"} <= set(stages) and args["VLLM_IMAGE"].startswith("vllm/vllm-openai:v")
    for target in ("cpu", "gpu"):
        users = re.findall(r"^USER\s+(\S+)", stages[target], flags=re.M)
        assert users and users[-1].split(":")[0] not in ("root", "0"), target
        entry = re.search(r"^ENTRYPOINT\s+(\[.*\])", stages[target], flags=re.M)
        assert entry and yaml.safe_load(entry.group(1)) == ["mascot", "serve"], target
    for port in ("50051", "50061", "50062", "50063", "50064", "9464"):  # the docs ports
        assert port in stages["cpu"] and port in stages["gpu"]
    p = subprocess.run([sys.executable, "-m", "mascot.cli", "serve", "--help"], capture_output=True, text=True,
                       timeout=120, cwd=ROOT)
    assert p.returncode == 0 and "--component" in p.stdout
