"""The one-port KServe ModelServer of the model services (:class:`mascot.app.modelserver.OnePortModelServer`) on
loopback, and following its gRPC health."""

from __future__ import annotations

import asyncio
import contextlib
import sys

import httpx
from grpc_health.v1 import health_pb2, health_pb2_grpc

from mascot.api.dialogue.v1 import dialogue_pb2 as dpb
from mascot.api.speaker.v1 import speaker_pb2 as spb
from mascot.core.server import channel

argv, sys.argv = sys.argv, sys.argv[:1]  # kserve parses sys.argv at import
try:
    from mascot.app.modelserver import OnePortModelServer
finally:
    sys.argv = argv

SERVING, NOT_SERVING = health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING
#: A short speaker request: the anchor comforting a user who said "hello there" (12 tokens at most).
SPEAKER_REQ = spb.GenerateReplyRequest(
    persona_id="anchor", directive=dpb.Directive(persona_id="anchor", action="Comfort the user.", tone="Warm"),
    history=[dpb.Turn(role=dpb.ROLE_USER, text="hello there")], max_tokens=12)


@contextlib.asynccontextmanager
async def model_server(component, cfg, engine=None):
    """A started server on 127.0.0.1 free ports; yields ``(server, channel, http client)``."""
    srv = OnePortModelServer(component, cfg, grpc_port=0, http_port=0, host="127.0.0.1", engine=engine, grace_s=1)
    await srv.start_async()
    ch = channel(f"127.0.0.1:{srv.grpc_port}")
    http = httpx.AsyncClient(base_url=f"http://127.0.0.1:{srv.http_port}", timeout=60)
    try:
        yield srv, ch, http
    finally:
        await http.aclose()
        await ch.close()
        await srv.shutdown()


async def until_health(ch, want=SERVING, timeout=60.0):
    """Follow grpc.health.v1 Watch (no polling) until the overall status is ``want``; TimeoutError after
    ``timeout`` seconds."""
    async def watch():
        async for r in health_pb2_grpc.HealthStub(ch).Watch(health_pb2.HealthCheckRequest(service=""),
                                                             wait_for_ready=True):
            if r.status == want:
                return
    await asyncio.wait_for(watch(), timeout)
