"""A port that is already taken: every server says which port, on which address, and the setting that chooses it
(gRPC servers, the Prometheus endpoint, ``mascot serve`` on the command line)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from mascot.core.config import MascotConfig
from mascot.core.metrics import Metrics
from mascot.core.server import PortInUse, build_server
from tests.helpers.paths import ROOT



@pytest.fixture
def taken():
    """A port held by a listening socket on 127.0.0.1."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    yield s.getsockname()[1]
    s.close()


async def test_a_grpc_server_names_the_port_it_cannot_bind_and_its_setting(taken):
    with pytest.raises(PortInUse) as e:
        await build_server("gateway", Metrics(), [], host="127.0.0.1", port=taken)
    assert f"127.0.0.1:{taken}" in str(e.value) and "server.gateway_port" in str(e.value)
    assert "in use" in str(e.value)


async def test_a_second_grpc_server_on_a_port_another_one_holds_is_refused():
    """grpcio sets SO_REUSEPORT by default, with which two servers on one port both listen and split its traffic;
    ours turn it off, so a second replica started on a busy port fails instead of serving half the calls."""
    first = await build_server("speaker", Metrics(), [], host="127.0.0.1", port=0)
    try:
        with pytest.raises(PortInUse) as e:
            await build_server("speaker", Metrics(), [], host="127.0.0.1", port=first.port)
        assert f"127.0.0.1:{first.port}" in str(e.value) and "server.speaker_port" in str(e.value)
    finally:
        await first.server.stop(0)


async def test_the_metrics_endpoint_names_its_port_and_setting(taken, tmp_path):
    from mascot.app.stack import start_stack

    cfg = MascotConfig(server={"gateway_port": 0, "metrics_port": taken, "director_target": "127.0.0.1:1",
                               "speaker_target": "127.0.0.1:1"}, store={"url": f"sqlite:///{tmp_path}/s.db"})
    with pytest.raises(PortInUse) as e:
        await start_stack(cfg, ("gateway",), serve_metrics=True)
    assert f"127.0.0.1:{taken}" in str(e.value) and "server.metrics_port" in str(e.value)


def test_mascot_serve_prints_the_taken_port_and_exits_2(taken, tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-m", "mascot.cli", "serve", "--component", "gateway", "--port", str(taken),
                          "--director-target", "127.0.0.1:1", "--speaker-target", "127.0.0.1:1",
                          "--store-url", f"sqlite:///{tmp_path}/s.db"],
                         capture_output=True, text=True, timeout=120, cwd=ROOT, env=env)
    assert out.returncode == 2, out.stdout + out.stderr
    text = " ".join((out.stdout + out.stderr).split())
    assert f"127.0.0.1:{taken}" in text and "server.gateway_port" in text and "Traceback" not in text
