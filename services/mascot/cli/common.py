"""What every ``mascot`` command group shares: the error console, quiet library logging, the config loader, the
``--tls-*`` / ``--token-file`` / ``--target`` options and the admin-plane session (``mascot adapters``, ``mascot
retrain``).

Import cost matters (``mascot health`` runs as a probe every few seconds): only typer and rich at import time.
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any, Awaitable, Callable, Literal, Optional

import typer
from rich.console import Console

console = Console(stderr=True)
MODEL_HELP = ("The generation model: a local model directory, a Hugging Face hub id such as Qwen/Qwen3-8B (read from "
              "the local HF cache), or 'tiny' for the tiny random-init Qwen3 (speed only, its words are not language). "
              "Default: SmolLM2-135M-Instruct, converted by `mascot models prepare` (make setup runs it).")
TARGET = typer.Option("127.0.0.1:50051", "--target", help="Gateway address host:port.")
#: The admin commands' address: the control plane's listener (control.host:control.port), never the gateway's.
CONTROL_TARGET = typer.Option("127.0.0.1:50061", "--target", envvar="MASCOT_CONTROL_TARGET",
                              help="Control plane address host:port (control.host:control.port; the chart's "
                                   "<release>-control Service).")
#: The choices of ``--mode``, ``--engine`` and ``--phase`` as types: the help lists them and the parser refuses
#: anything else (exit code 2). They equal the proto's modes, ``engine.kind`` and the proto's training phases
#: (a unit test keeps them so).
ModeName = Literal["support", "meeting"]
EngineKind = Literal["transformers", "vllm"]
PhaseName = Literal["persona-alignment", "collaborative"]
MODE = typer.Option("support", "--mode", help="support (EmpatheticDialogues situations) or meeting (QMSum excerpts).")
ENGINE = typer.Option(None, "--engine", help="Engine kind (default: engine.kind of the config).")
TOKEN_FILE = typer.Option(None, "--token-file", help="File holding the admin token (default: $MASCOT_ADMIN_TOKEN).")
TLS_CA = typer.Option(None, "--tls-ca", envvar="MASCOT_TLS_CA",
                      help="PEM CA bundle that verifies the gateway's certificate (turns TLS on).")
TLS_CERT = typer.Option(None, "--tls-cert", envvar="MASCOT_TLS_CERT",
                        help="PEM client certificate for mutual TLS (with --tls-key).")
TLS_KEY = typer.Option(None, "--tls-key", envvar="MASCOT_TLS_KEY", help="PEM key of --tls-cert.")


def quiet() -> None:
    """Silence transformers' progress bars and warnings (the commands print their own progress on stderr)."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        hf_logging.set_verbosity_error()
    except Exception:  # noqa: BLE001 - best effort: a command without transformers has nothing to quiet
        pass


def load_config_or_exit(config: Optional[Path], **flags: Any) -> Any:
    """The :class:`~mascot.core.config.MascotConfig` of ``config`` (or ``$MASCOT_CONFIG``) and the environment,
    with command-line ``flags`` (``"section.key": value``; None = not given) on top. Exits 2 with the validation
    message on a bad file or value."""
    from pydantic import ValidationError

    from mascot.core.config import ConfigFileError, load_config

    overrides: dict[str, Any] = {}
    for dotted, value in flags.items():
        if value is None:
            continue
        section, key = dotted.split(".")
        overrides.setdefault(section, {})[key] = value
    try:
        return load_config(config, overrides)
    except ValidationError as e:
        console.print(f"[red]configuration error:[/red] {validation_message(e)}", soft_wrap=True)
        raise typer.Exit(2) from None
    except (FileNotFoundError, ConfigFileError) as e:
        console.print(f"[red]configuration error:[/red] {e}", soft_wrap=True)
        raise typer.Exit(2) from None


def validation_message(error: Any) -> str:
    """A pydantic ``ValidationError`` as one line per problem: ``section.key: message (got VALUE)``, without
    pydantic's documentation links."""
    lines = []
    for item in error.errors():
        where = ".".join(str(part) for part in item.get("loc", ())) or "config"
        got = f" (got {item['input']!r})" if "input" in item and not isinstance(item["input"], dict) else ""
        lines.append(f"{where}: {item.get('msg', 'invalid')}{got}")
    return "; ".join(lines)


CALLER_TOKEN_FILE = typer.Option(None, "--token-file", help="File holding the caller token of the public API when the "
                                  "gateway has security.caller_auth on (default: $MASCOT_CALLER_TOKEN).")


def caller_token(token_file: Optional[Path]) -> Optional[str]:
    """The caller token of ``--token-file``; None = ``MASCOT_CALLER_TOKEN`` (read by the channel)."""
    return None if token_file is None else read_token_file(token_file)


def redacted(cfg: Any) -> str:
    """The effective config as indented JSON (secrets are never config values: they come from files or env)."""
    return json.dumps(cfg.model_dump(mode="json"), indent=2)


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


def admin_token(token_file: Optional[Path]) -> str:
    """The admin token of ``--token-file`` or ``MASCOT_ADMIN_TOKEN``; exits 2 when there is none."""
    if token_file is not None:
        return read_token_file(token_file)
    token = os.environ.get("MASCOT_ADMIN_TOKEN", "").strip()
    if not token:
        console.print("[red]no admin token: set MASCOT_ADMIN_TOKEN or pass --token-file[/red]")
        raise typer.Exit(2)
    return token


def admin_session(target: str, token_file: Optional[Path], stub_class: Any, service: str, how_to_enable: str,
                  body: Callable[[Any, tuple], Awaitable[Any]], deadline_hint: str = "") -> Any:
    """Run ``body(stub, metadata)`` on one channel to the control plane at ``target`` (``mascot adapters`` and
    ``mascot retrain``): ``stub`` is ``stub_class(channel)``, ``metadata`` carries the admin token
    (``--token-file`` or ``MASCOT_ADMIN_TOKEN``); TLS from ``--tls-*`` / ``MASCOT_TLS_*``.

    Exits 2 for bad usage (no token, a target that is not host:port, an unreadable TLS file) and 1 for an RPC
    error (``CODE: details``; UNIMPLEMENTED says ``target`` has no ``service`` and ``how_to_enable`` it;
    DEADLINE_EXCEEDED adds ``deadline_hint`` when given).
    """
    import grpc

    from mascot.core.server import channel

    token = admin_token(token_file)
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
            console.print(f"[red]{target} serves no {service}[/red]: give the control plane's address (control.port, "
                          f"not the gateway's), and {how_to_enable}", soft_wrap=True)
            raise typer.Exit(1) from None
        hint = f" ({deadline_hint})" if deadline_hint and e.code() == grpc.StatusCode.DEADLINE_EXCEEDED else ""
        console.print(f"[red]{e.code().name}:[/red] {e.details()}{hint}")
        raise typer.Exit(1) from None
    except ValueError as e:  # an unreadable TLS file
        console.print(f"[red]{e}[/red]")
        raise typer.Exit(2) from None
