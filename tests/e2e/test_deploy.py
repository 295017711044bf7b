"""On a real cluster (marked e2e: never run by `make test`): docs/deployment.md, from a `helm install`ed
release to a streamed conversation and a triggered retraining run.

Run after `helm install` (docs/deployment.md) with the gateway and the control plane reachable (e.g. `kubectl
port-forward svc/<release>-gateway 50051` and `svc/<release>-control 50061`):

    MASCOT_E2E_GATEWAY=127.0.0.1:50051 MASCOT_E2E_CONTROL=127.0.0.1:50061 MASCOT_ADMIN_TOKEN=... \
        .venv/bin/python -m pytest -m e2e tests/e2e

Without ``MASCOT_E2E_GATEWAY`` / ``MASCOT_E2E_CONTROL`` the tests fail (an e2e run without a cluster is a mistake,
not a skip).
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid

import pytest

from mascot.api.conversation.v1 import conversation_pb2 as cpb
from mascot.api.conversation.v1 import conversation_pb2_grpc as cpb_grpc
from mascot.core.server import channel
from tests.helpers.paths import ROOT

pytestmark = pytest.mark.e2e


@pytest.fixture
def gateway() -> str:
    target = os.environ.get("MASCOT_E2E_GATEWAY", "")
    if not target:
        pytest.fail("set MASCOT_E2E_GATEWAY=host:port of the deployed gateway (docs/deployment.md)")
    return target


async def test_streamed_conversation_on_the_deployed_release(gateway):
    async with channel(gateway) as ch:
        stub = cpb_grpc.ConversationServiceStub(ch)
        conv = (await stub.StartConversation(cpb.StartConversationRequest(mode=cpb.MODE_SUPPORT))).conversation
        kinds, turns = [], []
        async for r in stub.SendMessage(cpb.SendMessageRequest(conversation_id=conv.id, text="My exam went badly.",
                                                               idempotency_key=uuid.uuid4().hex)):
            kinds.append(r.event.WhichOneof("event"))
            if r.event.HasField("turn_completed"):
                turns.append(r.event.turn_completed.turn)
        assert "turn_delta" in kinds and turns  # streamed, then committed
        stored = (await stub.GetConversation(cpb.GetConversationRequest(conversation_id=conv.id))).conversation
        assert [t.text for t in stored.turns][-len(turns):] == [t.text for t in turns]


@pytest.fixture
def control() -> str:
    target = os.environ.get("MASCOT_E2E_CONTROL", "")
    if not target:
        pytest.fail("set MASCOT_E2E_CONTROL=host:port of the deployed control plane (docs/deployment.md)")
    return target


def test_the_public_port_serves_no_admin_service(gateway):
    out = subprocess.run([sys.executable, "-m", "mascot.cli", "retrain", "list", "--target", gateway],
                         capture_output=True, text=True, timeout=120, cwd=ROOT,
                         env={**os.environ, "MASCOT_ADMIN_TOKEN": os.environ.get("MASCOT_ADMIN_TOKEN", "x")})
    assert out.returncode == 1 and "serves no TrainingService" in out.stdout + out.stderr


def test_triggered_retraining_run_finishes(control):
    if not os.environ.get("MASCOT_ADMIN_TOKEN"):
        pytest.fail("set MASCOT_ADMIN_TOKEN to a control-plane token with the role operator")
    run_id = f"e2e-{uuid.uuid4().hex[:8]}"
    out = subprocess.run([sys.executable, "-m", "mascot.cli", "retrain", "persona-alignment", "--run-id", run_id,
                          "--wait", "--target", control], capture_output=True, text=True, timeout=6 * 3600, cwd=ROOT)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
