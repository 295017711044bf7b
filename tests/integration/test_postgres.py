"""The store on a real PostgreSQL server (initdb + pg_ctl into a temp dir, as an unprivileged user)."""

import getpass
import glob
import os
import shutil
import socket
import subprocess
import time

import pytest

from mascot.gateway.store import NewTurn, Store
from tests.conftest import need

pytestmark = [pytest.mark.integration, pytest.mark.postgres]


def _bin(name):
    found = shutil.which(name) or next(iter(sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))), None)
    need(found is not None, f"PostgreSQL server binary {name} not found (apt-get install postgresql)")
    return found


@pytest.fixture(scope="module")
def postgres_url(tmp_path_factory):
    initdb, pg_ctl = _bin("initdb"), _bin("pg_ctl")
    base = tmp_path_factory.mktemp("pg")
    data = base / "data"
    as_user = []
    if os.geteuid() == 0:  # PostgreSQL refuses to run as root
        user = "nobody"
        os.chmod(base, 0o777)
        for p in [base, *base.parents][:-1]:
            os.chmod(p, os.stat(p).st_mode | 0o111)
        as_user = ["runuser", "-u", user, "--"]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    subprocess.run([*as_user, initdb, "-D", str(data), "-U", "mascot", "--auth=trust"], check=True,
                   capture_output=True, timeout=120)
    subprocess.run([*as_user, pg_ctl, "-D", str(data), "-l", str(base / "log"), "-w", "-o",
                    f"-p {port} -k {base} -c listen_addresses=127.0.0.1", "start"], check=True, capture_output=True,
                   timeout=120)
    url = f"postgresql+psycopg://mascot@127.0.0.1:{port}/postgres"
    yield url
    subprocess.run([*as_user, pg_ctl, "-D", str(data), "-m", "fast", "stop"], capture_output=True, timeout=60)


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
