"""The store on a real PostgreSQL server (the ``postgres_url`` fixture of tests/conftest.py: initdb + pg_ctl into a
temp dir, as an unprivileged user)."""

import pytest

from mascot.gateway.store import NewTurn, Store

pytestmark = [pytest.mark.integration, pytest.mark.postgres]


def test_store_round_trip_on_postgres(postgres_url):
    store = Store(postgres_url)
    store.create_conversation("c1", "support", ["anchor", "beacon"], "ed-1", [("A", "hello")])
    rnd, user = store.start_round("c1", "k1", "héllo ✓")
    store.append_turn("c1", NewTurn(role="agent", text="reply", persona_id="anchor", round_key="k1",
                                    directive={"persona_id": "anchor", "action": "a", "tone": "t", "source": "model",
                                               "raw": "Agent: The Anchor"}), director_retries=1)
    store.finish_round("c1", "k1", "completed", 1)
    Store(postgres_url).close()  # migrations are idempotent
    conv, turns = store.get_conversation("c1")
    assert conv.director_retries == 1 and conv.context == [["A", "hello"]]
    assert [t.text for t in turns] == ["héllo ✓", "reply"] and turns[1].directive["source"] == "model"
    assert store.get_round("c1", "k1").state == "done"
    from sqlalchemy.exc import IntegrityError

    with pytest.raises(IntegrityError):
        store.start_round("c1", "k1", "again")
    assert store.delete_conversation("c1") and store.get_conversation("c1") is None
    store.close()
