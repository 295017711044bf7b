"""One round of a conversation, from the user's message (or self-play's opening) to its RoundCompleted event.

:class:`RoundRunner` owns a round's steps; SendMessage and RunSelfPlay each make one call to it:

1. Replay (SendMessage): a retry with a stored idempotency key replays the round's stored turns (RoundStarted with
   ``replayed``). A finished round ends there with its stored end reason (its stream was counted when it ran); an
   unfinished one resumes after its stored turns, the safety gate's stored decision included: a ``running`` one, or
   one a gateway restart closed while no newer message followed it (:meth:`Store.resume_round`).
2. Safety detection: the safety gate looks at the message (:meth:`TurnLoop.detect`) before anything is stored.
3. Start: :meth:`Store.start_round` stores the user turn, a ``running`` round and the message's safety events (the
   conversation flagged) in one transaction; the events are then counted (``mascot_safety_events_total``) and
   RoundStarted is sent.
4. State: the :class:`~mascot.gateway.turn_loop.RoundState` (roster, pinned adapter versions, history, seed).
5. Turns: a risky message is answered by one safety turn and the round ends (reason ``safety``); otherwise the
   :class:`~mascot.gateway.turn_loop.TurnLoop` runs the agent turns (in self-play with the simulated user) and
   records the end reason on the state.
6. Finish: :meth:`Store.finish_round` stores the reason and the agent-turn count, then RoundCompleted is sent.

A self-play run cannot be resumed: when its stream ends before RoundCompleted (an error, a cancel, a client that went
away) its round is closed at once as ``interrupted`` (``closed_by`` ``stream``); a gateway that was killed leaves it
to the next gateway start (``closed_by`` ``restart``). A store whose disk is full ends the stream with
:class:`~mascot.gateway.store.StoreFull` (RESOURCE_EXHAUSTED), whose message says what of the round was stored.

Metrics (:meth:`RoundRunner._metered`, the one place for them): ``mascot_conversations_active`` while the turns run,
``mascot_round_duration_seconds`` of a round that finished, and ``mascot_rounds_total{mode, reason}`` once per
stream: its end reason, or ``failed`` / ``cancelled`` (:func:`ended_early`) for one that ended before RoundCompleted.
A SendMessage round is metered from RoundStarted on, a self-play round from before its safety detection (as before).

Not here: request validation, admission control and the one-round-per-conversation lock (the servicer,
:mod:`mascot.gateway.servicer`); the director and speaker calls and the storing of each turn (the turn loop,
:mod:`mascot.gateway.turn_loop`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from contextlib import aclosing, contextmanager
from dataclasses import dataclass
from typing import Any, AsyncIterator, Callable, Iterator

from mascot.api.conversation.v1 import conversation_pb2 as cpb
from mascot.api.dialogue.v1 import dialogue_pb2 as dpb
from mascot.core.dialogue import HistoryTurn
from mascot.core.errors import FailedPrecondition, InvalidArgument, Unavailable
from mascot.core.interceptors import disk_full, stream_stalled
from mascot.core.personas import PersonaCatalog
from mascot.gateway.store import CLOSED_BY_RESTART, IntegrityError, Store, StoreFull, text_digest
from mascot.gateway.turn_loop import REASONS, RoundState, TurnLoop, event, history_turn, turn_to_proto

log = logging.getLogger(__name__)

#: Round key of a conversation's self-play run (it has no idempotency key of the caller's).
SELF_PLAY_KEY = "selfplay"


def ended_early(outcome: str) -> str:
    """The ``mascot_rounds_total`` reason of a round stream closed before it finished: ``cancelled`` (its client
    went away or its deadline passed), or ``failed`` when the boundary closed it because the client stopped reading;
    an outcome already reached stays."""
    return "cancelled" if outcome == "failed" and not stream_stalled() else outcome


@dataclass
class _Meter:
    """The metrics of one round stream: when it started and how it ended so far (``failed`` until it finishes)."""

    t0: float
    outcome: str = "failed"


_FREE_SPACE = "The operator must free space on the conversation store's disk (retry-after gives the seconds to wait)"


def store_full(self_play: bool, user_turn: int | None = None, st: RoundState | None = None,
               finishing: bool = False, closed: bool = False) -> StoreFull:
    """The error of a round whose store write failed on a full disk, saying exactly what was stored: nothing
    (``user_turn`` None: the message itself was not stored), the message and the agent turns sent as TurnCompleted
    but not the turn in progress (``st``), or every turn but not the round's end (``finishing``); of a self-play
    run also whether its round is already closed as interrupted (``closed``)."""
    what = "the self-play run" if self_play else "this message"
    if user_turn is None:
        retry = ("run self-play again on this conversation" if self_play
                 else "then retry with the same idempotency_key")
        return StoreFull(f"the conversation store's disk is full: nothing of {what} was stored. {_FREE_SPACE}; "
                         f"{retry}")
    turns = st.agent_turns if st is not None else 0
    first = (f"the self-play opening is stored (turn {user_turn})" if self_play
             else f"your message is stored (turn {user_turn})")
    if finishing:
        end = "its completion" if self_play else "the round's end"
        stored = (f"{first} with all {turns} agent turn(s) of the round (each sent as TurnCompleted); only {end} "
                  "was not recorded")
    else:
        nxt = st.next_index() if st is not None else user_turn + 1
        if nxt > user_turn + 1:
            first += (f" with the round's turns up to turn {nxt - 1} ({turns} agent turn(s), each sent as "
                      "TurnCompleted)")
        stored = f"{first}; turn {nxt}, the one in progress, and the rest of the round were not stored"
    if self_play:
        state = ("the run is closed as interrupted" if closed
                 else "the run is closed as interrupted when the gateway next starts")
        retry = (f"self-play cannot be resumed: {state}, its stored turns stay (GetConversation shows them); run "
                 "self-play on a new conversation (StartConversation)")
    else:
        retry = ("then retry with the same idempotency_key: it replays the stored turns and finishes the round "
                 "(a new message instead closes this round as interrupted)")
    return StoreFull(f"the conversation store's disk is full: {stored}. {_FREE_SPACE}; {retry}")


class RoundRunner:
    """Runs rounds: safety detection, the store's round (start, finish, replay), the turn loop and the metrics.

    Args:
        store: The conversation store.
        catalog: Persona cards.
        loop: The :class:`~mascot.gateway.turn_loop.TurnLoop` (director and speaker calls, the safety gate).
        cfg: :class:`~mascot.core.config.MascotConfig` (``dialogue``).
        metrics: :class:`~mascot.core.metrics.Metrics`.
    """

    def __init__(self, store: Store, catalog: PersonaCatalog, loop: TurnLoop, cfg: Any, metrics: Any) -> None:
        self.store, self.catalog, self.loop, self.cfg, self.metrics = store, catalog, loop, cfg, metrics

    async def message(self, conv: Any, turns: list, key: str, text: str,
                      deadline: Callable[[], float | None] | None = None) -> AsyncIterator[cpb.ConversationEvent]:
        """The round of one user message: yields its events, RoundStarted to RoundCompleted.

        Args:
            conv: The conversation (a store row), ``turns`` its most recent turns (``dialogue.history_window_turns``).
            key: The idempotency key; a round stored under it is replayed, and resumed when it did not finish.
            text: The validated message.
            deadline: Seconds left of the caller's deadline (``context.time_remaining``), or None.

        Raises:
            InvalidArgument: ``key`` was stored with another text.
            Unavailable: another request is storing this key's round right now.
            StoreFull: the store's disk is full (the message says what of the round was stored).
            ServiceError: from the turn loop or the store (e.g. RoundClosed when a newer message closed the round).
        """
        rnd = await asyncio.to_thread(self.store.get_round, conv.id, key)
        if rnd is not None and rnd.text_sha256 == text_digest(text) and (
                rnd.state == "running" or rnd.closed_by == CLOSED_BY_RESTART):
            # take the unfinished round over (reopened when a restart closed it and nothing newer followed); the
            # self-play run's round is never reopened as a message round
            try:
                rnd = await asyncio.to_thread(self.store.resume_round, conv.id, key, key != SELF_PLAY_KEY)
            except Exception as e:
                if disk_full(e):
                    log.error("conversation store disk full: a round could not be resumed")
                    raise StoreFull("the conversation store's disk is full: the round of this idempotency_key was "
                                    "not resumed and nothing new was stored; what it stored before stays (your "
                                    f"message is turn {rnd.user_turn_idx}). {_FREE_SPACE}; then retry with the "
                                    "same idempotency_key") from e
                raise
        replayed: list = []
        # RoundStarted and a replay's stored turns; a round that runs sends them inside _metered, so a stream
        # closed right after RoundStarted is counted (a finished round's replay is not a round and is not counted)
        opening: list[cpb.ConversationEvent] = []
        safety_round = check_in = False
        if rnd is not None:
            if rnd.text_sha256 != text_digest(text):
                raise InvalidArgument("idempotency_key was already used with a different text; use a new key")
            replayed = await asyncio.to_thread(self.store.round_turns, conv.id, key)
            opening.append(event(round_started=cpb.RoundStarted(user_turn=turn_to_proto(replayed[0]), replayed=True)))
            for row in replayed[1:]:
                t = turn_to_proto(row)
                opening.append(event(turn_started=cpb.TurnStarted(index=t.index, role=t.role, directive=t.directive)))
                opening.append(event(turn_completed=cpb.TurnCompleted(turn=t)))
            if rnd.state == "done":
                for ev in opening:
                    yield ev
                yield event(round_completed=cpb.RoundCompleted(agent_turns=rnd.agent_turns,
                                                               reason=REASONS.get(rnd.reason, 0)))
                return
            conv, turns = await asyncio.to_thread(self.store.get_conversation, conv.id,
                                                  self.cfg.dialogue.history_window_turns)
            kind = await asyncio.to_thread(self.store.user_risk_kind, conv.id, rnd.user_turn_idx)
            safety_round, check_in = kind == "user_risk", kind == "user_checkin"
        else:
            detection = await self.loop.detect(text)
            closed: list[str] = []
            try:
                _, user_row = await asyncio.to_thread(self.store.start_round, conv.id, key, text,
                                                      detection.events() if detection else [], closed)
            except IntegrityError:
                raise Unavailable("this message is being stored by another request; retry") from None
            except Exception as e:
                if disk_full(e):
                    log.error("conversation store disk full: a message was not stored")
                    raise store_full(False) from e
                raise
            if closed:  # their streams were counted when they ended (cancelled or failed)
                log.info("a new message closed %d unfinished round(s) of a conversation", len(closed))
            if detection is not None:
                self.loop.count_safety(detection.categories, detection.tier)
                safety_round, check_in = detection.tier == "crisis", detection.tier == "check_in"
            if turns and turns[-1].idx + 1 != user_row.idx or not turns and user_row.idx != 0:
                # a turn landed between the read and the new message (a closing round's last write): read again
                conv, turns = await asyncio.to_thread(self.store.get_conversation, conv.id,
                                                      self.cfg.dialogue.history_window_turns)
            else:
                turns = [*turns, user_row]
            opening.append(event(round_started=cpb.RoundStarted(user_turn=turn_to_proto(user_row), replayed=False)))
        st = self._state(conv, key, seed=int(text_digest(conv.id + key)[:8], 16),
                         history=[history_turn(self.catalog, t.role, t.text, t.persona_id, t.directive)
                                  for t in turns],
                         safety_categories=set(conv.safety_categories or []),
                         first_index=turns[0].idx if turns else 0)
        st.agent_turns = sum(1 for r in replayed[1:] if r.role == "agent")  # resumed after the stored turns
        # a check-in round: the check-in turn, then the round's usual agent turns
        per_round = 1 if safety_round else self.cfg.dialogue.agent_turns_per_round + check_in
        user_turn = rnd.user_turn_idx if rnd is not None else user_row.idx
        finishing = False
        with self._metered(conv.mode) as meter:
            try:
                for ev in opening:
                    yield ev
                async with aclosing(self._turns(st, per_round - st.agent_turns, safety_round, deadline,
                                                check_in=check_in)) as evs:
                    async for ev in evs:
                        yield ev
                finishing = True
                done = await self._finish(st, meter)
            except Exception as e:
                if disk_full(e):
                    log.error("conversation store disk full: a round stopped after %d stored agent turn(s)",
                              st.agent_turns)
                    raise store_full(False, user_turn, st, finishing) from e
                raise
            yield done

    async def self_play(self, conv: Any, opening: str, user: dpb.UserSimulation, agent_turns: int,
                        user_speak_prob: float, seed: int, deadline: Callable[[], float | None] | None = None
                        ) -> AsyncIterator[cpb.ConversationEvent]:
        """A self-play run on a conversation without turns, stored as one round (key :data:`SELF_PLAY_KEY`): the
        opening user message, then ``agent_turns`` agent turns with the simulated ``user`` speaking between them
        with probability ``user_speak_prob`` (:meth:`TurnLoop.agent_turns`). Yields its events.

        Raises:
            FailedPrecondition: self-play already ran on this conversation (its round key is stored).
            StoreFull: the store's disk is full (the message says what of the run was stored).
            ServiceError: from the turn loop or the store.
        """
        try:
            with self._metered(conv.mode) as meter:
                detection = await self.loop.detect(opening)
                try:
                    _, user_row = await asyncio.to_thread(self.store.start_round, conv.id, SELF_PLAY_KEY, opening,
                                                          detection.events() if detection else [])
                except Exception as e:
                    if disk_full(e):
                        log.error("conversation store disk full: a self-play opening was not stored")
                        raise store_full(True) from e
                    raise
                if detection is not None:
                    self.loop.count_safety(detection.categories, detection.tier)
                crisis = detection is not None and detection.tier == "crisis"
                check_in = detection is not None and detection.tier == "check_in"
                st = self._state(conv, SELF_PLAY_KEY, seed=seed, history=[HistoryTurn("user", opening)],
                                 safety_categories=set(detection.categories) if crisis else set())
                finishing = False
                try:
                    yield event(round_started=cpb.RoundStarted(user_turn=turn_to_proto(user_row)))
                    async with aclosing(self._turns(st, 1 if crisis else agent_turns + check_in, crisis, deadline,
                                                    user, user_speak_prob, check_in=check_in)) as evs:
                        async for ev in evs:
                            yield ev
                    finishing = True
                    done = await self._finish(st, meter)
                except BaseException as e:  # the run ends here unfinished: it can never be resumed, so close it
                    closed = await self._close_unfinished(conv.id)
                    if isinstance(e, Exception) and disk_full(e):
                        log.error("conversation store disk full: a self-play run stopped after %d stored agent "
                                  "turn(s)", st.agent_turns)
                        raise store_full(True, user_row.idx, st, finishing, closed) from e
                    raise
                yield done
        except IntegrityError:
            raise FailedPrecondition("self-play already ran on this conversation; start a new one") from None

    async def _close_unfinished(self, conv_id: str) -> bool:
        """Close a self-play round whose stream ended before RoundCompleted as ``interrupted`` (``closed_by``
        ``stream``), best effort: when the store cannot write, the next gateway start closes it. True when the round
        is closed now (by this call or before it)."""
        try:
            closed = await asyncio.shield(asyncio.to_thread(self.store.interrupt_round, conv_id, SELF_PLAY_KEY))
        except BaseException:  # noqa: BLE001 - the stream's own error is the one to report
            log.warning("a self-play run that ended early could not be closed now; the next gateway start closes it")
            return False
        if closed:
            log.info("a self-play run ended before it finished; its round was closed as interrupted")
        return True

    # ------------------------------------------------------------------ the steps both kinds share
    def _state(self, conv: Any, key: str, *, seed: int, history: list[HistoryTurn], safety_categories: set,
               first_index: int = 0) -> RoundState:
        """The RoundState of a round of ``conv`` under ``key``: its roster, pinned versions and context."""
        return RoundState(conv_id=conv.id, mode=conv.mode, roster=[self.catalog.get(i) for i in conv.persona_ids],
                          adapter_versions=dict(conv.adapter_versions or {}), history=history,
                          context=[tuple(c) for c in conv.context], round_key=key, seed=seed,
                          safety_categories=safety_categories, first_index=first_index)

    async def _turns(self, st: RoundState, left: int, safety: bool, deadline: Callable[[], float | None] | None,
                     user: dpb.UserSimulation | None = None, user_speak_prob: float = 0.0, *, check_in: bool = False
                     ) -> AsyncIterator[cpb.ConversationEvent]:
        """The round's remaining turns (``left`` agent turns): of a safety round its one safety turn (none when a
        retry resumes after it), else the turn loop's, after the check-in turn of a check-in round (counted in
        ``left``; not repeated when a retry resumes after it). ``st.reason`` holds the end reason once it is done."""
        if safety:
            st.reason = "safety"
            if left > 0:
                async for ev in self.loop.safety_turn(st):
                    yield ev
            return
        if check_in and st.agent_turns == 0 and left > 0:
            async for ev in self.loop.safety_turn(st, "check_in"):
                yield ev
            left -= 1
        async for ev in self.loop.agent_turns(st, left, deadline, user, user_speak_prob):
            yield ev

    async def _finish(self, st: RoundState, meter: _Meter) -> cpb.ConversationEvent:
        """Mark the round done in the store with ``st.reason``, record its outcome and duration; its RoundCompleted.

        Raises:
            RoundClosed: a newer message closed the round first.
        """
        await asyncio.to_thread(self.store.finish_round, st.conv_id, st.round_key, st.reason, st.agent_turns)
        meter.outcome = st.reason
        self.metrics.round_duration.labels(st.mode).observe(time.perf_counter() - meter.t0)
        return event(round_completed=cpb.RoundCompleted(agent_turns=st.agent_turns, reason=REASONS[st.reason]))

    @contextmanager
    def _metered(self, mode: str) -> Iterator[_Meter]:
        """Count a round stream: ``mascot_conversations_active{mode}`` while inside, and on the way out
        ``mascot_rounds_total{mode, reason}`` with the outcome :meth:`_finish` set, ``failed`` on an error, or
        :func:`ended_early`'s reason when the stream was cancelled or closed."""
        meter = _Meter(time.perf_counter())
        self.metrics.conversations_active.labels(mode).inc()
        try:
            yield meter
        except (asyncio.CancelledError, GeneratorExit):
            meter.outcome = ended_early(meter.outcome)
            raise
        finally:
            self.metrics.conversations_active.labels(mode).dec()
            self.metrics.rounds.labels(mode, meter.outcome).inc()
