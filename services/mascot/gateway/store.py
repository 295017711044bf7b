"""Conversation store: SQLAlchemy 2 models, Alembic-migrated schema, one committed transaction per write.

Any SQLAlchemy URL works (SQLite file by default, PostgreSQL by URL). A turn is committed before its
event is sent, so an acknowledged turn survives SIGKILL of the gateway. Rounds are keyed by
(conversation, idempotency key) so that a retried message is answered from what was stored.
Safety events (docs/safety.md) are stored in the same transaction as the turn they concern, and the
conversation's safety flag with them; they hold rule names and categories, never user text.
Deleting a conversation (DeleteConversation, the retention sweep; docs/security.md) removes every row that names
it, in every table, in one transaction; on SQLite deleted content is overwritten (``secure_delete``) and the
write-ahead log truncated after the delete.

Storage that goes away is never written blind: a SQLite file that was deleted, replaced (another file renamed over
it) or whose file system became read-only since the store opened it makes every transaction fail with
:class:`StoreUnavailable` (UNAVAILABLE) before it runs — SQLite itself would keep writing to the unlinked file and
lose every acknowledged turn at the next restart — and :meth:`Store.check` reports it for the gateway's health.

A round is ``running`` only while a gateway process works on it: each round names its ``runner`` (the process's
random id), and at its start the gateway closes the rounds a process that is gone left running
(:meth:`Store.recover_rounds`) as ``interrupted`` with ``closed_by`` ``restart``, their stored turns kept. On SQLite
(one gateway per database file) that is every running round; on PostgreSQL each gateway holds a session advisory lock
on its runner id for its lifetime, and only the rounds of runners whose lock is free (their process is gone) are
closed, never those of a live replica. The lock lives on one database connection: a keep-alive checks it every
``runner_lock_check_s`` seconds (:data:`RUNNER_LOCK_CHECK_S`) and, when that connection dropped (a database restart, a
terminated backend, a reset connection), reconnects and takes the lock again. A retry of a closed message round's
idempotency key reopens it when no newer message followed (:meth:`Store.resume_round`).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import secrets
import threading
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Awaitable, Callable

from sqlalchemy import (JSON, Boolean, DateTime, Float, ForeignKey, Integer, String, Text, UniqueConstraint, delete,
                        event, exists, func, select, text, update)
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column, sessionmaker

from mascot.core.db import create_engine
from mascot.core.errors import Aborted, ResourceExhausted, Unavailable
from mascot.core.interceptors import DISK_FULL_RETRY_S

MIGRATIONS_DIR = Path(__file__).parent / "migrations"
log = logging.getLogger(__name__)


class Base(DeclarativeBase):
    """Declarative base of the gateway tables."""


class ConversationRow(Base):
    """A conversation."""

    __tablename__ = "conversations"
    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    mode: Mapped[str] = mapped_column(String(16))
    persona_ids: Mapped[list] = mapped_column(JSON)
    source_id: Mapped[str] = mapped_column(String(256), default="")
    context: Mapped[list] = mapped_column(JSON, default=list)
    adapter_versions: Mapped[dict] = mapped_column(JSON, default=dict)
    director_retries: Mapped[int] = mapped_column(Integer, default=0)
    director_fallbacks: Mapped[int] = mapped_column(Integer, default=0)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), index=True)
    #: Set by the safety gate on the first risky user message; never cleared (migration 0002).
    safety_flagged: Mapped[bool] = mapped_column(Boolean, default=False)
    #: Risk categories detected so far, in first-detected order.
    safety_categories: Mapped[list] = mapped_column(JSON, default=list)
    #: Caller id that started it under ``security.caller_auth`` ("" without caller tokens; migration 0003).
    owner: Mapped[str] = mapped_column(String(64), default="", index=True)


class TurnRow(Base):
    """A stored turn; ``idx`` is its 0-based position in the conversation."""

    __tablename__ = "turns"
    __table_args__ = (UniqueConstraint("conversation_id", "idx", name="uq_turn_position"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    conversation_id: Mapped[str] = mapped_column(ForeignKey("conversations.id", ondelete="CASCADE"), index=True)
    idx: Mapped[int] = mapped_column(Integer)
    round_key: Mapped[str] = mapped_column(String(160), default="")
    role: Mapped[str] = mapped_column(String(8))
    persona_id: Mapped[str] = mapped_column(String(64), default="")
    directive: Mapped[dict | None] = mapped_column(JSON, nullable=True)
    adapter_version: Mapped[str] = mapped_column(String(128), default="")
    text: Mapped[str] = mapped_column(Text)
    think: Mapped[str] = mapped_column(Text, default="")
    safety: Mapped[bool] = mapped_column(Boolean, default=False)
    latency_s: Mapped[float] = mapped_column(Float, default=0.0)
    first_token_s: Mapped[float] = mapped_column(Float, default=0.0)
    director_s: Mapped[float] = mapped_column(Float, default=0.0)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    #: Reply checks (migration 0004): ``{"rejections": [{persona_id, attempt, reason, text}], "cut_reason": str}``,
    #: None when nothing was refused or cut.
    guard: Mapped[dict | None] = mapped_column(JSON, nullable=True)


class RoundRow(Base):
    """A round started by a user message, keyed by its idempotency key."""

    __tablename__ = "rounds"
    conversation_id: Mapped[str] = mapped_column(ForeignKey("conversations.id", ondelete="CASCADE"),
                                                 primary_key=True)
    idempotency_key: Mapped[str] = mapped_column(String(128), primary_key=True)
    text_sha256: Mapped[str] = mapped_column(String(64))
    state: Mapped[str] = mapped_column(String(16))  # running | done
    user_turn_idx: Mapped[int] = mapped_column(Integer)
    #: Why it ended: completed, empty_replies, safety, or interrupted (closed before it finished: ``closed_by``).
    reason: Mapped[str] = mapped_column(String(32), default="")
    agent_turns: Mapped[int] = mapped_column(Integer, default=0)
    #: Refused replies of a turn that ended the round with no reply (migration 0004): ``{"rejections": [...]}``.
    guard: Mapped[dict | None] = mapped_column(JSON, nullable=True)
    #: The gateway process that runs (or last ran) it: :attr:`Store.runner` (migration 0006; "" before it).
    runner: Mapped[str] = mapped_column(String(32), default="")
    #: What closed an ``interrupted`` round (migration 0006): :data:`CLOSED_BY_MESSAGE` (a newer message of the
    #: conversation), :data:`CLOSED_BY_RESTART` (a gateway start found it running after its process was gone) or
    #: :data:`CLOSED_BY_STREAM` (its self-play stream ended before the run finished); "" otherwise.
    closed_by: Mapped[str] = mapped_column(String(16), default="")


#: ``RoundRow.closed_by`` values of an interrupted round.
CLOSED_BY_MESSAGE, CLOSED_BY_RESTART, CLOSED_BY_STREAM = "message", "restart", "stream"
#: Advisory-lock class id ("masc") under which each gateway on PostgreSQL locks its runner id while it lives.
RUNNER_LOCK_CLASS = 0x6D617363
#: Seconds between checks that this gateway still holds its runner lock (PostgreSQL). A lock lost with its database
#: connection is taken again at the next check; until then a gateway that starts may close this gateway's running
#: rounds as interrupted, so the interval is short.
RUNNER_LOCK_CHECK_S = 5.0
_TRY_LOCK = text("SELECT pg_try_advisory_lock(:c, :o)")
#: Whether this session holds the lock (pg_locks: a two-key advisory lock has classid, objid = the keys, objsubid 2).
_HOLDS_LOCK = text("SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND granted AND "
                   "pid = pg_backend_pid() AND objsubid = 2 AND classid::bigint = :c AND objid::bigint = :o)")
#: Why the runner lock is not held (:meth:`Store.check_runner_lock` logs each once and names it when the lock is back).
_LOST, _MISSING = "its connection had dropped", "its connection had lost it"
_UNREACHABLE, _HELD = "the database had not answered", "another session had held it"


class SafetyEventRow(Base):
    """One safety gate action: ``kind`` ``user_risk`` (a user message at ``turn_idx`` showed risk of ``category``:
    crisis tier), ``user_checkin`` (possible risk: check-in tier) or ``reply_screened`` (the agent reply at
    ``turn_idx`` was replaced; ``category`` names the screen)."""

    __tablename__ = "safety_events"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    conversation_id: Mapped[str] = mapped_column(ForeignKey("conversations.id", ondelete="CASCADE"), index=True)
    turn_idx: Mapped[int] = mapped_column(Integer)
    kind: Mapped[str] = mapped_column(String(16))
    category: Mapped[str] = mapped_column(String(32))
    #: Names of the rules (or ``classifier``) that fired, comma-separated; never user text.
    rules: Mapped[str] = mapped_column(String(256), default="")
    #: The detectors that fired, joined with ``+``: ``rules``, ``classifier``, ``lexicon`` (e.g. ``rules+classifier``).
    detector: Mapped[str] = mapped_column(String(32), default="rules")
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class AuditEventRow(Base):
    """One control-plane call that changes state (migration 0005): who (``actor``, ``role``, ``via``) did what
    (``method`` on ``target``, ``detail`` a JSON of the request's non-secret fields), when, with which ``outcome``
    (``OK`` or the gRPC status code name) and ``request_id``. Written by the control plane, never by the public API;
    independent of conversations (no retention sweep or conversation delete touches it)."""

    __tablename__ = "audit_events"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), index=True)
    actor: Mapped[str] = mapped_column(String(128))
    role: Mapped[str] = mapped_column(String(16))
    via: Mapped[str] = mapped_column(String(16))
    method: Mapped[str] = mapped_column(String(64))
    target: Mapped[str] = mapped_column(String(256), default="")
    outcome: Mapped[str] = mapped_column(String(32))
    message: Mapped[str] = mapped_column(Text, default="")
    detail: Mapped[dict | None] = mapped_column(JSON, nullable=True)
    request_id: Mapped[str] = mapped_column(String(128), default="")


@dataclass(frozen=True)
class SafetyEvent:
    """A safety event to store with a turn (see :class:`SafetyEventRow`)."""

    kind: str
    category: str
    rules: str = ""
    detector: str = "rules"


@dataclass
class NewTurn:
    """A turn to append (``idx`` is assigned by the store)."""

    role: str
    text: str
    persona_id: str = ""
    directive: dict | None = None
    adapter_version: str = ""
    think: str = ""
    safety: bool = False
    latency_s: float = 0.0
    first_token_s: float = 0.0
    director_s: float = 0.0
    round_key: str = ""
    extra: dict = field(default_factory=dict)
    guard: dict | None = None


def text_digest(text: str) -> str:
    """SHA-256 hex digest of a message text (stored instead of comparing texts)."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _now() -> datetime:
    return datetime.now(timezone.utc)


class _NoRowsLogger(logging.LoggerAdapter):
    """SQLAlchemy's engine logger without its INFO (statements) and DEBUG (result rows) records."""

    def __init__(self, logger: Any) -> None:
        super().__init__(getattr(logger, "logger", logger), {})

    def isEnabledFor(self, level: int) -> bool:  # logging's name
        return level >= logging.WARNING and self.logger.isEnabledFor(level)


def _secure_delete(conn: object, _record: object) -> None:
    """SQLite: overwrite deleted content with zeros instead of leaving it in free pages."""
    cur = conn.cursor()  # type: ignore[attr-defined]
    cur.execute("PRAGMA secure_delete=ON")
    cur.close()


def _conversation_tables() -> list:
    """Every table holding rows of a conversation (a ``conversation_id`` column), children first, then
    ``conversations``: what a delete must erase."""
    tables = [t for t in Base.metadata.sorted_tables if "conversation_id" in t.c]
    return [*reversed(tables), ConversationRow.__table__]


def _delete_rows(s: Session, conv_id: str) -> None:
    """Delete every row of a conversation in the session's transaction."""
    for table in _conversation_tables():
        col = table.c.id if table is ConversationRow.__table__ else table.c.conversation_id
        s.execute(delete(table).where(col == conv_id))


class StoreUnavailable(Unavailable):
    """The conversation store cannot be written safely (UNAVAILABLE): its SQLite file was deleted or replaced, its
    file system is read-only, or the database does not answer."""


class StoreFull(ResourceExhausted):
    """The conversation store's disk is full (RESOURCE_EXHAUSTED with ``retry-after``); the message says what of the
    call was stored and what was not."""

    retry_after_s = DISK_FULL_RETRY_S


class RoundClosed(Aborted):
    """A turn of a round that a newer message of its conversation closed (reason ``interrupted``): it is not stored,
    so the stored order stays the conversation's order."""


def sqlite_file(url: str) -> Path | None:
    """The database file of a SQLite file URL (``sqlite:///PATH``), or None for an in-memory or server database."""
    if not url.startswith("sqlite:///") or url in ("sqlite:///:memory:",) or url.startswith("sqlite:///:memory:?"):
        return None
    return Path(url[len("sqlite:///"):].split("?", 1)[0])


def _file_identity(path: Path) -> tuple[int, int]:
    st = os.stat(path)
    return st.st_dev, st.st_ino


def _lock_conversation(s: Session, conv_id: str) -> None:
    """Take the write lock a read-then-write transaction needs before its first read: a no-op UPDATE of the
    conversation row (SQLite: the database's write lock, since pysqlite starts a transaction only at the first write;
    PostgreSQL: that row's lock). Concurrent writers of one conversation then run one after the other, so a round's
    state and the next turn index are read under the lock they are written under."""
    s.execute(update(ConversationRow).where(ConversationRow.id == conv_id).values(owner=ConversationRow.owner))


def _agent_turns(s: Session, conv_id: str, key: str) -> int:
    """Agent turns stored under a round key."""
    return int(s.scalar(select(func.count()).select_from(TurnRow).where(
        TurnRow.conversation_id == conv_id, TurnRow.round_key == key, TurnRow.role == "agent")))


def _interrupt(s: Session, rnd: RoundRow, by: str) -> None:
    """Close a running round as ``interrupted`` (``closed_by`` ``by``) with the agent turns it stored."""
    rnd.state, rnd.reason, rnd.closed_by = "done", "interrupted", by
    rnd.agent_turns = _agent_turns(s, rnd.conversation_id, rnd.idempotency_key)


def run_migrations(engine: Engine) -> None:
    """Bring the schema to the newest Alembic revision (idempotent)."""
    from alembic import command
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "head")


class Store:
    """Synchronous store; the gateway calls it through ``asyncio.to_thread``.

    Args:
        url: SQLAlchemy URL. For a SQLite file the parent directory is created.
        migrate: Run Alembic migrations at start (the Helm chart runs them as a hook Job instead).
        runner_lock_check_s: PostgreSQL: seconds between the keep-alive checks of this runner's advisory lock once
            :meth:`recover_rounds` took it (a lock lost with its connection is taken again at the next check).

    Raises:
        sqlalchemy.exc.ArgumentError: a malformed URL.
    """

    def __init__(self, url: str, migrate: bool = True, runner_lock_check_s: float = RUNNER_LOCK_CHECK_S) -> None:
        self.engine = create_engine(url, foreign_keys=True)
        # Statement parameters and result rows hold user text: never in exception messages or SQLAlchemy's logs,
        # whatever level an operator gives its loggers (only its warnings and errors pass).
        self.engine.hide_parameters = True
        self.engine.logger = _NoRowsLogger(self.engine.logger)
        if self.engine.dialect.name == "sqlite":
            event.listen(self.engine, "connect", _secure_delete)
        if migrate:
            run_migrations(self.engine)
        self._file = sqlite_file(url)
        #: This process's id in ``RoundRow.runner`` (a 31-bit number: the PostgreSQL advisory lock's object id).
        self.runner = str(secrets.randbelow(2 ** 31))
        self._runner_conn: Any = None  # PostgreSQL: the connection holding this runner's advisory lock
        self.runner_lock_check_s = runner_lock_check_s
        self._runner_mutex = threading.Lock()  # the keep-alive thread and the caller share _runner_conn
        self._runner_stop = threading.Event()
        self._runner_keeper: threading.Thread | None = None
        self._runner_trouble = ""  # why the lock is not held now ("" while it is), so each episode is logged once
        self._identity: tuple[int, int] | None = None
        self._lost = False
        if self._file is not None:
            with self.engine.connect():  # SQLite creates the file on the first connection
                pass
            self._identity = _file_identity(self._file)
            event.listen(self.engine, "begin", self._refuse_lost_file)
        self._session = sessionmaker(self.engine, expire_on_commit=False)

    def _file_problem(self) -> tuple[str, str]:
        """Why the SQLite file cannot be written safely, as ``(what happened, the file's path)``, or ``("", "")``
        (always for other databases)."""
        if self._file is None:
            return "", ""
        where = str(self._file)
        try:
            identity = _file_identity(self._file)
            read_only = bool(os.statvfs(self._file).f_flag & os.ST_RDONLY)
        except FileNotFoundError:
            return "its database file was deleted while the gateway was serving", where
        except OSError as e:
            return f"its database file cannot be read ({e.strerror})", where
        if identity != self._identity:
            return "its database file was replaced by another file while the gateway was serving", where
        if read_only:
            return "the file system of its database file is read-only", where
        return "", ""

    def _refuse_lost_file(self, _conn: object) -> None:
        problem, where = self._file_problem()
        if problem:
            if not self._lost:
                log.error("conversation store %s: %s; every request that reads or writes it is refused with "
                          "UNAVAILABLE until the file is back (a deleted or replaced file: restore it and restart the "
                          "gateway)", where, problem)
            self._lost = True
            raise StoreUnavailable(f"the conversation store is unavailable: {problem}; nothing was stored. The "
                                   "operator must restore it and restart the gateway; retry later")

    def check(self) -> None:
        """Probe the store: for a SQLite file, that it is still the file opened at start on a writable file system;
        for a server database, one ``SELECT 1``.

        Raises:
            StoreUnavailable: with the reason.
        """
        if self._file is not None:
            self._refuse_lost_file(None)
            return
        try:
            with self.engine.connect() as c:
                c.exec_driver_sql("SELECT 1")
        except Exception as e:  # any failure means the store is not usable
            raise StoreUnavailable(f"the conversation store does not answer: {type(e).__name__}") from e

    def close(self) -> None:
        """Stop the runner lock's keep-alive, release the lock (PostgreSQL) and dispose of the connection pool."""
        self._runner_stop.set()
        keeper = self._runner_keeper
        if keeper is not None and keeper is not threading.current_thread():
            keeper.join(timeout=10)
        if self._runner_mutex.acquire(timeout=10):  # a keep-alive stuck on an unreachable server: leave it
            try:
                self._drop_runner_conn()  # the session's advisory lock goes with it
            finally:
                self._runner_mutex.release()
        self.engine.dispose()

    def _drop_runner_conn(self) -> None:
        """Close the runner lock's connection (held :attr:`_runner_mutex`)."""
        if self._runner_conn is not None:
            conn, self._runner_conn = self._runner_conn, None
            try:
                conn.close()
            except Exception:  # noqa: BLE001 - a connection already lost holds no lock either
                pass

    def session(self) -> Session:
        """A new session (use as a context manager)."""
        return self._session()

    # conversations
    def create_conversation(self, conv_id: str, mode: str, persona_ids: list[str], source_id: str,
                            context: list[tuple[str, str]], adapter_versions: dict[str, str] | None = None,
                            owner: str = "") -> ConversationRow:
        """Insert a conversation (with the adapter versions it is pinned to and its owner's caller id) and return
        it."""
        row = ConversationRow(id=conv_id, mode=mode, persona_ids=list(persona_ids), source_id=source_id,
                              context=[list(c) for c in context], adapter_versions=dict(adapter_versions or {}),
                              created_at=_now(), owner=owner)
        with self.session() as s, s.begin():
            s.add(row)
        return row

    def get_conversation(self, conv_id: str, tail: int | None = None, start: int = 0, limit: int | None = None
                         ) -> tuple[ConversationRow, list[TurnRow]] | None:
        """The conversation and its turns in order, or None.

        Args:
            tail: Only the last ``tail`` turns (a round needs its recent history, not the whole conversation).
            start: Only turns with index >= ``start`` (a page of GetConversation).
            limit: At most ``limit`` turns from ``start``.
        """
        with self.session() as s:
            conv = s.get(ConversationRow, conv_id)
            if conv is None:
                return None
            q = select(TurnRow).where(TurnRow.conversation_id == conv_id, TurnRow.idx >= start)
            if tail is not None:
                turns = list(s.scalars(q.order_by(TurnRow.idx.desc()).limit(tail)))[::-1]
            else:
                turns = list(s.scalars(q.order_by(TurnRow.idx).limit(limit)))
            return conv, turns

    def delete_conversation(self, conv_id: str) -> bool:
        """Delete a conversation with every row that names it (turns, rounds, safety events, any table with a
        ``conversation_id``) in one transaction; False when it did not exist."""
        with self.session() as s, s.begin():
            conv = s.get(ConversationRow, conv_id)
            if conv is None:
                return False
            _delete_rows(s, conv_id)
        self._scrub()
        return True

    def _scrub(self) -> None:
        """SQLite: move the write-ahead log into the database and truncate it, so deleted content does not linger
        in the log file (pages freed in the database are zeroed by ``secure_delete``)."""
        if self.engine.dialect.name != "sqlite":
            return
        with self.engine.connect() as c:
            c.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")

    @staticmethod
    def _inactive(cutoff: datetime) -> list:
        """Conditions on ConversationRow: created before ``cutoff`` and no turn stored since."""
        recent = exists().where(TurnRow.conversation_id == ConversationRow.id, TurnRow.created_at >= cutoff)
        return [ConversationRow.created_at < cutoff, ~recent]

    def inactive_conversations(self, cutoff: datetime, limit: int = 500) -> list[str]:
        """Ids of conversations created before ``cutoff`` with no turn stored since (oldest first, at most
        ``limit``): what the retention sweep deletes."""
        with self.session() as s:
            return list(s.scalars(select(ConversationRow.id).where(*self._inactive(cutoff))
                                  .order_by(ConversationRow.created_at, ConversationRow.id).limit(limit)))

    def delete_inactive(self, max_age: timedelta, now: datetime | None = None, skip: set[str] | frozenset = frozenset(),
                        batch: int = 500) -> int:
        """Delete every conversation with no activity (created, or a turn stored) for ``max_age`` before ``now``
        (default: the current time) with all its rows, one transaction each (re-checked inside it), except the ids
        in ``skip`` (rounds running in this process); returns how many were deleted."""
        cutoff = (now or _now()) - max_age
        done, passed = 0, set(skip)
        while True:
            ids = [i for i in self.inactive_conversations(cutoff, batch + len(passed)) if i not in passed]
            if not ids:
                break
            for conv_id in ids[:batch]:
                passed.add(conv_id)
                with self.session() as s, s.begin():
                    if s.scalar(select(ConversationRow.id).where(ConversationRow.id == conv_id,
                                                                 *self._inactive(cutoff))) is None:
                        continue  # it became active since the listing
                    _delete_rows(s, conv_id)
                done += 1
        if done:
            self._scrub()
        return done

    def add_audit_event(self, *, actor: str, role: str, via: str, method: str, target: str, outcome: str,
                        message: str = "", detail: dict | None = None, request_id: str = "",
                        at: datetime | None = None) -> int:
        """Store one control-plane audit event (:class:`AuditEventRow`); returns its id. Strings are cut to their
        column's length."""
        row = AuditEventRow(created_at=at or datetime.now(timezone.utc), actor=actor[:128], role=role[:16],
                            via=via[:16], method=method[:64], target=target[:256], outcome=outcome[:32],
                            message=message[:2000], detail=detail, request_id=request_id[:128])
        with self.session() as s, s.begin():
            s.add(row)
            s.flush()
            return row.id

    def audit_events(self, *, limit: int, before_id: int = 0, actor: str = "", method: str = "",
                     target: str = "") -> list[AuditEventRow]:
        """Audit events newest first, at most ``limit``, with an id below ``before_id`` when it is > 0 (paging),
        filtered by exact ``actor``, ``method`` and ``target`` prefix when given."""
        q = select(AuditEventRow).order_by(AuditEventRow.id.desc()).limit(limit)
        if before_id > 0:
            q = q.where(AuditEventRow.id < before_id)
        if actor:
            q = q.where(AuditEventRow.actor == actor)
        if method:
            q = q.where(AuditEventRow.method == method)
        if target:
            q = q.where(AuditEventRow.target.startswith(target, autoescape=True))
        with self.session() as s:
            return list(s.scalars(q))

    def count_turns(self, conv_id: str) -> int:
        """Number of stored turns."""
        with self.session() as s:
            return int(s.scalar(select(func.count()).select_from(TurnRow).where(TurnRow.conversation_id == conv_id)))

    # safety
    @staticmethod
    def _add_safety_events(s: Session, conv_id: str, turn_idx: int, events: tuple[SafetyEvent, ...] | list) -> None:
        """Add event rows; a ``user_risk`` event also sets the conversation's flag and adds its category."""
        if not events:
            return
        now = _now()
        for e in events:
            s.add(SafetyEventRow(conversation_id=conv_id, turn_idx=turn_idx, kind=e.kind, category=e.category,
                                 rules=e.rules[:256], detector=e.detector, created_at=now))
        risk = [e.category for e in events if e.kind == "user_risk"]
        if risk:
            conv = s.get(ConversationRow, conv_id)
            conv.safety_flagged = True
            conv.safety_categories = list(dict.fromkeys([*(conv.safety_categories or []), *risk]))

    def safety_events(self, conv_id: str) -> list[SafetyEventRow]:
        """The conversation's safety events in the order stored."""
        with self.session() as s:
            return list(s.scalars(select(SafetyEventRow).where(SafetyEventRow.conversation_id == conv_id)
                                  .order_by(SafetyEventRow.id)))

    def user_risk_kind(self, conv_id: str, turn_idx: int) -> str | None:
        """The tier event of the user turn at ``turn_idx``: ``user_risk`` (a safety round), ``user_checkin`` (a
        check-in round) or None."""
        with self.session() as s:
            kinds = set(s.scalars(select(SafetyEventRow.kind).where(
                SafetyEventRow.conversation_id == conv_id, SafetyEventRow.turn_idx == turn_idx,
                SafetyEventRow.kind.in_(("user_risk", "user_checkin")))))
        return "user_risk" if "user_risk" in kinds else "user_checkin" if kinds else None

    def has_user_risk(self, conv_id: str, turn_idx: int) -> bool:
        """True when the user turn at ``turn_idx`` has a ``user_risk`` event (its round is a safety round)."""
        with self.session() as s:
            return bool(s.scalar(select(func.count()).select_from(SafetyEventRow).where(
                SafetyEventRow.conversation_id == conv_id, SafetyEventRow.turn_idx == turn_idx,
                SafetyEventRow.kind == "user_risk")))

    # turns
    def append_turn(self, conv_id: str, turn: NewTurn, director_retries: int = 0,
                    director_fallbacks: int = 0, safety_events: tuple[SafetyEvent, ...] | list = ()) -> TurnRow:
        """Append a turn at the next index (and add director counters and the turn's safety events) in one
        committed transaction.

        Raises:
            RoundClosed: the turn's round (``turn.round_key``) is no longer running: a newer message closed it.
        """
        with self.session() as s, s.begin():
            _lock_conversation(s, conv_id)
            if turn.round_key:
                rnd = s.get(RoundRow, (conv_id, turn.round_key))
                if rnd is not None and rnd.state != "running":
                    raise RoundClosed("a newer message of this conversation closed this round before its turn was "
                                      "stored; the round's earlier turns stay (GetConversation shows them)")
            n = s.scalar(select(func.count()).select_from(TurnRow).where(TurnRow.conversation_id == conv_id))
            row = TurnRow(conversation_id=conv_id, idx=int(n), round_key=turn.round_key, role=turn.role,
                          persona_id=turn.persona_id, directive=turn.directive, adapter_version=turn.adapter_version,
                          text=turn.text, think=turn.think, safety=turn.safety, latency_s=turn.latency_s,
                          first_token_s=turn.first_token_s, director_s=turn.director_s, created_at=_now(),
                          guard=turn.guard)
            s.add(row)
            if director_retries or director_fallbacks:
                conv = s.get(ConversationRow, conv_id)
                conv.director_retries += director_retries
                conv.director_fallbacks += director_fallbacks
            self._add_safety_events(s, conv_id, int(n), safety_events)
        return row

    def add_director_counts(self, conv_id: str, retries: int, fallbacks: int, rejections: list | None = None,
                            round_key: str = "") -> None:
        """Add to the conversation's director counters; ``rejections`` of a turn that produced no reply are added to
        the round stored under ``round_key`` (``guard.rejections``)."""
        if not (retries or fallbacks or rejections):
            return
        with self.session() as s, s.begin():
            conv = s.get(ConversationRow, conv_id)
            conv.director_retries += retries
            conv.director_fallbacks += fallbacks
            rnd = s.get(RoundRow, (conv_id, round_key)) if rejections and round_key else None
            if rnd is not None:
                g = dict(rnd.guard or {})
                g["rejections"] = [*g.get("rejections", []), *rejections]
                rnd.guard = g

    # rounds
    def get_round(self, conv_id: str, key: str) -> RoundRow | None:
        """The round stored under ``key``, or None."""
        with self.session() as s:
            return s.get(RoundRow, (conv_id, key))

    def start_round(self, conv_id: str, key: str, text: str, safety_events: tuple[SafetyEvent, ...] | list = (),
                    closed: list[str] | None = None) -> tuple[RoundRow, TurnRow]:
        """Store the user's turn, a ``running`` round and the message's safety events in one transaction. Rounds of
        the conversation still ``running`` (a stream cancelled or failed mid-round and not retried) are closed in the
        same transaction with reason ``interrupted``: their later turns are refused (:class:`RoundClosed`), so the
        stored order is the conversation's order. Their keys are appended to ``closed`` when given.

        Raises:
            IntegrityError: a round with this key already exists (a concurrent duplicate).
        """
        with self.session() as s, s.begin():
            _lock_conversation(s, conv_id)
            open_rounds = list(s.scalars(select(RoundRow).where(RoundRow.conversation_id == conv_id,
                                                                RoundRow.state == "running")))
            if closed is not None:
                closed.extend(r.idempotency_key for r in open_rounds)
            for rnd in open_rounds:  # unfinished rounds end here, so no later turn of theirs lands after this one
                _interrupt(s, rnd, CLOSED_BY_MESSAGE)
            n = s.scalar(select(func.count()).select_from(TurnRow).where(TurnRow.conversation_id == conv_id))
            turn = TurnRow(conversation_id=conv_id, idx=int(n), round_key=key, role="user", text=text,
                           created_at=_now())
            rnd = RoundRow(conversation_id=conv_id, idempotency_key=key, text_sha256=text_digest(text),
                           state="running", user_turn_idx=int(n), runner=self.runner)
            s.add_all([turn, rnd])
            self._add_safety_events(s, conv_id, int(n), safety_events)
        return rnd, turn

    def finish_round(self, conv_id: str, key: str, reason: str, agent_turns: int) -> None:
        """Mark a round ``done`` with why it ended.

        Raises:
            RoundClosed: a newer message closed the round first (it stays ``interrupted``).
        """
        with self.session() as s, s.begin():
            _lock_conversation(s, conv_id)
            rnd = s.get(RoundRow, (conv_id, key))
            if rnd.state != "running":
                raise RoundClosed("a newer message of this conversation closed this round before it finished; "
                                  "the round's turns stay (GetConversation shows them)")
            rnd.state, rnd.reason, rnd.agent_turns = "done", reason, agent_turns

    def resume_round(self, conv_id: str, key: str, reopen: bool = True) -> RoundRow | None:
        """The round stored under ``key``, taken over by this process when it did not finish: a ``running`` one gets
        this :attr:`runner`, and (``reopen``) one that a gateway restart closed (``closed_by`` ``restart``) is
        ``running`` again when no newer message of the conversation followed it. Any other finished round is returned
        as it is; None when there is none."""
        with self.session() as s, s.begin():
            _lock_conversation(s, conv_id)
            rnd = s.get(RoundRow, (conv_id, key))
            if rnd is None:
                return None
            newer = s.scalar(select(func.count()).select_from(RoundRow).where(
                RoundRow.conversation_id == conv_id, RoundRow.user_turn_idx > rnd.user_turn_idx))
            if rnd.state == "done" and reopen and rnd.closed_by == CLOSED_BY_RESTART and not newer:
                rnd.state, rnd.reason, rnd.closed_by = "running", "", ""
            if rnd.state == "running":
                rnd.runner = self.runner
            return rnd

    def interrupt_round(self, conv_id: str, key: str, by: str = CLOSED_BY_STREAM) -> bool:
        """Close the round stored under ``key`` as ``interrupted`` (``closed_by`` ``by``) with the agent turns it
        stored, if it is still running; True when it was."""
        with self.session() as s, s.begin():
            _lock_conversation(s, conv_id)
            rnd = s.get(RoundRow, (conv_id, key))
            if rnd is None or rnd.state != "running":
                return False
            _interrupt(s, rnd, by)
            return True

    def recover_rounds(self, self_play_key: str = "") -> tuple[int, int]:
        """Run once at the gateway's start: close as ``interrupted`` (``closed_by`` ``restart``, stored turns kept)
        the rounds that a gateway process that is gone left ``running``. SQLite (one gateway per database file):
        every running round. PostgreSQL: first this process takes the advisory lock of its :attr:`runner` id, held
        until :meth:`close` (a keep-alive thread takes it again when its connection drops, see
        :meth:`check_runner_lock`); then the rounds of every other runner whose lock is free (its process is gone) are
        closed, that runner's lock held by the closing transaction; rounds of live replicas, and rounds stored before
        migration 0006 (no runner), are left alone. Other databases: nothing is closed (a warning says so).

        Returns:
            ``(rounds closed, of them self-play rounds)`` (``self_play_key``: the key of self-play rounds).
        """
        dialect = self.engine.dialect.name
        if dialect == "postgresql":
            self._take_runner_lock()
        elif dialect != "sqlite":
            log.warning("rounds left running by a stopped gateway are not closed at start on %s (SQLite and "
                        "PostgreSQL only); a retry of their key still resumes them", dialect)
            return 0, 0
        with self.session() as s, s.begin():
            q = select(RoundRow).where(RoundRow.state == "running", RoundRow.runner != self.runner)
            if dialect == "postgresql":
                gone = self._gone_runners(s)
                if not gone:
                    return 0, 0
                q = q.where(RoundRow.runner.in_(gone)).with_for_update()
            rows = list(s.scalars(q))
            for rnd in rows:
                _interrupt(s, rnd, CLOSED_BY_RESTART)
        return len(rows), sum(1 for r in rows if self_play_key and r.idempotency_key == self_play_key)

    def _gone_runners(self, s: Session) -> list[str]:
        """PostgreSQL: the other runner ids of running rounds whose advisory lock is free (their gateway process is
        gone: a session's advisory locks end with it). Each is locked until ``s``'s transaction ends (a transaction
        lock), so a gateway that is only between connections cannot take its lock again and go on with a round that
        this transaction closes."""
        runners = set(s.scalars(select(RoundRow.runner).where(
            RoundRow.state == "running", RoundRow.runner != "", RoundRow.runner != self.runner).distinct()))
        gone = []
        for r in sorted(runners):
            if not r.isdigit() or int(r) >= 2 ** 31:
                continue
            if s.execute(text("SELECT pg_try_advisory_xact_lock(:c, :o)"),
                         {"c": RUNNER_LOCK_CLASS, "o": int(r)}).scalar():
                gone.append(r)
        return gone

    def _take_runner_lock(self) -> None:
        """PostgreSQL, the first time: hold this runner's advisory lock on a connection of its own (a new id if
        another process has it) and start the keep-alive thread that takes it again when that connection drops."""
        with self._runner_mutex:
            if self._runner_keeper is not None:
                return
            conn = self.engine.connect()
            try:
                for _ in range(16):
                    if conn.execute(_TRY_LOCK, {"c": RUNNER_LOCK_CLASS, "o": int(self.runner)}).scalar():
                        break
                    self.runner = str(secrets.randbelow(2 ** 31))
                else:
                    raise RuntimeError("no free gateway runner id after 16 tries")
                conn.commit()  # a session lock outlives the transaction; the connection is not left idle in one
            except BaseException:
                conn.close()
                raise
            self._runner_conn = conn
            self._runner_keeper = threading.Thread(target=self._keep_runner_lock, name=f"runner-lock-{self.runner}",
                                                   daemon=True)
            self._runner_keeper.start()

    def _keep_runner_lock(self) -> None:
        """The keep-alive thread: :meth:`check_runner_lock` every :attr:`runner_lock_check_s` seconds until
        :meth:`close`."""
        while not self._runner_stop.wait(self.runner_lock_check_s):
            try:
                self.check_runner_lock()
            except Exception:  # the keep-alive must outlive whatever one check hit
                log.exception("gateway runner %s: checking its PostgreSQL advisory lock failed; trying again in "
                              "%.1f s", self.runner, self.runner_lock_check_s)

    def check_runner_lock(self) -> bool:
        """PostgreSQL, once :meth:`recover_rounds` took the runner lock: whether this process holds it, after taking
        it again if its connection dropped (a new connection) or it is gone from a live one. Each change is logged
        once: the lost connection and a database that does not answer as warnings, a lock that another session holds
        as an error (a gateway that started meanwhile may be closing this gateway's running rounds), the lock taken
        again as a warning."""
        params = {"c": RUNNER_LOCK_CLASS, "o": int(self.runner)}
        every = f"trying again every {self.runner_lock_check_s:g} s"
        with self._runner_mutex:
            if self._runner_stop.is_set() or self._runner_keeper is None:
                return False
            if self._runner_conn is not None:
                try:
                    held = bool(self._runner_conn.execute(_HOLDS_LOCK, params).scalar())
                    self._runner_conn.commit()
                except Exception as e:  # noqa: BLE001 - any failure: the connection, and the lock with it, is gone
                    self._drop_runner_conn()
                    self._runner_trouble = _LOST
                    log.warning("gateway runner %s: the database connection holding its PostgreSQL advisory lock was "
                                "lost (%s), and the lock with it; reconnecting to take it again (%s). Until then a "
                                "gateway that starts may take this one for stopped and close its running rounds as "
                                "interrupted", self.runner, type(e).__name__, every)
                else:
                    if held:
                        return True
                    if not self._runner_trouble:  # a live connection without the lock: take it again on it
                        self._runner_trouble = _MISSING
                        log.warning("gateway runner %s: its PostgreSQL advisory lock is no longer held by its "
                                    "database connection; taking it again", self.runner)
            if self._runner_conn is None:
                try:
                    self._runner_conn = self.engine.connect()
                except Exception as e:  # noqa: BLE001 - the database does not answer (yet)
                    if self._runner_trouble != _UNREACHABLE:
                        self._runner_trouble = _UNREACHABLE
                        log.warning("gateway runner %s: cannot reconnect to the database to take its PostgreSQL "
                                    "advisory lock again (%s); %s", self.runner, type(e).__name__, every)
                    return False
            try:
                got = bool(self._runner_conn.execute(_TRY_LOCK, params).scalar())
                self._runner_conn.commit()
            except Exception as e:  # noqa: BLE001 - lost again: the next check reconnects
                self._drop_runner_conn()
                if self._runner_trouble != _UNREACHABLE:
                    self._runner_trouble = _UNREACHABLE
                    log.warning("gateway runner %s: the database connection dropped while taking its PostgreSQL "
                                "advisory lock again (%s); %s", self.runner, type(e).__name__, every)
                return False
            if got:
                log.warning("gateway runner %s: its PostgreSQL advisory lock is taken again (%s); a gateway that "
                            "starts now leaves this gateway's running rounds alone", self.runner,
                            self._runner_trouble or _LOST)
                self._runner_trouble = ""
                return True
            if self._runner_trouble != _HELD:
                self._runner_trouble = _HELD
                log.error("gateway runner %s: its PostgreSQL advisory lock is held by another database session, so "
                          "this gateway cannot take it again: a gateway that started while the lock was lost may be "
                          "closing this gateway's running rounds as interrupted (or another process uses the same "
                          "runner id); %s", self.runner, every)
            return False

    def round_turns(self, conv_id: str, key: str) -> list[TurnRow]:
        """Turns stored under a round key, in order (the user turn first)."""
        with self.session() as s:
            return list(s.scalars(select(TurnRow).where(TurnRow.conversation_id == conv_id,
                                                        TurnRow.round_key == key).order_by(TurnRow.idx)))


async def watch_health(store: Store, set_serving: Callable[[bool], Awaitable[None]], interval_s: float) -> None:
    """Probe ``store`` (:meth:`Store.check`) every ``interval_s`` seconds and call ``set_serving(False)`` when it
    fails, ``set_serving(True)`` when it passes again (a server database back after a restart). Runs until
    cancelled."""
    healthy = True
    while True:
        await asyncio.sleep(interval_s)
        try:
            await asyncio.to_thread(store.check)
            ok = True
        except Exception as e:  # noqa: BLE001 - whatever the probe hit, the store is not usable now
            ok = False
            if healthy:
                log.error("gateway NOT_SERVING: %s", getattr(e, "message", None) or type(e).__name__)
        if ok != healthy:
            if ok:
                log.warning("conversation store reachable again: gateway SERVING")
            await set_serving(ok)
            healthy = ok


__all__ = [
    "Store", "StoreUnavailable", "StoreFull", "RoundClosed", "watch_health", "sqlite_file", "NewTurn",
    "ConversationRow", "TurnRow", "RoundRow", "SafetyEventRow", "SafetyEvent", "AuditEventRow", "IntegrityError",
    "text_digest", "run_migrations", "CLOSED_BY_MESSAGE", "CLOSED_BY_RESTART", "CLOSED_BY_STREAM"
]
