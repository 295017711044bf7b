"""Rounds stay in conversation order, retries are answered with the code that fits, and streams that end early are
counted with their real codes.

Found by a reviewer: a round cancelled after its first agent turn and retried after a newer message appended its
turns after the newer round's (``uA aA uB aB aB aB aA aA``), so the models saw B as the latest message; the same key
with another text while the round ran answered UNAVAILABLE "retry with the same key" and that retry then got
INVALID_ARGUMENT; cancelled and deadline-exceeded streams were counted as ``code="OK"``."""

from __future__ import annotations

import asyncio
from contextlib import asynccontextmanager

import grpc
import pytest

from mascot.api.conversation.v1 import conversation_pb2 as cpb
from mascot.api.conversation.v1 import conversation_pb2_grpc as cpb_grpc
from mascot.api.dialogue.v1 import dialogue_pb2 as dpb
from mascot.core.engine import GenerationRequest
from mascot.core.server import channel
from mascot.app.stack import start_stack
from tests.helpers.config import make_config
from tests.helpers.engine import ScriptedEngine
from tests.helpers.rpc import collect

pytestmark = [pytest.mark.integration]
DIRECTOR = "Agent: The Catalyst\nAction: Ask one question.\nTone: Curious"


class SlowSpeaker(ScriptedEngine):
    """Speaker replies stream one 3-character delta every ``delay_s`` seconds (a round takes a while)."""

    def __init__(self, delay_s: float) -> None:
        super().__init__(lambda p: DIRECTOR, lambda p: "What would help you most right now, do you think?")
        self.delay_s = delay_s

    async def stream(self, request: GenerationRequest):
        async for item in super().stream(request):
            if "You are the director" not in request.prompt:
                await asyncio.sleep(self.delay_s)
            yield item


@asynccontextmanager
async def _served(tmp_path, delay_s: float):
    """``(stack, stub)`` of a gateway, director and speaker on a :class:`SlowSpeaker`; stopped on exit."""
    stack = await start_stack(make_config(tmp_path), ("gateway", "director", "speaker"), engine=SlowSpeaker(delay_s))
    ch = channel(stack.target("gateway"))
    try:
        yield stack, cpb_grpc.ConversationServiceStub(ch)
    finally:
        await ch.close()
        await stack.stop(0)


def _send(stub, conv_id: str, text: str, key: str, **kw):
    return stub.SendMessage(cpb.SendMessageRequest(conversation_id=conv_id, text=text, idempotency_key=key), **kw)


async def _until_admitted(stub, conv_id: str, text: str, key: str) -> list:
    """Send, retrying while the gateway has not yet seen the cancel of the previous round (FAILED_PRECONDITION)."""
    for _ in range(100):
        try:
            return await collect(_send(stub, conv_id, text, key))
        except grpc.aio.AioRpcError as e:
            if e.code() != grpc.StatusCode.FAILED_PRECONDITION:
                raise
            await asyncio.sleep(0.05)
    raise AssertionError("the cancelled round never let go of its conversation")


async def _conversation(stub) -> str:
    return (await stub.StartConversation(cpb.StartConversationRequest(mode=cpb.MODE_SUPPORT))).conversation.id


async def _started(stub, conv_id: str, text: str, key: str):
    """A SendMessage call read up to its RoundStarted event (the round is running)."""
    call = _send(stub, conv_id, text, key)
    async for r in call:
        if r.event.HasField("round_started"):
            return call
    raise AssertionError("the round never started")


def _count(stack, rpc: str, code: str) -> float:
    return stack.metrics.registry.get_sample_value(
        "mascot_rpc_requests_total", {"component": "gateway", "rpc": rpc, "code": code}) or 0.0


async def test_a_round_cancelled_and_retried_after_a_newer_message_never_lands_after_it(tmp_path):
    async with _served(tmp_path, 0.0) as (stack, stub):
        conv = (await stub.StartConversation(cpb.StartConversationRequest(mode=cpb.MODE_SUPPORT))).conversation
        call = _send(stub, conv.id, "Message A.", "kA")
        async for r in call:  # cancel A after its first agent turn
            if r.event.HasField("turn_completed"):
                call.cancel()
                break
        b = await _until_admitted(stub, conv.id, "Message B.", "kB")
        assert b[-1].round_completed.reason == cpb.ROUND_END_REASON_COMPLETED
        again = await collect(_send(stub, conv.id, "Message A.", "kA"))  # the retry of A, after B
        assert again[0].round_started.replayed
        assert again[-1].round_completed.reason == cpb.ROUND_END_REASON_INTERRUPTED
        stored = (await stub.GetConversation(cpb.GetConversationRequest(conversation_id=conv.id))).conversation
        roles = ["u" if t.role == dpb.ROLE_USER else "a" for t in stored.turns]
        users = [t.text for t in stored.turns if t.role == dpb.ROLE_USER]
        assert users == ["Message A.", "Message B."]
        a_turns = again[-1].round_completed.agent_turns
        assert roles == ["u"] + ["a"] * a_turns + ["u", "a", "a", "a"], roles  # nothing of A after B
        assert a_turns >= 1
        rounds = {r: stack.metrics.registry.get_sample_value("mascot_rounds_total", {"mode": "support", "reason": r})
                  for r in ("completed", "cancelled", "failed")}
        assert rounds == {"completed": 1, "cancelled": 1, "failed": 0}  # each stream once; the replay not at all


async def test_the_same_key_with_another_text_while_its_round_runs_is_invalid_argument_at_once(tmp_path):
    async with _served(tmp_path, 0.05) as (stack, stub):
        conv_id = await _conversation(stub)
        call = await _started(stub, conv_id, "First text.", "k1")
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await collect(_send(stub, conv_id, "Another text.", "k1"))
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "different text" in err.value.details()
        with pytest.raises(grpc.aio.AioRpcError) as err:  # the same text: still running, retry later
            await collect(_send(stub, conv_id, "First text.", "k1"))
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        call.cancel()


async def test_cancelled_and_deadline_exceeded_streams_are_counted_with_their_codes(tmp_path):
    async with _served(tmp_path, 0.05) as (stack, stub):
        (await _started(stub, await _conversation(stub), "Hello.", "c1")).cancel()
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await collect(_send(stub, await _conversation(stub), "Hello again.", "c2", timeout=0.5))
        assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        rounds = stack.metrics.registry.get_sample_value
        for _ in range(200):  # the server records a call when its handler ends, a round when its finish has run
            if (_count(stack, "SendMessage", "CANCELLED") and _count(stack, "SendMessage", "DEADLINE_EXCEEDED")
                    and rounds("mascot_rounds_total", {"mode": "support", "reason": "cancelled"}) == 2):
                break
            await asyncio.sleep(0.05)
        assert _count(stack, "SendMessage", "CANCELLED") == 1
        assert _count(stack, "SendMessage", "DEADLINE_EXCEEDED") == 1
        assert _count(stack, "SendMessage", "OK") == 0
        assert stack.metrics.registry.get_sample_value("mascot_rounds_total",
                                                       {"mode": "support", "reason": "cancelled"}) == 2


async def test_a_client_that_stops_reading_cannot_hold_a_round_slot(tmp_path):
    """A stream whose client stops reading (a tiny HTTP/2 window, nothing read after RoundStarted) is ended after
    ``server.stream_stall_s`` and its slot freed, so the next caller's round runs (before: every slot stayed held)."""
    long_reply = "Tell me more about what happened next, and how it felt. " * 40
    eng = ScriptedEngine(lambda p: DIRECTOR, lambda p: long_reply)
    stack = await start_stack(make_config(tmp_path, server={"stream_stall_s": 1.0}, limits={"max_active_rounds": 1}),
                              ("gateway", "director", "speaker"), engine=eng)
    slow_ch = grpc.aio.insecure_channel(stack.target("gateway"), options=[
        ("grpc.http2.lookahead_bytes", 1024), ("grpc.http2.bdp_probe", 0)])
    ch = channel(stack.target("gateway"))
    slow, stub = cpb_grpc.ConversationServiceStub(slow_ch), cpb_grpc.ConversationServiceStub(ch)
    try:
        c1 = (await stub.StartConversation(cpb.StartConversationRequest(mode=cpb.MODE_SUPPORT))).conversation
        c2 = (await stub.StartConversation(cpb.StartConversationRequest(mode=cpb.MODE_SUPPORT))).conversation
        stalled = _send(slow, c1.id, "Hello.", "s1")
        first = await stalled.read()
        assert first.event.HasField("round_started")  # then this client reads nothing more
        active = stack.metrics.registry.get_sample_value
        for _ in range(200):
            if active("mascot_conversations_active", {"mode": "support"}) == 0:
                break
            await asyncio.sleep(0.05)
        assert active("mascot_conversations_active", {"mode": "support"}) == 0
        events = await collect(_send(stub, c2.id, "My turn now.", "s2"))  # the slot is free again
        assert events[-1].round_completed.reason == cpb.ROUND_END_REASON_COMPLETED
        assert _count(stack, "SendMessage", "UNAVAILABLE") == 1
        assert stack.metrics.registry.get_sample_value("mascot_rounds_total",
                                                       {"mode": "support", "reason": "failed"}) == 1
        stalled.cancel()
        # what the stalled round stored is kept: a retry with its key replays it and finishes it
        again = await collect(_send(stub, c1.id, "Hello.", "s1"))
        assert again[0].round_started.replayed and again[-1].HasField("round_completed")
    finally:
        await slow_ch.close()
        await ch.close()
        await stack.stop(0)


async def test_one_caller_cannot_take_every_round_slot_and_our_clients_wait_as_told(tmp_path):
    """``limits.max_rounds_per_caller``: a third concurrent round of one caller is refused before anything is
    stored (RESOURCE_EXHAUSTED with retry-after); :func:`mascot.app.runjob.admitted` waits as told and then runs it."""
    from mascot.app.runjob import admitted

    stack = await start_stack(make_config(tmp_path, limits={"max_active_rounds": 10, "max_rounds_per_caller": 2}),
                              ("gateway", "director", "speaker"), engine=SlowSpeaker(0.02))
    ch = channel(stack.target("gateway"))
    stub = cpb_grpc.ConversationServiceStub(ch)
    try:
        convs = [(await stub.StartConversation(cpb.StartConversationRequest(mode=cpb.MODE_SUPPORT))).conversation
                 for _ in range(3)]
        calls = [_send(stub, c.id, "Hello.", "p1") for c in convs[:2]]
        for call in calls:
            assert (await call.read()).event.HasField("round_started")
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await collect(_send(stub, convs[2].id, "Me too.", "p1"))
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "max_rounds_per_caller" in err.value.details()
        assert dict(err.value.trailing_metadata())["retry-after"] == "1"
        assert stack.store.count_turns(convs[2].id) == 0  # refused before anything was stored
        waited: list[float] = []

        async def sleep(s: float) -> None:
            waited.append(s)
            await asyncio.sleep(s)

        third = [r.event async for r in admitted(lambda: _send(stub, convs[2].id, "Me too.", "p1"), sleep=sleep)]
        assert third[-1].round_completed.reason == cpb.ROUND_END_REASON_COMPLETED and waited and waited[0] == 1.0
        for call in calls:
            call.cancel()
    finally:
        await ch.close()
        await stack.stop(0)
