"""Admission control: at 4x ``limits.max_active_rounds`` the excess is refused with
RESOURCE_EXHAUSTED (retry-after metadata) before anything is stored, the admitted rounds complete whole, a slot is
freed when a round ends or its caller goes away, and RunSelfPlay shares the same capacity.

The scripted engine holds every speaker reply at a gate, so exactly ``capacity`` rounds are in flight while the rest
are offered; no sleeps.
"""

from __future__ import annotations

import asyncio

import grpc
import pytest

from mascot.api.conversation.v1 import conversation_pb2 as cpb
from mascot.api.conversation.v1 import conversation_pb2_grpc as cpb_grpc
from mascot.api.dialogue.v1 import dialogue_pb2 as dpb
from mascot.core.server import channel
from mascot.gateway.servicer import ConversationServicer
from mascot.app.stack import start_stack
from tests.helpers.config import make_config
from tests.helpers.engine import ScriptedEngine
from tests.helpers.rpc import collect

pytestmark = pytest.mark.integration

DIRECTOR = "Agent: The Anchor\nAction: Hold steady.\nTone: Calm"
CAPACITY = 3


class Gated:
    """A scripted stack whose speaker replies wait for ``gate``; ``entered`` counts replies that reached it."""

    def __init__(self, stack, eng):
        self.stack, self.eng = stack, eng
        self.gate = asyncio.Event()
        self.entered = 0
        self.waiting = asyncio.Condition()
        self.ch = channel(stack.target("gateway"), stack.cfg.server.max_message_bytes)
        self.stub = cpb_grpc.ConversationServiceStub(self.ch)
        orig = eng.stream

        async def stream(request):
            if "You are the director" not in request.prompt:
                async with self.waiting:
                    self.entered += 1
                    self.waiting.notify_all()
                await self.gate.wait()
            async for item in orig(request):
                yield item

        eng.stream = stream

    async def until_entered(self, n: int) -> None:
        async with self.waiting:
            await self.waiting.wait_for(lambda: self.entered >= n)

    async def start(self) -> str:
        return (await self.stub.StartConversation(cpb.StartConversationRequest(mode=cpb.MODE_SUPPORT))).conversation.id

    async def send(self, conv_id: str, key: str = "k1", text: str = "I had a rough day.") -> list:
        return await collect(self.stub.SendMessage(cpb.SendMessageRequest(conversation_id=conv_id, text=text,
                                                                          idempotency_key=key)))

    async def turns(self, conv_id: str) -> list:
        return list((await self.stub.GetConversation(cpb.GetConversationRequest(
            conversation_id=conv_id))).conversation.turns)

    def refused_count(self, rpc: str = "SendMessage") -> float:
        return self.stack.metrics.registry.get_sample_value(
            "mascot_rpc_requests_total", {"component": "gateway", "rpc": rpc, "code": "RESOURCE_EXHAUSTED"}) or 0.0


@pytest.fixture
async def gated(tmp_path):
    eng = ScriptedEngine(lambda p: DIRECTOR, lambda p: "I'm here with you.")
    stack = await start_stack(make_config(tmp_path, limits={"max_active_rounds": CAPACITY}), engine=eng)
    g = Gated(stack, eng)
    yield g
    g.gate.set()
    await g.ch.close()
    await stack.stop(0)


async def outcome(coro):
    """``("ok", events)`` or ``(status code, error)``."""
    try:
        return "ok", await coro
    except grpc.aio.AioRpcError as e:
        return e.code(), e


def assert_whole_or_nothing(turns: list, events: list | None) -> None:
    """Refused (``events`` None): nothing stored. Admitted: the user turn and exactly the acknowledged agent turns."""
    if events is None:
        assert turns == []
        return
    acked = [e.turn_completed.turn for e in events if e.HasField("turn_completed")]
    assert events[-1].round_completed.agent_turns == len(acked) == 3
    assert [t.role for t in turns] == [dpb.ROLE_USER] + [dpb.ROLE_AGENT] * 3
    assert [t.text for t in turns[1:]] == [t.text for t in acked]


async def test_four_times_capacity_refuses_the_excess_and_stores_nothing_half(gated):
    offered = 4 * CAPACITY
    convs = [await gated.start() for _ in range(offered)]
    tasks = [asyncio.create_task(outcome(gated.send(c))) for c in convs]
    await gated.until_entered(CAPACITY)  # the admitted rounds are in their first reply, held at the gate
    # the excess comes back refused while the admitted rounds are still held (a leak would hang here: 30 s, fail)
    while sum(t.done() for t in tasks) < offered - CAPACITY:
        done, _ = await asyncio.wait([t for t in tasks if not t.done()], timeout=30,
                                     return_when=asyncio.FIRST_COMPLETED)
        assert done, "the excess rounds were not refused"
    assert sum(t.done() for t in tasks) == offered - CAPACITY and gated.entered == CAPACITY
    gated.gate.set()
    results = [await t for t in tasks]
    codes = [r[0] for r in results]
    assert codes.count("ok") == CAPACITY
    assert codes.count(grpc.StatusCode.RESOURCE_EXHAUSTED) == offered - CAPACITY
    for code, err in results:
        if code != "ok":
            assert "retry later" in err.details()
            assert ("retry-after", "1") in tuple(err.trailing_metadata() or ())  # the overload mark clients retry on
    for conv, (code, res) in zip(convs, results):
        assert_whole_or_nothing(await gated.turns(conv), res if code == "ok" else None)
    assert gated.refused_count() == offered - CAPACITY  # counted by the boundary in mascot_rpc_requests_total
    # capacity is free again: the refused conversations are served, a retry with the same key stores the round once
    retried = [c for c, (code, _) in zip(convs, results) if code != "ok"][:CAPACITY]
    again = await asyncio.gather(*(gated.send(c) for c in retried))
    for conv, events in zip(retried, again):
        assert not events[0].round_started.replayed
        assert_whole_or_nothing(await gated.turns(conv), events)


async def test_self_play_shares_the_capacity(gated):
    convs = [await gated.start() for _ in range(CAPACITY + 1)]
    user = dpb.UserSimulation(situation="A hard week.", emotion="sad")
    plays = [asyncio.create_task(outcome(collect(gated.stub.RunSelfPlay(cpb.RunSelfPlayRequest(
        conversation_id=c, opening_text="Hi.", agent_turns=1, user=user))))) for c in convs[:CAPACITY]]
    await gated.until_entered(CAPACITY)
    code, err = await outcome(gated.send(convs[-1]))
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert await gated.turns(convs[-1]) == []
    code, err = await outcome(collect(gated.stub.RunSelfPlay(cpb.RunSelfPlayRequest(
        conversation_id=convs[-1], opening_text="Hi.", agent_turns=1, user=user))))
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and gated.refused_count("RunSelfPlay") == 1
    assert await gated.turns(convs[-1]) == []
    gated.gate.set()
    assert [r[0] for r in await asyncio.gather(*plays)] == ["ok"] * CAPACITY
    assert (await gated.send(convs[-1]))[-1].HasField("round_completed")


async def test_a_cancelled_round_frees_its_slot(gated, monkeypatch):
    released = asyncio.Event()
    orig = ConversationServicer._release

    def release(self, *args):
        orig(self, *args)
        released.set()

    monkeypatch.setattr(ConversationServicer, "_release", release)
    convs = [await gated.start() for _ in range(CAPACITY + 1)]
    calls = [gated.stub.SendMessage(cpb.SendMessageRequest(conversation_id=c, text="hello", idempotency_key="k1"))
             for c in convs[:CAPACITY]]
    async def read(call):
        try:
            return await outcome(collect(call))
        except asyncio.CancelledError:  # what reading a call the client cancelled raises
            return "cancelled", None

    readers = [asyncio.create_task(read(c)) for c in calls]
    await gated.until_entered(CAPACITY)
    code, _ = await outcome(gated.send(convs[-1]))
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
    calls[0].cancel()  # the client goes away mid-round
    await asyncio.wait_for(released.wait(), 30)
    assert (await readers[0])[0] in ("cancelled", grpc.StatusCode.CANCELLED)
    gated.gate.set()  # with the slot back, the waiting conversation is served
    assert (await gated.send(convs[-1]))[-1].round_completed.agent_turns == 3
    assert [r[0] for r in await asyncio.gather(*readers[1:])] == ["ok"] * (CAPACITY - 1)
    # the cancelled round resumes with its idempotency key: its turns are stored once, the round ends whole
    events = await gated.send(convs[0], text="hello")
    assert events[0].round_started.replayed
    turns = await gated.turns(convs[0])
    assert [t.role for t in turns] == [dpb.ROLE_USER] + [dpb.ROLE_AGENT] * 3


async def test_refusals_do_not_leak_capacity(gated):
    """Many refused and invalid calls leave the counter where it was: ``capacity`` rounds still fit afterwards."""
    convs = [await gated.start() for _ in range(CAPACITY + 1)]
    for _ in range(5):
        code, _ = await outcome(gated.send("no-such-conversation"))
        assert code == grpc.StatusCode.NOT_FOUND
    busy = asyncio.create_task(outcome(gated.send(convs[0])))
    await gated.until_entered(1)
    for _ in range(3):  # a second message while the conversation's round runs
        code, _ = await outcome(gated.send(convs[0], key="k2"))
        assert code == grpc.StatusCode.FAILED_PRECONDITION
    gated.gate.set()
    assert (await busy)[0] == "ok"
    results = await asyncio.gather(*(outcome(gated.send(c)) for c in convs[1:]))
    assert [r[0] for r in results] == ["ok"] * CAPACITY
