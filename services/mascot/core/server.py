"""build_server(): one grpc.aio server with health, reflection, the boundary interceptor and size limits.

Clients come from :func:`channel` with the same message-size limits (DESIGN.md section 3: set in one
place, equal on servers and clients) and a retry policy for UNAVAILABLE only.
"""

from __future__ import annotations

import json
from typing import Any, Callable, Sequence

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from mascot.core.interceptors import BoundaryInterceptor

DEFAULT_MAX_MESSAGE_BYTES = 16 * 1024 * 1024


def _options(max_message_bytes: int) -> list[tuple[str, Any]]:
    return [("grpc.max_send_message_length", max_message_bytes),
            ("grpc.max_receive_message_length", max_message_bytes)]


class Server:
    """A started gRPC server: ``port`` is the bound port, ``health`` the health servicer."""

    def __init__(self, server: grpc.aio.Server, port: int, health_servicer: health.aio.HealthServicer,
                 services: Sequence[str]) -> None:
        self.server, self.port, self.health, self.services = server, port, health_servicer, services

    async def set_serving(self, serving: bool = True) -> None:
        """Mark every service (and the overall server, "") SERVING or NOT_SERVING."""
        status = (health_pb2.HealthCheckResponse.SERVING if serving
                  else health_pb2.HealthCheckResponse.NOT_SERVING)
        for name in ("", *self.services):
            await self.health.set(name, status)

    async def stop(self, grace: float = 5.0) -> None:
        """Mark NOT_SERVING, then stop, letting in-flight RPCs finish for ``grace`` seconds."""
        await self.set_serving(False)
        await self.server.stop(grace)


async def build_server(component: str, metrics: Any, add: Sequence[tuple[Callable, Any, str]], *,
                       host: str = "127.0.0.1", port: int = 0,
                       max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> Server:
    """Create, bind and start a server.

    Args:
        component: Metric label of this server.
        metrics: :class:`~mascot.core.metrics.Metrics`.
        add: ``(add_XServicer_to_server, servicer, full_service_name)`` triples.
        host: Bind address (127.0.0.1 in embedded mode and tests).
        port: Port; 0 picks a free one.
        max_message_bytes: gRPC send/receive limit.

    Raises:
        RuntimeError: the port could not be bound.
    """
    server = grpc.aio.server(interceptors=[BoundaryInterceptor(component, metrics)],
                             options=_options(max_message_bytes))
    names = []
    for adder, servicer, name in add:
        adder(servicer, server)
        names.append(name)
    hs = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(hs, server)
    reflection.enable_server_reflection([*names, health.SERVICE_NAME, reflection.SERVICE_NAME], server)
    bound = server.add_insecure_port(f"{host}:{port}")
    if bound == 0:
        raise RuntimeError(f"could not bind {host}:{port}; is the port in use?")
    await server.start()
    srv = Server(server, bound, hs, names)
    await srv.set_serving(True)
    return srv


def channel(target: str, max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> grpc.aio.Channel:
    """An insecure async channel with equal size limits and retries of UNAVAILABLE (3 attempts)."""
    service_config = {"methodConfig": [{
        "name": [{}],
        "retryPolicy": {"maxAttempts": 3, "initialBackoff": "0.1s", "maxBackoff": "1s", "backoffMultiplier": 2,
                        "retryableStatusCodes": ["UNAVAILABLE"]},
    }]}
    return grpc.aio.insecure_channel(target, options=[*_options(max_message_bytes),
                                                      ("grpc.service_config", json.dumps(service_config)),
                                                      ("grpc.enable_retries", 1)])
