"""Assemble and start components in one process (embedded mode) or one at a time.

Embedded mode runs the director and speaker services on 127.0.0.1 free ports and the gateway on its
port, all sharing ONE engine; the gateway reaches the others over real gRPC on loopback, exactly as
in a cluster.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
from pathlib import Path
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from mascot.core.config import MascotConfig
from mascot.core.metrics import Metrics
from mascot.core.server import (ClientTLS, ConnectionSettings, PortInUse, Server, build_server, channel,
                                port_in_use_message)

log = logging.getLogger(__name__)
COMPONENTS = ("gateway", "control", "director", "speaker", "judge", "reward")
#: What ``mascot serve`` runs by default (the dialogue path); judge and reward join on request.
DEFAULT_COMPONENTS = ("gateway", "director", "speaker")
ENGINE_COMPONENTS = {"director", "speaker", "judge"}
#: The model services: each runs alone under KServe (``mascot serve-model``) or in the stack.
MODEL_COMPONENTS = ("director", "speaker", "judge", "reward")


def parse_model_components(component: "str | Sequence[str]") -> list[str]:
    """Model components from ``"speaker"``, ``"director,speaker"`` or a sequence, in the order given.

    Raises:
        ValueError: an unknown component, none, or one given twice (the message lists the choices).
    """
    names = [c.strip() for c in (component.split(",") if isinstance(component, str) else component) if c.strip()]
    unknown = [c for c in names if c not in MODEL_COMPONENTS]
    if unknown or not names or len(set(names)) != len(names):
        raise ValueError(f"model components must be one or more of {', '.join(MODEL_COMPONENTS)}, each once, "
                         f"comma-separated; got {component!r}")
    return names


@dataclass
class Stack:
    """Running components: servers by name, the shared engine, the store, the metrics."""

    cfg: MascotConfig
    metrics: Metrics
    servers: dict[str, Server] = field(default_factory=dict)
    engine: Any = None
    store: Any = None
    channels: list = field(default_factory=list)
    own_engine: bool = False
    judges: dict = field(default_factory=dict)
    tasks: list = field(default_factory=list)
    metrics_server: Any = None

    @property
    def metrics_port(self) -> int | None:
        """Bound port of the Prometheus ``/metrics`` endpoint, or None when it is not served."""
        return self.metrics_server.server_port if self.metrics_server is not None else None

    def target(self, component: str) -> str:
        """``host:port`` of a running component (the control plane's on ``control.host``)."""
        host = self.cfg.control.host if component == "control" else self.cfg.server.host
        return f"{host}:{self.servers[component].port}"

    async def stop(self, grace: float = 2.0) -> None:
        """Stop servers (gateway first), background tasks, channels, the engine and the store."""
        for t in self.tasks:
            t.cancel()
        for t in self.tasks:
            try:
                await t
            except BaseException:  # noqa: BLE001 - cancelled or already failed; nothing to do at shutdown
                pass
        self.tasks.clear()
        for name in COMPONENTS:
            if name in self.servers:
                await self.servers[name].stop(grace)
        await close_judges(self.judges)
        for ch in self.channels:
            await ch.close()
        if self.engine is not None and self.own_engine:
            await self.engine.close()
        if self.store is not None:
            self.store.close()
        if self.metrics_server is not None:
            self.metrics_server.shutdown()
            self.metrics_server.server_close()
            self.metrics_server = None


async def start_stack(cfg: MascotConfig, components: tuple[str, ...] = DEFAULT_COMPONENTS, *, engine: Any = None,
                      metrics: Metrics | None = None, serve_metrics: bool = False, admin: bool = True) -> Stack:
    """Start ``components`` in this process.

    Args:
        cfg: Effective configuration. ``server.gateway_port`` 0 picks a free port (tests).
        components: Any of ``gateway``, ``control``, ``director``, ``speaker``, ``judge``, ``reward``. A gateway
            without the other two uses ``server.director_target`` / ``server.speaker_target``; a control plane
            without a speaker uses ``server.speaker_target`` for the promote gate.
        engine: An already started engine to share (tests inject a scripted engine); else one is built from
            ``cfg.engine`` when a model component runs.
        metrics: Metrics to register on; a fresh registry by default.
        serve_metrics: Serve the registry as Prometheus text on ``http://<server.host>:<server.metrics_port>/metrics``
            (``mascot serve`` does; port 0 picks a free one, see :attr:`Stack.metrics_port`), with the process's own
            series and, on a vllm engine with ``engine.log_stats``, vLLM's ``vllm:*``. The model services under
            KServe serve theirs on the REST port instead (``mascot serve-model``).
        admin: With a gateway, also open the control plane (AdapterService on ``adapters.store``, TrainingService on
            ``training.templates_dir``, when those are set) on its own listener ``control.host:control.port``, as
            the ``control`` component does alone; an evaluation's stacks only converse (False). The gateway's
            public port never serves the admin services.

    Raises:
        ValueError: an unknown component, or a lone gateway without targets.
        PersonaFileError: a bad persona file.
    """
    from mascot.api.conversation.v1 import conversation_pb2_grpc
    from mascot.api.director.v1 import director_pb2_grpc
    from mascot.api.speaker.v1 import speaker_pb2_grpc
    from mascot.core.personas import PersonaCatalog

    unknown = set(components) - set(COMPONENTS)
    if unknown:
        raise ValueError(f"unknown component(s) {sorted(unknown)}; choose from {COMPONENTS}")
    metrics = metrics or Metrics()
    catalog = PersonaCatalog.load(cfg.personas.extra_files)
    stack = Stack(cfg=cfg, metrics=metrics)
    srv = cfg.server
    conns = ConnectionSettings.from_config(srv)  # keepalive and max connection age of servers and channels alike
    try:
        if needs_engine(cfg, components):
            if engine is None:
                from mascot.core.engine import build_engine

                engine = build_engine(cfg.engine, metrics, component="+".join(
                    c for c in components if c in ENGINE_COMPONENTS))
                stack.engine, stack.own_engine = engine, True
                await engine.start()
            stack.engine = engine
        resolver = None
        if engine is not None:
            from mascot.core.adapters.reconcile import AdapterResolver

            resolver = AdapterResolver(engine, cfg.adapters.store or None, metrics, config=cfg.adapters)
            if cfg.adapters.store:  # serve only after the registry's stable/canary versions are loaded
                failed = await resolver.reconcile_once()
                if failed:
                    log.warning("adapters that failed to load at start: %s", failed)
                stack.tasks.append(asyncio.create_task(resolver.run(cfg.adapters.poll_s)))
        for name in MODEL_COMPONENTS:
            if name in components:
                service = await component_service(name, cfg, engine=engine, catalog=catalog, metrics=metrics,
                                                  resolver=resolver)
                if name == "judge":
                    stack.judges = service[1].judges
                stack.servers[name] = await build_server(name, metrics, [service], host=srv.host,
                                                         port=getattr(srv, f"{name}_port"),
                                                         max_message_bytes=srv.max_message_bytes, tls=srv.tls,
                                                         stream_stall_s=srv.stream_stall_s, connections=conns)
        if "gateway" in components:
            from mascot.gateway.servicer import ConversationServicer
            from mascot.gateway.store import Store
            from mascot.gateway.turn_loop import TurnLoop

            director_target = stack.target("director") if "director" in stack.servers else srv.director_target
            speaker_target = stack.target("speaker") if "speaker" in stack.servers else srv.speaker_target
            if not director_target or not speaker_target:
                raise ValueError("a gateway alone needs server.director_target and server.speaker_target")
            out_tls = ClientTLS.from_config(srv.tls)  # the gateway's channels follow server.tls, never the env
            dch = channel(director_target, srv.max_message_bytes, tls=out_tls, token="", connections=conns)
            sch = channel(speaker_target, srv.max_message_bytes, tls=out_tls, token="", connections=conns)
            stack.channels += [dch, sch]
            stack.store = Store(cfg.store.resolved_url())
            await recover_rounds(stack.store)
            loop = TurnLoop(stack.store, catalog, director_pb2_grpc.DirectorServiceStub(dch),
                            speaker_pb2_grpc.SpeakerServiceStub(sch), cfg, metrics)
            conversations = ConversationServicer(stack.store, catalog, loop, cfg, metrics)
            services = [(conversation_pb2_grpc.add_ConversationServiceServicer_to_server, conversations,
                         "mascot.api.conversation.v1.ConversationService")]
            sec = cfg.security
            if sec.retention_days > 0:  # docs/security.md: inactive conversations are deleted by a periodic sweep
                from mascot.gateway.security import watch_retention

                stack.tasks.append(asyncio.create_task(watch_retention(
                    stack.store, sec.retention_days, sec.retention_sweep_s, conversations.running_conversations)))
            if conversations.auth.enabled and not srv.tls.enabled:
                log.warning("security.caller_auth is on without server.tls: caller tokens cross the network in "
                            "plaintext unless TLS ends in front of the gateway")
            stack.servers["gateway"] = await build_server("gateway", metrics, services, host=srv.host,
                                                          port=srv.gateway_port,
                                                          max_message_bytes=srv.max_message_bytes,
                                                          max_request_bytes=srv.max_request_bytes, tls=srv.tls,
                                                          stream_stall_s=srv.stream_stall_s, connections=conns,
                                                          reflection_on=srv.reflection)
            from mascot.gateway.store import watch_health

            # A store that vanished or stopped answering turns the gateway's health NOT_SERVING (its writes are
            # refused at once by the store itself).
            stack.tasks.append(asyncio.create_task(watch_health(stack.store, stack.servers["gateway"].set_serving,
                                                                cfg.store.health_poll_s)))
        if "control" in components or (admin and "gateway" in components and control_has_work(cfg)):
            stack.servers["control"] = await _control_server(cfg, metrics, stack, catalog, conns)
        if serve_metrics:
            from prometheus_client import GC_COLLECTOR, PLATFORM_COLLECTOR, PROCESS_COLLECTOR, start_http_server

            # the process's own series (process_*, python_*), as the default registry would have them
            for collector in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR):
                with contextlib.suppress(ValueError):  # already registered on this registry
                    metrics.registry.register(collector)
            # the engine's own series that its library keeps in the default registry (vLLM's vllm:*, with
            # engine.log_stats), read from there at every scrape
            prefix = getattr(stack.engine, "prometheus_prefix", None)
            if prefix:
                metrics.export_default_series(prefix)

            try:
                stack.metrics_server, _ = start_http_server(srv.metrics_port, addr=srv.host,
                                                            registry=metrics.registry)
            except OSError as e:
                if e.errno != errno.EADDRINUSE:
                    raise
                raise PortInUse(port_in_use_message("the Prometheus metrics port", srv.host, srv.metrics_port,
                                                    "server.metrics_port")) from None
    except BaseException:
        await stack.stop(0)
        raise
    return stack


async def recover_rounds(store: Any) -> int:
    """Close the rounds a gateway process that is gone left running (:meth:`~mascot.gateway.store.Store.
    recover_rounds`: ``interrupted``, their stored turns kept) and say how many in one log line; returns how many."""
    from mascot.gateway.round import SELF_PLAY_KEY

    closed, self_play = await asyncio.to_thread(store.recover_rounds, SELF_PLAY_KEY)
    if closed:
        log.warning("closed %d round(s) left running by a gateway process that stopped (%d self-play run(s)) as "
                    "interrupted; their stored turns stay. A SendMessage retry with the same idempotency key "
                    "resumes its round; an interrupted self-play run cannot be resumed (run it on a new "
                    "conversation)", closed, self_play)
    else:
        log.info("no round was left running by a gateway process that stopped")
    return closed


def control_has_work(cfg: MascotConfig) -> bool:
    """True when the control plane has a service to host: ``adapters.store`` or ``training.templates_dir`` set."""
    return bool(cfg.adapters.store or cfg.training.templates_dir)


async def _control_server(cfg: MascotConfig, metrics: Metrics, stack: Stack, catalog: Any,
                          conns: ConnectionSettings) -> Server:
    """The control plane's listener on ``control.host:control.port``: AdapterService and TrainingService behind
    :class:`~mascot.gateway.audit.ControlGuard` (roles and the audit trail in the conversation store), reflection per
    ``control.reflection``.

    Raises:
        ValueError: nothing to host (neither ``adapters.store`` nor ``training.templates_dir``), no speaker for an
            enabled promote gate, a token file or JWKS that cannot be read, or the errors of the services.
    """
    from mascot.api.speaker.v1 import speaker_pb2_grpc
    from mascot.gateway.audit import ControlGuard
    from mascot.gateway.control_auth import ControlAuth
    from mascot.gateway.store import Store

    if not control_has_work(cfg):
        raise ValueError("the control plane has nothing to serve: set adapters.store (AdapterService) and/or "
                         "training.templates_dir (TrainingService)")
    srv, c = cfg.server, cfg.control
    auth = ControlAuth.from_config(cfg)
    if not auth.configured:
        log.warning("the control plane has no admin identity (control.tokens_file, control.jwt or "
                    "adapters.admin_token_*): it refuses every call")
    store = stack.store
    if store is None:  # the control plane alone: its audit trail goes to the same database
        store = stack.store = Store(cfg.store.resolved_url())
    guard = ControlGuard(auth, store, c.audit_page_max)
    services = []
    if cfg.adapters.store:
        gate = None
        if cfg.adapters.promote_gate.enabled:
            speaker_target = stack.target("speaker") if "speaker" in stack.servers else srv.speaker_target
            if not speaker_target:
                raise ValueError("adapters.promote_gate.enabled needs a speaker: run the speaker in this process or "
                                 "set server.speaker_target")
            sch = channel(speaker_target, srv.max_message_bytes, tls=ClientTLS.from_config(srv.tls), token="",
                          connections=conns)
            stack.channels.append(sch)
            gate = _promote_gate(cfg, stack, catalog, speaker_pb2_grpc.SpeakerServiceStub(sch))
        services.append(_adapter_service(cfg, guard, gate))
    if cfg.training.templates_dir:
        services.append(await _training_service(cfg, metrics, stack, guard))
    if not srv.tls.enabled and c.host not in ("127.0.0.1", "::1", "localhost"):
        log.warning("the control plane listens on %s without server.tls: admin tokens cross the network in "
                    "plaintext unless TLS ends in front of it", c.host)
    return await build_server("control", metrics, services, host=c.host, port=c.port,
                              max_message_bytes=srv.max_message_bytes, tls=srv.tls,
                              stream_stall_s=srv.stream_stall_s, connections=conns, reflection_on=c.reflection,
                              port_setting="control.port")


def needs_engine(cfg: MascotConfig, components: tuple[str, ...] | set[str]) -> bool:
    """True when ``components`` need a generation engine: the director or speaker, or a judge with a local judge."""
    comps = set(components)
    return bool({"director", "speaker"} & comps or ("judge" in comps and any(j.kind == "local"
                                                                            for j in cfg.judge.judges)))


async def component_service(component: str, cfg: MascotConfig, *, engine: Any, catalog: Any, metrics: Metrics,
                            resolver: Any = None) -> tuple[Callable, Any, str]:
    """The servicer of one model component, built as every server of it serves it (the stack's ``build_server``
    and :mod:`mascot.app.modelserver`).

    Args:
        component: ``director``, ``speaker``, ``judge`` or ``reward``.
        cfg: Effective configuration.
        engine: The started engine (director, speaker, local judges); None for reward or a judge of remote judges.
        catalog: :class:`~mascot.core.personas.PersonaCatalog`.
        metrics: Metrics the servicer records on.
        resolver: :class:`~mascot.core.adapters.reconcile.AdapterResolver` for pinned adapter versions (director,
            speaker).

    Returns:
        ``(add_XServiceServicer_to_server, servicer, full service name)``. A judge servicer's ``judges`` hold
        backends and a cache to close (:func:`close_judges`).

    Raises:
        ValueError: an unknown component, or a judge configuration that cannot be built.
        OSError: the reward model cannot be read.
    """
    if component == "director":
        from mascot.api.director.v1 import director_pb2_grpc
        from mascot.director.servicer import DirectorServicer

        return (director_pb2_grpc.add_DirectorServiceServicer_to_server,
                DirectorServicer(engine, catalog, cfg.director, metrics, resolver),
                "mascot.api.director.v1.DirectorService")
    if component == "speaker":
        from mascot.api.speaker.v1 import speaker_pb2_grpc
        from mascot.speaker.servicer import SpeakerServicer

        return (speaker_pb2_grpc.add_SpeakerServiceServicer_to_server,
                SpeakerServicer(engine, catalog, cfg.speaker, cfg.selfplay, metrics, resolver, cfg.guard),
                "mascot.api.speaker.v1.SpeakerService")
    if component == "judge":
        from mascot.api.judge.v1 import judge_pb2_grpc
        from mascot.core.engine import resolve_model
        from mascot.judge.servicer import JudgeServicer, build_judges

        from mascot.core.engine.default_model import model_identity

        model_name = model_identity(resolve_model(cfg.engine.model, cfg.engine.tiny_dir, cfg.engine.cache_dir))["name"]
        judges = build_judges(cfg.judge, engine, model_name, metrics)
        return (judge_pb2_grpc.add_JudgeServiceServicer_to_server,
                JudgeServicer(judges, catalog, cfg.judge.max_batch), "mascot.api.judge.v1.JudgeService")
    if component == "reward":
        from mascot.api.reward.v1 import reward_pb2_grpc
        from mascot.reward.scorer import RewardScorer, resolve_reward_model
        from mascot.reward.servicer import RewardServicer

        rcfg = cfg.reward
        model_dir = await asyncio.to_thread(resolve_reward_model, rcfg.model, rcfg.tiny_dir)
        scorer = await asyncio.to_thread(RewardScorer, model_dir, rcfg.max_length, rcfg.batch_size,
                                         rcfg.padding_side)
        return (reward_pb2_grpc.add_RewardServiceServicer_to_server,
                RewardServicer(scorer, catalog, rcfg.max_batch, metrics), "mascot.api.reward.v1.RewardService")
    raise ValueError(f"unknown model component {component!r}; choose from {MODEL_COMPONENTS}")


async def close_judges(judges: dict) -> None:
    """Close the backends (each once) and the caches of judges built by :func:`component_service`."""
    closed = set()
    for j in judges.values():
        close = getattr(j.backend, "close", None)
        if close is not None and id(j.backend) not in closed:
            closed.add(id(j.backend))
            await close()
    caches = {id(j.cache): j.cache for j in judges.values() if j.cache is not None}
    for c in caches.values():
        c.close()


def _promote_gate(cfg: MascotConfig, stack: Stack, catalog: Any, speaker: Any) -> Any:
    """The evaluation gate of PromoteAdapter bound to the speaker, the judge and the held-out situations; None when
    ``adapters.promote_gate.enabled`` is off.

    Raises:
        ValueError: the gate is enabled without a judge (none in this process and no ``judge_target``) or without
            readable situations.
    """
    pg = cfg.adapters.promote_gate
    if not pg.enabled:
        return None
    from mascot.api.judge.v1 import judge_pb2_grpc
    from mascot.gateway.promote_gate import evaluate_promotion, read_gate_situations

    target = stack.target("judge") if "judge" in stack.servers else pg.judge_target
    if not target:
        raise ValueError("adapters.promote_gate.enabled needs a judge: run the judge component in the gateway's "
                         "process or set adapters.promote_gate.judge_target")
    if not pg.situations:
        raise ValueError("adapters.promote_gate.enabled needs adapters.promote_gate.situations (a JSONL file)")
    try:
        situations = read_gate_situations(pg.situations, pg.limit)
    except (OSError, ValueError) as e:
        raise ValueError(f"adapters.promote_gate.situations: {e}") from None
    if not situations:
        raise ValueError(f"adapters.promote_gate.situations {pg.situations} holds no situations")
    jch = channel(target, cfg.server.max_message_bytes, tls=ClientTLS.from_config(cfg.server.tls), token="",
                  connections=ConnectionSettings.from_config(cfg.server))
    stack.channels.append(jch)
    judge = judge_pb2_grpc.JudgeServiceStub(jch)

    async def gate(persona_id: str, candidate: str, baseline: str) -> Any:
        return await evaluate_promotion(speaker, judge, catalog, persona_id, candidate, baseline, situations,
                                        max_drop=pg.max_drop, judge_name=pg.judge, max_tokens=pg.max_tokens,
                                        timeout_s=pg.timeout_s, seeds=pg.seeds,
                                        max_compliance_drop=pg.max_compliance_drop)

    return gate


def _adapter_service(cfg: MascotConfig, guard: Any, gate: Any = None) -> tuple:
    """AdapterService on ``adapters.store`` (the control plane is the registry's only writer)."""
    from mascot.api.adapter.v1 import adapter_pb2_grpc
    from mascot.core.engine import resolve_model
    from mascot.gateway.admin import AdapterServicer

    from mascot.core.personas import PersonaCatalog

    a = cfg.adapters
    if Path(a.store).exists() and not Path(a.store).is_dir():
        raise ValueError(f"adapters.store {a.store} is not a directory")
    base = a.base_model or resolve_model(cfg.engine.model, cfg.engine.tiny_dir, cfg.engine.cache_dir)
    known = set(PersonaCatalog.load(cfg.personas.extra_files).cards) | {"director"}
    return (adapter_pb2_grpc.add_AdapterServiceServicer_to_server,
            AdapterServicer(a.store, base, guard, a.max_rank, known, config=a, gate=gate),
            "mascot.api.adapter.v1.AdapterService")


async def _training_service(cfg: MascotConfig, metrics: Metrics, stack: Stack, guard: Any) -> tuple:
    """TrainingService on the Job templates of ``training.templates_dir`` (``mascot.gateway.jobs``), behind the
    control plane's ``guard`` as AdapterService; starts the poll that counts finished runs
    (:func:`mascot.gateway.training.watch_runs`, a task of ``stack`` that closes the API client when cancelled).

    Raises:
        ValueError: no readable template, or no Kubernetes API configuration (in-cluster or kubeconfig).
    """
    from mascot.api.training.v1 import training_pb2_grpc
    from mascot.gateway import jobs
    from mascot.gateway.training import FinishedRuns, TrainingServicer, watch_runs

    t = cfg.training
    client = await asyncio.to_thread(jobs.api_client, t.kubeconfig, t.context)
    try:
        fallback = await asyncio.to_thread(jobs.default_namespace, t.kubeconfig, t.context)
        manager = jobs.JobManager.from_directory(t.templates_dir, client, t.namespace, fallback_namespace=fallback,
                                                 max_active_runs=t.max_active_runs, propagation=t.cancel_propagation,
                                                 timeout_s=t.request_timeout_s)
    except BaseException:
        client.close()
        raise
    counter = FinishedRuns(metrics, manager.clock())
    stack.tasks.append(asyncio.create_task(watch_runs(manager, counter, t.poll_s)))
    log.info("TrainingService: phases %s, Jobs in namespace %s, at most %d unfinished run(s) per phase",
             ", ".join(manager.phases), manager.namespace, t.max_active_runs)
    return (training_pb2_grpc.add_TrainingServiceServicer_to_server,
            TrainingServicer(manager, guard, metrics, counter), "mascot.api.training.v1.TrainingService")
