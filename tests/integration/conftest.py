"""Fixtures of the TrainingService tests (test_training_service.py, test_training_multinode.py): the chart's Job
templates, a kubernetes client and kubeconfig on kmock (the ``kmock`` fixture of the kmock pytest plugin), and
gateways with TrainingService on it."""

from __future__ import annotations

import pytest
import yaml

from mascot.api.training.v1 import training_pb2_grpc
from mascot.app.stack import start_stack
from mascot.core.server import channel
from tests.helpers.chart import render, training_templates
from tests.helpers.config import make_config
from tests.helpers.engine import ScriptedEngine
from tests.helpers.kube import TOKEN, Env, write_kubeconfig


@pytest.fixture(scope="module")
def chart_templates(tmp_path_factory):
    """The chart's Job templates (training enabled), as the control plane mounts them at /etc/mascot/training."""
    r = render({"training": {"enabled": True}})
    control_cfg = yaml.safe_load(r.one("ConfigMap", "-config")["data"]["control.yaml"])
    assert control_cfg["training"]["templates_dir"] == "/etc/mascot/training"  # the chart turns TrainingService on
    d = tmp_path_factory.mktemp("training-templates")
    for phase, job in training_templates(r).items():
        (d / f"{phase}.yaml").write_text(yaml.safe_dump(job))
    return d


@pytest.fixture
def kube(kmock, tmp_path):
    """A kubernetes BatchV1Api on kmock (the tests' view as the Job controller) and a kubeconfig for the gateway."""
    import kubernetes

    kmock.resources["batch/v1/jobs"].namespaced = True  # lists work before the first Job exists
    cfg = kubernetes.client.Configuration()
    cfg.host = str(kmock.url).rstrip("/")
    client = kubernetes.client.ApiClient(cfg)
    yield kubernetes.client.BatchV1Api(client), write_kubeconfig(tmp_path / "kubeconfig", cfg.host)
    client.close()


@pytest.fixture
async def envs(kmock, kube, chart_templates, tmp_path, monkeypatch):
    """Start gateways (the default stack: gateway, director, speaker on a scripted engine) with TrainingService on
    kmock: ``await envs(**training_config)``. Stopped at teardown."""
    monkeypatch.setenv("MASCOT_TEST_ADMIN", TOKEN)
    batch, kubeconfig = kube
    started = []

    async def start(templates_dir=chart_templates, **training):
        cfg = make_config(tmp_path, adapters={"admin_token_env": "MASCOT_TEST_ADMIN"},
                          training={"templates_dir": str(templates_dir), "kubeconfig": str(kubeconfig),
                                    "poll_s": 0, **training})
        stack = await start_stack(cfg, engine=ScriptedEngine(lambda p: "", lambda p: ""))
        ch = channel(stack.target("control"))
        started.append((stack, ch))
        return Env(stack, training_pb2_grpc.TrainingServiceStub(ch), batch, kmock)

    yield start
    for stack, ch in started:
        await ch.close()
        await stack.stop(0)
