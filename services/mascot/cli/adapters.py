"""``mascot adapters``: list, publish, promote, roll back and retire adapter versions, and read the audit trail,
through the control plane's AdapterService (the registry's only writer; ``--target`` or ``MASCOT_CONTROL_TARGET``).
The admin token comes from ``MASCOT_ADMIN_TOKEN`` (or ``--token-file``), never from a flag value. TLS:
``mascot adapters --tls-ca CA [--tls-cert C --tls-key K] ...`` or
``MASCOT_TLS_CA`` / ``MASCOT_TLS_CERT`` / ``MASCOT_TLS_KEY`` (docs/security.md)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

import typer
from rich.console import Console
from rich.table import Table

from mascot.cli.common import CONTROL_TARGET, TLS_CA, TLS_CERT, TLS_KEY, TOKEN_FILE, admin_session, console, export_tls

adapters_app = typer.Typer(help="Adapter registry: list | publish | promote | rollback | retire | audit "
                                "(AdapterService on the control plane).",
                           no_args_is_help=True, add_completion=False)


def _state(number: int) -> str:
    """The AdapterState name of ``number`` (``stable``), ``?`` for a value this client does not know."""
    from mascot.api.adapter.v1 import adapter_pb2 as pb
    from mascot.core.enums import enum_name

    return enum_name(pb.AdapterState, number, default="?")


@adapters_app.callback()
def _options(tls_ca: Optional[Path] = TLS_CA, tls_cert: Optional[Path] = TLS_CERT,
             tls_key: Optional[Path] = TLS_KEY) -> None:
    """Adapter registry: list | publish | promote | rollback | retire | audit (AdapterService on the control
    plane)."""
    export_tls(tls_ca, tls_cert, tls_key)


def _call(target: str, token_file: Optional[Path], method: str, request: Any, timeout: float = 120.0,
          deadline_hint: str = "") -> Any:
    from mascot.api.adapter.v1 import adapter_pb2_grpc

    return admin_session(target, token_file, adapter_pb2_grpc.AdapterServiceStub, "AdapterService",
                         "start it with adapters.store set (docs/serving.md)",
                         lambda stub, md: getattr(stub, method)(request, metadata=md, timeout=timeout),
                         deadline_hint=deadline_hint)


def _show(personas: Any) -> None:
    t = Table("persona", "version", "name", "state", "digest", "created")
    for p in personas:
        for v in p.versions:
            mark = " (canary {:.0%})".format(p.canary_weight) if v.version == p.canary else ""
            t.add_row(p.persona_id, str(v.version), v.name, _state(v.state) + mark, v.digest[:12],
                      v.create_time)
    Console().print(t)


@adapters_app.command("list")
def list_(persona: str = typer.Option("", "--persona", help="Only this persona."), target: str = CONTROL_TARGET,
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
            target: str = CONTROL_TARGET, token_file: Optional[Path] = TOKEN_FILE) -> None:
    """Publish an adapter as a new staged version (checked against the serving base model and rank)."""
    from mascot.api.adapter.v1 import adapter_pb2 as pb

    r = _call(target, token_file, "PublishAdapter", pb.PublishAdapterRequest(
        persona_id=persona, source_path=str(source.resolve()), run_id=run_id))
    v = r.version
    what = "already published as" if r.already_published else "published"
    console.print(f"{what} {v.name} ({_state(v.state)}), registry revision {r.revision}")


@adapters_app.command("promote")
def promote(persona: str = typer.Argument(...), version: int = typer.Argument(..., min=1),
            canary: Optional[float] = typer.Option(
                None, "--canary", help="Make it the canary with this share of new conversations (0 < W < 1)."),
            skip_eval_gate: bool = typer.Option(False, "--skip-eval-gate",
                                                help="Promote without the gateway's evaluation gate (override)."),
            timeout: float = typer.Option(1800.0, "--timeout", min=1.0, help="Seconds to wait for the gateway: its "
                                          "evaluation gate first generates and judges a reply per held-out "
                                          "situation for both versions (minutes on a CPU)."),
            target: str = CONTROL_TARGET, token_file: Optional[Path] = TOKEN_FILE) -> None:
    """Make a version stable (or the canary with --canary W); the gateway's evaluation gate runs first if enabled."""
    from mascot.api.adapter.v1 import adapter_pb2 as pb

    if canary is not None and not 0.0 < canary < 1.0:
        console.print(f"[red]--canary must be between 0 and 1 (exclusive), got {canary}; omit it to make the "
                      "version stable[/red]")
        raise typer.Exit(2)
    canary = canary or 0.0
    r = _call(target, token_file, "PromoteAdapter", pb.PromoteAdapterRequest(
        persona_id=persona, version=version, canary_weight=canary, skip_eval_gate=skip_eval_gate), timeout=timeout,
        deadline_hint=f"no answer within --timeout {timeout:g} s; the gateway stops an evaluation gate still "
                      "running when the call is given up, so the version was most likely not promoted: check with "
                      "mascot adapters list, then raise --timeout (or lower adapters.promote_gate.limit)")
    g = r.eval_gate
    if g.ran:
        moves = (f"; move compliance {g.candidate_compliance:.3f} vs {g.baseline_compliance:.3f}"
                 if g.HasField("candidate_compliance") else "")
        console.print(f"evaluation gate passed: {g.candidate} {g.candidate_score:.3f} vs {g.baseline} "
                      f"{g.baseline_score:.3f} on {g.situations} replies{moves}")
    _show([r.persona])


@adapters_app.command("rollback")
def rollback(persona: str = typer.Argument(...), target: str = CONTROL_TARGET,
             token_file: Optional[Path] = TOKEN_FILE) -> None:
    """Restore the previous stable version (the current one is retired)."""
    from mascot.api.adapter.v1 import adapter_pb2 as pb

    r = _call(target, token_file, "RollbackAdapter", pb.RollbackAdapterRequest(persona_id=persona))
    _show([r.persona])


@adapters_app.command("retire")
def retire(persona: str = typer.Argument(...), version: int = typer.Argument(..., min=1),
           target: str = CONTROL_TARGET, token_file: Optional[Path] = TOKEN_FILE) -> None:
    """Retire a staged or canary version."""
    from mascot.api.adapter.v1 import adapter_pb2 as pb

    r = _call(target, token_file, "RetireAdapter", pb.RetireAdapterRequest(persona_id=persona, version=version))
    _show([r.persona])


@adapters_app.command("audit")
def audit(actor: str = typer.Option("", "--actor", help="Only this identity."),
          method: str = typer.Option("", "--method", help="Only this method (e.g. PromoteAdapter)."),
          target_filter: str = typer.Option("", "--on", help="Only targets starting with this (e.g. anchor)."),
          page_size: int = typer.Option(50, "--page-size", min=1, help="Events per page."),
          page_token: str = typer.Option("", "--page-token", help="The next-page token a previous call printed."),
          target: str = CONTROL_TARGET, token_file: Optional[Path] = TOKEN_FILE,
          as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table.")) -> None:
    """The control plane's audit trail, newest first: who published, promoted, rolled back, retired, started or
    cancelled what, when, with which outcome and request id (role viewer or above)."""
    from google.protobuf.json_format import MessageToDict

    from mascot.api.adapter.v1 import adapter_pb2 as pb

    r = _call(target, token_file, "ListAuditEvents",
              pb.ListAuditEventsRequest(page_size=page_size, page_token=page_token, actor=actor, method=method,
                                        target=target_filter))
    if as_json:
        print(json.dumps(MessageToDict(r, preserving_proto_field_name=True), indent=2))
        return
    t = Table("id", "time", "actor", "role", "method", "target", "outcome", "request id")
    for e in r.events:
        outcome = e.outcome if e.outcome == "OK" else f"[red]{e.outcome}[/red]"
        t.add_row(str(e.id), e.time[:19], e.actor, e.role, e.method, e.target, outcome, e.request_id)
    Console().print(t)
    if r.next_page_token:
        console.print(f"more: --page-token {r.next_page_token}")
