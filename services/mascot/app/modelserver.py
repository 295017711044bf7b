"""The one-port KServe ModelServer of the model services.

The runtime behind it (bring-up, readiness gating, the OIP model and codec) is :mod:`mascot.app.model_runtime`.

:class:`OnePortModelServer` runs one or more components (``director``, ``speaker``, ``judge``, ``reward``) as a
``kserve.ModelServer`` (kserve 0.21.0, pinned exactly: ``_serve``/``stop`` and RESTServer internals are re-checked on
every upgrade):

- gRPC port (TLS or mutual TLS when ``server.tls`` names a certificate): our services (the servicers
  :func:`mascot.app.stack.component_service` builds, the same code as ``mascot serve``), KServe's Open Inference
  Protocol ``inference.GRPCInferenceService``, ``grpc.health.v1.Health`` (SERVING only when ready) and reflection. Our
  services and ModelInfer pass the boundary interceptor (status codes,
  ``mascot_rpc_*`` metrics, access log).
- HTTP port: KServe's REST (``/v2/health/live``, ``/v2/health/ready``, ``/v2/models/<component>/ready``,
  ``/v2/models/<component>/infer``, ...) and ``/metrics`` (our ``mascot_*`` series plus KServe's own).

Components served together share ONE engine and one adapter resolver (:class:`~mascot.app.model_runtime.ModelHost`):
director, speaker and local judges are one base model with different adapters and prompts, so the chart's default
runs them as one generation service. Each component is its own KServe model (``/v2/models/<component>/...``) and
its own gRPC service on the shared port; ``mascot_rpc_*`` series carry the component of the service called (gRPC
ModelInfer, whose model is inside the request, carries the joined name, e.g. ``director+speaker``).

Readiness: the component is ready once its engine has started (director, speaker, local judges), its model is
loaded (reward) and :meth:`~mascot.core.adapters.reconcile.AdapterResolver.reconcile_once` reports no failure for
the stable/canary versions the adapter registry names; the reconcile is retried every ``adapters.poll_s`` seconds.
Until then our RPCs answer UNAVAILABLE saying what is missing, ModelInfer answers UNAVAILABLE (REST 503), KServe
readiness is false and gRPC health NOT_SERVING. Once ready the service stays ready and keeps following the registry
(hot-loads); a version that fails to load later is retried, logged and counted
(``mascot_adapter_load_failures_total``), and a conversation pinned to it gets UNAVAILABLE, while the service keeps
serving every other version (a bad promote must not take every replica out of rotation).

Open Inference Protocol contract (model name = the component)::

    request:  inputs  = [{"name": "request",  "datatype": "BYTES", "shape": [1], "data": [<UTF-8 JSON>]}]
              <JSON>  = {"method": "<RPC name, e.g. NextDirective>",
                         "request": <the native request message as protobuf JSON (google.protobuf.json_format)>}
    response: outputs = [{"name": "response", "datatype": "BYTES", "shape": [1], "data": [<UTF-8 JSON>]}]
              <JSON>  = the native response message as protobuf JSON (json_format.MessageToJson: lowerCamelCase
                        names, default values omitted), or for a server-streaming RPC (GenerateReply) a JSON list of
                        every streamed message in order.

The OIP call runs the same servicer method as the native call, so greedy results are identical. Errors: input that
is not one BYTES tensor ``request`` holding that JSON, an unknown method, or a request JSON that does not parse into
the RPC's request message -> INVALID_ARGUMENT (REST 400); the servicer's own errors keep their codes (REST: 400,
404, 503, ...); not ready -> UNAVAILABLE (REST 503).

Importing this module imports ``kserve.model_server``, which parses ``sys.argv`` at import: a command line imports it
with ``sys.argv`` cleared (``mascot serve-model`` does), or its ``--config`` would be read as kserve's
``--configure_logging`` and exit.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import hmac
import logging
import signal
import socket
import time
from typing import Any, Callable, Sequence

import grpc
from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse
from fastapi.routing import APIRouter
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from kserve import ModelServer
from kserve.errors import ModelNotReady, ServerNotLive, ServerNotReady
from kserve.protocol.dataplane import DataPlane
from kserve.protocol.grpc import grpc_predict_v2_pb2_grpc as v2_grpc
from kserve.protocol.grpc.interceptors import ExceptionToStatusInterceptor
from kserve.protocol.grpc.servicer import InferenceServicer
from kserve.protocol.rest.server import RESTServer, metrics_handler
from kserve.protocol.rest.v1_endpoints import register_v1_endpoints
from kserve.protocol.rest.v2_endpoints import register_v2_endpoints
from prometheus_client import REGISTRY, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from mascot.core.config import MascotConfig
from mascot.core.errors import ServiceError
from mascot.core.interceptors import BoundaryInterceptor
from mascot.core.metrics import Metrics
from mascot.app.model_runtime import HTTP_STATUS, V2_SERVICE, ComponentModel, ComponentRuntime, ModelHost
from mascot.core.server import (ConnectionSettings, PortInUse, bind_port, enable_reflection, port_in_use_message,
                                server_credentials, service_rpcs)
from mascot.app.stack import parse_model_components

log = logging.getLogger(__name__)


def _register_kserve_routes(rest: RESTServer, app: FastAPI) -> None:
    """KServe's REST routes (live, ``/metrics``, V1 and V2 inference) on ``app``, without its OpenAI routes.

    ``RESTServer._register_endpoints`` (kserve 0.21.0) does the same and then imports
    ``kserve.protocol.rest.openai``, which imports vLLM's OpenAI protocol (about 10-15 s of CPU at every start) only
    to find that no model implements KServe's OpenAI interface. MASCOT's components never do (the OpenAI-compatible
    server is ``vllm serve`` itself) and none is a time-series model, so those routes are skipped
    (``test_modelserver`` checks the route table).
    """
    root = APIRouter()
    root.add_api_route(r"/", rest.dataplane.live)
    root.add_api_route(r"/metrics", metrics_handler, methods=["GET"])
    app.include_router(root)
    register_v1_endpoints(app, rest.dataplane, rest.model_repository_extension)
    register_v2_endpoints(app, rest.dataplane, rest.model_repository_extension)


class _ReadinessDataPlane(DataPlane):
    """KServe's data plane whose server readiness (``/v2/health/ready``, ServerReady) is every model's readiness
    (stock KServe answers True as soon as the server runs)."""

    async def ready(self) -> bool:
        models = self.model_registry.get_models()
        return bool(models) and all([await m.healthy() for m in models.values()])


#: HTTP status of a REST inference call -> the gRPC status code name it is counted under (the inverse of
#: :data:`~mascot.app.model_runtime.HTTP_STATUS`, where 400 stands for INVALID_ARGUMENT).
REST_CODES = {200: "OK", 400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED", 404: "NOT_FOUND",
              422: "INVALID_ARGUMENT", 429: "RESOURCE_EXHAUSTED", 500: "INTERNAL", 503: "UNAVAILABLE",
              504: "DEADLINE_EXCEEDED"}


class _Only(grpc.aio.ServerInterceptor):
    """Apply ``inner`` only to methods of the named services (health and reflection stay untouched)."""

    def __init__(self, inner: grpc.aio.ServerInterceptor, services: tuple[str, ...]) -> None:
        self._inner, self._prefixes = inner, tuple(f"/{s}/" for s in services)

    async def intercept_service(self, continuation: Callable, details: grpc.HandlerCallDetails) -> Any:
        if details.method.startswith(self._prefixes):
            return await self._inner.intercept_service(continuation, details)
        return await continuation(details)


class _OipStatus(ExceptionToStatusInterceptor):
    """KServe's exception -> status mapping of ModelInfer, plus our ServiceError with its own code and message, and
    the not-ready errors KServe 0.21 itself fails on (it reads a ``reason`` they do not have)."""

    async def handle_exception(self, ex: Exception, request_or_iterator: Any, context: Any, method_name: str) -> Any:
        if isinstance(ex, ServiceError):
            await context.abort(ex.code, ex.message)
        if isinstance(ex, (ModelNotReady, ServerNotReady, ServerNotLive)):
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(ex))
        await super().handle_exception(ex, request_or_iterator, context, method_name)


async def _service_error(_request: Request, exc: ServiceError) -> JSONResponse:
    return JSONResponse(status_code=HTTP_STATUS.get(exc.code, 500), content={"error": exc.message})


class OnePortModelServer(ModelServer):
    """A ``kserve.ModelServer`` serving one or more components on one gRPC port plus KServe's HTTP port, all on one
    engine (module docstring).

    Args:
        component: ``director``, ``speaker``, ``judge`` or ``reward``, or several of them (a sequence, or a
            comma-separated string).
        cfg: Effective configuration.
        grpc_port: gRPC port; 0 picks a free one (read :attr:`grpc_port` after :meth:`start_async`).
        http_port: KServe REST port; 0 picks a free one (read :attr:`http_port`).
        host: Bind address of both ports; default ``cfg.server.host`` (127.0.0.1; 0.0.0.0 in a container).
        engine: An already started engine to share (tests); None builds one.
        metrics: Metrics to record on; a fresh registry by default.
        grace_s: Seconds in-flight calls get at shutdown.

    Raises:
        ValueError: an unknown component, none, or one given twice.
    """

    def __init__(self, component: "str | Sequence[str]", cfg: MascotConfig, *, grpc_port: int, http_port: int,
                 host: str | None = None, engine: Any = None, metrics: Metrics | None = None,
                 grace_s: float = 5.0) -> None:
        super().__init__(http_port=http_port, grpc_port=grpc_port, enable_grpc=False, workers=1,
                         enable_docs_url=False, grace_period=max(1, int(grace_s)))
        self.dataplane = _ReadinessDataPlane(model_registry=self.registered_models)
        self.cfg, self.host, self.grace_s = cfg, host or cfg.server.host, grace_s
        self.metrics = metrics or Metrics()
        names = parse_model_components(component)
        self.runtimes = [ComponentRuntime(c, cfg, self.metrics, engine=engine) for c in names]
        self.host_runtime = ModelHost(self.runtimes, cfg, self.metrics, engine=engine)
        self.label = self.host_runtime.label
        self.models = [ComponentModel(rt) for rt in self.runtimes]
        self._grpc: grpc.aio.Server | None = None
        self._health: Any = None
        self._uvicorn: Any = None
        self._tasks: list[asyncio.Task] = []
        self._stopping: asyncio.Task | None = None
        self._stopped: asyncio.Event | None = None
        self.failure: BaseException | None = None
        self._rest_token: Any = None

    @property
    def runtime(self) -> ComponentRuntime:
        """The first component's runtime (the only one of a one-component server)."""
        return self.runtimes[0]

    @property
    def model(self) -> ComponentModel:
        """The first component's KServe model."""
        return self.models[0]

    # ------------------------------------------------------------------------------------------------ start
    async def start_async(self, models: list | None = None) -> None:
        """Register ``models`` (default: the component's), bind and start gRPC and REST, and begin bring-up in the
        background. Returns once both ports accept connections (not ready yet).

        Raises:
            OSError / RuntimeError: a port could not be bound.
        """
        if self._stopped is None:
            self._stopped = asyncio.Event()
        self._register_and_check_atleast_one_model_is_ready(models or list(self.models))
        try:
            await self._start_grpc()
            await self._start_rest()
        except BaseException:
            if self._grpc is not None:
                await self._grpc.stop(0)
            raise
        self._tasks.append(asyncio.create_task(self._bring_up(), name=f"{self.label}-bring-up"))
        log.info("%s serving: gRPC %s:%d, HTTP %s:%d (not ready until started)", self.label, self.host,
                 self.grpc_port, self.host, self.http_port)

    async def _start_grpc(self) -> None:
        size, stall = self.cfg.server.max_message_bytes, self.cfg.server.stream_stall_s
        services = tuple(rt.service_name for rt in self.runtimes)
        ours = (*services, V2_SERVICE)
        server = grpc.aio.server(
            interceptors=[*(_Only(BoundaryInterceptor(rt.component, self.metrics, stall), (rt.service_name,))
                            for rt in self.runtimes),
                          _Only(BoundaryInterceptor(self.label, self.metrics, stall), (V2_SERVICE,)),
                          _Only(_OipStatus(), (V2_SERVICE,))],
            options=[("grpc.max_send_message_length", size), ("grpc.max_receive_message_length", size),
                     *ConnectionSettings.from_config(self.cfg.server).server_options()])
        v2_grpc.add_GRPCInferenceServiceServicer_to_server(
            InferenceServicer(self.dataplane, self.model_repository_extension), server)
        for rt in self.runtimes:
            rt.add_to_server(rt.gate(), server)
        rpcs = {rt.component: service_rpcs((rt.service_name,)) for rt in self.runtimes}
        oip = service_rpcs((V2_SERVICE,))
        if len(self.runtimes) > 1:  # REST ModelInfer is counted under the component its path names
            rpcs = {c: [*names, "ModelInfer"] for c, names in rpcs.items()}
        rpcs[self.label] = [*rpcs.get(self.label, []), *oip]  # one component: one label
        self.metrics.declare(rpcs=rpcs)
        self._health = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self._health, server)
        if self.cfg.server.reflection:
            enable_reflection([*ours, health.SERVICE_NAME, reflection.SERVICE_NAME], server)
        creds = server_credentials(self.cfg.server.tls)  # TLS / mutual TLS per server.tls (docs/security.md)
        bound = bind_port(server, self.host, self.grpc_port, creds, f"the {self.label}'s gRPC port", "--port")
        await self._set_serving(False)
        await server.start()
        self._grpc, self.grpc_port = server, bound

    async def _start_rest(self) -> None:
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((self.host, self.http_port))
        except OSError as e:
            sock.close()
            if e.errno == errno.EADDRINUSE:
                raise PortInUse(port_in_use_message(f"the {self.label}'s KServe HTTP port", self.host,
                                                    self.http_port, "--rest-port")) from None
            raise
        sock.listen(128)
        sock.setblocking(False)
        self.http_port = sock.getsockname()[1]
        rest = RESTServer("kserve.model_server:app", self.dataplane, self.model_repository_extension, self.http_port,
                          workers=1, grace_period=self.grace_period, event_loop="asyncio")
        # A fresh app per server: KServe's create_application() adds routes to one module-level app, so a second
        # server in a process would answer from the first one's data plane.
        app = FastAPI(title="KServe ModelServer", docs_url=None, redoc_url=None)
        rest._add_middlewares(app)
        app.add_api_route("/metrics", self._metrics_endpoint, methods=["GET"])  # before KServe's own /metrics
        app.middleware("http")(self._count_rest_infer)
        if self.cfg.server.rest_token_file:  # outermost: a refused call reaches nothing else
            self._rest_token = self._watch_rest_token(self.cfg.server.rest_token_file)
            app.middleware("http")(self._rest_auth)
        _register_kserve_routes(rest, app)
        rest._add_exception_handlers(app)
        app.add_exception_handler(ServiceError, _service_error)
        rest.config.app = app
        self._rest_server, self._uvicorn = rest, rest._server
        self._uvicorn.capture_signals = contextlib.nullcontext  # signals are ours (stop()), not uvicorn's
        task = asyncio.create_task(self._uvicorn.serve(sockets=[sock]), name="kserve-rest")
        task.add_done_callback(self._rest_ended)
        self._tasks.append(task)

    @staticmethod
    def _watch_rest_token(path: str) -> Any:
        """The REST token file (``server.rest_token_file``), re-read when it changes.

        Raises:
            ValueError: the file cannot be read or is empty (the start fails, naming the file).
        """
        from mascot.gateway.control_auth import WatchedFile

        def parse(text: str) -> bytes:
            if not text.strip():
                raise ValueError(f"server.rest_token_file {path} is empty")
            return text.strip().encode()

        watched = WatchedFile(path, parse, reload_s=1.0)
        watched.value()
        return watched

    async def _rest_auth(self, request: Request, call_next: Callable) -> Response:
        """Refuse REST calls that are not GET/HEAD (inference, model load/unload) without ``Authorization: Bearer
        <server.rest_token_file's token>``: 401 (constant-time compare, the token never logged or echoed). Health,
        readiness, metadata and ``/metrics`` (GET) stay open to whoever reaches the port."""
        if request.method in ("GET", "HEAD"):
            return await call_next(request)
        scheme, _, value = request.headers.get("authorization", "").strip().partition(" ")
        try:
            expected = self._rest_token.value()
        except ValueError:
            return JSONResponse({"error": "the model service's REST token file is unusable; the operator must fix "
                                          "server.rest_token_file"}, status_code=503)
        if scheme.lower() != "bearer" or not hmac.compare_digest(value.strip().encode(), expected):
            return JSONResponse({"error": "REST inference needs 'Authorization: Bearer <token>' with the model "
                                          "service's token (server.rest_token_file)"}, status_code=401,
                                headers={"WWW-Authenticate": "Bearer"})
        return await call_next(request)

    def _rest_ended(self, task: asyncio.Task) -> None:
        if self._stopping is None:  # REST died on its own: without health endpoints the pod must not live on
            self.failure = (task.exception() if not task.cancelled() else None) or RuntimeError("REST server ended")
            log.error("the KServe REST server ended unexpectedly: %s", self.failure)
            self.stop(None)

    async def _count_rest_infer(self, request: Request, call_next: Callable) -> Response:
        """Count REST Open Inference Protocol calls (``POST /v2/models/<name>/infer``) in ``mascot_rpc_requests_total``
        and ``mascot_rpc_duration_seconds`` as ``rpc="ModelInfer"``, like the gRPC ones, with the status code the
        HTTP status maps to (:data:`REST_CODES`)."""
        path = request.url.path
        if not (path.startswith("/v2/models/") and path.endswith("/infer")):
            return await call_next(request)
        t0, code = time.perf_counter(), "INTERNAL"
        try:
            response = await call_next(request)
            status = response.status_code
            code = REST_CODES.get(status, "UNKNOWN" if status >= 500 else "INVALID_ARGUMENT")
            return response
        finally:
            model = path[len("/v2/models/"):].split("/", 1)[0]
            component = model if model in {rt.component for rt in self.runtimes} else self.label
            self.metrics.rpc_requests.labels(component, "ModelInfer", code).inc()
            self.metrics.rpc_duration.labels(component, "ModelInfer", code).observe(time.perf_counter() - t0)

    async def _metrics_endpoint(self, _request: Request) -> Response:
        """``mascot_*`` series (this server's registry) followed by the default registry's: KServe's, the process's
        and, on a vllm engine with ``engine.log_stats``, vLLM's own ``vllm:*`` (vLLM registers them there)."""
        body = generate_latest(self.metrics.registry)
        if self.metrics.registry is not REGISTRY:
            body += generate_latest(REGISTRY)
        return Response(content=body, headers={"content-type": CONTENT_TYPE_LATEST})

    async def _set_serving(self, serving: bool) -> None:
        status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        for name in ("", *(rt.service_name for rt in self.runtimes), V2_SERVICE):
            await self._health.set(name, status)

    async def _bring_up(self) -> None:
        try:
            await self.host_runtime.bring_up(lambda: self._set_serving(True))
        except asyncio.CancelledError:
            raise
        except Exception as e:  # a component that cannot start stops the server (liveness restarts)
            log.exception("%s could not start", self.label)
            self.failure = e
            await self.host_runtime.set_all(False, f"start-up failed ({type(e).__name__})")
            self.stop(None)

    # ------------------------------------------------------------------------------------------------ run/stop
    def start(self, models: list | None = None, on_started: Callable[["OnePortModelServer"], None] | None = None
              ) -> None:
        """Serve until SIGTERM/SIGINT (the blocking entry point of ``mascot serve-model``).

        Args:
            models: KServe models to register; default the component's.
            on_started: Called once both ports are bound (e.g. to print them).

        Raises:
            RuntimeError: the component could not start (its cause chained).
        """
        asyncio.run(self._serve(models, on_started))
        if self.failure is not None:
            raise RuntimeError(f"{self.label} could not start: {self.failure}") from self.failure

    async def _serve(self, models: list | None = None, on_started: Callable | None = None) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self.stop, sig)
        await self.start_async(models)
        if on_started is not None:
            on_started(self)
        await self.wait_stopped()

    def stop(self, sig: int | None = None) -> None:
        """Begin shutdown (signal handler; idempotent): NOT_SERVING, then gRPC and REST stop with ``grace_s`` for
        in-flight calls, bring-up is cancelled and the engine closed. Must run on the server's event loop."""
        if self._stopped is None:
            self._stopped = asyncio.Event()
        if self._stopping is None:
            log.info("stopping %s (signal %s)", self.label, sig)
            self._stopping = asyncio.get_running_loop().create_task(self._shutdown())

    async def shutdown(self) -> None:
        """Stop and wait until everything is closed (tests and embedders)."""
        self.stop(None)
        await self.wait_stopped()

    async def wait_stopped(self) -> None:
        """Wait until a shutdown begun by :meth:`stop` has finished."""
        await self._stopped.wait()

    async def _shutdown(self) -> None:
        try:
            if self._health is not None:
                await self._set_serving(False)
            if self._uvicorn is not None:
                self._uvicorn.should_exit = True
            if self._grpc is not None:
                await self._grpc.stop(self.grace_s)
            for t in self._tasks:
                if t.get_name() != "kserve-rest":
                    t.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
            await self.host_runtime.close()
            for name in list(self.registered_models.get_models()):
                self.registered_models.unload(name)
        finally:
            self._stopped.set()
