"""The model components' runtime behind :mod:`mascot.app.modelserver`: readiness gating per component
(:class:`ComponentRuntime`), bring-up of a server's components on one engine (:class:`ModelHost`) and the Open
Inference Protocol model (:class:`ComponentModel`, the JSON-in-BYTES codec described in
:mod:`mascot.app.modelserver`).

Importing this module imports ``kserve``, which parses ``sys.argv`` at import: import it through
``mascot serve-model``, which clears ``sys.argv`` first.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import logging
import uuid
from dataclasses import dataclass
from typing import Any, Callable

import grpc
from google.protobuf import json_format, message_factory
from kserve import Model
from kserve.errors import InvalidInput, ModelNotReady
from kserve.protocol.infer_type import InferOutput, InferRequest, InferResponse

from mascot.core.config import MascotConfig
from mascot.core.errors import Unavailable
from mascot.core.metrics import Metrics

log = logging.getLogger(__name__)
OIP_INPUT, OIP_OUTPUT = "request", "response"
V2_SERVICE = "inference.GRPCInferenceService"
#: component -> (generated module, service): the gRPC surface is known before the servicer is built.
SERVICES = {"director": ("mascot.api.director.v1.director_pb2", "DirectorService"),
            "speaker": ("mascot.api.speaker.v1.speaker_pb2", "SpeakerService"),
            "judge": ("mascot.api.judge.v1.judge_pb2", "JudgeService"),
            "reward": ("mascot.api.reward.v1.reward_pb2", "RewardService")}
#: ServiceError code -> REST status of the OIP endpoint (the google.rpc HTTP mapping).
HTTP_STATUS = {grpc.StatusCode.INVALID_ARGUMENT: 400, grpc.StatusCode.FAILED_PRECONDITION: 400,
               grpc.StatusCode.NOT_FOUND: 404, grpc.StatusCode.UNAUTHENTICATED: 401,
               grpc.StatusCode.PERMISSION_DENIED: 403, grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
               grpc.StatusCode.UNAVAILABLE: 503, grpc.StatusCode.DEADLINE_EXCEEDED: 504}


@dataclass(frozen=True)
class Rpc:
    """One RPC of a component's service: its name, request/response classes and whether it streams responses."""

    name: str
    request: type
    response: type
    streaming: bool


class ComponentRuntime:
    """One model component of a server: its gRPC surface, its readiness, and the gate in front of its servicer.
    A :class:`ModelHost` brings it up (engine, servicer, adapters).

    Args:
        component: ``director``, ``speaker``, ``judge`` or ``reward``.
        cfg: Effective configuration (the component's section).
        metrics: Metrics the servicer records on.
        engine: An already started engine (tests); the host that brings it up sets it otherwise.

    Raises:
        ValueError: an unknown component.
    """

    def __init__(self, component: str, cfg: MascotConfig, metrics: Metrics, *, engine: Any = None) -> None:
        if component not in SERVICES:
            raise ValueError(f"unknown model component {component!r}; choose from {', '.join(SERVICES)}")
        module, short = SERVICES[component]
        self.component, self.cfg, self.metrics = component, cfg, metrics
        self.engine = engine
        self.resolver: Any = None
        self.servicer: Any = None
        self.judges: dict = {}
        self.ready = False
        self.missing = "the service is starting"
        self._changed = asyncio.Condition()
        self.descriptor = importlib.import_module(module).DESCRIPTOR.services_by_name[short]
        self.service_name: str = self.descriptor.full_name
        self.add_to_server: Callable = getattr(importlib.import_module(module + "_grpc"),
                                               f"add_{short}Servicer_to_server")
        self.rpcs = {m.name: Rpc(m.name, message_factory.GetMessageClass(m.input_type),
                                 message_factory.GetMessageClass(m.output_type), m.server_streaming)
                     for m in self.descriptor.methods}

    async def set_state(self, ready: bool, missing: str) -> None:
        async with self._changed:
            self.ready, self.missing = ready, missing
            self._changed.notify_all()

    async def wait_until(self, predicate: Callable[["ComponentRuntime"], bool]) -> None:
        """Return once ``predicate(self)`` holds; re-checked at every readiness change (tests, embedders)."""
        async with self._changed:
            await self._changed.wait_for(lambda: predicate(self))

    def require(self) -> Any:
        """The servicer, once ready.

        Raises:
            Unavailable: not ready yet; the message says what is missing.
        """
        if not self.ready:
            raise Unavailable(f"{self.component} is not ready: {self.missing}; retry later")
        return self.servicer

    def gate(self) -> Any:
        """A servicer object for ``add_XServicer_to_server``: every RPC checks :meth:`require`, then runs the real
        servicer's method (unary or server-streaming)."""
        gate = type(f"Gated{self.descriptor.name}", (), {})()
        for rpc in self.rpcs.values():
            if rpc.streaming:
                async def method(request: Any, context: Any, _n: str = rpc.name) -> Any:
                    async for item in getattr(self.require(), _n)(request, context):
                        yield item
            else:
                async def method(request: Any, context: Any, _n: str = rpc.name) -> Any:  # type: ignore[misc]
                    return await getattr(self.require(), _n)(request, context)
            setattr(gate, rpc.name, method)
        return gate


class ModelHost:
    """The model components of one server process, brought up together on ONE engine.

    Director, speaker and local judges are one base model with different adapters and prompts: served by one host,
    they share one engine (its weights, KV cache and batches, every persona and director adapter loaded side by side)
    and one :class:`~mascot.core.adapters.reconcile.AdapterResolver`, as in the embedded stack. A host of one
    component is the one-service-per-role form.

    Args:
        runtimes: The components' :class:`ComponentRuntime` s (distinct components).
        cfg: Effective configuration (``engine``, ``adapters.store``/``poll_s``, the components' sections).
        metrics: Metrics the servicers, engine and resolver record on.
        engine: An already started engine to share (tests); None builds and starts one from ``cfg.engine`` when any
            component needs it (and closes it in :meth:`close`).

    Raises:
        ValueError: no component, or one given twice.
    """

    def __init__(self, runtimes: list[ComponentRuntime], cfg: MascotConfig, metrics: Metrics, *,
                 engine: Any = None) -> None:
        names = [rt.component for rt in runtimes]
        if not names or len(set(names)) != len(names):
            raise ValueError(f"a model server runs each component once, got {names}")
        self.runtimes, self.cfg, self.metrics = runtimes, cfg, metrics
        self.engine, self._own_engine = engine, engine is None
        self.resolver: Any = None
        self.label = "+".join(names)

    async def set_all(self, ready: bool, missing: str) -> None:
        """Set every component's readiness (``missing``: what keeps it from serving, shown to callers)."""
        for rt in self.runtimes:
            await rt.set_state(ready, missing)

    async def bring_up(self, on_ready: Callable[[], Any]) -> None:
        """Start the engine (once, when any component needs it), build every servicer on it, reconcile adapters
        until none fails, mark every component ready, call ``on_ready``, then follow the registry until cancelled.

        Raises:
            Exception: the engine or a model cannot start (e.g. OSError for a missing model); the server stops.
        """
        from mascot.core.personas import PersonaCatalog
        from mascot.app.stack import ENGINE_COMPONENTS, component_service, needs_engine

        cfg, store = self.cfg, self.cfg.adapters.store
        names = tuple(rt.component for rt in self.runtimes)
        if needs_engine(cfg, names):
            if self.engine is None:
                from mascot.core.engine import build_engine

                await self.set_all(False, "the engine is starting")
                self.engine = build_engine(cfg.engine, self.metrics, component="+".join(
                    c for c in names if c in ENGINE_COMPONENTS))
                await self.engine.start()  # close() closes it even when start-up is cancelled half-way
            from mascot.core.adapters.reconcile import AdapterResolver

            self.resolver = AdapterResolver(self.engine, store or None, self.metrics, config=cfg.adapters)
        catalog = PersonaCatalog.load(cfg.personas.extra_files)
        for rt in self.runtimes:
            await rt.set_state(False, f"the {rt.component} model is loading")
            _, servicer, name = await component_service(rt.component, cfg, engine=self.engine, catalog=catalog,
                                                        metrics=self.metrics, resolver=self.resolver)
            assert name == rt.service_name, (name, rt.service_name)
            rt.engine, rt.resolver = self.engine, self.resolver
            rt.servicer, rt.judges = servicer, getattr(servicer, "judges", {}) if rt.component == "judge" else {}
        follow = self.resolver is not None and bool(store)
        while follow:
            failed = await self.resolver.reconcile_once()
            if not failed:
                break
            await self.set_all(False, "adapter versions the registry requires are not loaded (" + "; ".join(
                f"{n}: {e}" for n, e in sorted(failed.items())) + f"); retrying every {cfg.adapters.poll_s:g} s")
            log.warning("%s not ready: %s", self.label, self.runtimes[0].missing)
            await asyncio.sleep(cfg.adapters.poll_s)
        await self.set_all(True, "")
        log.info("%s ready", self.label)
        await on_ready()
        if follow:
            await self.resolver.run(cfg.adapters.poll_s)

    async def close(self) -> None:
        """Close judges' backends and caches and the engine this host started."""
        from mascot.app.stack import close_judges

        await self.set_all(False, "the service is stopping")
        for rt in self.runtimes:
            await close_judges(rt.judges)
        if self.engine is not None and self._own_engine:
            try:
                await self.engine.close()
            except Exception:  # an engine whose start was cancelled may not close cleanly
                log.exception("closing the %s engine failed", self.label)


class _OipContext:
    """The ``context`` a servicer method gets on the OIP path (our servicers read nothing from it)."""

    def __init__(self, headers: dict[str, str] | None) -> None:
        self._metadata = tuple((k.lower(), v) for k, v in (headers or {}).items())

    def invocation_metadata(self) -> tuple:
        return self._metadata

    def time_remaining(self) -> None:
        return None

    def set_trailing_metadata(self, _metadata: Any) -> None:
        return None


class ComponentModel(Model):
    """The KServe model of a component (name = the component); :meth:`predict` serves the OIP contract of the module
    docstring through the same servicer as the native RPCs.

    Args:
        runtime: The component's :class:`ComponentRuntime`.
    """

    def __init__(self, runtime: ComponentRuntime) -> None:
        super().__init__(runtime.component)
        self.runtime = runtime
        self.ready = True  # registered with KServe; real readiness is healthy()

    async def healthy(self) -> bool:
        """KServe model readiness: True once the component is ready."""
        return self.runtime.ready

    def load(self) -> bool:
        """KServe calls this before each request while not healthy: no side effect, bring-up runs on its own."""
        return self.runtime.ready

    def get_input_types(self) -> list[dict]:
        return [{"name": OIP_INPUT, "datatype": "BYTES", "shape": [1]}]

    def get_output_types(self) -> list[dict]:
        return [{"name": OIP_OUTPUT, "datatype": "BYTES", "shape": [1]}]

    def decode(self, payload: Any) -> tuple[Rpc, Any]:
        """``(rpc, native request message)`` from an OIP request.

        Raises:
            InvalidInput: not one BYTES input ``request`` holding ``{"method", "request"}`` JSON, an unknown
                method, or a request that does not parse into the method's request message.
        """
        shape = f'one BYTES input "{OIP_INPUT}" holding {{"method": ..., "request": ...}} JSON'
        if not isinstance(payload, InferRequest) or len(payload.inputs) != 1 or payload.inputs[0].name != OIP_INPUT \
                or payload.inputs[0].datatype != "BYTES":
            raise InvalidInput(f"{self.name} expects an Open Inference Protocol v2 request with {shape}")
        inp = payload.inputs[0]
        data = list(inp.data) if inp.data else inp.as_numpy().ravel().tolist()
        if len(data) != 1:
            raise InvalidInput(f'input "{OIP_INPUT}" must hold exactly one element, got {len(data)}')
        raw = data[0]
        try:
            doc = json.loads(raw.decode("utf-8") if isinstance(raw, (bytes, bytearray)) else raw)
        except (ValueError, UnicodeDecodeError, TypeError) as e:
            raise InvalidInput(f'input "{OIP_INPUT}" is not UTF-8 JSON ({e}); send {shape}') from None
        if not isinstance(doc, dict) or set(doc) - {"method", "request"} or not isinstance(doc.get("method"), str):
            raise InvalidInput(f'input "{OIP_INPUT}" must be a JSON object {{"method": "<RPC name>", '
                               f'"request": {{...}}}}')
        rpc = self.runtime.rpcs.get(doc["method"])
        if rpc is None:
            raise InvalidInput(f"unknown method {doc['method'][:80]!r}; {self.runtime.service_name} has "
                               f"{', '.join(self.runtime.rpcs)}")
        if not isinstance(doc.get("request", {}), dict):
            raise InvalidInput(f'"request" must be a JSON object ({rpc.request.DESCRIPTOR.full_name} as protobuf JSON)')
        try:
            message = json_format.ParseDict(doc.get("request", {}), rpc.request())
        except json_format.ParseError as e:
            raise InvalidInput(f'"request" is not a {rpc.request.DESCRIPTOR.full_name} in protobuf JSON: '
                               f"{str(e)[:300]}") from None
        return rpc, message

    async def predict(self, payload: Any, headers: dict[str, str] | None = None) -> InferResponse:
        """Run one RPC given as OIP (module docstring).

        Raises:
            ModelNotReady: not ready (UNAVAILABLE / 503), with what is missing.
            InvalidInput: see :meth:`decode` (INVALID_ARGUMENT / 400).
            ServiceError: the servicer's own error (its code; REST status from ``HTTP_STATUS``).
        """
        if not self.runtime.ready:
            raise ModelNotReady(self.name, self.runtime.missing)
        rpc, request = self.decode(payload)
        method = getattr(self.runtime.require(), rpc.name)
        ctx = _OipContext(headers)
        if rpc.streaming:
            doc = "[" + ",".join([json_format.MessageToJson(m, indent=None) async for m in method(request, ctx)]) + "]"
        else:
            doc = json_format.MessageToJson(await method(request, ctx), indent=None)
        return InferResponse(response_id=payload.id or str(uuid.uuid4()), model_name=self.name,
                             infer_outputs=[InferOutput(name=OIP_OUTPUT, shape=[1], datatype="BYTES", data=[doc])])


