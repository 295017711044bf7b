"""``mascot_rpc_in_flight{component, rpc}``, the load gauge the chart's load autoscaling reads: real servers on
loopback (the stack's ``build_server`` and the one-port KServe ModelServer of the model services) whose engine holds
each generation until the test releases it. A server stream counts 1 while it is open and 0 after it ends, cancelled
included; a unary call counts while its handler runs; every served RPC starts at 0; the model server exposes the
gauge on its HTTP ``/metrics`` (the port the chart's ServiceMonitor scrapes)."""

from __future__ import annotations

import asyncio
import contextlib
import re

import grpc
import pytest

from mascot.api.dialogue.v1 import dialogue_pb2 as dpb
from mascot.api.director.v1 import director_pb2 as dirpb
from mascot.api.director.v1 import director_pb2_grpc as dir_grpc
from mascot.api.speaker.v1 import speaker_pb2 as spb
from mascot.api.speaker.v1 import speaker_pb2_grpc as sp_grpc
from mascot.core.engine import GenerationRequest
from mascot.core.server import channel
from mascot.app.stack import start_stack
from tests.helpers.config import make_config
from tests.helpers.engine import ScriptedEngine

pytestmark = [pytest.mark.integration]
DIRECTOR = "Agent: anchor\nAction: Ask one question.\nTone: Curious"
REPLY = "What would help you most right now, do you think?"
SPEAKER_REQ = spb.GenerateReplyRequest(
    persona_id="anchor", directive=dpb.Directive(persona_id="anchor", action="Comfort the user.", tone="Warm"),
    history=[dpb.Turn(role=dpb.ROLE_USER, text="hello there")], max_tokens=64)
DIRECTOR_REQ = dirpb.NextDirectiveRequest(persona_ids=["anchor", "beacon"],
                                          history=[dpb.Turn(role=dpb.ROLE_USER, text="I feel terrible.")])


class GatedEngine(ScriptedEngine):
    """A ScriptedEngine whose generations wait for :attr:`release` after setting :attr:`started` (a call stays
    in flight as long as the test wants)."""

    def __init__(self) -> None:
        super().__init__(lambda p: DIRECTOR, lambda p: REPLY)
        self.started = asyncio.Event()
        self.release = asyncio.Event()

    async def stream(self, request: GenerationRequest):
        self.started.set()
        await self.release.wait()
        async for item in super().stream(request):
            yield item


def in_flight(stack, component: str, rpc: str) -> float | None:
    """The gauge's value in the stack's registry (None when the series does not exist)."""
    return stack.metrics.registry.get_sample_value("mascot_rpc_in_flight", {"component": component, "rpc": rpc})


async def until(predicate, timeout: float = 10.0) -> None:
    """Wait for ``predicate()`` to hold (the server side of a call ends a moment after the client sees it end)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        assert loop.time() < deadline, "condition not reached"
        await asyncio.sleep(0.01)


@contextlib.asynccontextmanager
async def served(tmp_path, engine):
    stack = await start_stack(make_config(tmp_path), ("director", "speaker"), engine=engine)
    try:
        yield stack
    finally:
        await stack.stop(0)


async def test_a_server_stream_is_in_flight_while_open_and_not_after(tmp_path):
    engine = GatedEngine()
    async with served(tmp_path, engine) as stack, channel(stack.target("speaker")) as ch:
        # declared at zero for every served RPC before any call, so an idle pod reports 0, not nothing
        assert in_flight(stack, "speaker", "GenerateReply") == 0
        assert in_flight(stack, "director", "NextDirective") == 0
        call = sp_grpc.SpeakerServiceStub(ch).GenerateReply(SPEAKER_REQ)
        reading = asyncio.ensure_future(_read_all(call))
        await asyncio.wait_for(engine.started.wait(), 10)
        assert in_flight(stack, "speaker", "GenerateReply") == 1
        assert in_flight(stack, "director", "NextDirective") == 0  # per component and method
        engine.release.set()
        messages = await asyncio.wait_for(reading, 30)
        assert messages[-1].HasField("final") and messages[-1].final.text
        await until(lambda: in_flight(stack, "speaker", "GenerateReply") == 0)


async def _read_all(call) -> list:
    return [m async for m in call]


async def test_two_open_streams_count_two_and_a_cancelled_one_is_released(tmp_path):
    engine = GatedEngine()
    async with served(tmp_path, engine) as stack, channel(stack.target("speaker")) as ch:
        stub = sp_grpc.SpeakerServiceStub(ch)
        first, second = stub.GenerateReply(SPEAKER_REQ), stub.GenerateReply(SPEAKER_REQ)
        reads = [asyncio.ensure_future(_read_all(c)) for c in (first, second)]
        await until(lambda: in_flight(stack, "speaker", "GenerateReply") == 2)
        first.cancel()
        with pytest.raises(asyncio.CancelledError):
            await reads[0]
        await until(lambda: in_flight(stack, "speaker", "GenerateReply") == 1)
        engine.release.set()
        await asyncio.wait_for(reads[1], 30)
        await until(lambda: in_flight(stack, "speaker", "GenerateReply") == 0)


async def test_a_unary_call_is_in_flight_while_its_handler_runs_refusals_included(tmp_path):
    engine = GatedEngine()
    async with served(tmp_path, engine) as stack, channel(stack.target("director")) as ch:
        stub = dir_grpc.DirectorServiceStub(ch)
        pending = asyncio.ensure_future(stub.NextDirective(DIRECTOR_REQ))
        await asyncio.wait_for(engine.started.wait(), 10)
        assert in_flight(stack, "director", "NextDirective") == 1
        engine.release.set()
        resp = await asyncio.wait_for(pending, 30)
        assert resp.directive.persona_id in DIRECTOR_REQ.persona_ids
        await until(lambda: in_flight(stack, "director", "NextDirective") == 0)
        # a refused call (INVALID_ARGUMENT before any generation) leaves nothing behind
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await stub.NextDirective(dirpb.NextDirectiveRequest())
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        await until(lambda: in_flight(stack, "director", "NextDirective") == 0)


GAUGE_LINE = re.compile(r'^mascot_rpc_in_flight\{component="speaker",rpc="GenerateReply"\} (\S+)$', re.M)


async def test_the_model_server_exposes_the_gauge_on_its_metrics_port(tmp_path):
    """The KServe form of the model services (``mascot serve-model``) serves /metrics on its HTTP port, which the
    models ServiceMonitor scrapes and the load autoscaling reads."""
    from tests.helpers.modelserver import model_server, until_health

    engine = GatedEngine()
    async with model_server("speaker", make_config(tmp_path), engine) as (srv, ch, http):
        await until_health(ch)

        async def scraped() -> float:
            values = GAUGE_LINE.findall((await http.get("/metrics")).text)
            assert len(values) == 1, ("no single speaker/GenerateReply series of mascot_rpc_in_flight on /metrics: "
                                      "the model server must declare every RPC it serves (Metrics.declare(rpcs=...))")
            return float(values[0])

        assert await scraped() == 0
        reading = asyncio.ensure_future(_read_all(sp_grpc.SpeakerServiceStub(ch).GenerateReply(SPEAKER_REQ)))
        await asyncio.wait_for(engine.started.wait(), 10)
        assert await scraped() == 1
        engine.release.set()
        messages = await asyncio.wait_for(reading, 30)
        assert messages[-1].HasField("final")
        for _ in range(200):
            if await scraped() == 0:
                break
            await asyncio.sleep(0.01)
        assert await scraped() == 0
