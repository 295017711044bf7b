"""Request size and count limits of the public API, and the per-caller limit of new conversations, through the real
gateway on 127.0.0.1 with the tiny model.

- A request over ``server.max_request_bytes`` (1 MiB) is refused by gRPC before it is parsed.
- Counts (context entries, persona ids) and lengths are checked before any per-entry work; a refused request is
  freed at once, not at a later garbage collection, and a client that sends such requests back to back does not
  hold up another client's round.
- A caller may start ``security.conversations_per_minute`` conversations a minute (bursts of
  ``security.conversations_burst``), on by default; one more is RESOURCE_EXHAUSTED with ``retry-after``.
"""

from __future__ import annotations

import asyncio
import gc
import time

import grpc
import psutil
import pytest
import pytest_asyncio
from sqlalchemy import func, select

from mascot.api.conversation.v1 import conversation_pb2 as cpb
from mascot.api.conversation.v1 import conversation_pb2_grpc as cpb_grpc
from mascot.api.dialogue.v1 import dialogue_pb2 as dpb
from mascot.app.stack import start_stack
from mascot.core.config import DialogueConfig, SecurityConfig, ServerConfig
from mascot.core.server import channel
from mascot.gateway.store import ConversationRow
from tests.helpers.config import make_config
from tests.helpers.engine import ScriptedEngine
from tests.helpers.rpc import code_of, collect
from tests.helpers.wire import field as wire_field, varint

pytestmark = [pytest.mark.integration, pytest.mark.serial, pytest.mark.asyncio(loop_scope="module")]

SERVICE = "/mascot.api.conversation.v1.ConversationService"
LIMIT = ServerConfig().max_request_bytes  # server.max_request_bytes (the default)
MiB = 1024 * 1024


def empty_entries(field: str, size: int) -> bytes:
    """A StartConversation (support mode) of about ``size`` bytes: countless empty entries of the repeated ``field``
    (``context`` or ``persona_ids``), two bytes each."""
    number = cpb.StartConversationRequest.DESCRIPTOR.fields_by_name[field].number
    return varint(1 << 3) + varint(cpb.MODE_SUPPORT) + wire_field(number, b"") * (size // 2)


class Client:
    """The module's stack; ``stub`` on the project's channel, ``raw`` calls send bytes as they are (no send limit)."""

    def __init__(self, stack) -> None:
        self.stack = stack
        self.ch = channel(stack.target("gateway"), stack.cfg.server.max_message_bytes, token="")
        self.stub = cpb_grpc.ConversationServiceStub(self.ch)
        self.raw_ch = grpc.aio.insecure_channel(stack.target("gateway"))

    def raw(self, method: str, kind: str = "unary_unary"):
        return getattr(self.raw_ch, kind)(f"{SERVICE}/{method}", request_serializer=lambda b: b,
                                          response_deserializer=lambda b: b)

    def conversations(self) -> int:
        with self.stack.store.session() as s:
            return int(s.scalar(select(func.count()).select_from(ConversationRow)))

    async def round_s(self, text: str, key: str) -> float:
        """Seconds of one whole round (SendMessage on a new conversation) with the tiny model."""
        conv = (await self.stub.StartConversation(cpb.StartConversationRequest(mode=cpb.MODE_SUPPORT))).conversation
        t0 = time.perf_counter()
        events = await collect(self.stub.SendMessage(cpb.SendMessageRequest(conversation_id=conv.id, text=text,
                                                                            idempotency_key=key)))
        assert events[-1].HasField("round_completed")
        return time.perf_counter() - t0


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def c(tmp_path_factory, engine):
    cfg = make_config(tmp_path_factory.mktemp("limits"), dialogue={"agent_turns_per_round": 1})
    stack = await start_stack(cfg, engine=engine)
    client = Client(stack)
    yield client
    await client.ch.close()
    await client.raw_ch.close()
    await stack.stop(0)


async def test_a_request_over_max_request_bytes_is_refused_by_grpc_before_it_is_parsed(c):
    before = c.conversations()
    for method, kind, body in [
        ("StartConversation", "unary_unary", empty_entries("context", 16 * MiB)),
        ("SendMessage", "unary_stream", cpb.SendMessageRequest(conversation_id="x", text="w" * (2 * MiB),
                                                               idempotency_key="k").SerializeToString())]:
        code, details = await code_of(c.raw(method, kind)(body))
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED, details
        assert "larger than max" in details and f"vs. {LIMIT})" in details
    assert c.conversations() == before


async def test_the_largest_valid_context_is_accepted_and_one_more_character_is_refused(c):
    entries = DialogueConfig().max_context_entries
    per = DialogueConfig().max_context_chars // entries
    ctx = [dpb.ContextUtterance(speaker="", content="😊" * per) for _ in range(entries)]  # 4 bytes a character
    req = cpb.StartConversationRequest(mode=cpb.MODE_SUPPORT, context=ctx)
    assert 4 * DialogueConfig().max_context_chars < req.ByteSize() <= LIMIT
    conv = (await c.stub.StartConversation(req)).conversation
    assert len(conv.context) == entries and conv.context[-1].content == "😊" * per
    ctx[-1].speaker = "A"
    code, details = await code_of(c.stub.StartConversation(cpb.StartConversationRequest(mode=cpb.MODE_SUPPORT,
                                                                                          context=ctx)))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "(dialogue.max_context_chars)" in details, details


def _oversized(c: Client, conv_id: str, i: int):
    """The ``i``-th of four requests just under ``server.max_request_bytes`` that the gateway must refuse: countless
    empty context entries or persona ids, a text or a situation far over ``dialogue.max_message_chars``."""
    big = LIMIT - 1024
    return [
        lambda: c.raw("StartConversation")(empty_entries("context", big)),
        lambda: c.raw("StartConversation")(empty_entries("persona_ids", big)),
        lambda: collect(c.stub.SendMessage(cpb.SendMessageRequest(conversation_id=conv_id, text=" " * big,
                                                                  idempotency_key="big"))),
        lambda: collect(c.stub.RunSelfPlay(cpb.RunSelfPlayRequest(
            conversation_id=conv_id, opening_text="hi", user=dpb.UserSimulation(situation=" " * big)))),
    ][i % 4]()


EXPECTED = ["(dialogue.max_context_entries)", "persona_ids has", "(dialogue.max_message_chars)",
            "(dialogue.max_message_chars)"]


async def test_refused_requests_are_freed_at_once(c):
    """Ten requests just under the gRPC limit, each refused by a count or length check: the memory they took comes
    back at once (automatic garbage collection is off meanwhile, so nothing waits for a later collection)."""
    conv = (await c.stub.StartConversation(cpb.StartConversationRequest(mode=cpb.MODE_SUPPORT))).conversation
    before = c.conversations()
    proc = psutil.Process()
    for i in range(4):  # warm up: the allocator's first arenas, the channel's buffers
        await code_of(_oversized(c, conv.id, i))
    gc.collect()
    gc.disable()
    try:
        rss0 = proc.memory_info().rss
        got = [await code_of(_oversized(c, conv.id, i)) for i in range(10)]
        grown = (proc.memory_info().rss - rss0) / MiB
    finally:
        gc.enable()
    assert grown < 40, f"the process grew by {grown:.0f} MiB over 10 refused requests"
    for i, (code, details) in enumerate(got):
        assert code == grpc.StatusCode.INVALID_ARGUMENT and EXPECTED[i % 4] in details, details
    assert c.conversations() == before


async def test_a_round_answers_promptly_while_another_client_floods_oversized_requests(c):
    base = await c.round_s("I had a long day.", "base")
    conv = (await c.stub.StartConversation(cpb.StartConversationRequest(mode=cpb.MODE_SUPPORT))).conversation
    flood = empty_entries("context", 15 * MiB)  # as big as the default gRPC limit once let through
    sent = {"n": 0}
    stop = asyncio.Event()

    async def flooder() -> None:
        i = 0
        while not stop.is_set() and sent["n"] < 16:
            call = c.raw("StartConversation")(flood) if i % 2 == 0 else _oversized(c, conv.id, i // 2)
            await code_of(call)
            sent["n"] += 1
            i += 1

    task = asyncio.create_task(flooder())
    try:
        while sent["n"] < 2:  # the flood is under way
            await asyncio.sleep(0.01)
        took = await c.round_s("I had a long day.", "flooded")
    finally:
        stop.set()
        await task
    assert took < 2 * base + 1.5, f"a round took {took:.1f} s during the flood ({base:.1f} s without)"


async def test_a_caller_over_the_default_limit_of_new_conversations_gets_resource_exhausted(tmp_path, monkeypatch,
                                                                                         engine):
    alice, bob = "alice-token-0123456789abcdef", "bob-token-0123456789abcdef"
    monkeypatch.setenv("MASCOT_CALLER_TOKENS", f"alice={alice},bob={bob}")
    sec = SecurityConfig()
    assert sec.conversations_per_minute == 30 and sec.conversations_burst == 60  # on by default
    stack = await start_stack(make_config(tmp_path, security={"caller_auth": True}), engine=engine)
    try:
        async with channel(stack.target("gateway"), token="") as ch:
            stub = cpb_grpc.ConversationServiceStub(ch)

            def start(token: str):
                return stub.StartConversation(cpb.StartConversationRequest(mode=cpb.MODE_SUPPORT),
                                              metadata=(("authorization", f"Bearer {token}"),))

            t0, started = time.perf_counter(), 0
            with pytest.raises(grpc.aio.AioRpcError) as e:
                for _ in range(sec.conversations_burst + 30):
                    await start(alice)
                    started += 1
            refill = (time.perf_counter() - t0) * sec.conversations_per_minute / 60  # while the burst was spent
            assert sec.conversations_burst <= started <= sec.conversations_burst + refill + 1
            assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            details = e.value.details()
            assert "at most 30 new conversations per minute (bursts of 60) per caller" in details, details
            assert "(security.conversations_per_minute, security.conversations_burst); retry in" in details
            assert dict(e.value.trailing_metadata() or ())["retry-after"] in ("1", "2")  # a conversation every 2 s
            await start(bob)  # another caller has its own
        with stack.store.session() as s:
            assert s.scalar(select(func.count()).select_from(ConversationRow)) == started + 1
    finally:
        await stack.stop(0)


async def test_run_job_waits_out_the_limit_of_new_conversations(tmp_path):
    """``mascot run`` against a gateway that limits new conversations: a refused StartConversation is made again
    after the ``retry-after`` wait, so every conversation completes."""
    from mascot.app.runjob import run_job
    from mascot.core.situations import Situation

    cfg = make_config(tmp_path, security={"conversations_per_minute": 60, "conversations_burst": 1},
                      selfplay={"agent_turns": 1})
    eng = ScriptedEngine(lambda p: "Agent: The Anchor\nAction: Listen.\nTone: Calm", lambda p: "I hear you.")
    stack = await start_stack(cfg, engine=eng)
    try:
        sits = [Situation(id=f"s{i}", split="", opening="Hello there.", situation="A long week.") for i in range(3)]
        t0 = time.perf_counter()
        summary = await run_job(stack.target("gateway"), sits, "support", tmp_path / "out", agent_turns=1,
                                concurrency=3)
        assert summary["failed"] == [] and time.perf_counter() - t0 >= 0.9  # at least one wait of about a second
    finally:
        await stack.stop(0)
