"""Balanced gRPC to model-service replicas through the services' own ``channel()`` and ``build_server`` settings.

Two real speaker servers (SpeakerService, health, the boundary interceptor; a scripted engine) stand for two pods of
the speaker's headless Service, reached as the chart's gateway reaches them: ``dns:///NAME:PORT``. The name is
``localhost``, which gRPC's DNS resolver (c-ares) resolves to both loopback addresses, 127.0.0.1 and ::1 (RFC 6761),
whatever /etc/hosts says, so replica A binds 127.0.0.1:P and replica B [::1]:P. Checked: calls go to both replicas
in turn; stopping A loses no call; a server's ``max_connection_age`` makes a client connected to one replica reach a
replica started later behind the same address (and without it the client stays on the first); keepalive pings of
``channel()`` are accepted by servers with ``build_server``'s options, and refused by gRPC's default server policy.
"""

from __future__ import annotations

import asyncio
import os
import socket
import time

import grpc
import pytest

from mascot.api.dialogue.v1 import dialogue_pb2 as dpb
from mascot.api.speaker.v1 import speaker_pb2 as spb
from mascot.api.speaker.v1 import speaker_pb2_grpc as sp_grpc
from mascot.core.server import ClientTLS, ConnectionSettings, channel
from mascot.app.stack import Stack, start_stack
from tests.helpers.config import make_config
from tests.helpers.engine import ScriptedEngine
from tests.helpers.paths import need

pytestmark = [pytest.mark.integration, pytest.mark.serial]  # times replicas answering and stopping
REQUEST = spb.GenerateReplyRequest(
    persona_id="anchor", directive=dpb.Directive(persona_id="anchor", action="Comfort the user.", tone="Warm"),
    history=[dpb.Turn(role=dpb.ROLE_USER, text="hello there")], max_tokens=12)


def _port_free_on_both_loopbacks() -> int:
    """A TCP port free on 127.0.0.1 and on ::1 (skips when this machine has no IPv6 loopback)."""
    for _ in range(50):
        with socket.socket() as v4:
            v4.bind(("127.0.0.1", 0))
            port = v4.getsockname()[1]
            try:
                with socket.socket(socket.AF_INET6) as v6:
                    v6.bind(("::1", port))
                    return port
            except OSError as e:
                need(e.errno != 99, "no IPv6 loopback (::1) on this machine")  # EADDRNOTAVAIL
    raise AssertionError("no port free on both 127.0.0.1 and ::1")


@pytest.fixture
def port() -> int:
    need(os.environ.get("GRPC_DNS_RESOLVER", "ares").lower() != "native",
         "GRPC_DNS_RESOLVER=native resolves localhost from /etc/hosts only; the test needs gRPC's c-ares resolver")
    return _port_free_on_both_loopbacks()


async def _replica(tmp_path, name: str, host: str, port: int, **server) -> Stack:
    """A speaker server on ``host:port`` built as every stack builds it (its own metrics registry)."""
    cfg = make_config(tmp_path / name, server={"host": host, "speaker_port": port, **server})
    return await start_stack(cfg, ("speaker",), engine=ScriptedEngine(lambda p: "", lambda p: "I hear you."))


def _served(replica: Stack) -> int:
    """GenerateReply calls the replica answered OK (``mascot_rpc_requests_total``)."""
    value = replica.metrics.registry.get_sample_value(
        "mascot_rpc_requests_total", {"component": "speaker", "rpc": "GenerateReply", "code": "OK"})
    return int(value or 0)


async def _reply(stub: sp_grpc.SpeakerServiceStub) -> str:
    """One GenerateReply stream; the reply's final text."""
    return [r.final.text async for r in stub.GenerateReply(REQUEST, timeout=10) if r.WhichOneof("event") == "final"][0]


async def test_calls_alternate_between_replicas_and_survive_one_stopping(tmp_path, port):
    a = await _replica(tmp_path, "a", "127.0.0.1", port)
    b = await _replica(tmp_path, "b", "[::1]", port)
    stopped = False
    try:
        async with channel(f"dns:///localhost:{port}", tls=ClientTLS.plaintext(), token="") as ch:
            stub = sp_grpc.SpeakerServiceStub(ch)
            t0 = time.monotonic()  # round_robin picks READY connections only: wait until both have answered
            while not (_served(a) and _served(b)) and time.monotonic() - t0 < 10:
                await _reply(stub)
            a0, b0 = _served(a), _served(b)
            for _ in range(20):
                assert await _reply(stub) == "I hear you."
            assert (_served(a) - a0) + (_served(b) - b0) == 20
            assert _served(a) - a0 >= 8 and _served(b) - b0 >= 8, (_served(a) - a0, _served(b) - b0)  # in turn

            # A stops (GOAWAY, in-flight calls finish within its grace) while calls keep coming: none fails
            failures: list[str] = []
            done = asyncio.Event()

            async def keep_calling() -> int:
                n = 0
                while not done.is_set():
                    try:
                        await _reply(stub)
                    except grpc.aio.AioRpcError as e:
                        failures.append(f"{e.code().name}: {e.details()}")
                    n += 1
                return n

            caller = asyncio.create_task(keep_calling())
            await asyncio.sleep(0.3)
            await a.stop(1.0)
            stopped = True
            served_by_a = _served(a)
            b_before = _served(b)
            await asyncio.sleep(1.0)
            done.set()
            calls = await caller
            after = [await _reply(stub) for _ in range(10)]
            assert not failures, failures
            assert calls > 5 and after == ["I hear you."] * 10
            assert _served(b) - b_before >= 10 and _served(a) == served_by_a  # everything after the stop went to B
    finally:
        if not stopped:
            await a.stop(0)
        await b.stop(0)


async def _named_server(name: bytes, options: list, port: int = 0) -> tuple[grpc.aio.Server, int]:
    """A gRPC server on ``127.0.0.1:port`` (0: a free one) whose one method ``/test.Who/Who`` answers ``name``."""
    async def who(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        return name

    server = grpc.aio.server(options=options)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
        "test.Who", {"Who": grpc.unary_unary_rpc_method_handler(who)}),))
    bound = server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    return server, bound


@pytest.mark.parametrize("max_age_s", [1.0, 0.0], ids=["max-connection-age-1s", "no-max-connection-age"])
async def test_max_connection_age_brings_clients_to_a_replica_started_later(max_age_s):
    """Like a pod joining a Service, B listens on A's address and is only reached by a new connection. Our servers'
    options (:meth:`ConnectionSettings.server_options`) are used as they are, except that this test turns
    SO_REUSEPORT on for both servers (ours turn it off) as the stand-in for two pods behind one Service address. With
    ``max_connection_age`` A sends GOAWAY, the client reconnects, and new connections land on A or B; without it the
    client's connection stays on A forever."""
    settings = ConnectionSettings(max_connection_age_s=max_age_s, max_connection_age_grace_s=1.0)
    options = [o for o in settings.server_options() if o[0] != "grpc.so_reuseport"] + [("grpc.so_reuseport", 1)]
    a, port = await _named_server(b"A", options)
    b = None
    try:
        async with channel(f"dns:///127.0.0.1:{port}", tls=ClientTLS.plaintext(), token="") as ch:
            call = ch.unary_unary("/test.Who/Who")
            assert [await call(b"", timeout=5) for _ in range(3)] == [b"A"] * 3
            b, b_port = await _named_server(b"B", options, port)
            assert b_port == port
            window = 12.0 if max_age_s else 4.0  # ample for several 1 s connection ages; the control waits less
            t0, answers = time.monotonic(), []
            while time.monotonic() - t0 < window and answers.count(b"B") < 3:
                answers.append(await call(b"", timeout=5))  # any failure raises: reconnects lose no call
                await asyncio.sleep(0.05)
            if max_age_s:
                assert answers.count(b"B") >= 3, f"B got {answers.count(b'B')} of {len(answers)} calls in {window} s"
                assert b"A" in answers  # A kept serving new connections too
            else:
                assert answers and set(answers) == {b"A"}
    finally:
        await a.stop(0)
        if b is not None:
            await b.stop(0)


async def _peer_server(options: list) -> tuple[grpc.aio.Server, int]:
    """A gRPC server whose one method answers the caller's address (one per TCP connection)."""
    async def peer(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        return context.peer().encode()

    server = grpc.aio.server(options=options)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
        "test.Peer", {"Peer": grpc.unary_unary_rpc_method_handler(peer)}),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, port


@pytest.mark.parametrize("ours", [True, False], ids=["build-server-options", "grpc-default-server"])
async def test_keepalive_pings_of_idle_channels_are_accepted_by_our_servers(ours):
    """A channel pinging every second on an idle connection: a server with build_server's keepalive options keeps the
    connection; gRPC's default server (pings no more often than every 5 minutes) ends it with GOAWAY too_many_pings
    after two strikes, so the next call arrives on a new connection (another client port)."""
    fast = ConnectionSettings(keepalive_time_s=1.0, keepalive_timeout_s=1.0, max_connection_age_s=0)
    server, port = await _peer_server(fast.server_options() if ours else [])
    try:
        async with channel(f"dns:///127.0.0.1:{port}", tls=ClientTLS.plaintext(), token="", connections=fast) as ch:
            call = ch.unary_unary("/test.Peer/Peer")
            first = await call(b"", timeout=5)
            await asyncio.sleep(4.5)  # idle: four pings
            second = await call(b"", timeout=5)
        assert (first == second) is ours, (first, second)
    finally:
        await server.stop(0)
