"""Rounds a gateway process left running when it died are closed at the next gateway start.

Found by a reviewer: a self-play run interrupted by a crash (the process killed mid-round) stayed ``running`` for
ever; RunSelfPlay on its conversation said only "needs a conversation without turns", and the one way to close it
was a SendMessage with the undocumented idempotency key ``selfplay``. Now a gateway start closes every round left
running by a process that is gone as ``interrupted`` (``closed_by`` ``restart``, its stored turns kept, counted in a
log line); a retried message resumes its round (unless a newer message followed), and RunSelfPlay says the run was
interrupted and what to do. Real gateway, director and speaker servers on loopback over a SQLite file (a scripted
engine); the rounds are planted as a killed process leaves them: turns committed, the round never finished, written
by another process (another runner id)."""

from __future__ import annotations

import asyncio
import logging
import time

import grpc
import pytest

from mascot.api.conversation.v1 import conversation_pb2 as cpb
from mascot.api.conversation.v1 import conversation_pb2_grpc as cpb_grpc
from mascot.api.dialogue.v1 import dialogue_pb2 as dpb
from mascot.app.stack import start_stack
from mascot.core.engine import GenerationRequest
from mascot.core.server import channel
from mascot.gateway.round import SELF_PLAY_KEY
from mascot.gateway.store import RUNNER_LOCK_CLASS, NewTurn, Store
from tests.helpers.config import make_config
from tests.helpers.engine import ScriptedEngine
from tests.helpers.rpc import code_of, collect

pytestmark = [pytest.mark.integration]
DIRECTOR = "Agent: The Catalyst\nAction: Ask one question.\nTone: Curious"
REPLY = "What would help you most right now?"


def _engine() -> ScriptedEngine:
    return ScriptedEngine(lambda p: DIRECTOR, lambda p: REPLY)


def _plant(db: str, conv_id: str, key: str, text: str, agent_turns: int) -> None:
    """What a gateway killed mid-round leaves: the user turn and ``agent_turns`` acknowledged agent turns committed
    under a ``running`` round written by another process (its own runner id)."""
    dead = Store(db)
    try:
        dead.start_round(conv_id, key, text)
        for i in range(agent_turns):
            dead.append_turn(conv_id, NewTurn(role="agent", text=f"reply {i}", persona_id="catalyst", round_key=key,
                                              directive={"persona_id": "catalyst", "action": "Ask.", "tone": "Warm",
                                                         "source": "model", "raw": ""}))
        assert dead.get_round(conv_id, key).state == "running"
    finally:
        dead.close()


async def test_rounds_left_running_by_a_dead_gateway_are_closed_at_start_and_the_api_says_so(tmp_path, caplog):
    db = f"sqlite:///{tmp_path}/store.db"
    cfg = make_config(tmp_path, store={"url": db})
    stack = await start_stack(cfg, ("gateway", "director", "speaker"), engine=_engine())
    try:
        async with channel(stack.target("gateway")) as ch:
            stub = cpb_grpc.ConversationServiceStub(ch)
            ids = [(await stub.StartConversation(cpb.StartConversationRequest(mode=cpb.MODE_SUPPORT))).conversation.id
                   for _ in range(3)]
    finally:
        await stack.stop(0)
    sp, msg, overtaken = ids
    _plant(db, sp, SELF_PLAY_KEY, "My exam went badly today.", agent_turns=2)  # a self-play run killed mid-run
    _plant(db, msg, "round-1", "I miss my grandmother.", agent_turns=1)  # a message round killed mid-round
    _plant(db, overtaken, "old", "I had a rough week.", agent_turns=1)

    caplog.set_level(logging.INFO, logger="mascot.app.stack")
    stack = await start_stack(cfg, ("gateway", "director", "speaker"), engine=_engine())  # the restarted gateway
    try:
        assert any("closed 3 round(s) left running by a gateway process that stopped (1 self-play run(s)) as "
                   "interrupted" in r.getMessage() for r in caplog.records), [r.getMessage() for r in caplog.records]
        store = stack.store
        for conv_id, key, agents in ((sp, SELF_PLAY_KEY, 2), (msg, "round-1", 1), (overtaken, "old", 1)):
            rnd = store.get_round(conv_id, key)
            assert (rnd.state, rnd.reason, rnd.closed_by, rnd.agent_turns) == ("done", "interrupted", "restart",
                                                                               agents)
            assert store.count_turns(conv_id) == 1 + agents  # the acknowledged turns stay
        async with channel(stack.target("gateway")) as ch:
            stub = cpb_grpc.ConversationServiceStub(ch)
            # self-play: told it was interrupted, that it cannot be resumed and what to do
            code, details = await code_of(stub.RunSelfPlay(cpb.RunSelfPlayRequest(
                conversation_id=sp, opening_text="My exam went badly today.",
                user=dpb.UserSimulation(situation="A student after a failed exam."))))
            assert code == grpc.StatusCode.FAILED_PRECONDITION
            assert ("interrupted (the gateway stopped before the run finished) after 2 agent turn(s)" in details
                    and "cannot be resumed" in details and "new conversation" in details), details
            got = await stub.GetConversation(cpb.GetConversationRequest(conversation_id=sp))
            assert [t.text for t in got.conversation.turns] == ["My exam went badly today.", "reply 0", "reply 1"]
            # the undocumented way out is no way in: the self-play round is replayed as closed, never resumed
            events = await collect(stub.SendMessage(cpb.SendMessageRequest(
                conversation_id=sp, text="My exam went badly today.", idempotency_key=SELF_PLAY_KEY)))
            assert events[-1].round_completed.reason == cpb.ROUND_END_REASON_INTERRUPTED
            assert store.count_turns(sp) == 3

            # a message round: the retry with the same key resumes it after its stored turn and finishes it
            events = await collect(stub.SendMessage(cpb.SendMessageRequest(
                conversation_id=msg, text="I miss my grandmother.", idempotency_key="round-1")))
            assert events[0].round_started.replayed
            done = events[-1].round_completed
            assert done.agent_turns == cfg.dialogue.agent_turns_per_round
            assert done.reason == cpb.ROUND_END_REASON_COMPLETED
            assert store.count_turns(msg) == 1 + cfg.dialogue.agent_turns_per_round  # nothing duplicated
            rnd = store.get_round(msg, "round-1")
            assert (rnd.state, rnd.reason, rnd.closed_by, rnd.runner) == ("done", "completed", "", store.runner)

            # a message round overtaken by a newer message is never reopened: its retry replays it as interrupted
            await collect(stub.SendMessage(cpb.SendMessageRequest(conversation_id=overtaken, text="Work was hard.",
                                                                  idempotency_key="new")))
            before = store.count_turns(overtaken)
            events = await collect(stub.SendMessage(cpb.SendMessageRequest(
                conversation_id=overtaken, text="I had a rough week.", idempotency_key="old")))
            assert events[0].round_started.replayed
            assert events[-1].round_completed.reason == cpb.ROUND_END_REASON_INTERRUPTED
            assert events[-1].round_completed.agent_turns == 1
            assert store.count_turns(overtaken) == before
    finally:
        await stack.stop(0)


class SlowSpeaker(ScriptedEngine):
    """Speaker replies stream one 3-character delta every ``delay_s`` seconds (a run takes a while)."""

    def __init__(self, delay_s: float) -> None:
        super().__init__(lambda p: DIRECTOR, lambda p: REPLY)
        self.delay_s = delay_s

    async def stream(self, request: GenerationRequest):
        async for item in super().stream(request):
            if "You are the director" not in request.prompt:
                await asyncio.sleep(self.delay_s)
            yield item


async def test_a_self_play_stream_that_ends_early_closes_its_round_at_once(tmp_path):
    """A live gateway need not restart: a self-play run whose client goes away is closed as interrupted (``stream``)
    when its stream ends, and RunSelfPlay on it says so."""
    stack = await start_stack(make_config(tmp_path), ("gateway", "director", "speaker"), engine=SlowSpeaker(0.02))
    try:
        async with channel(stack.target("gateway")) as ch:
            stub = cpb_grpc.ConversationServiceStub(ch)
            conv = (await stub.StartConversation(cpb.StartConversationRequest(mode=cpb.MODE_SUPPORT))).conversation
            req = cpb.RunSelfPlayRequest(conversation_id=conv.id, opening_text="I lost my job today.", agent_turns=4,
                                         user=dpb.UserSimulation(situation="Someone who was just laid off."))
            call = stub.RunSelfPlay(req)
            async for r in call:
                if r.event.HasField("turn_completed") and r.event.turn_completed.turn.role == dpb.ROLE_AGENT:
                    break
            call.cancel()
            for _ in range(200):
                rnd = stack.store.get_round(conv.id, SELF_PLAY_KEY)
                if rnd.state == "done":
                    break
                await asyncio.sleep(0.05)
            assert (rnd.state, rnd.reason, rnd.closed_by) == ("done", "interrupted", "stream")
            assert rnd.agent_turns >= 1
            code, details = await code_of(stub.RunSelfPlay(req))
            assert code == grpc.StatusCode.FAILED_PRECONDITION
            assert "interrupted (its stream ended before the run finished)" in details, details
    finally:
        await stack.stop(0)


def test_on_postgres_only_the_rounds_of_gateways_that_are_gone_are_closed(postgres_url):
    """Replicas share a PostgreSQL store: a starting gateway must not close the rounds a live replica runs. Each
    gateway holds an advisory lock on its runner id while it lives; rounds of runners whose lock is free are closed,
    rounds of live runners and rounds stored before the runner column (no runner) are left alone."""
    live, gone = Store(postgres_url), Store(postgres_url)
    assert live.recover_rounds() == (0, 0) and gone.recover_rounds() == (0, 0)  # both hold their runner locks
    for store, conv in ((live, "c-live"), (gone, "c-gone"), (gone, "c-legacy")):
        store.create_conversation(conv, "support", ["anchor"], "", [])
        store.start_round(conv, "k", "hello")
        store.append_turn(conv, NewTurn(role="agent", text="hi", persona_id="anchor", round_key="k"))
    with gone.session() as s, s.begin():
        from sqlalchemy import update

        from mascot.gateway.store import RoundRow
        s.execute(update(RoundRow).where(RoundRow.conversation_id == "c-legacy").values(runner=""))
    gone.close()  # its process is gone: its lock with it
    starting = Store(postgres_url)
    try:
        assert starting.recover_rounds() == (1, 0)
        assert live.get_round("c-live", "k").state == "running"  # a live replica's round is untouched
        assert starting.get_round("c-legacy", "k").state == "running"
        rnd = starting.get_round("c-gone", "k")
        assert (rnd.state, rnd.reason, rnd.closed_by, rnd.agent_turns) == ("done", "interrupted", "restart", 1)
        live.close()
        again = Store(postgres_url)
        try:
            assert again.recover_rounds() == (1, 0)  # now the other replica is gone too
            assert again.get_round("c-live", "k").closed_by == "restart"
        finally:
            again.close()
    finally:
        starting.close()


def _lock_holder(admin, runner: str) -> int | None:
    """The backend pid holding ``runner``'s advisory lock, or None when it is free."""
    from sqlalchemy import text

    with admin.connect() as c:
        return c.execute(text("SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted AND objsubid = 2 "
                              "AND classid::bigint = :c AND objid::bigint = :o"),
                         {"c": RUNNER_LOCK_CLASS, "o": int(runner)}).scalar()


def _wait_for(what, within_s: float = 10.0):
    """Poll ``what()`` every 20 ms until it is truthy or ``within_s`` passed; its last value."""
    deadline = time.monotonic() + within_s
    while not (got := what()) and time.monotonic() < deadline:
        time.sleep(0.02)
    return got


def _running_rounds(store: Store) -> list[tuple[str, str]]:
    """Two rounds ``store``'s gateway works on: a message round and a self-play run, each with a stored agent turn."""
    rounds = [("c-blip-msg", "round-1"), ("c-blip-sp", SELF_PLAY_KEY)]
    for conv, key in rounds:
        store.create_conversation(conv, "support", ["anchor"], "", [])
        store.start_round(conv, key, "hello")
        store.append_turn(conv, NewTurn(role="agent", text="hi", persona_id="anchor", round_key=key))
    return rounds


def test_on_postgres_a_runner_lock_lost_with_its_connection_is_taken_again(postgres_url, caplog):
    """A gateway's runner lock lives on one database connection: when that connection drops (killed here with
    pg_terminate_backend; a database restart or a network cut drops it alike) the lock goes with it, and a gateway
    starting then would take the live gateway for gone and close the rounds it is running. The lock's keep-alive
    notices the lost connection, reconnects and takes the lock again; a gateway that starts after that leaves the live
    gateway's rounds alone."""
    from sqlalchemy import create_engine, text
    from sqlalchemy.pool import NullPool

    caplog.set_level(logging.WARNING, logger="mascot.gateway.store")
    live = Store(postgres_url, runner_lock_check_s=0.1)
    admin = create_engine(postgres_url, poolclass=NullPool)
    starting = None
    try:
        assert live.recover_rounds() == (0, 0)
        rounds = _running_rounds(live)
        killed = _lock_holder(admin, live.runner)
        assert killed is not None
        with admin.begin() as c:
            assert c.execute(text("SELECT pg_terminate_backend(:p)"), {"p": killed}).scalar()
        holder = _wait_for(lambda: (h := _lock_holder(admin, live.runner)) not in (None, killed) and h)

        starting = Store(postgres_url)  # a gateway that starts after the blip
        closed = starting.recover_rounds(SELF_PLAY_KEY)
        assert closed == (0, 0), "a live gateway's running rounds were closed after its lock was lost and retaken"
        for conv, key in rounds:
            rnd = starting.get_round(conv, key)
            assert (rnd.state, rnd.closed_by, rnd.runner) == ("running", "", live.runner)
        assert holder, "the runner lock was not taken again after its connection was killed"
        messages = [r.getMessage() for r in caplog.records]
        assert any(f"gateway runner {live.runner}: the database connection holding its PostgreSQL advisory lock was "
                   "lost" in m for m in messages), messages
        assert any(f"gateway runner {live.runner}: its PostgreSQL advisory lock is taken again" in m
                   for m in messages), messages
        live.close()  # now it is gone: the next start closes its rounds
        assert starting.recover_rounds(SELF_PLAY_KEY) == (2, 1)
    finally:
        live.close()
        if starting is not None:
            starting.close()
        admin.dispose()


def test_on_postgres_a_runner_lock_someone_else_took_meanwhile_is_an_error_until_it_is_free(postgres_url, caplog):
    """When another session holds the lock by the time the keep-alive reconnects (a gateway that started during the
    blip and is closing this gateway's rounds), the keep-alive says so in an error and takes the lock once it is
    free."""
    from sqlalchemy import create_engine, text
    from sqlalchemy.pool import NullPool

    caplog.set_level(logging.WARNING, logger="mascot.gateway.store")
    live = Store(postgres_url, runner_lock_check_s=0.3)
    admin = create_engine(postgres_url, poolclass=NullPool)
    try:
        live.recover_rounds()
        killed = _lock_holder(admin, live.runner)
        with admin.connect() as other:
            other.execute(text("SELECT pg_terminate_backend(:p)"), {"p": killed})
            other.execute(text("SELECT pg_advisory_lock(:c, :o)"), {"c": RUNNER_LOCK_CLASS, "o": int(live.runner)})
            other.commit()
            assert _wait_for(lambda: any(r.levelno == logging.ERROR and f"gateway runner {live.runner}: its PostgreSQL "
                                         "advisory lock is held by another database session" in r.getMessage()
                                         for r in caplog.records)), [r.getMessage() for r in caplog.records]
            assert _lock_holder(admin, live.runner) != killed
            other.execute(text("SELECT pg_advisory_unlock(:c, :o)"), {"c": RUNNER_LOCK_CLASS, "o": int(live.runner)})
            other.commit()
        # the other session let it go: the keep-alive takes it
        assert _wait_for(lambda: _lock_holder(admin, live.runner) not in (None, killed))
        assert _wait_for(lambda: any("advisory lock is taken again" in r.getMessage() for r in caplog.records))
    finally:
        live.close()
        admin.dispose()


def test_on_postgres_a_runner_lock_is_taken_again_after_a_database_restart(postgres_server, caplog):
    """A PostgreSQL restart cuts every session, the runner lock's too: the keep-alive retries until the database
    answers again and takes the lock back."""
    from sqlalchemy import create_engine
    from sqlalchemy.pool import NullPool

    caplog.set_level(logging.WARNING, logger="mascot.gateway.store")
    live = Store(postgres_server.url, runner_lock_check_s=0.1)
    admin = create_engine(postgres_server.url, poolclass=NullPool)
    try:
        live.recover_rounds()
        postgres_server.restart(down_s=0.5)
        assert _wait_for(lambda: _lock_holder(admin, live.runner), within_s=20), "the runner lock was not taken again"
        messages = [r.getMessage() for r in caplog.records]
        assert any("advisory lock was lost" in m for m in messages), messages
        assert _wait_for(lambda: any(f"gateway runner {live.runner}: its PostgreSQL advisory lock is taken again"
                                     in r.getMessage() for r in caplog.records))
    finally:
        live.close()
        admin.dispose()
