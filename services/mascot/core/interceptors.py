"""The boundary interceptor: request id, ServiceError -> status, RPC metrics, access log (no user text).

Only this module turns :class:`~mascot.core.errors.ServiceError` into gRPC status codes. A request whose bytes do
not parse as the method's message (e.g. a proto3 string field that is not UTF-8) is INVALID_ARGUMENT before the
handler runs; a database that cannot be reached (connection refused or lost, e.g. while PostgreSQL restarts) is
UNAVAILABLE; a database whose disk is full (or an ENOSPC ``OSError``) is RESOURCE_EXHAUSTED (gRPC's code for "the
entire file system is out of space"); any other exception becomes INTERNAL with a generic message; the trace goes to
the log. A call the client cancelled, or whose deadline passed, is counted and logged with CANCELLED or
DEADLINE_EXCEEDED, never OK.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import math
import re
import time
import uuid
from typing import Any, Awaitable, Callable

import grpc

from google.protobuf.message import DecodeError

from mascot.core.errors import InvalidArgument, ResourceExhausted, ServiceError, Unavailable

log = logging.getLogger("mascot.access")
REQUEST_ID_KEY = "x-request-id"
#: Default of ``server.stream_stall_s``: seconds a server stream waits for its client to take one message.
DEFAULT_STREAM_STALL_S = 60.0


class StreamStalled(Unavailable):
    """The client stopped reading a server stream for longer than ``server.stream_stall_s`` (UNAVAILABLE)."""


_STALLED: contextvars.ContextVar[bool] = contextvars.ContextVar("mascot_stream_stalled", default=False)


def stream_stalled() -> bool:
    """True inside a stream handler's cleanup when the boundary is closing it because its client stopped reading
    (the call ends UNAVAILABLE, not CANCELLED)."""
    return _STALLED.get()


class _Undecodable:
    """Stands in for a request whose bytes did not parse (see :func:`_tolerant`); the wrapped handler refuses it."""

    __slots__ = ("type_name",)

    def __init__(self, type_name: str) -> None:
        self.type_name = type_name


def _tolerant(deserializer: Callable[[bytes], Any] | None) -> Callable[[bytes], Any] | None:
    """``deserializer`` that returns :class:`_Undecodable` instead of raising on bytes that are not a valid message.

    gRPC's aio runtime answers a raising deserializer with UNKNOWN before any interceptor code runs; returning a
    marker lets the wrapped handler answer INVALID_ARGUMENT, count the call and log it like any other refusal.
    """
    if deserializer is None:
        return None

    def parse(raw: bytes) -> Any:
        try:
            return deserializer(raw)
        except DecodeError:
            owner = getattr(deserializer, "__self__", None)
            name = getattr(getattr(owner, "DESCRIPTOR", None), "full_name", "") or "request"
            return _Undecodable(name)
    return parse


def _refuse_undecodable(request: Any) -> None:
    if isinstance(request, _Undecodable):
        raise InvalidArgument(f"the request bytes are not a valid {request.type_name} message (a string field that is "
                              "not UTF-8, as proto3 requires, or malformed protobuf); send UTF-8 text")


def _drop_frames(e: BaseException) -> None:
    """Clear the tracebacks of ``e`` and of the exceptions chained to it. gRPC keeps the abort error of a call in a
    reference cycle with the call's context, so a traceback left on it would hold the handler's frames, and with them
    the request (megabytes for a refused oversized one), until a later garbage collection."""
    seen: set[int] = set()
    stack: list[BaseException | None] = [e]
    while stack:
        x = stack.pop()
        if x is None or id(x) in seen:
            continue
        seen.add(id(x))
        x.__traceback__ = None
        stack += [x.__cause__, x.__context__]


def _database_unreachable(e: BaseException) -> bool:
    """True for SQLAlchemy errors meaning the database could not be reached or the connection was lost (PostgreSQL
    restarting, network gone): retryable, so UNAVAILABLE. Constraint violations, bad SQL etc. stay INTERNAL."""
    try:
        from sqlalchemy import exc
    except ImportError:  # pragma: no cover - sqlalchemy is a dependency of the gateway
        return False
    if isinstance(e, exc.DBAPIError) and e.connection_invalidated:
        return True
    return isinstance(e, (exc.OperationalError, exc.InterfaceError, exc.DisconnectionError))


def disk_full(e: BaseException) -> bool:
    """True for an error saying the store's disk is full: SQLite's SQLITE_FULL ("database or disk is full"),
    PostgreSQL's SQLSTATE 53100 (``disk_full``), or an ``OSError`` ENOSPC (also as a database error's cause)."""
    import errno

    for err in (e, getattr(e, "orig", None), e.__cause__):
        if isinstance(err, OSError) and err.errno == errno.ENOSPC:
            return True
    try:
        from sqlalchemy import exc
    except ImportError:  # pragma: no cover - sqlalchemy is a dependency of the gateway
        return False
    if not isinstance(e, exc.DBAPIError):
        return False
    orig = e.orig
    return (getattr(orig, "sqlite_errorname", "") == "SQLITE_FULL" or getattr(orig, "sqlstate", "") == "53100"
            or "database or disk is full" in str(orig))


DISK_FULL_RETRY_S = 60


def _ended_code(context: grpc.aio.ServicerContext) -> grpc.StatusCode:
    """The code of a call whose handler was cancelled: DEADLINE_EXCEEDED when its deadline has passed, else
    CANCELLED (the client went away or cancelled)."""
    remaining = context.time_remaining()
    return grpc.StatusCode.DEADLINE_EXCEEDED if remaining is not None and remaining <= 0 else grpc.StatusCode.CANCELLED


#: The request id of the call being handled (set by the boundary interceptor; "" outside a call), for records that
#: name it (the control plane's audit trail).
CURRENT_REQUEST_ID: contextvars.ContextVar[str] = contextvars.ContextVar("mascot_request_id", default="")
_REQUEST_ID_RE = re.compile(r"^[A-Za-z0-9._:@/+=-]{1,64}$")


def _request_id(context: grpc.aio.ServicerContext) -> str:
    """The caller's ``x-request-id`` when it is 1-64 visible characters of ``[A-Za-z0-9._:@/+=-]``, else a new
    random one (a caller's id is never written to a log or record with line breaks, escapes or unbounded
    length); also set as :data:`CURRENT_REQUEST_ID`."""
    rid = ""
    for k, v in context.invocation_metadata() or ():
        if k == REQUEST_ID_KEY and v:
            v = v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)
            rid = v if _REQUEST_ID_RE.match(v) else ""
            break
    rid = rid or uuid.uuid4().hex
    CURRENT_REQUEST_ID.set(rid)
    return rid


def _consume(fut: "asyncio.Future[Any]") -> None:
    """Retrieve the outcome of an abandoned write, so asyncio does not report it as never retrieved."""
    if not fut.cancelled():
        fut.exception()


def _exception_code(e: BaseException) -> grpc.StatusCode:
    """The status :meth:`BoundaryInterceptor._fail` sends for an exception that is not a ServiceError."""
    if disk_full(e):
        return grpc.StatusCode.RESOURCE_EXHAUSTED
    return grpc.StatusCode.UNAVAILABLE if _database_unreachable(e) else grpc.StatusCode.INTERNAL


class BoundaryInterceptor(grpc.aio.ServerInterceptor):
    """Wrap every handler of a server.

    ``mascot_rpc_in_flight{component, rpc}`` holds each call from the moment its handler starts until it ends (a
    unary call once answered or failed, a server stream once its last message is sent, it fails, or the client
    cancels it), the per-pod load the chart's load autoscaling reads.

    Args:
        component: Label value for ``mascot_rpc_*`` metrics (gateway, director, speaker).
        metrics: A :class:`~mascot.core.metrics.Metrics`.
        stream_stall_s: Longest wait for a client to take one message of a server stream (HTTP/2 flow control: a
            client that stops reading stops the writes). Past it the call ends with UNAVAILABLE, so a client that
            does not read cannot hold a round slot (``server.stream_stall_s``).
    """

    def __init__(self, component: str, metrics: Any, stream_stall_s: float = DEFAULT_STREAM_STALL_S) -> None:
        self._component = component
        self._metrics = metrics
        self._stall_s = stream_stall_s

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
                                                       _tolerant(handler.request_deserializer),
                                                       handler.response_serializer)
        if handler.unary_stream:
            return grpc.unary_stream_rpc_method_handler(self._wrap_stream(handler.unary_stream, rpc),
                                                        _tolerant(handler.request_deserializer),
                                                        handler.response_serializer)
        return handler

    def _record(self, rpc: str, code: grpc.StatusCode, t0: float, rid: str) -> None:
        name = code.name
        self._metrics.rpc_requests.labels(self._component, rpc, name).inc()
        self._metrics.rpc_duration.labels(self._component, rpc, name).observe(time.perf_counter() - t0)
        log.info("rpc %s.%s code=%s request_id=%s seconds=%.3f", self._component, rpc, name, rid,
                 time.perf_counter() - t0)

    async def _fail(self, context: grpc.aio.ServicerContext, e: BaseException) -> grpc.StatusCode:
        if isinstance(e, ServiceError):
            _drop_frames(e)  # the refused request is freed now, not at a later garbage collection
            if isinstance(e, ResourceExhausted):  # seconds; a rate limit knows when its next call is accepted
                wait = getattr(e, "retry_after_s", None)
                context.set_trailing_metadata((("retry-after", str(max(1, math.ceil(wait or 1)))),))
            await context.abort(e.code, e.message)
        if disk_full(e):
            log.error("database disk full: %s", type(e.__cause__ or e).__name__)
            context.set_trailing_metadata((("retry-after", str(DISK_FULL_RETRY_S)),))
            # rounds say what they stored (mascot.gateway.round); here only the failed write is known to be lost
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "the conversation store's disk is full; the "
                                "write this call was making was not stored (what earlier calls stored stays). The "
                                "operator must free space; retry later")
        if _database_unreachable(e):
            log.warning("database unreachable: %s", type(e.__cause__ or e).__name__)  # never the SQL parameters
            await context.abort(grpc.StatusCode.UNAVAILABLE, "the conversation store (database) is unreachable; retry "
                                "with backoff (a SendMessage retry with the same idempotency_key resumes the round)")
        log.exception("unhandled error in handler")
        _drop_frames(e)
        await context.abort(grpc.StatusCode.INTERNAL, "internal error; see the server log for the request id")
        raise AssertionError("unreachable")

    def _wrap_unary(self, fn: Callable, rpc: str) -> Callable:
        async def handler(request: Any, context: grpc.aio.ServicerContext) -> Any:
            t0, rid = time.perf_counter(), _request_id(context)
            code = grpc.StatusCode.OK
            in_flight = self._metrics.rpc_in_flight.labels(self._component, rpc)
            in_flight.inc()
            try:
                _refuse_undecodable(request)
                call = fn(request, context)
                del request  # only the handler holds it: freed as soon as the handler is done with it
                return await call
            except ServiceError as e:
                code = e.code
                await self._fail(context, e)
            except (grpc.aio.AbortError, grpc.RpcError):
                code = context.code() or grpc.StatusCode.UNKNOWN
                raise
            except asyncio.CancelledError:
                code = _ended_code(context)
                raise
            except Exception as e:  # noqa: BLE001 - any handler error becomes a status here
                code = _exception_code(e)
                await self._fail(context, e)
            finally:
                in_flight.dec()
                self._record(rpc, code if isinstance(code, grpc.StatusCode) else grpc.StatusCode.UNKNOWN, t0, rid)
        return handler

    def _wrap_stream(self, fn: Callable, rpc: str) -> Callable:
        async def handler(request: Any, context: grpc.aio.ServicerContext) -> Any:
            t0, rid = time.perf_counter(), _request_id(context)
            code = grpc.StatusCode.OK
            stream = None
            recorded = False
            in_flight = self._metrics.rpc_in_flight.labels(self._component, rpc)
            in_flight.inc()
            try:
                _refuse_undecodable(request)
                stream = fn(request, context)
                del request  # only the handler holds it: freed as soon as the handler is done with it
                async for item in stream:
                    # A write waits for the client's HTTP/2 window; gRPC cannot cancel it, so the wait is bounded
                    # here and a write that never completes is left to end with the connection.
                    write = asyncio.ensure_future(context.write(item))
                    try:
                        done, _ = await asyncio.wait({write}, timeout=self._stall_s)
                    finally:
                        if not write.done():
                            write.add_done_callback(_consume)
                    if not done:
                        raise StreamStalled(f"the client did not read the stream for {self._stall_s:g} s "
                                            "(server.stream_stall_s); the call was ended. What was acknowledged is "
                                            "stored: retry with the same idempotency key to replay it")
                    write.result()
            except ServiceError as e:
                code = e.code
                if isinstance(e, StreamStalled):  # free the round (slot, running state) before the status, which
                    _STALLED.set(True)             # waits behind the unread messages
                    await stream.aclose()
                    self._record(rpc, code, t0, rid)
                    recorded = True
                    log.warning("%s.%s: the client stopped reading for %.0f s; round released", self._component,
                                rpc, self._stall_s)
                await self._fail(context, e)
            except (grpc.aio.AbortError, grpc.RpcError):
                code = context.code() or grpc.StatusCode.UNKNOWN
                raise
            except asyncio.CancelledError:
                code = _ended_code(context)
                raise
            except Exception as e:  # noqa: BLE001 - any handler error becomes a status here
                code = _exception_code(e)
                await self._fail(context, e)
            finally:
                in_flight.dec()
                if stream is not None:  # the handler's own cleanup (slots, running rounds) runs now, not at GC
                    await stream.aclose()
                if not recorded:
                    self._record(rpc, code if isinstance(code, grpc.StatusCode) else grpc.StatusCode.UNKNOWN, t0,
                                 rid)
        return handler
