"""Assemble and start components in one process (embedded mode, DESIGN.md section 1) or one at a time.

Embedded mode runs the director and speaker services on 127.0.0.1 free ports and the gateway on its
port, all sharing ONE engine; the gateway reaches the others over real gRPC on loopback, exactly as
in a cluster.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from dataclasses import dataclass, field
from typing import Any

from mascot.core.config import MascotConfig
from mascot.core.metrics import Metrics
from mascot.core.server import Server, build_server, channel

log = logging.getLogger(__name__)
COMPONENTS = ("gateway", "director", "speaker", "judge", "reward")
#: What ``mascot serve`` runs by default (the dialogue path); judge and reward join on request.
DEFAULT_COMPONENTS = ("gateway", "director", "speaker")
ENGINE_COMPONENTS = {"director", "speaker", "judge"}


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

    def target(self, component: str) -> str:
        """``host:port`` of a running component."""
        return f"{self.cfg.server.host}:{self.servers[component].port}"

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
        closed = set()
        for j in self.judges.values():
            close = getattr(j.backend, "close", None)
            if close is not None and id(j.backend) not in closed:
                closed.add(id(j.backend))
                await close()
        caches = {id(j.cache): j.cache for j in self.judges.values() if j.cache is not None}
        for c in caches.values():
            c.close()
        for ch in self.channels:
            await ch.close()
        if self.engine is not None and self.own_engine:
            await self.engine.close()
        if self.store is not None:
            self.store.close()


async def start_stack(cfg: MascotConfig, components: tuple[str, ...] = DEFAULT_COMPONENTS, *, engine: Any = None,
                      metrics: Metrics | None = None) -> Stack:
    """Start ``components`` in this process.

    Args:
        cfg: Effective configuration. ``server.gateway_port`` 0 picks a free port (tests).
        components: Any of ``gateway``, ``director``, ``speaker``, ``judge``, ``reward``. A gateway without the other two uses
            ``server.director_target`` / ``server.speaker_target``.
        engine: An already started engine to share (tests inject a scripted engine); else one is built from
            ``cfg.engine`` when a model component runs.
        metrics: Metrics to register on; a fresh registry by default.

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
    try:
        needs_engine = bool(ENGINE_COMPONENTS & set(components)) and (
            {"director", "speaker"} & set(components) or any(j.kind == "local" for j in cfg.judge.judges))
        if needs_engine:
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

            resolver = AdapterResolver(engine, cfg.adapters.store or None, metrics)
            if cfg.adapters.store:  # serve only after the registry's stable/canary versions are loaded
                failed = await resolver.reconcile_once()
                if failed:
                    log.warning("adapters that failed to load at start: %s", failed)
                stack.tasks.append(asyncio.create_task(resolver.run(cfg.adapters.poll_s)))
        if "director" in components:
            from mascot.director.servicer import DirectorServicer

            stack.servers["director"] = await build_server("director", metrics, [(
                director_pb2_grpc.add_DirectorServiceServicer_to_server,
                DirectorServicer(engine, catalog, cfg.director, metrics, resolver),
                "mascot.api.director.v1.DirectorService")],
                host=srv.host, port=srv.director_port, max_message_bytes=srv.max_message_bytes)
        if "speaker" in components:
            from mascot.speaker.servicer import SpeakerServicer

            stack.servers["speaker"] = await build_server("speaker", metrics, [(
                speaker_pb2_grpc.add_SpeakerServiceServicer_to_server,
                SpeakerServicer(engine, catalog, cfg.speaker, cfg.selfplay, metrics, resolver),
                "mascot.api.speaker.v1.SpeakerService")],
                host=srv.host, port=srv.speaker_port, max_message_bytes=srv.max_message_bytes)
        if "judge" in components:
            from mascot.api.judge.v1 import judge_pb2_grpc
            from mascot.core.engine import resolve_model
            from mascot.judge.servicer import JudgeServicer, build_judges

            model_name = cfg.engine.model or Path(resolve_model("", cfg.engine.tiny_dir)).name
            stack.judges = build_judges(cfg.judge, engine, model_name, metrics)
            stack.servers["judge"] = await build_server("judge", metrics, [(
                judge_pb2_grpc.add_JudgeServiceServicer_to_server,
                JudgeServicer(stack.judges, catalog, cfg.judge.max_batch), "mascot.api.judge.v1.JudgeService")],
                host=srv.host, port=srv.judge_port, max_message_bytes=srv.max_message_bytes)
        if "reward" in components:
            from mascot.api.reward.v1 import reward_pb2_grpc
            from mascot.reward.scorer import RewardScorer, resolve_reward_model
            from mascot.reward.servicer import RewardServicer

            rcfg = cfg.reward
            model_dir = await asyncio.to_thread(resolve_reward_model, rcfg.model, rcfg.tiny_dir)
            scorer = await asyncio.to_thread(RewardScorer, model_dir, rcfg.max_length, rcfg.batch_size,
                                             rcfg.padding_side)
            stack.servers["reward"] = await build_server("reward", metrics, [(
                reward_pb2_grpc.add_RewardServiceServicer_to_server,
                RewardServicer(scorer, catalog, rcfg.max_batch, metrics), "mascot.api.reward.v1.RewardService")],
                host=srv.host, port=srv.reward_port, max_message_bytes=srv.max_message_bytes)
        if "gateway" in components:
            from mascot.gateway.servicer import ConversationServicer
            from mascot.gateway.store import Store
            from mascot.gateway.turn_loop import TurnLoop

            director_target = stack.target("director") if "director" in stack.servers else srv.director_target
            speaker_target = stack.target("speaker") if "speaker" in stack.servers else srv.speaker_target
            if not director_target or not speaker_target:
                raise ValueError("a gateway alone needs server.director_target and server.speaker_target")
            dch = channel(director_target, srv.max_message_bytes)
            sch = channel(speaker_target, srv.max_message_bytes)
            stack.channels += [dch, sch]
            stack.store = Store(cfg.store.url)
            loop = TurnLoop(stack.store, catalog, director_pb2_grpc.DirectorServiceStub(dch),
                            speaker_pb2_grpc.SpeakerServiceStub(sch), cfg, metrics)
            services = [(conversation_pb2_grpc.add_ConversationServiceServicer_to_server,
                         ConversationServicer(stack.store, catalog, loop, cfg, metrics),
                         "mascot.api.conversation.v1.ConversationService")]
            if cfg.adapters.store:
                services.append(_adapter_service(cfg))
            stack.servers["gateway"] = await build_server("gateway", metrics, services, host=srv.host,
                                                          port=srv.gateway_port,
                                                          max_message_bytes=srv.max_message_bytes)
    except BaseException:
        await stack.stop(0)
        raise
    return stack


def _adapter_service(cfg: MascotConfig) -> tuple:
    """AdapterService on ``adapters.store`` (the gateway is the registry's only writer, DESIGN.md section 5)."""
    from mascot.api.adapter.v1 import adapter_pb2_grpc
    from mascot.core.engine import resolve_model
    from mascot.gateway.admin import AdapterServicer, read_admin_token

    from mascot.core.personas import PersonaCatalog

    a = cfg.adapters
    if Path(a.store).exists() and not Path(a.store).is_dir():
        raise ValueError(f"adapters.store {a.store} is not a directory")
    base = a.base_model or resolve_model(cfg.engine.model, cfg.engine.tiny_dir)
    token = read_admin_token(a.admin_token_env, a.admin_token_file)
    if not token:
        log.warning("AdapterService has no admin token (%s / adapters.admin_token_file): it refuses every call",
                    a.admin_token_env)
    known = set(PersonaCatalog.load(cfg.personas.extra_files).cards) | {"director"}
    return (adapter_pb2_grpc.add_AdapterServiceServicer_to_server,
            AdapterServicer(a.store, base, token, a.max_rank, known), "mascot.api.adapter.v1.AdapterService")
