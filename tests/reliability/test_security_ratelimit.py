"""Per-caller rate limits: a token bucket per caller id (or per peer address
without caller tokens) on StartConversation, SendMessage and RunSelfPlay; over it RESOURCE_EXHAUSTED with a
``retry-after`` hint, and nothing stored for the refused call."""

from __future__ import annotations

import grpc
import pytest
from sqlalchemy import text

from mascot.api.conversation.v1 import conversation_pb2 as cpb
from mascot.api.conversation.v1 import conversation_pb2_grpc as cpb_grpc
from mascot.api.dialogue.v1 import dialogue_pb2 as dpb
from mascot.core.server import channel
from mascot.gateway.security import RateLimited, RateLimiter
from mascot.app.stack import start_stack
from tests.helpers.config import make_config
from tests.helpers.engine import ScriptedEngine
from tests.helpers.rpc import collect

DIRECTOR = "Agent: The Anchor\nAction: Comfort the user.\nTone: Warm"
ALICE, BOB = "alice-token-0123456789abcdef", "bob-token-0123456789abcdef"


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_token_bucket_refills_at_the_configured_rate():
    clock = Clock()
    lim = RateLimiter(per_minute=60, burst=3, clock=clock)  # one call per second, bursts of 3
    for _ in range(3):
        lim.take("a")
    with pytest.raises(RateLimited) as e:
        lim.take("a")
    assert e.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED and e.value.retry_after_s == pytest.approx(1.0)
    lim.take("b")  # another caller has its own bucket
    clock.t += 0.5
    with pytest.raises(RateLimited) as e:
        lim.take("a")
    assert e.value.retry_after_s == pytest.approx(0.5)
    clock.t += 0.5
    lim.take("a")  # refilled
    clock.t += 100
    for _ in range(3):  # the bucket holds at most `burst`
        lim.take("a")
    with pytest.raises(RateLimited):
        lim.take("a")
    assert not RateLimiter(0, 1).enabled
    RateLimiter(0, 1).take("a")  # off: never refuses


def test_buckets_are_bounded():
    clock = Clock()
    lim = RateLimiter(per_minute=1, burst=1, max_keys=2, clock=clock)
    lim.take("a")
    lim.take("b")
    lim.take("c")  # drops the least recently used bucket ("a"), which starts full again
    lim.take("a")
    assert len(lim._buckets) == 2


def counts(stack) -> tuple[int, int, int]:
    with stack.store.engine.connect() as c:
        return tuple(c.execute(text(f"SELECT count(*) FROM {t}")).scalar()
                     for t in ("conversations", "turns", "rounds"))


@pytest.mark.integration
async def test_over_the_limit_is_resource_exhausted_with_retry_after_and_stores_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("MASCOT_CALLER_TOKENS", f"alice={ALICE},bob={BOB}")
    cfg = make_config(tmp_path, security={"caller_auth": True, "rate_limit_per_minute": 0.5, "rate_limit_burst": 2})
    stack = await start_stack(cfg, engine=ScriptedEngine(lambda p: DIRECTOR, lambda p: "I hear you."))
    try:
        async with channel(stack.target("gateway"), token="") as ch:
            stub = cpb_grpc.ConversationServiceStub(ch)
            alice, bob = (("authorization", f"Bearer {ALICE}"),), (("authorization", f"Bearer {BOB}"),)
            conv = (await stub.StartConversation(cpb.StartConversationRequest(mode=cpb.MODE_SUPPORT),
                                                 metadata=alice)).conversation
            await collect(stub.SendMessage(cpb.SendMessageRequest(conversation_id=conv.id, text="hello",
                                                                  idempotency_key="k1"), metadata=alice))
            before = counts(stack)
            refused = [stub.StartConversation(cpb.StartConversationRequest(mode=cpb.MODE_SUPPORT), metadata=alice),
                       stub.SendMessage(cpb.SendMessageRequest(conversation_id=conv.id, text="again",
                                                               idempotency_key="k2"), metadata=alice),
                       stub.RunSelfPlay(cpb.RunSelfPlayRequest(conversation_id=conv.id, opening_text="hi",
                                                               user=dpb.UserSimulation(situation="s")),
                                        metadata=alice)]
            for call in refused:
                with pytest.raises(grpc.aio.AioRpcError) as e:
                    if hasattr(call, "__aiter__"):
                        [x async for x in call]
                    else:
                        await call
                assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                assert "rate limit" in e.value.details() and "retry in" in e.value.details()
                retry = dict(e.value.trailing_metadata() or ())["retry-after"]
                assert int(retry) >= 60  # 0.5 calls a minute: the next one in about two minutes
            assert counts(stack) == before  # nothing stored for a refused call
            # reads are not limited, and another caller has its own bucket
            assert len((await stub.GetConversation(cpb.GetConversationRequest(conversation_id=conv.id),
                                                   metadata=alice)).conversation.turns) == 4
            await stub.StartConversation(cpb.StartConversationRequest(mode=cpb.MODE_SUPPORT), metadata=bob)
    finally:
        await stack.stop(0)


@pytest.mark.integration
async def test_without_caller_tokens_the_limit_is_per_peer_address(tmp_path):
    cfg = make_config(tmp_path, security={"rate_limit_per_minute": 1, "rate_limit_burst": 1})
    stack = await start_stack(cfg, engine=ScriptedEngine(lambda p: DIRECTOR, lambda p: "I hear you."))
    try:
        async with channel(stack.target("gateway"), token="") as one, channel(stack.target("gateway"), token="") as two:
            await cpb_grpc.ConversationServiceStub(one).StartConversation(
                cpb.StartConversationRequest(mode=cpb.MODE_SUPPORT))
            with pytest.raises(grpc.aio.AioRpcError) as e:  # another connection from the same address shares it
                await cpb_grpc.ConversationServiceStub(two).StartConversation(
                    cpb.StartConversationRequest(mode=cpb.MODE_SUPPORT))
            assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert counts(stack)[0] == 1
    finally:
        await stack.stop(0)
