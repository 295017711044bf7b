"""Judgement cache keyed by content hash.

The key is the SHA-256 of (judge name, model, rubric version, the rendered first-attempt messages). Any
SQLAlchemy URL works (a SQLite file by default; PostgreSQL for several judge replicas). Each judgement
is committed on its own, so a judge killed mid-batch keeps everything answered before the kill.
"""

from __future__ import annotations

import hashlib
import json
import threading
from dataclasses import dataclass
from typing import Sequence

import sqlalchemy as sa

from mascot.core.db import create_engine

_META = sa.MetaData()
JUDGEMENTS = sa.Table(
    "judgements", _META,
    sa.Column("key", sa.String(64), primary_key=True),
    sa.Column("judge", sa.String(128), nullable=False),
    sa.Column("model", sa.String(256), nullable=False),
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("scores", sa.Text, nullable=False),
    sa.Column("rationale", sa.Text, nullable=False),
    sa.Column("error", sa.Text, nullable=False),
    sa.Column("attempts", sa.Integer, nullable=False),
)


def content_hash(judge: str, model: str, rubric_version: str, messages: list[dict],
                 extra: Sequence[str] = ()) -> str:
    """Hex SHA-256 of the canonical JSON of the judge identity, the prompt messages and ``extra`` (what else the
    verdict depends on, e.g. the metrics judge's version and roster; left out of the hash when empty)."""
    key: dict = {"judge": judge, "model": model, "rubric": rubric_version, "messages": messages}
    if extra:
        key["extra"] = list(extra)
    blob = json.dumps(key, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class CachedJudgement:
    """A stored verdict: ``status`` ``"ok"`` or ``"unparseable"``."""

    status: str
    scores: dict[str, int]
    rationale: str
    error: str
    attempts: int


class JudgeCache:
    """Persistent judgement cache.

    Args:
        url: SQLAlchemy URL, e.g. ``sqlite:///.cache/judge-cache.db``. The table is created if missing.
    """

    def __init__(self, url: str) -> None:
        self._engine = create_engine(url)
        _META.create_all(self._engine)
        self._lock = threading.Lock()

    def get(self, key: str) -> CachedJudgement | None:
        """The stored verdict for ``key``, or None."""
        with self._engine.connect() as c:
            row = c.execute(sa.select(JUDGEMENTS).where(JUDGEMENTS.c.key == key)).first()
        if row is None:
            return None
        return CachedJudgement(row.status, json.loads(row.scores), row.rationale, row.error, row.attempts)

    def put(self, key: str, judge: str, model: str, v: CachedJudgement) -> None:
        """Store a verdict (first writer wins; a second put of the same key is ignored)."""
        with self._lock, self._engine.begin() as c:
            if c.execute(sa.select(JUDGEMENTS.c.key).where(JUDGEMENTS.c.key == key)).first() is None:
                c.execute(JUDGEMENTS.insert().values(key=key, judge=judge, model=model, status=v.status,
                                                     scores=json.dumps(v.scores), rationale=v.rationale,
                                                     error=v.error, attempts=v.attempts))

    def __len__(self) -> int:
        with self._engine.connect() as c:
            return c.execute(sa.select(sa.func.count()).select_from(JUDGEMENTS)).scalar_one()

    def close(self) -> None:
        """Dispose of the connection pool."""
        self._engine.dispose()
