"""gRPC client helpers: the events of a server-streaming call, and the status of a call that must fail."""

from __future__ import annotations

import grpc
import pytest


async def collect(call) -> list:
    """All events of a server-streaming call (``.event`` of each response)."""
    return [r.event async for r in call]


async def code_of(call) -> tuple[grpc.StatusCode, str]:
    """The (status code, details) of a call that must fail: a unary call or coroutine (awaited) or a
    server-streaming call (read to its end). Fails the test when the call succeeds."""
    with pytest.raises(grpc.aio.AioRpcError) as e:
        if hasattr(call, "__aiter__"):
            [x async for x in call]
        else:
            await call
    return e.value.code(), e.value.details()
