"""Faults: a model service dies mid-round, a model service hangs past the deadline, the gateway is
SIGKILLed on PostgreSQL. The round ends with a clear status (or completes), nothing acknowledged is lost, and the
conversation goes on once the service is back."""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest

from mascot.api.conversation.v1 import conversation_pb2 as cpb
from mascot.api.conversation.v1 import conversation_pb2_grpc as cpb_grpc
from mascot.api.dialogue.v1 import dialogue_pb2 as dpb
from mascot.core.engine import GenerationRequest
from mascot.core.personas import PersonaCatalog
from mascot.core.server import build_server, channel
from mascot.app.stack import component_service, start_stack
from tests.helpers.config import make_config
from tests.helpers.engine import ScriptedEngine
from tests.helpers.persistence import check_sigkill_and_resume

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


async def test_gateway_sigkill_on_postgresql_loses_no_acknowledged_turn(tiny_model_dir, tmp_path,
                                                                         postgres_url):
    await check_sigkill_and_resume(tiny_model_dir, tmp_path, postgres_url)


async def test_control_characters_from_a_model_never_reach_the_client_or_the_store(tmp_path, postgres_url):
    """A model that emits NUL, ESC or DEL (the random tiny model does, now and then): the characters are removed
    from the streamed deltas, the stored turn and the raw directive. PostgreSQL text cannot hold NUL at all; this was
    the cause of the INTERNAL once seen after a gateway restart on PostgreSQL."""
    eng = ScriptedEngine(lambda p: "Agent: The Catalyst\x00\nAction: Ask one\x1b[0m question.\nTone: Curious",
                         lambda p: "I hear\x00 you\x1b[31m, tru\x7fly.\tReally.")
    stack = await start_stack(make_config(tmp_path, store={"url": postgres_url}), engine=eng)
    ch = channel(stack.target("gateway"))
    stub = cpb_grpc.ConversationServiceStub(ch)
    try:
        conv = (await stub.StartConversation(cpb.StartConversationRequest(mode=cpb.MODE_SUPPORT))).conversation
        events = [r.event async for r in stub.SendMessage(cpb.SendMessageRequest(conversation_id=conv.id,
                                                                                 text="Hello.", idempotency_key="k"))]
        assert events[-1].round_completed.agent_turns == 3
        streamed = "".join(e.turn_delta.text for e in events if e.HasField("turn_delta"))
        stored = (await stub.GetConversation(cpb.GetConversationRequest(conversation_id=conv.id))).conversation
        for t in stored.turns[1:]:
            assert t.text == "I hear you[31m, truly.\tReally."  # tab kept; NUL, ESC and DEL gone
            assert t.directive.raw == "Agent: The Catalyst\nAction: Ask one[0m question.\nTone: Curious"
        assert streamed == "I hear you[31m, truly.\tReally." * 3
    finally:
        await ch.close()
        await stack.stop(0)


async def _rounds_with_retries(stub, conv_id: str, n: int, acked: list, errors: list, done: list) -> None:
    """``n`` rounds on one conversation; a round refused UNAVAILABLE (database or model service away) is retried with
    the same idempotency key and backoff, as a client does. Every acknowledged turn goes to ``acked``, every refusal's
    code to ``errors``."""
    for r in range(n):
        req = cpb.SendMessageRequest(conversation_id=conv_id, text=f"Message {r} about my week.",
                                     idempotency_key=f"{conv_id}-r{r}")
        for k in range(60):
            try:
                async for resp in stub.SendMessage(req, timeout=120):
                    if resp.event.HasField("turn_completed"):
                        acked.append((conv_id, resp.event.turn_completed.turn))
                break
            except grpc.aio.AioRpcError as e:
                errors.append(e.code())
                if e.code() != grpc.StatusCode.UNAVAILABLE:
                    raise
                await asyncio.sleep(min(0.1 * 2 ** k, 2.0))
        else:
            raise AssertionError(f"round {r} of {conv_id} was never served")
        done.append((conv_id, r))


async def test_postgresql_restart_under_load_loses_no_acknowledged_turn(engine, tmp_path, postgres_server):
    """PostgreSQL is restarted (fast shutdown: every session cut) while 6 conversations run rounds on the real tiny
    model. Calls that meet the outage get UNAVAILABLE (never INTERNAL); retried with the same key they finish; every
    acknowledged turn is stored once, in place; the gateway serves on without a restart of its own."""
    from sqlalchemy import create_engine, text

    stack = await start_stack(make_config(tmp_path, store={"url": postgres_server.url},
                                          dialogue={"agent_turns_per_round": 2}), engine=engine)
    ch = channel(stack.target("gateway"))
    stub = cpb_grpc.ConversationServiceStub(ch)
    probe = create_engine(postgres_server.url)

    def started_at():
        with probe.connect() as c:
            return c.execute(text("select pg_postmaster_start_time()")).scalar()
    try:
        before = started_at()
        probe.dispose()
        convs = [(await stub.StartConversation(cpb.StartConversationRequest(mode=cpb.MODE_SUPPORT))).conversation.id
                 for _ in range(6)]
        acked, errors, done = [], [], []
        rounds = 4
        load = asyncio.gather(*(_rounds_with_retries(stub, c, rounds, acked, errors, done) for c in convs))
        while len(done) < 4:  # under way: some rounds finished, the others in flight
            await asyncio.sleep(0.05)
        await asyncio.to_thread(postgres_server.restart, 1.0)
        await asyncio.wait_for(load, 600)
        assert started_at() > before  # the database really restarted under the load
        assert set(errors) <= {grpc.StatusCode.UNAVAILABLE}, errors
        print(f"rounds refused UNAVAILABLE during the restart and retried: {len(errors)}")
        for c in convs:
            stored = (await stub.GetConversation(cpb.GetConversationRequest(conversation_id=c))).conversation.turns
            # 1 user + 2 agent turns per round, in order: nothing duplicated or missing
            assert [t.role for t in stored] == [dpb.ROLE_USER, dpb.ROLE_AGENT, dpb.ROLE_AGENT] * rounds
            assert [t.text for t in stored][::3] == [f"Message {r} about my week." for r in range(rounds)]
            mine = [t for cid, t in acked if cid == c]
            for t in mine:  # every acknowledged turn is stored, at its index, as sent
                assert stored[t.index].text == t.text and stored[t.index].persona_id == t.persona_id
        # the conversation goes on after the outage
        events = [r.event async for r in stub.SendMessage(cpb.SendMessageRequest(
            conversation_id=convs[0], text="One more thing.", idempotency_key="after"))]
        assert events[-1].round_completed.agent_turns == 2
    finally:
        probe.dispose()
        await ch.close()
        await stack.stop(0)
