"""Erasure: DeleteConversation removes every row of the conversation in every
table (turns, rounds, safety events, ...) and nothing of any other; conversations inactive for
``security.retention_days`` are deleted by the gateway's sweep (an injected clock, and the periodic task); migration
0003 (owner column) upgrades an existing database and downgrades."""

from __future__ import annotations

import asyncio
import datetime as dt

import grpc
import pytest
from sqlalchemy import text

from mascot.api.conversation.v1 import conversation_pb2 as cpb
from mascot.api.conversation.v1 import conversation_pb2_grpc as cpb_grpc
from mascot.core.config import MascotConfig
from mascot.core.db import create_engine
from mascot.core.server import channel
from mascot.gateway.security import sweep_retention
from mascot.gateway.store import Base, NewTurn, SafetyEvent, Store
from mascot.app.stack import start_stack
from tests.helpers.config import make_config
from tests.helpers.engine import ScriptedEngine
from tests.helpers.migrations import alembic
from tests.helpers.rpc import collect

DIRECTOR = "Agent: The Anchor\nAction: Comfort the user.\nTone: Warm"
NOW = dt.datetime(2030, 1, 10, 12, 0, tzinfo=dt.timezone.utc)


def rows_of(store: Store, conv_id: str) -> dict[str, int]:
    """Rows naming ``conv_id`` in every table of the schema (any column ``conversation_id``, or ``id`` of
    ``conversations``)."""
    out = {}
    with store.engine.connect() as c:
        for t in Base.metadata.sorted_tables:
            col = "id" if t.name == "conversations" else "conversation_id"
            if col in t.c:
                out[t.name] = c.execute(text(f"SELECT count(*) FROM {t.name} WHERE {col} = :i"),
                                        {"i": conv_id}).scalar()
    return out


def fill(store: Store, conv_id: str, at: dt.datetime | None = None, owner: str = "") -> None:
    """A conversation with a risky user turn (safety events), an agent turn (thinking text) and a done round;
    ``at`` back-dates every row."""
    store.create_conversation(conv_id, "support", ["anchor", "beacon"], "src", [("A", "ctx")], {}, owner)
    store.start_round(conv_id, "k1", "I want to kill myself", [SafetyEvent("user_risk", "suicide", "kill_self")])
    store.append_turn(conv_id, NewTurn(role="agent", text="reply", think="private", round_key="k1"),
                      safety_events=[SafetyEvent("reply_screened", "reply_dismissive", "dismiss")])
    store.finish_round(conv_id, "k1", "safety", 1)
    if at is not None:
        with store.engine.begin() as c:
            for table in ("conversations", "turns"):
                col = "id" if table == "conversations" else "conversation_id"
                c.execute(text(f"UPDATE {table} SET created_at = :t WHERE {col} = :i"), {"t": at, "i": conv_id})


def test_delete_erases_every_row_of_the_conversation_and_nothing_else(tmp_path):
    store = Store(f"sqlite:///{tmp_path}/s.db")
    fill(store, "a")
    fill(store, "b")
    assert all(n > 0 for n in rows_of(store, "a").values())
    assert set(rows_of(store, "a")) >= {"conversations", "turns", "rounds", "safety_events"}
    assert store.delete_conversation("a") and not store.delete_conversation("a")
    assert set(rows_of(store, "a").values()) == {0}
    assert all(n > 0 for n in rows_of(store, "b").values())
    # on disk, while the gateway runs: only b's copy of the text is left (secure_delete + the WAL truncated; without
    # them the database file and its write-ahead log still hold several copies of a's)
    wal = tmp_path / "s.db-wal"
    raw = (tmp_path / "s.db").read_bytes() + (wal.read_bytes() if wal.exists() else b"")
    assert raw.count(b"I want to kill myself") == 1
    store.close()


@pytest.mark.integration
async def test_delete_conversation_rpc_erases_turns_and_safety_events(tmp_path):
    stack = await start_stack(make_config(tmp_path), engine=ScriptedEngine(lambda p: DIRECTOR, lambda p: "ok"))
    try:
        async with channel(stack.target("gateway"), token="") as ch:
            stub = cpb_grpc.ConversationServiceStub(ch)
            conv = (await stub.StartConversation(cpb.StartConversationRequest(mode=cpb.MODE_SUPPORT))).conversation
            await collect(stub.SendMessage(cpb.SendMessageRequest(conversation_id=conv.id, text="I want to end my life",
                                                                  idempotency_key="k1")))
            await collect(stub.SendMessage(cpb.SendMessageRequest(conversation_id=conv.id, text="thanks",
                                                                  idempotency_key="k2")))
            before = rows_of(stack.store, conv.id)
            assert before["safety_events"] >= 1 and before["turns"] >= 3 and before["rounds"] == 2
            await stub.DeleteConversation(cpb.DeleteConversationRequest(conversation_id=conv.id))
            assert set(rows_of(stack.store, conv.id).values()) == {0}
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await stub.GetConversation(cpb.GetConversationRequest(conversation_id=conv.id))
            assert e.value.code() == grpc.StatusCode.NOT_FOUND
    finally:
        await stack.stop(0)


def test_retention_deletes_only_inactive_conversations(tmp_path):
    store = Store(f"sqlite:///{tmp_path}/s.db")
    old, fresh, revived, busy = "old", "fresh", "revived", "busy"
    fill(store, old, NOW - dt.timedelta(days=40))
    fill(store, fresh, NOW - dt.timedelta(days=2))
    fill(store, revived, NOW - dt.timedelta(days=40))
    fill(store, busy, NOW - dt.timedelta(days=40))
    store.append_turn(revived, NewTurn(role="user", text="I'm back"))  # active now (a turn stored today)
    with store.engine.begin() as c:
        c.execute(text("UPDATE turns SET created_at = :t WHERE conversation_id = :i AND text = :x"),
                  {"t": NOW - dt.timedelta(days=1), "i": revived, "x": "I'm back"})
    assert asyncio.run(sweep_retention(store, 0, now=NOW)) == 0  # 0 days = keep everything
    assert asyncio.run(sweep_retention(store, 30, skip={busy}, now=NOW)) == 1
    assert set(rows_of(store, old).values()) == {0}
    for kept in (fresh, revived, busy):
        assert store.get_conversation(kept) is not None
    assert store.delete_inactive(dt.timedelta(days=30), NOW) == 1  # busy, once its round is over
    assert store.delete_inactive(dt.timedelta(days=1), NOW + dt.timedelta(days=3)) == 2
    store.close()


@pytest.mark.integration
async def test_the_gateway_sweeps_on_start_and_periodically(tmp_path):
    url = f"sqlite:///{tmp_path}/store.db"
    store = Store(url)
    fill(store, "ancient", dt.datetime.now(dt.timezone.utc) - dt.timedelta(days=400))
    fill(store, "recent")
    store.close()
    cfg = make_config(tmp_path, security={"retention_days": 365, "retention_sweep_s": 0.05})
    stack = await start_stack(cfg, engine=ScriptedEngine(lambda p: DIRECTOR, lambda p: "ok"))
    try:
        for _ in range(200):  # the first sweep runs as the gateway starts
            if stack.store.get_conversation("ancient") is None:
                break
            await asyncio.sleep(0.05)
        assert stack.store.get_conversation("ancient") is None
        assert stack.store.get_conversation("recent") is not None
    finally:
        await stack.stop(0)
    assert MascotConfig().security.retention_days == 0  # default: keep until DeleteConversation


def check_owner_migration(url: str) -> None:
    engine = create_engine(url, foreign_keys=True)
    alembic(engine, "upgrade", "0002")
    with engine.begin() as c:
        c.execute(text("INSERT INTO conversations (id, mode, persona_ids, source_id, context, adapter_versions, "
                       "director_retries, director_fallbacks, created_at, safety_flagged, safety_categories) VALUES "
                       "('old', 'support', '[]', '', '[]', '{}', 0, 0, CURRENT_TIMESTAMP, false, '[]')"))
    store = Store(url)  # migrates to head
    assert store.get_conversation("old")[0].owner == ""
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext

    with store.engine.connect() as c:
        assert compare_metadata(MigrationContext.configure(c), Base.metadata) == []  # models == migrations
    store.create_conversation("new", "support", [], "", [], {}, "alice")
    assert store.get_conversation("new")[0].owner == "alice"
    store.close()
    alembic(engine, "downgrade", "0002")
    alembic(engine, "upgrade", "head")
    engine.dispose()


def test_migration_0003_on_sqlite(tmp_path):
    check_owner_migration(f"sqlite:///{tmp_path}/old.db")


@pytest.mark.integration
@pytest.mark.postgres
def test_migration_0003_on_postgres(postgres_url):
    check_owner_migration(postgres_url)
