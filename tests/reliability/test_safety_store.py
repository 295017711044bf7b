"""Migration 0002 (safety flag, categories, safety_events) on SQLite and PostgreSQL: an existing database upgrades
with its conversations unflagged, the models match the migrated schema, and the downgrade works."""

from __future__ import annotations

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import text

from mascot.core.db import create_engine
from mascot.gateway.store import Base, NewTurn, SafetyEvent, Store
from tests.helpers.migrations import alembic


def check_upgrade_from_0001(url: str) -> None:
    engine = create_engine(url, foreign_keys=True)
    alembic(engine, "upgrade", "0001")
    with engine.begin() as c:
        c.execute(text("INSERT INTO conversations (id, mode, persona_ids, source_id, context, adapter_versions, "
                       "director_retries, director_fallbacks, created_at) VALUES ('old', 'support', '[]', '', '[]', "
                       "'{}', 0, 0, CURRENT_TIMESTAMP)"))
    store = Store(url)  # migrates to head
    conv, _ = store.get_conversation("old")
    assert conv.safety_flagged is False and conv.safety_categories == []
    with store.engine.connect() as c:
        assert compare_metadata(MigrationContext.configure(c), Base.metadata) == []  # models == migrations
    _, user = store.start_round("old", "k1", "I want to kill myself",
                                [SafetyEvent("user_risk", "suicide", "kill_self")])
    store.append_turn("old", NewTurn(role="agent", text="t", safety=True, round_key="k1"),
                      safety_events=[SafetyEvent("reply_screened", "reply_dismissive", "dismiss")])
    conv, turns = store.get_conversation("old")
    assert conv.safety_flagged and conv.safety_categories == ["suicide"] and turns[1].safety
    assert [(e.kind, e.turn_idx) for e in store.safety_events("old")] == [("user_risk", 0), ("reply_screened", 1)]
    assert store.has_user_risk("old", 0) and not store.has_user_risk("old", 1)
    store.close()
    alembic(engine, "downgrade", "0001")
    alembic(engine, "upgrade", "head")
    engine.dispose()


def test_migration_0002_on_sqlite(tmp_path):
    check_upgrade_from_0001(f"sqlite:///{tmp_path}/old.db")


@pytest.mark.integration
@pytest.mark.postgres
def test_migration_0002_on_postgres(postgres_url):
    check_upgrade_from_0001(postgres_url)
