"""Storage that goes away while the gateway serves: a SQLite file deleted or replaced, a PostgreSQL server stopped.

SQLite keeps writing to a file that was unlinked, so without a check every turn acknowledged after the delete was
lost at the next restart while health said SERVING. The gateway must refuse every call that would store something
(UNAVAILABLE, a message an operator can act on), turn its health NOT_SERVING, and never acknowledge what it did not
store where a restart will find it."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sqlite3

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from mascot.api.conversation.v1 import conversation_pb2 as cpb
from mascot.api.conversation.v1 import conversation_pb2_grpc as cpb_grpc
from mascot.api.dialogue.v1 import dialogue_pb2 as dpb
from mascot.core.server import channel
from mascot.gateway.store import Store, StoreUnavailable, sqlite_file
from mascot.app.stack import start_stack
from tests.helpers.config import make_config
from tests.helpers.engine import ScriptedEngine
from tests.helpers.rpc import collect

pytestmark = [pytest.mark.integration]
DIRECTOR = "Agent: The Catalyst\nAction: Ask one question.\nTone: Curious"


def _engine() -> ScriptedEngine:
    return ScriptedEngine(lambda p: DIRECTOR, lambda p: "What would help you most right now?")


async def _health(ch) -> int:
    return (await health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=5)).status


async def _wait_health(ch, status: int, within_s: float = 5.0) -> None:
    for _ in range(int(within_s / 0.05)):
        if await _health(ch) == status:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"health did not become {status} within {within_s} s (it is {await _health(ch)})")


def _stored_ids(db) -> set[str]:
    """Conversation ids a restarted gateway would find in ``db``."""
    store = Store(f"sqlite:///{db}")
    try:
        with store.session() as s:
            from sqlalchemy import select

            from mascot.gateway.store import ConversationRow
            return set(s.scalars(select(ConversationRow.id)))
    finally:
        store.close()


@pytest.mark.parametrize("how", ["deleted", "replaced"])
async def test_a_sqlite_file_that_goes_away_makes_the_gateway_refuse_writes_and_report_not_serving(tmp_path, how):
    db = tmp_path / "store.db"
    cfg = make_config(tmp_path, store={"url": f"sqlite:///{db}", "health_poll_s": 0.1})
    stack = await start_stack(cfg, ("gateway", "director", "speaker"), engine=_engine())
    ch = channel(stack.target("gateway"))
    stub = cpb_grpc.ConversationServiceStub(ch)
    try:
        assert await _health(ch) == health_pb2.HealthCheckResponse.SERVING
        before = (await stub.StartConversation(cpb.StartConversationRequest(mode=cpb.MODE_SUPPORT))).conversation
        await collect(stub.SendMessage(cpb.SendMessageRequest(conversation_id=before.id, text="Hello.",
                                                              idempotency_key="k1")))
        if how == "deleted":
            for suffix in ("", "-wal", "-shm"):
                if os.path.exists(f"{db}{suffix}"):
                    os.unlink(f"{db}{suffix}")
        else:  # another database renamed over the file, as a careless restore would
            other = tmp_path / "other.db"
            sqlite3.connect(other).close()
            os.replace(other, db)
        acknowledged = []
        with pytest.raises(grpc.aio.AioRpcError) as err:
            acknowledged.append(await stub.StartConversation(cpb.StartConversationRequest(mode=cpb.MODE_SUPPORT)))
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE, err.value.details()
        assert f"was {how}" in err.value.details() and "restart the gateway" in err.value.details()
        assert "store.db" not in err.value.details()  # a server path is the operator's business, not the caller's
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await collect(stub.SendMessage(cpb.SendMessageRequest(conversation_id=before.id, text="Still there?",
                                                                  idempotency_key="k2")))
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE, err.value.details()
        await _wait_health(ch, health_pb2.HealthCheckResponse.NOT_SERVING)
        assert not acknowledged
        # What a restarted gateway finds is what was acknowledged after the loss: nothing, not a turn it dropped.
        if how == "replaced":
            assert _stored_ids(db) == set()
    finally:
        await ch.close()
        await stack.stop(0)


def test_the_store_refuses_every_transaction_once_its_file_is_gone_and_check_says_why(tmp_path):
    db = tmp_path / "s.db"
    store = Store(f"sqlite:///{db}")
    try:
        store.create_conversation("c1", "support", ["anchor"], "", [])
        store.check()  # the file it opened: fine
        os.unlink(db)
        with pytest.raises(StoreUnavailable, match="deleted"):
            store.check()
        with pytest.raises(StoreUnavailable, match="deleted"):
            store.create_conversation("c2", "support", ["anchor"], "", [])
        with pytest.raises(StoreUnavailable):
            store.get_conversation("c1")  # a read of the unlinked file would answer from data a restart loses
        assert not db.exists()  # the refused write did not create a fresh file either
    finally:
        store.close()


def test_sqlite_file_reads_urls():
    assert sqlite_file("sqlite:///runs/x.db") == sqlite_file("sqlite:///runs/x.db?timeout=5")
    assert str(sqlite_file("sqlite:////abs/x.db")) == "/abs/x.db"
    assert sqlite_file("sqlite://") is None and sqlite_file("sqlite:///:memory:") is None
    assert sqlite_file("postgresql+psycopg://u@h/db") is None


async def test_a_stopped_postgresql_turns_health_not_serving_and_back_when_it_returns(tmp_path, postgres_server):
    cfg = make_config(tmp_path, store={"url": postgres_server.url, "health_poll_s": 0.1})
    stack = await start_stack(cfg, ("gateway", "director", "speaker"), engine=_engine())
    ch = channel(stack.target("gateway"))
    try:
        assert await _health(ch) == health_pb2.HealthCheckResponse.SERVING
        await asyncio.to_thread(postgres_server.stop)
        try:
            await _wait_health(ch, health_pb2.HealthCheckResponse.NOT_SERVING, within_s=10)
        finally:
            await asyncio.to_thread(postgres_server.start)
        await _wait_health(ch, health_pb2.HealthCheckResponse.SERVING, within_s=20)
        conv = await cpb_grpc.ConversationServiceStub(ch).StartConversation(
            cpb.StartConversationRequest(mode=cpb.MODE_SUPPORT))
        assert conv.conversation.id
    finally:
        await ch.close()
        await stack.stop(0)


async def test_a_full_disk_is_resource_exhausted_with_a_message_that_says_so(tmp_path):
    from sqlalchemy import event

    db = tmp_path / "store.db"
    stack = await start_stack(make_config(tmp_path, store={"url": f"sqlite:///{db}"}),
                              ("gateway", "director", "speaker"), engine=_engine())
    ch = channel(stack.target("gateway"))
    stub = cpb_grpc.ConversationServiceStub(ch)
    try:
        conv = (await stub.StartConversation(cpb.StartConversationRequest(mode=cpb.MODE_SUPPORT))).conversation
        with sqlite3.connect(db) as c:
            pages = c.execute("PRAGMA page_count").fetchone()[0]

        def full(conn, _rec):  # SQLite's own "database or disk is full" once the file would grow
            conn.execute(f"PRAGMA max_page_count={pages}")
        event.listen(stack.store.engine, "connect", full)
        stack.store.engine.dispose()
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await collect(stub.SendMessage(cpb.SendMessageRequest(conversation_id=conv.id, text="x " * 1990,
                                                                  idempotency_key="big")))
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, err.value.details()
        assert "disk is full" in err.value.details() and "unreachable" not in err.value.details()
        assert dict(err.value.trailing_metadata()).get("retry-after")
        sample = stack.metrics.registry.get_sample_value(
            "mascot_rpc_requests_total", {"component": "gateway", "rpc": "SendMessage", "code": "RESOURCE_EXHAUSTED"})
        assert sample == 1
    finally:
        await ch.close()
        await stack.stop(0)


class _FullAfterTheMessage:
    """SQLite's own "database or disk is full" from the first speaker call on: the user turn (and the round) are
    committed before any model runs, so the first write that fails is the first agent turn's. ``free()`` gives the
    space back. The reply is longer than a page, so storing it needs a page the database may not grow by."""

    REPLY = " ".join(f"word{i}" for i in range(1200))  # ~10 kB

    def __init__(self, db) -> None:
        self.db, self.store, self.armed = db, None, False

    def engine(self) -> ScriptedEngine:
        return ScriptedEngine(lambda p: DIRECTOR, self._speak)

    def _limit(self, conn, _rec) -> None:
        conn.execute(f"PRAGMA max_page_count={self.pages}")

    def _speak(self, _prompt: str) -> str:
        if not self.armed:
            self.armed = True
            with sqlite3.connect(self.db) as c:
                self.pages = c.execute("PRAGMA page_count").fetchone()[0]
            from sqlalchemy import event

            event.listen(self.store.engine, "connect", self._limit)
            self.store.engine.dispose()  # pooled connections reopen with the limit
        return self.REPLY

    def free(self) -> None:
        from sqlalchemy import event

        event.remove(self.store.engine, "connect", self._limit)
        self.store.engine.dispose()


@contextlib.asynccontextmanager
async def _full_disk_stack(tmp_path):
    """A gateway, director and speaker on a SQLite store whose disk fills up after the user's message is stored:
    yields ``(full, stack, ConversationService stub)``."""
    db = tmp_path / "store.db"
    full = _FullAfterTheMessage(db)
    stack = await start_stack(make_config(tmp_path, store={"url": f"sqlite:///{db}"}, guard={"enabled": False}),
                              ("gateway", "director", "speaker"), engine=full.engine())
    full.store = stack.store
    ch = channel(stack.target("gateway"))
    try:
        yield full, stack, cpb_grpc.ConversationServiceStub(ch)
    finally:
        await ch.close()
        await stack.stop(0)


async def test_a_full_disk_after_the_message_was_stored_says_what_was_stored(tmp_path):
    """Found by a reviewer: the disk-full status said "nothing was stored" although the user's message was. The
    message now says the message is stored, which turn was not, and that a retry with the same key finishes the
    round; the store holds exactly that, and the retry after space is freed finishes the round without duplicates."""
    async with _full_disk_stack(tmp_path) as (full, stack, stub):
        conv = (await stub.StartConversation(cpb.StartConversationRequest(mode=cpb.MODE_SUPPORT))).conversation
        req = cpb.SendMessageRequest(conversation_id=conv.id, text="I failed my driving test again.",
                                     idempotency_key="k1")
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await collect(stub.SendMessage(req))
        details = err.value.details()
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, details
        assert dict(err.value.trailing_metadata()).get("retry-after") == "60"
        assert "nothing" not in details, details
        assert ("disk is full: your message is stored (turn 0); turn 1, the one in progress, and the rest of the "
                "round were not stored" in details), details
        assert "retry with the same idempotency_key" in details, details
        # exactly that is stored: the message, its round still open for the retry, no agent turn
        _, turns = stack.store.get_conversation(conv.id)
        assert [(t.role, t.text) for t in turns] == [("user", "I failed my driving test again.")]
        assert stack.store.get_round(conv.id, "k1").state == "running"

        full.free()
        events = await collect(stub.SendMessage(req))
        assert events[0].round_started.replayed and events[-1].round_completed.agent_turns == 3
        _, turns = stack.store.get_conversation(conv.id)
        assert [t.role for t in turns] == ["user", "agent", "agent", "agent"]


async def test_a_full_disk_mid_self_play_says_what_was_stored_and_closes_the_run(tmp_path):
    async with _full_disk_stack(tmp_path) as (full, stack, stub):
        conv = (await stub.StartConversation(cpb.StartConversationRequest(mode=cpb.MODE_SUPPORT))).conversation
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await collect(stub.RunSelfPlay(cpb.RunSelfPlayRequest(
                conversation_id=conv.id, opening_text="My dog is sick.", agent_turns=2,
                user=dpb.UserSimulation(situation="Someone whose old dog is ill."))))
        details = err.value.details()
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, details
        assert "the self-play opening is stored (turn 0)" in details and "turn 1, the one in progress" in details
        assert "self-play cannot be resumed: the run is closed as interrupted" in details, details
        _, turns = stack.store.get_conversation(conv.id)
        assert [t.role for t in turns] == ["user"]
        rnd = stack.store.get_round(conv.id, "selfplay")
        assert (rnd.state, rnd.reason, rnd.closed_by) == ("done", "interrupted", "stream")
