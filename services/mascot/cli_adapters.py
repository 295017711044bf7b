"""``mascot adapters``: list, publish, promote, roll back and retire adapter versions through the gateway's
AdapterService (the registry's only writer). The admin token comes from ``MASCOT_ADMIN_TOKEN``
(or ``--token-file``), never from a flag value. TLS: ``mascot adapters --tls-ca CA [--tls-cert C --tls-key K] ...`` or
``MASCOT_TLS_CA`` / ``MASCOT_TLS_CERT`` / ``MASCOT_TLS_KEY`` (README "Security")."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any, Awaitable, Callable, Optional

import typer
from rich.console import Console
from rich.table import Table

console = Console(stderr=True)
adapters_app = typer.Typer(help="Adapter registry: list | publish | promote | rollback | retire (AdapterService).",
                           no_args_is_help=True, add_completion=False)
TARGET = typer.Option("127.0.0.1:50051", "--target", help="Gateway address host:port.")
TOKEN_FILE = typer.Option(None, "--token-file", help="File holding the admin token (default: $MASCOT_ADMIN_TOKEN).")
STATES = {0: "unspecified", 1: "staged", 2: "canary", 3: "stable", 4: "retired"}
TLS_CA = typer.Option(None, "--tls-ca", envvar="MASCOT_TLS_CA",
                      help="PEM CA bundle that verifies the gateway's certificate (turns TLS on).")
TLS_CERT = typer.Option(None, "--tls-cert", envvar="MASCOT_TLS_CERT",
                        help="PEM client certificate for mutual TLS (with --tls-key).")
TLS_KEY = typer.Option(None, "--tls-key", envvar="MASCOT_TLS_KEY", help="PEM key of --tls-cert.")


def client_tls(ca: Optional[Path], cert: Optional[Path], key: Optional[Path]) -> Any:
    """The :class:`~mascot.core.server.ClientTLS` of ``--tls-*`` options (their env variables included), or None
    (the environment decides: plaintext unless ``MASCOT_TLS=1``)."""
    from mascot.core.server import ClientTLS

    if (cert is None) != (key is None):
        console.print("[red]--tls-cert and --tls-key go together (mutual TLS)[/red]")
        raise typer.Exit(2)
    if ca is None and cert is None:
        return None
    return ClientTLS(ca_file=str(ca or ""), cert_file=str(cert or ""), key_file=str(key or ""),
                     server_name=os.environ.get("MASCOT_TLS_SERVER_NAME", "").strip())


def export_tls(ca: Optional[Path], cert: Optional[Path], key: Optional[Path]) -> None:
    """Put ``--tls-*`` options in this process's environment, where every channel of the command reads them
    (:meth:`mascot.core.server.ClientTLS.from_env`)."""
    client_tls(ca, cert, key)  # validates the pair
    for name, value in (("MASCOT_TLS_CA", ca), ("MASCOT_TLS_CERT", cert), ("MASCOT_TLS_KEY", key)):
        if value is not None:
            os.environ[name] = str(value)


@adapters_app.callback()
def _options(tls_ca: Optional[Path] = TLS_CA, tls_cert: Optional[Path] = TLS_CERT,
             tls_key: Optional[Path] = TLS_KEY) -> None:
    """Adapter registry: list | publish | promote | rollback | retire (AdapterService)."""
    export_tls(tls_ca, tls_cert, tls_key)


def read_token_file(token_file: Path) -> str:
    """The token in ``token_file`` (stripped); exits 2 with a message when it cannot be read or is empty."""
    try:
        token = token_file.read_text(encoding="utf-8").strip()
    except OSError as e:
        console.print(f"[red]cannot read --token-file {token_file}: {e.strerror}[/red]")
        raise typer.Exit(2) from None
    if not token:
        console.print(f"[red]--token-file {token_file} is empty[/red]")
        raise typer.Exit(2)
    return token


def _token(token_file: Optional[Path]) -> str:
    if token_file is not None:
        return read_token_file(token_file)
    token = os.environ.get("MASCOT_ADMIN_TOKEN", "").strip()
    if not token:
        console.print("[red]no admin token: set MASCOT_ADMIN_TOKEN or pass --token-file[/red]")
        raise typer.Exit(2)
    return token


def admin_session(target: str, token_file: Optional[Path], stub_class: Any, service: str, how_to_enable: str,
                  body: Callable[[Any, tuple], Awaitable[Any]]) -> Any:
    """Run ``body(stub, metadata)`` on one channel to the gateway at ``target`` (the admin plane of ``mascot
    adapters`` and ``mascot retrain``): ``stub`` is ``stub_class(channel)``, ``metadata`` carries the admin token
    (``--token-file`` or ``MASCOT_ADMIN_TOKEN``); TLS from ``--tls-*`` / ``MASCOT_TLS_*``.

    Exits 2 for bad usage (no token, a target that is not host:port, an unreadable TLS file) and 1 for an RPC
    error (``CODE: details``; UNIMPLEMENTED says the gateway has no ``service`` and ``how_to_enable`` it).
    """
    import grpc

    from mascot.core.server import channel

    token = _token(token_file)
    if not target.strip() or ":" not in target:
        console.print(f"[red]--target {target!r} must be host:port[/red]")
        raise typer.Exit(2)

    async def go() -> Any:
        ch = channel(target, token="")  # the admin token goes in the metadata, not as a caller token
        try:
            return await body(stub_class(ch), (("authorization", f"Bearer {token}"),))
        finally:
            await ch.close()

    try:
        return asyncio.run(go())
    except grpc.aio.AioRpcError as e:
        if e.code() == grpc.StatusCode.UNIMPLEMENTED:
            console.print(f"[red]the gateway at {target} has no {service}[/red]: {how_to_enable}", soft_wrap=True)
            raise typer.Exit(1) from None
        console.print(f"[red]{e.code().name}:[/red] {e.details()}")
        raise typer.Exit(1) from None
    except ValueError as e:  # an unreadable TLS file
        console.print(f"[red]{e}[/red]")
        raise typer.Exit(2) from None


def _call(target: str, token_file: Optional[Path], method: str, request: Any) -> Any:
    from mascot.api.adapter.v1 import adapter_pb2_grpc

    return admin_session(target, token_file, adapter_pb2_grpc.AdapterServiceStub, "AdapterService",
                         "start it with adapters.store set (README: Adapters)",
                         lambda stub, md: getattr(stub, method)(request, metadata=md, timeout=120))


def _show(personas: Any) -> None:
    t = Table("persona", "version", "name", "state", "digest", "created")
    for p in personas:
        for v in p.versions:
            mark = " (canary {:.0%})".format(p.canary_weight) if v.version == p.canary else ""
            t.add_row(p.persona_id, str(v.version), v.name, STATES.get(v.state, "?") + mark, v.digest[:12],
                      v.create_time)
    Console().print(t)


@adapters_app.command("list")
def list_(persona: str = typer.Option("", "--persona", help="Only this persona."), target: str = TARGET,
          token_file: Optional[Path] = TOKEN_FILE,
          as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table.")) -> None:
    """List every version, its state and the aliases."""
    from google.protobuf.json_format import MessageToDict

    from mascot.api.adapter.v1 import adapter_pb2 as pb

    r = _call(target, token_file, "ListAdapters", pb.ListAdaptersRequest(persona_id=persona))
    if as_json:
        print(json.dumps(MessageToDict(r, preserving_proto_field_name=True), indent=2))
    else:
        _show(r.personas)
        console.print(f"registry revision {r.revision}")


@adapters_app.command("publish")
def publish(persona: str = typer.Argument(..., help="Persona id (snake_case) or 'director'."),
            source: Path = typer.Argument(..., help="PEFT adapter directory the gateway can read."),
            run_id: str = typer.Option("", "--run-id", help="Training run id for the manifest."),
            target: str = TARGET, token_file: Optional[Path] = TOKEN_FILE) -> None:
    """Publish an adapter as a new staged version (checked against the serving base model and rank)."""
    from mascot.api.adapter.v1 import adapter_pb2 as pb

    r = _call(target, token_file, "PublishAdapter", pb.PublishAdapterRequest(
        persona_id=persona, source_path=str(source.resolve()), run_id=run_id))
    v = r.version
    what = "already published as" if r.already_published else "published"
    console.print(f"{what} {v.name} ({STATES.get(v.state)}), registry revision {r.revision}")


@adapters_app.command("promote")
def promote(persona: str = typer.Argument(...), version: int = typer.Argument(..., min=1),
            canary: Optional[float] = typer.Option(
                None, "--canary", help="Make it the canary with this share of new conversations (0 < W < 1)."),
            skip_eval_gate: bool = typer.Option(False, "--skip-eval-gate",
                                                help="Promote without the gateway's evaluation gate (override)."),
            target: str = TARGET, token_file: Optional[Path] = TOKEN_FILE) -> None:
    """Make a version stable (or the canary with --canary W); the gateway's evaluation gate runs first if enabled."""
    from mascot.api.adapter.v1 import adapter_pb2 as pb

    if canary is not None and not 0.0 < canary < 1.0:
        console.print(f"[red]--canary must be between 0 and 1 (exclusive), got {canary}; omit it to make the "
                      "version stable[/red]")
        raise typer.Exit(2)
    canary = canary or 0.0
    r = _call(target, token_file, "PromoteAdapter", pb.PromoteAdapterRequest(
        persona_id=persona, version=version, canary_weight=canary, skip_eval_gate=skip_eval_gate))
    g = r.eval_gate
    if g.ran:
        console.print(f"evaluation gate passed: {g.candidate} {g.candidate_score:.3f} vs {g.baseline} "
                      f"{g.baseline_score:.3f} on {g.situations} situations")
    _show([r.persona])


@adapters_app.command("rollback")
def rollback(persona: str = typer.Argument(...), target: str = TARGET,
             token_file: Optional[Path] = TOKEN_FILE) -> None:
    """Restore the previous stable version (the current one is retired)."""
    from mascot.api.adapter.v1 import adapter_pb2 as pb

    r = _call(target, token_file, "RollbackAdapter", pb.RollbackAdapterRequest(persona_id=persona))
    _show([r.persona])


@adapters_app.command("retire")
def retire(persona: str = typer.Argument(...), version: int = typer.Argument(..., min=1), target: str = TARGET,
           token_file: Optional[Path] = TOKEN_FILE) -> None:
    """Retire a staged or canary version."""
    from mascot.api.adapter.v1 import adapter_pb2 as pb

    r = _call(target, token_file, "RetireAdapter", pb.RetireAdapterRequest(persona_id=persona, version=version))
    _show([r.persona])
