"""The boundary interceptor: request id, ServiceError -> status, RPC metrics, access log (no user text).

Only this module turns :class:`~mascot.core.errors.ServiceError` into gRPC status codes (DESIGN.md
section 3). Any other exception becomes INTERNAL with a generic message; the trace goes to the log.
"""

from __future__ import annotations

import logging
import math
import time
import uuid
from typing import Any, Awaitable, Callable

import grpc

from mascot.core.errors import ResourceExhausted, ServiceError

log = logging.getLogger("mascot.access")
REQUEST_ID_KEY = "x-request-id"


def _request_id(context: grpc.aio.ServicerContext) -> str:
    for k, v in context.invocation_metadata() or ():
        if k == REQUEST_ID_KEY and v:
            return str(v)[:64]
    return uuid.uuid4().hex


class BoundaryInterceptor(grpc.aio.ServerInterceptor):
    """Wrap every handler of a server.

    Args:
        component: Label value for ``mascot_rpc_*`` metrics (gateway, director, speaker).
        metrics: A :class:`~mascot.core.metrics.Metrics`.
    """

    def __init__(self, component: str, metrics: Any) -> None:
        self._component = component
        self._metrics = metrics

    async def intercept_service(self, continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Any]],
                                details: grpc.HandlerCallDetails) -> Any:
        handler = await continuation(details)
        if handler is None or details.method.startswith("/grpc."):
            # gRPC's own services (health, reflection) pass through: health Watch writes with context.write(), which a
            # wrapping async generator would break (INTERNAL), and they are not part of the RPC metrics
            return handler
        rpc = details.method.rsplit("/", 1)[-1]
        if handler.unary_unary:
            return grpc.unary_unary_rpc_method_handler(self._wrap_unary(handler.unary_unary, rpc),
                                                       handler.request_deserializer, handler.response_serializer)
        if handler.unary_stream:
            return grpc.unary_stream_rpc_method_handler(self._wrap_stream(handler.unary_stream, rpc),
                                                        handler.request_deserializer, handler.response_serializer)
        return handler

    def _record(self, rpc: str, code: grpc.StatusCode, t0: float, rid: str) -> None:
        name = code.name
        self._metrics.rpc_requests.labels(self._component, rpc, name).inc()
        self._metrics.rpc_duration.labels(self._component, rpc, name).observe(time.perf_counter() - t0)
        log.info("rpc %s.%s code=%s request_id=%s seconds=%.3f", self._component, rpc, name, rid,
                 time.perf_counter() - t0)

    async def _fail(self, context: grpc.aio.ServicerContext, e: BaseException) -> grpc.StatusCode:
        if isinstance(e, ServiceError):
            if isinstance(e, ResourceExhausted):  # seconds; a rate limit knows when its next call is accepted
                wait = getattr(e, "retry_after_s", None)
                context.set_trailing_metadata((("retry-after", str(max(1, math.ceil(wait or 1)))),))
            await context.abort(e.code, e.message)
        log.exception("unhandled error in handler")
        await context.abort(grpc.StatusCode.INTERNAL, "internal error; see the server log for the request id")
        raise AssertionError("unreachable")

    def _wrap_unary(self, fn: Callable, rpc: str) -> Callable:
        async def handler(request: Any, context: grpc.aio.ServicerContext) -> Any:
            t0, rid = time.perf_counter(), _request_id(context)
            code = grpc.StatusCode.OK
            try:
                return await fn(request, context)
            except ServiceError as e:
                code = e.code
                await self._fail(context, e)
            except (grpc.aio.AbortError, grpc.RpcError):
                code = context.code() or grpc.StatusCode.UNKNOWN
                raise
            except Exception as e:  # noqa: BLE001
                code = grpc.StatusCode.INTERNAL
                await self._fail(context, e)
            finally:
                self._record(rpc, code if isinstance(code, grpc.StatusCode) else grpc.StatusCode.UNKNOWN, t0, rid)
        return handler

    def _wrap_stream(self, fn: Callable, rpc: str) -> Callable:
        async def handler(request: Any, context: grpc.aio.ServicerContext) -> Any:
            t0, rid = time.perf_counter(), _request_id(context)
            code = grpc.StatusCode.OK
            try:
                async for item in fn(request, context):
                    yield item
            except ServiceError as e:
                code = e.code
                await self._fail(context, e)
            except (grpc.aio.AbortError, grpc.RpcError):
                code = context.code() or grpc.StatusCode.UNKNOWN
                raise
            except GeneratorExit:
                code = grpc.StatusCode.CANCELLED
                raise
            except Exception as e:  # noqa: BLE001
                code = grpc.StatusCode.INTERNAL
                await self._fail(context, e)
            finally:
                self._record(rpc, code if isinstance(code, grpc.StatusCode) else grpc.StatusCode.UNKNOWN, t0, rid)
        return handler
