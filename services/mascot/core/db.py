"""SQLAlchemy engines for our stores: a SQLite file (its folder created) with durable settings, or any URL."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import sqlalchemy as sa


def create_engine(url: str, *, foreign_keys: bool = False) -> sa.Engine:
    """An engine for ``url``. SQLite files get their folder created and, on every connection, WAL journaling and
    ``synchronous=FULL`` (a committed row survives a SIGKILL or power loss), plus ``foreign_keys=ON`` if asked.

    An in-memory SQLite URL (``sqlite://``, ``sqlite:///:memory:``) shares one connection across threads
    (SQLAlchemy ``StaticPool``); otherwise every pooled connection would open its own empty database. A server database
    (PostgreSQL) gets ``pool_pre_ping`` (SQLAlchemy "Disconnect Handling - Pessimistic"): a pooled connection that a
    database restart dropped is replaced on checkout instead of failing the next statement.

    Raises:
        sqlalchemy.exc.ArgumentError: a malformed URL.
    """
    in_memory = url in ("sqlite://", "sqlite:///:memory:") or url.startswith("sqlite:///:memory:?")
    if url.startswith("sqlite:///") and not in_memory:
        Path(url[len("sqlite:///"):]).parent.mkdir(parents=True, exist_ok=True)
    if in_memory:
        engine = sa.create_engine(url, future=True, poolclass=sa.pool.StaticPool,
                                  connect_args={"check_same_thread": False})
    elif url.startswith("sqlite"):
        engine = sa.create_engine(url, future=True)
    else:  # a server database: test a pooled connection before use, so one dropped by a restart is replaced
        engine = sa.create_engine(url, future=True, pool_pre_ping=True)
    if engine.dialect.name == "sqlite":
        @sa.event.listens_for(engine, "connect")
        def _pragmas(conn: Any, _rec: Any) -> None:
            cur = conn.cursor()
            if foreign_keys:
                cur.execute("PRAGMA foreign_keys=ON")
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=FULL")
            cur.close()
    return engine
