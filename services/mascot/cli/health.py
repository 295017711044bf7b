"""``mascot health``: one standard ``grpc.health.v1.Health/Check`` of a MASCOT gRPC server, with the TLS of the
server's own configuration (docs/deployment.md).

Kubelet ``grpc:`` probes cannot speak TLS, so the chart probes a TLS-enabled pod with ``exec: mascot health --port
<port>``: it reads the same ``MascotConfig`` as the server (``MASCOT_CONFIG`` / ``MASCOT_*``), and when
``server.tls`` is on it connects with :meth:`mascot.core.server.ClientTLS.from_config` (the CA, and under mutual TLS
the client certificate), exactly like the gateway's own channels. The ``helm test`` Pod runs it with ``--target`` for
every component.

Exit status: 0 when every target answers SERVING; 1 otherwise (NOT_SERVING, SERVICE_UNKNOWN, UNAVAILABLE: nothing
listening or a failed TLS handshake, DEADLINE_EXCEEDED), with one line on stderr naming each failed target; 2 for a
usage or configuration error (invalid config, unreadable TLS file). stdout gets one ``<target> <STATUS>`` line per
target.

Import cost matters (a probe runs every few seconds): only typer at import time; grpc, pydantic and the config are
imported when the command runs, and never torch or transformers.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path
from typing import Any, Optional

import typer

#: Hosts for which the name checked on the server's certificate comes from the server's own certificate.
LOOPBACK = ("127.0.0.1", "localhost", "::1", "[::1]")
#: Longest error detail kept per target on the stderr line.
DETAIL_CHARS = 240


def _fail(message: str, code: int) -> typer.Exit:
    print(f"mascot health: {message}", file=sys.stderr, flush=True)
    return typer.Exit(code)


def _one_line(text: str) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= DETAIL_CHARS else text[:DETAIL_CHARS - 3] + "..."


def own_certificate_name(cert_file: str) -> str:
    """A name the server's own certificate (``server.tls.cert_file``, the one it presents) is valid for, to check
    it when probing it on 127.0.0.1: "" when the certificate already covers 127.0.0.1 or cannot be read (then
    ``server.tls.server_name``, else the target host, is checked); else localhost or the first DNS name of the
    subjectAltName (a wildcard ``*.example`` becomes ``probe.example``), else its first IP address, else the common
    name.
    """
    try:
        from cryptography import x509  # a kserve dependency; imported only under TLS

        cert = x509.load_pem_x509_certificate(Path(cert_file).read_bytes())
    except (ImportError, OSError, ValueError):
        return ""
    dns: list[str] = []
    ips: list[str] = []
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        dns = [str(n) for n in san.get_values_for_type(x509.DNSName)]
        ips = [str(ip) for ip in san.get_values_for_type(x509.IPAddress)]
    except x509.ExtensionNotFound:
        pass
    if "127.0.0.1" in ips:
        return ""
    if dns:
        name = "localhost" if "localhost" in dns else dns[0]
        return "probe." + name[2:] if name.startswith("*.") else name
    if ips:
        return ips[0]
    cns = [a.value for a in cert.subject.get_attributes_for_oid(x509.oid.NameOID.COMMON_NAME)]
    return str(cns[0]) if cns else ""


def _load_config(config: Optional[Path]) -> Any:
    from pydantic import ValidationError

    from mascot.core.config import ConfigFileError, load_config

    try:
        return load_config(config)
    except (FileNotFoundError, ConfigFileError) as e:
        raise _fail(f"configuration error: {e}", 2) from None
    except ValidationError as e:
        errors = "; ".join(f"{'.'.join(map(str, err['loc'])) or 'config'}: {err['msg']}" for err in e.errors())
        raise _fail(f"configuration error: {_one_line(errors)}", 2) from None


async def _check(target: str, tls: Any, service: str, timeout: float, max_message_bytes: int) -> tuple[str, str]:
    """(status name, error detail) of one Check of ``target``."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from mascot.core.server import channel

    try:
        async with channel(target, max_message_bytes, tls=tls, token="") as ch:
            reply = await health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=service),
                                                               timeout=timeout)
    except grpc.aio.AioRpcError as e:
        name = e.code().name
        return ("SERVICE_UNKNOWN", "") if name == "NOT_FOUND" else (name, e.details() or "")
    return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status), ""


def health(
    port: Optional[int] = typer.Option(None, "--port", min=1, max=65535,
                                       help="Check 127.0.0.1:PORT: the server of this pod (kubelet exec probes)."),
    target: list[str] = typer.Option([], "--target", help="HOST:PORT to check (repeatable; the helm test Pod checks "
                                     "every component). Names on the certificates: server.tls.server_name, else "
                                     "the host."),
    service: str = typer.Option("", "--service", help='grpc.health.v1 service name; "" = the whole server.'),
    timeout: float = typer.Option(5.0, "--timeout", min=0.05, max=3600.0,
                                  help="Deadline of each Check, in seconds (0.05 to 3600)."),
    config: Optional[Path] = typer.Option(None, "--config", help="YAML config file (default: $MASCOT_CONFIG); "
                                          "server.tls decides TLS and mutual TLS, as for the server."),
    server_name: Optional[str] = typer.Option(None, "--server-name", help="Name checked on the server's "
                                              "certificate (default: on 127.0.0.1 a name of server.tls.cert_file, "
                                              "else server.tls.server_name, else the host)."),
) -> None:
    """gRPC health Check (grpc.health.v1) of a MASCOT server with its own TLS settings: exit 0 when SERVING."""
    targets = ([f"127.0.0.1:{port}"] if port is not None else []) + list(target)
    if not targets:
        raise _fail("nothing to check: pass --port PORT (127.0.0.1) or --target HOST:PORT", 2)
    bad = [t for t in targets if not t.rpartition(":")[0] or not t.rpartition(":")[2].isdigit()
           or not 1 <= int(t.rpartition(":")[2]) <= 65535]
    if bad:
        raise _fail(f"--target {bad[0]!r} is not HOST:PORT with a port from 1 to 65535", 2)
    os.environ.setdefault("GRPC_VERBOSITY", "NONE")  # gRPC's own log lines would break the one-line contract
    cfg = _load_config(config)
    from dataclasses import replace

    from mascot.core.server import ClientTLS

    base = ClientTLS.from_config(cfg.server.tls)
    tls_of: dict[str, Any] = {}
    for t in targets:
        tls = base
        if base.enabled:
            name = server_name
            if name is None and t.rpartition(":")[0] in LOOPBACK:
                name = own_certificate_name(cfg.server.tls.cert_file) or None
            if name is not None:
                tls = replace(base, server_name=name)
            try:
                tls.credentials()  # an unreadable file is a configuration error, not an unhealthy server
            except ValueError as e:
                raise _fail(f"TLS error: {_one_line(str(e))}", 2) from None
        tls_of[t] = tls

    async def check_all() -> list[tuple[str, str]]:
        return await asyncio.gather(*(_check(t, tls_of[t], service, timeout, cfg.server.max_message_bytes)
                                      for t in targets))

    results = asyncio.run(check_all())
    failed = []
    for t, (status, detail) in zip(targets, results):
        print(f"{t} {status}", flush=True)
        if status != "SERVING":
            mode = "TLS" if tls_of[t].enabled else "plaintext"
            failed.append(f"{t} {status}" + (f" ({mode}: {_one_line(detail)})" if detail else ""))
    if failed:
        svc = f" service {service!r}" if service else ""
        raise _fail(f"not serving{svc}: " + "; ".join(failed), 1)
