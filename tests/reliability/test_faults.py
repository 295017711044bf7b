"""Faults (issue 8, item 3): a model service dies mid-round, a model service hangs past the deadline, the gateway is
SIGKILLed on PostgreSQL. The round ends with a clear status (or completes), nothing acknowledged is lost, and the
conversation goes on once the service is back."""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest

from mascot.api.conversation.v1 import conversation_pb2 as cpb
from mascot.api.conversation.v1 import conversation_pb2_grpc as cpb_grpc
from mascot.core.engine import GenerationRequest
from mascot.core.personas import PersonaCatalog
from mascot.core.server import build_server, channel
from mascot.stack import component_service, start_stack
from tests.conftest import make_config
from tests.helpers import ScriptedEngine
from tests.integration.test_persistence import check_sigkill_and_resume
from tests.integration.test_postgres import postgres_url  # noqa: F401  (the throwaway PostgreSQL server fixture)

pytestmark = [pytest.mark.integration]
DIRECTOR = "Agent: The Catalyst\nAction: Ask one question.\nTone: Curious"


async def restart(stack, component):
    """Serve ``component`` again on the port it had (the gateway's channel reconnects to it)."""
    port = stack.servers[component].port
    service = await component_service(component, stack.cfg, engine=stack.engine,
                                      catalog=PersonaCatalog.load(), metrics=stack.metrics)
    stack.servers[component] = await build_server(component, stack.metrics, [service], host=stack.cfg.server.host,
                                                  port=port)


async def retry_until_served(stub, request, attempts: int = 40):
    """What a client does after UNAVAILABLE: retry with the same idempotency key, backing off, until served (the
    gateway's channel reconnects with gRPC's own backoff, so the first retries may still find the service down)."""
    for k in range(attempts):
        try:
            return [r.event async for r in stub.SendMessage(request)]
        except grpc.aio.AioRpcError as e:
            if e.code() != grpc.StatusCode.UNAVAILABLE or k == attempts - 1:
                raise
            await asyncio.sleep(min(0.1 * 2 ** k, 2.0))


@pytest.mark.parametrize("component", ["speaker", "director"])
async def test_a_model_service_killed_mid_round_ends_it_unavailable_and_the_retry_finishes(component, engine,
                                                                                           tmp_path):
    stack = await start_stack(make_config(tmp_path), engine=engine)
    ch = channel(stack.target("gateway"))
    stub = cpb_grpc.ConversationServiceStub(ch)
    try:
        conv = (await stub.StartConversation(cpb.StartConversationRequest(mode=cpb.MODE_SUPPORT))).conversation
        acked = []
        call = stub.SendMessage(cpb.SendMessageRequest(conversation_id=conv.id, text="My cat is ill.",
                                                       idempotency_key="r1"))
        with pytest.raises(grpc.aio.AioRpcError) as err:
            async for r in call:
                if r.event.HasField("turn_completed") and r.event.turn_completed.turn.persona_id:
                    acked.append(r.event.turn_completed.turn)
                    if len(acked) == 1:
                        await stack.servers[component].stop(0)  # dies after the first agent turn
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE and component in err.value.details()
        stored = (await stub.GetConversation(cpb.GetConversationRequest(conversation_id=conv.id))).conversation
        assert [t.text for t in stored.turns][1:] == [t.text for t in acked]  # the acknowledged turn is kept

        await restart(stack, component)
        events = await retry_until_served(stub, cpb.SendMessageRequest(conversation_id=conv.id, text="My cat is ill.",
                                                                       idempotency_key="r1"))
        assert events[0].round_started.replayed and events[-1].round_completed.agent_turns == 3
        stored = (await stub.GetConversation(cpb.GetConversationRequest(conversation_id=conv.id))).conversation
        assert len(stored.turns) == 4 and stored.turns[1].text == acked[0].text  # nothing duplicated
        events = [r.event async for r in stub.SendMessage(cpb.SendMessageRequest(
            conversation_id=conv.id, text="Thanks.", idempotency_key="r2"))]
        assert events[-1].round_completed.agent_turns == 3  # the conversation goes on
    finally:
        await ch.close()
        await stack.stop(0)


class HangingSpeaker(ScriptedEngine):
    """The director answers at once; every speaker reply hangs (a wedged model service)."""

    async def stream(self, request: GenerationRequest):
        if "You are the director" in request.prompt:
            async for item in super().stream(request):
                yield item
            return
        await asyncio.sleep(3600)
        yield None  # pragma: no cover


async def test_a_hanging_speaker_hits_the_call_deadline_and_nothing_half_is_stored(tmp_path):
    stack = await start_stack(make_config(tmp_path, server={"call_timeout_s": 1.0}),
                              engine=HangingSpeaker(lambda p: DIRECTOR, lambda p: "never"))
    ch = channel(stack.target("gateway"))
    stub = cpb_grpc.ConversationServiceStub(ch)
    try:
        conv = (await stub.StartConversation(cpb.StartConversationRequest(mode=cpb.MODE_SUPPORT))).conversation
        t0 = time.monotonic()
        with pytest.raises(grpc.aio.AioRpcError) as err:
            async for _ in stub.SendMessage(cpb.SendMessageRequest(conversation_id=conv.id, text="Hello.",
                                                                   idempotency_key="r1")):
                pass
        assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED and "speaker" in err.value.details()
        assert time.monotonic() - t0 < 30  # bounded by call_timeout_s, not by the hang
        stored = (await stub.GetConversation(cpb.GetConversationRequest(conversation_id=conv.id))).conversation
        assert [t.role for t in stored.turns] == [1]  # the user's message only: no half-written agent turn
    finally:
        await ch.close()
        await stack.stop(0)


@pytest.mark.xfail(reason="known intermittent defect (issue 8 note): the restarted gateway sometimes answers the retry "
                          "on PostgreSQL with INTERNAL; seen 2 times in ~8 runs under load, cause not found yet; the "
                          "server log is kept in the test's tmp dir (server.log)", strict=False)
async def test_gateway_sigkill_on_postgresql_loses_no_acknowledged_turn(tiny_model_dir, tmp_path,
                                                                         postgres_url):  # noqa: F811
    await check_sigkill_and_resume(tiny_model_dir, tmp_path, postgres_url)
