"""`mascot health` (the chart's exec probes under TLS and its `helm test` Pod; docs/deployment.md), run as a
real subprocess (`python -m mascot.cli health ...`) against real gRPC servers made with
mascot.core.server.build_server on 127.0.0.1:0: plaintext, TLS and mutual TLS with a throwaway CA
(tests/helpers/pki.py). Exit 0 only on SERVING; otherwise non-zero with one line on stderr."""

from __future__ import annotations

import asyncio
import socket
import sys
from pathlib import Path

import pytest
import yaml

from mascot.core.config import TLSConfig
from mascot.core.metrics import Metrics
from mascot.core.server import build_server
from tests.helpers.net import free_port
from tests.helpers.paths import ROOT
from tests.helpers.pki import PKI, Pair, make_cluster_leaf, make_pki

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> tuple[PKI, Pair, Pair]:
    """(the shared test PKI, a cluster-names-only server certificate, one with a wildcard name only)."""
    d = tmp_path_factory.mktemp("pki")
    base, ca_key, ca = make_pki(d)
    cluster = make_cluster_leaf(d / "cluster", ["demo-mascot-gateway", "demo-mascot-gateway.mascot.svc"], ca_key, ca)
    wildcard = make_cluster_leaf(d / "wildcard", ["*.mascot.svc.cluster.local"], ca_key, ca)
    return base, cluster, wildcard


def tls_config(ca: Path, pair: Pair, client_auth: bool = False) -> dict:
    return {"cert_file": str(pair.cert), "key_file": str(pair.key), "ca_file": str(ca), "client_auth": client_auth}


async def serve(tls: dict | None = None):
    """A started server with only health and reflection (what every MASCOT server has), SERVING."""
    return await build_server("health-test", Metrics(), [], tls=TLSConfig(**tls) if tls else None)


async def mascot_health(tmp_path: Path, *args: str, config: dict | None = None) -> tuple[int, str, str]:
    """Run `python -m mascot.cli health ARGS` with MASCOT_CONFIG = ``config`` (none: no config file) in a clean
    environment; the server keeps serving on this event loop meanwhile. Returns (exit status, stdout, stderr)."""
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "PYTHONDONTWRITEBYTECODE": "1"}
    if config is not None:
        path = tmp_path / f"config-{len(list(tmp_path.glob('config-*.yaml')))}.yaml"
        path.write_text(yaml.safe_dump(config))
        env["MASCOT_CONFIG"] = str(path)
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "mascot.cli", "health", *args, cwd=ROOT,
                                                env=env, stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), timeout=60)
    return proc.returncode, out.decode(), err.decode()


def one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, f"expected one line on stderr, got: {err!r}"
    return lines[0]


# ----------------------------------------------------------------------------------------------- plaintext
async def test_serving_exits_0(tmp_path):
    srv = await serve()
    try:
        rc, out, err = await mascot_health(tmp_path, "--port", str(srv.port))
        assert (rc, out.strip(), err) == (0, f"127.0.0.1:{srv.port} SERVING", "")
        rc, _, err = await mascot_health(tmp_path, "--port", str(srv.port), config={"server": {"host": "0.0.0.0"}})
        assert rc == 0, err  # a config without server.tls: plaintext, as the server
    finally:
        await srv.stop(0)


async def test_not_serving_exits_non_zero_with_one_line(tmp_path):
    srv = await serve()
    await srv.set_serving(False)
    try:
        rc, out, err = await mascot_health(tmp_path, "--port", str(srv.port))
        assert rc == 1
        assert out.strip() == f"127.0.0.1:{srv.port} NOT_SERVING"
        assert f"127.0.0.1:{srv.port} NOT_SERVING" in one_line(err)
    finally:
        await srv.stop(0)


async def test_unknown_service_is_not_serving(tmp_path):
    srv = await serve()
    try:
        rc, _, err = await mascot_health(tmp_path, "--port", str(srv.port), "--service", "mascot.api.nope.v1.Nope")
        assert rc == 1 and "SERVICE_UNKNOWN" in one_line(err) and "mascot.api.nope.v1.Nope" in err
    finally:
        await srv.stop(0)


async def test_nothing_listening_exits_non_zero_with_a_clear_message(tmp_path):
    port = free_port()
    rc, out, err = await mascot_health(tmp_path, "--port", str(port))
    assert rc == 1 and out.strip() == f"127.0.0.1:{port} UNAVAILABLE"
    line = one_line(err)
    assert line.startswith("mascot health: not serving: ") and f"127.0.0.1:{port} UNAVAILABLE" in line
    assert "connect" in line.lower()  # gRPC's reason: failed to connect ... Connection refused


async def test_a_server_that_never_answers_times_out(tmp_path):
    with socket.socket() as s:  # accepts TCP (the backlog) and never speaks HTTP/2
        s.bind(("127.0.0.1", 0))
        s.listen(8)
        rc, _, err = await mascot_health(tmp_path, "--port", str(s.getsockname()[1]), "--timeout", "0.5")
    assert rc == 1 and "DEADLINE_EXCEEDED" in one_line(err)


async def test_several_targets_fail_when_any_fails(tmp_path):
    """The `helm test` Pod's form: --target for every component; one line per target on stdout."""
    up, down = await serve(), await serve()
    await down.set_serving(False)
    closed = free_port()
    try:
        a, b, c = f"127.0.0.1:{up.port}", f"localhost:{down.port}", f"127.0.0.1:{closed}"
        rc, out, _ = await mascot_health(tmp_path, "--target", a, "--target", a)
        assert rc == 0 and out.splitlines() == [f"{a} SERVING"] * 2
        rc, out, err = await mascot_health(tmp_path, "--target", a, "--target", b, "--target", c)
        assert rc == 1
        assert out.splitlines() == [f"{a} SERVING", f"{b} NOT_SERVING", f"{c} UNAVAILABLE"]
        line = one_line(err)
        assert f"{b} NOT_SERVING" in line and f"{c} UNAVAILABLE" in line and f"{a} SERVING" not in line
    finally:
        await up.stop(0)
        await down.stop(0)


async def test_usage_and_configuration_errors_exit_2_with_one_line(tmp_path):
    rc, _, err = await mascot_health(tmp_path)
    assert rc == 2 and "--port" in one_line(err)
    rc, _, err = await mascot_health(tmp_path, "--target", "no-port")
    assert rc == 2 and "HOST:PORT" in one_line(err)
    rc, _, err = await mascot_health(tmp_path, "--target", "127.0.0.1:100997")  # gRPC would wrap it to a real port
    assert rc == 2 and "1 to 65535" in one_line(err)
    broken = tmp_path / "broken.yaml"
    broken.write_text("{{{\n")
    rc, _, err = await mascot_health(tmp_path, "--port", "50051", "--config", str(broken))
    assert rc == 2 and "is not valid YAML" in one_line(err)
    rc, _, err = await mascot_health(tmp_path, "--port", "50051", config={"server": {"no_such_key": 1}})
    assert rc == 2 and "configuration error" in one_line(err) and "no_such_key" in err
    missing = {"server": {"tls": {"cert_file": str(tmp_path / "nope.crt"), "key_file": str(tmp_path / "nope.key"),
                                  "ca_file": str(tmp_path / "nope-ca.crt")}}}
    rc, _, err = await mascot_health(tmp_path, "--port", "50051", config=missing)
    assert rc == 2 and "TLS error" in one_line(err) and "nope" in err


# ----------------------------------------------------------------------------------------------- TLS
async def test_tls_server_with_its_tls_config_exits_0(tmp_path, pki):
    base, _, _ = pki
    tls = tls_config(base.ca, base.server)
    srv = await serve(tls)
    try:
        rc, out, err = await mascot_health(tmp_path, "--port", str(srv.port), config={"server": {"tls": tls}})
        assert (rc, out.strip()) == (0, f"127.0.0.1:{srv.port} SERVING"), err
    finally:
        await srv.stop(0)


async def test_tls_server_with_a_plaintext_client_config_fails(tmp_path, pki):
    base, _, _ = pki
    srv = await serve(tls_config(base.ca, base.server))
    try:
        for config in (None, {"server": {"host": "0.0.0.0"}}):
            rc, _, err = await mascot_health(tmp_path, "--port", str(srv.port), "--timeout", "3", config=config)
            line = one_line(err)
            assert rc == 1 and f"127.0.0.1:{srv.port}" in line and "plaintext" in line, err
    finally:
        await srv.stop(0)


async def test_tls_server_of_another_ca_fails(tmp_path, pki):
    base, _, _ = pki
    srv = await serve(tls_config(base.other_ca, base.other_server))
    try:
        rc, _, err = await mascot_health(tmp_path, "--port", str(srv.port), "--timeout", "3",
                                         config={"server": {"tls": tls_config(base.ca, base.server)}})
        assert rc == 1 and "UNAVAILABLE" in one_line(err) and "TLS" in err
    finally:
        await srv.stop(0)


async def test_mutual_tls_with_the_client_certificate_exits_0(tmp_path, pki):
    base, _, _ = pki
    tls = tls_config(base.ca, base.server, client_auth=True)
    srv = await serve(tls)
    try:
        # the server's own config: under client_auth it presents its certificate as the client certificate
        rc, out, err = await mascot_health(tmp_path, "--port", str(srv.port), config={"server": {"tls": tls}})
        assert rc == 0 and out.strip().endswith("SERVING"), err
        # an explicit client certificate (server.tls.client_cert_file / client_key_file)
        explicit = {**tls, "client_cert_file": str(base.client.cert), "client_key_file": str(base.client.key)}
        rc, _, err = await mascot_health(tmp_path, "--port", str(srv.port), config={"server": {"tls": explicit}})
        assert rc == 0, err
        # TLS without a client certificate is refused by a mutual-TLS server
        rc, _, err = await mascot_health(tmp_path, "--port", str(srv.port), "--timeout", "3",
                                         config={"server": {"tls": tls_config(base.ca, base.server)}})
        assert rc == 1 and "UNAVAILABLE" in one_line(err)
    finally:
        await srv.stop(0)


async def test_a_certificate_without_loopback_names_is_checked_against_its_own_name(tmp_path, pki):
    """A Secret made for the cluster's Service names (no 127.0.0.1): the probe on 127.0.0.1 checks a name of the
    server's own certificate (a wildcard too); a name it does not carry fails."""
    base, cluster, wildcard = pki
    for pair in (cluster, wildcard):
        tls = tls_config(base.ca, pair, client_auth=True)
        srv = await serve(tls)
        try:
            rc, _, err = await mascot_health(tmp_path, "--port", str(srv.port), config={"server": {"tls": tls}})
            assert rc == 0, err
            rc, _, err = await mascot_health(tmp_path, "--port", str(srv.port), "--server-name", "elsewhere.example",
                                             "--timeout", "3", config={"server": {"tls": tls}})
            assert rc == 1 and "UNAVAILABLE" in one_line(err)
        finally:
            await srv.stop(0)
    # another host (127.0.0.2 stands for a Service) is checked against server.tls.server_name, the gateway's rule
    # for its channels, else against the host itself
    tls = tls_config(base.ca, cluster)
    srv = await build_server("health-test", Metrics(), [], host="127.0.0.2", tls=TLSConfig(**tls))
    try:
        target = f"127.0.0.2:{srv.port}"
        rc, _, err = await mascot_health(tmp_path, "--target", target,
                                         config={"server": {"tls": {**tls, "server_name": "demo-mascot-gateway"}}})
        assert rc == 0, err
        rc, _, err = await mascot_health(tmp_path, "--target", target, "--timeout", "3",
                                         config={"server": {"tls": tls}})
        assert rc == 1 and "UNAVAILABLE" in one_line(err)  # 127.0.0.2 is not a name of the certificate
    finally:
        await srv.stop(0)


# ----------------------------------------------------------------------------------------------- cost
def test_health_imports_no_model_libraries(tmp_path):
    """A probe runs every few seconds in the model pods: no torch, transformers, vLLM or kserve at import."""
    import subprocess

    port = free_port()
    p = subprocess.run([sys.executable, "-X", "importtime", "-m", "mascot.cli", "health", "--port", str(port),
                        "--timeout", "0.5"], capture_output=True, text=True, timeout=60, cwd=ROOT,
                       env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
    assert p.returncode == 1
    modules = {line.split("|")[-1].strip().split(".")[0] for line in p.stderr.splitlines()
               if line.startswith("import time:")}
    assert "mascot" in modules and "grpc" in modules
    assert not modules & {"torch", "transformers", "vllm", "kserve", "sqlalchemy", "numpy"}, modules
