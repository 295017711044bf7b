"""A channel from :func:`mascot.core.server.channel` owns its connections.

gRPC shares connections (subchannels) between channels of one process that have the same address and arguments. A
channel left open to an address where nothing listened keeps that connection in reconnect backoff, and a new channel to
the same address, now served, then failed at once with the old "connection refused", its three attempts included: a
port reused by a later server in one test process (the full suite hit it), or a pod IP reused behind a Service.
"""

from __future__ import annotations

import socket

import grpc
import pytest

from mascot.core.server import ClientTLS, channel

pytestmark = pytest.mark.integration


async def _who(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
    return b"A"


async def test_a_new_channel_reaches_a_server_an_older_channel_could_not():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    target = f"127.0.0.1:{port}"
    old = channel(target, tls=ClientTLS.plaintext(), token="")
    server = None
    try:
        for _ in range(3):  # nothing listens yet: each call fails and the connection backs off further
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await old.unary_unary("/test.Who/Who")(b"", timeout=2)
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        server = grpc.aio.server()
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
            "test.Who", {"Who": grpc.unary_unary_rpc_method_handler(_who)}),))
        assert server.add_insecure_port(target) == port
        await server.start()
        async with channel(target, tls=ClientTLS.plaintext(), token="") as new:
            assert await new.unary_unary("/test.Who/Who")(b"", timeout=5) == b"A"
    finally:
        await old.close()
        if server is not None:
            await server.stop(0)
