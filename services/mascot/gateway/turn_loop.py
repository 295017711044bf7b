"""The turn loop: director -> speaker, the turns of one round (its agent turns, and in self-play the simulated user's).

The round around the turns (safety gate on the user's message, start and finish in the store, metrics) is run by
:class:`~mascot.gateway.round.RoundRunner`. The generators here yield only ``ConversationEvent`` messages; what a
turn or the loop came to (a turn delivered or not, the end reason, a risky simulated-user message) is recorded on
the :class:`RoundState`, for the caller to read once the generator is done.

Each agent turn: NextDirective on the director service, then GenerateReply on the speaker service with
its deltas forwarded as events. The speaker checks every reply before its text leaves (mascot.core.guard) and
regenerates refused attempts; when it refuses a persona's every attempt, the director is asked again with that
persona excluded; when the replacement is refused too, the round ends (``empty_replies``). Every turn is
committed to the store before its TurnCompleted event is yielded.

The safety gate (:mod:`mascot.gateway.safety`, docs/safety.md) sits ahead of the director: a user message at the
crisis tier is answered by :meth:`TurnLoop.safety_turn` and the round ends; one at the check-in tier gets a check-in
turn (the same method) before the round's agent turns. In a flagged conversation each reply is generated
in full, screened, and only then sent (one delta): a screened reply is replaced by the template's follow-up line.
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Callable

import grpc

from mascot.api.conversation.v1 import conversation_pb2 as cpb
from mascot.api.dialogue.v1 import dialogue_pb2 as dpb
from mascot.api.director.v1 import director_pb2 as dirpb
from mascot.api.speaker.v1 import speaker_pb2 as spb
from mascot.core.dialogue import (HistoryTurn, directive_message, directive_source_name, directive_source_value,
                                  history_to_proto)
from mascot.core.enums import enum_names, enum_value
from mascot.core.errors import (DeadlineExceeded, FailedPrecondition, InvalidArgument, ResourceExhausted, ServiceError,
                                 Unavailable)
from mascot.core.personas import PersonaCatalog
from mascot.gateway.risk_rules import CATEGORIES, SCREEN_CATEGORIES
from mascot.gateway.languages import unread_label
from mascot.gateway.safety import Detection, SafetyGate
from mascot.gateway.store import NewTurn, SafetyEvent, Store, TurnRow

REASONS = {name: enum_value(cpb.RoundEndReason, name) for name in enum_names(cpb.RoundEndReason)}


def duration(seconds: float) -> Any:
    """A ``google.protobuf.Duration`` of ``seconds``."""
    from google.protobuf.duration_pb2 import Duration

    d = Duration()
    d.FromNanoseconds(int(max(0.0, seconds) * 1e9))
    return d


def turn_to_proto(row: TurnRow, include_think: bool = False) -> dpb.Turn:
    """A stored turn as a proto ``Turn`` (thinking text only on request)."""
    from google.protobuf.timestamp_pb2 import Timestamp

    ts = Timestamp()
    ts.FromDatetime(row.created_at)
    directive = None
    if row.directive:
        d = row.directive
        directive = dpb.Directive(persona_id=d["persona_id"], action=d["action"], tone=d["tone"],
                                  source=directive_source_value(d["source"]), raw=d.get("raw", ""))
    g = row.guard or {}
    rejections = [dpb.ReplyRejection(persona_id=r.get("persona_id", ""), attempt=r.get("attempt", 0),
                                     reason=r.get("reason", ""), text=r.get("text", ""))
                  for r in g.get("rejections", [])] if include_think else []
    return dpb.Turn(index=row.idx, role=dpb.ROLE_USER if row.role == "user" else dpb.ROLE_AGENT,
                    persona_id=row.persona_id, directive=directive, adapter_version=row.adapter_version,
                    rejections=rejections, cut_reason=g.get("cut_reason", "") or "",
                    text=row.text, think=row.think if include_think else "", safety=row.safety, create_time=ts,
                    timings=dpb.TurnTimings(latency=duration(row.latency_s), first_token=duration(row.first_token_s),
                                            director=duration(row.director_s)))


def event(**kw: Any) -> cpb.ConversationEvent:
    """A ConversationEvent with one field set."""
    return cpb.ConversationEvent(**kw)


def _rpc_error(e: grpc.aio.AioRpcError, what: str) -> ServiceError:
    code = e.code()
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return DeadlineExceeded(f"the {what} did not answer before the deadline")
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        return InvalidArgument(f"the {what} rejected the request: {e.details()}")
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED and "larger than max" in (e.details() or ""):
        return FailedPrecondition(f"a request to the {what} is larger than server.max_message_bytes; lower "
                                  "dialogue.history_window_chars or raise the limit (a retry cannot succeed)")
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        return ResourceExhausted(f"the {what} is at capacity: {(e.details() or '')[:300]}; retry later")
    if code == grpc.StatusCode.UNAVAILABLE and e.details():
        return Unavailable(f"the {what} is unavailable: {e.details()[:300]}")
    return Unavailable(f"the {what} is unavailable ({code.name}); retry later")


def history_turn(catalog: PersonaCatalog, role: str, text: str, persona_id: str = "",
                 directive: dict | None = None) -> HistoryTurn:
    """A turn as the director and speakers see it; an agent turn carries the director's message that chose it
    (:func:`~mascot.core.dialogue.directive_message` of the stored directive dict: persona_id, action, tone,
    source, raw)."""
    text_d = ""
    if role == "agent" and directive:
        name = catalog.get(persona_id).name if persona_id in catalog.cards else persona_id
        text_d = directive_message(name, directive.get("action", ""), directive.get("tone", ""),
                                   directive.get("source", ""), directive.get("raw", ""))
    return HistoryTurn(role, text, persona_id, text_d)


@dataclass
class RoundState:
    """Mutable state of one running round or self-play session, with the outcomes the turn loop records (its
    generators yield events only)."""

    conv_id: str
    mode: str
    roster: list
    history: list[HistoryTurn]
    context: list[tuple[str, str]]
    round_key: str
    seed: int
    agent_turns: int = 0
    #: ``{persona_id | "director": adapter version}`` the conversation is pinned to ("" entries: service's choice).
    adapter_versions: dict = field(default_factory=dict)
    #: Risk categories the conversation is flagged with; non-empty turns on reply screening.
    safety_categories: set = field(default_factory=set)
    #: Stored index of ``history[0]``: the history holds the conversation's most recent turns only.
    first_index: int = 0
    #: Why the round ended (a key of :data:`REASONS`), set when the loop ends; "" while it runs.
    reason: str = ""
    #: Whether the last :meth:`TurnLoop.agent_turn` stored a turn (False: every persona it asked was refused).
    delivered: bool = False
    #: The safety gate's detection on the last simulated-user message, None when it had no risk.
    user_risk: Detection | None = None

    def next_index(self) -> int:
        """Stored index of the next turn."""
        return self.first_index + len(self.history)


@dataclass
class Reply:
    """Where :meth:`TurnLoop._speak` leaves the ``ReplyFinal`` of a GenerateReply stream once the stream ended."""

    final: spb.ReplyFinal | None = None


class TurnLoop:
    """Runs the turns of a round against the director and speaker services (the round around them:
    :class:`~mascot.gateway.round.RoundRunner`).

    Args:
        store: The conversation store.
        catalog: Persona cards.
        director: A ``DirectorServiceStub``.
        speaker: A ``SpeakerServiceStub``.
        cfg: :class:`~mascot.core.config.MascotConfig`.
        metrics: :class:`~mascot.core.metrics.Metrics`.
        safety: The :class:`~mascot.gateway.safety.SafetyGate`; built from ``cfg.safety`` when not given.

    Raises:
        ValueError: a bad ``safety`` config (see :class:`~mascot.gateway.safety.SafetyGate`).
    """

    def __init__(self, store: Store, catalog: PersonaCatalog, director: Any, speaker: Any, cfg: Any,
                 metrics: Any, safety: SafetyGate | None = None) -> None:
        self.store, self.catalog, self.director, self.speaker = store, catalog, director, speaker
        self.cfg, self.metrics = cfg, metrics
        self.safety = safety if safety is not None else SafetyGate(cfg.safety, catalog)
        metrics.declare(safety_categories=(*CATEGORIES, *SCREEN_CATEGORIES))

    def window(self, st: RoundState) -> list[HistoryTurn]:
        """The most recent turns of ``st.history`` within ``dialogue.history_window_turns`` and
        ``dialogue.history_window_chars`` (at least the latest turn): what the director and speakers are sent."""
        d = self.cfg.dialogue
        out: list[HistoryTurn] = []
        chars = 0
        for h in reversed(st.history[-d.history_window_turns:]):
            chars += len(h.text) + len(h.directive)
            if out and chars > d.history_window_chars:
                break
            out.append(h)
        return out[::-1]

    # ------------------------------------------------------------------ safety gate
    async def detect(self, text: str) -> Detection | None:
        """Risk in a user message (the classifier, when configured, runs in a worker thread). A message in a
        language the gate does not read is counted in ``mascot_safety_unread_total{language}``."""
        def run() -> tuple[Detection | None, str | None]:
            return self.safety.detect(text), self.safety.unread_language(text)

        detection, unread = await asyncio.to_thread(run) if self.safety.slow else run()
        if unread:
            self.metrics.safety_unread.labels(language=unread_label(unread)).inc()
        return detection

    def count_safety(self, categories: Any, tier: str | None = None) -> None:
        """Count stored safety events in ``mascot_safety_events_total{category}`` (after they are committed) and a
        user message's detection in ``mascot_safety_detections_total{tier}`` when ``tier`` is given."""
        for c in categories:
            self.metrics.safety_events.labels(category=c).inc()
        if tier is not None:
            self.metrics.safety_detections.labels(tier=tier).inc()

    async def safety_turn(self, st: RoundState, tier: str = "crisis") -> AsyncIterator[cpb.ConversationEvent]:
        """Yield the events of one safety turn: the fixed template (``tier`` crisis) or the check-in question
        (``tier`` check_in), delivered by the mode's safety persona, stored with ``safety`` true and directive
        source ``safety`` (no director or speaker call). Counted in ``mascot_safety_turns_total{tier}``."""
        t0 = time.perf_counter()
        pid = self.safety.persona_for(st.mode, [c.id for c in st.roster])
        d = self.safety.directive(pid, tier)
        index = st.next_index()
        yield event(turn_started=cpb.TurnStarted(index=index, role=dpb.ROLE_AGENT, directive=dpb.Directive(
            persona_id=pid, action=d["action"], tone=d["tone"], source=dpb.DIRECTIVE_SOURCE_SAFETY, raw="")))
        text = self.safety.safety_text() if tier == "crisis" else self.safety.check_in_text()
        yield event(turn_delta=cpb.TurnDelta(index=index, text=text))
        row = await self._store(st.conv_id, NewTurn(role="agent", text=text, persona_id=pid, directive=d,
                                                    safety=True, latency_s=time.perf_counter() - t0,
                                                    round_key=st.round_key))
        st.history.append(history_turn(self.catalog, "agent", text, pid, d))
        st.agent_turns += 1
        self.metrics.safety_turns.labels(tier=tier).inc()
        yield event(turn_completed=cpb.TurnCompleted(turn=turn_to_proto(row)))

    def _timeout(self, time_remaining: Callable[[], float | None] | None) -> float:
        t = self.cfg.server.call_timeout_s
        left = time_remaining() if time_remaining else None
        return min(t, left) if left is not None else t

    async def _store(self, conv_id: str, turn: NewTurn, retries: int = 0, fallbacks: int = 0,
                     safety_events: list[SafetyEvent] | None = None) -> TurnRow:
        return await asyncio.to_thread(self.store.append_turn, conv_id, turn, retries, fallbacks,
                                       safety_events or [])

    async def _speak(self, st: RoundState, index: int, request: spb.GenerateReplyRequest, reply: Reply,
                     deadline: Callable[[], float | None] | None) -> AsyncIterator[cpb.ConversationEvent]:
        """Forward speaker deltas as TurnDelta events; when the stream ends, its ReplyFinal goes to ``reply.final``.

        Raises:
            ServiceError: the speaker call failed (:func:`_rpc_error`), or Unavailable: its stream ended without a
                final reply.
        """
        final = None
        try:
            call = self.speaker.GenerateReply(request, timeout=self._timeout(deadline))
            async for msg in call:
                if msg.WhichOneof("event") == "delta":
                    yield event(turn_delta=cpb.TurnDelta(index=index, text=msg.delta.text))
                else:
                    final = msg.final
        except grpc.aio.AioRpcError as e:
            raise _rpc_error(e, "speaker service") from None
        if final is None:
            raise Unavailable("the speaker service ended the stream without a final reply; retry")
        reply.final = final

    async def _direct(self, st: RoundState, exclude: list[str], deadline: Callable[[], float | None] | None) -> Any:
        try:
            return await self.director.NextDirective(dirpb.NextDirectiveRequest(
                persona_ids=[c.id for c in st.roster], history=history_to_proto(self.window(st)),
                context=[dpb.ContextUtterance(speaker=s, content=c) for s, c in st.context],
                seed=st.seed + st.next_index() + 101 * len(exclude),
                adapter_version=st.adapter_versions.get("director", ""), exclude_persona_ids=exclude),
                timeout=self._timeout(deadline))
        except grpc.aio.AioRpcError as e:
            raise _rpc_error(e, "director service") from None

    async def agent_turn(self, st: RoundState, deadline: Callable[[], float | None] | None = None
                         ) -> AsyncIterator[cpb.ConversationEvent]:
        """Yield the events of one agent turn; ``st.delivered`` tells, once it is done, whether a turn was stored.

        The director names a persona and the speaker answers under the reply checks (it regenerates refused
        attempts itself). When the speaker refuses every attempt (``ReplyFinal.rejected``), the director is asked
        again with that persona excluded, up to ``guard.max_personas`` personas; then no turn is stored and the
        caller ends the round. Refused attempts are stored with the turn (or, when none follows, with the round).
        """
        t0 = time.perf_counter()
        st.delivered = False
        index = st.next_index()
        screening = bool(st.safety_categories)  # a flagged conversation: no reply text leaves before screening
        retries = fallbacks = 0
        director_s = 0.0
        excluded: list[str] = []
        rejections: list[dict] = []
        max_personas = min(self.cfg.guard.max_personas, len(st.roster))
        while len(excluded) < max_personas:
            resp = await self._direct(st, excluded, deadline)
            if not excluded:
                director_s = time.perf_counter() - t0
            retries += resp.retries
            fallbacks += 1 if resp.directive.source == dpb.DIRECTIVE_SOURCE_FALLBACK else 0
            directive = resp.directive
            pid = directive.persona_id
            yield event(turn_started=cpb.TurnStarted(index=index, role=dpb.ROLE_AGENT, directive=directive))
            req = spb.GenerateReplyRequest(
                persona_id=pid, directive=directive, history=history_to_proto(self.window(st)),
                context=[dpb.ContextUtterance(speaker=s, content=c) for s, c in st.context],
                roster_persona_ids=[c.id for c in st.roster], seed=st.seed * 7919 + index * 13 + len(excluded) * 2,
                adapter_version=st.adapter_versions.get(pid, ""))
            reply = Reply()
            async for ev in self._speak(st, index, req, reply, deadline):
                if not screening:
                    yield ev
            final = reply.final
            rejections += [{"persona_id": pid, "attempt": r.attempt, "reason": r.reason, "text": r.text}
                           for r in final.rejections]
            if final.rejected or not final.text.strip():
                excluded.append(pid)
                continue
            latency = time.perf_counter() - t0
            first = final.first_token.ToTimedelta().total_seconds()
            d = {"persona_id": pid, "action": directive.action, "tone": directive.tone,
                 "source": directive_source_name(directive.source), "raw": directive.raw}
            text, screened = final.text, None
            if screening:
                screened = self.safety.screen(text, st.safety_categories)
                if screened is not None:
                    text = self.safety.follow_up_text()
                yield event(turn_delta=cpb.TurnDelta(index=index, text=text))
            events = [SafetyEvent("reply_screened", screened.category, screened.rule)] if screened else []
            guard = ({"rejections": rejections, "cut_reason": final.cut_reason}
                     if rejections or final.cut_reason else None)
            row = await self._store(st.conv_id, NewTurn(
                role="agent", text=text, persona_id=pid, directive=d, adapter_version=final.adapter_version,
                think=final.think, safety=screened is not None, latency_s=latency, first_token_s=first,
                director_s=director_s, round_key=st.round_key, guard=guard), retries, fallbacks, events)
            if screened is not None:
                self.count_safety([screened.category])
            st.history.append(history_turn(self.catalog, "agent", text, pid, d))
            st.agent_turns += 1
            self.metrics.turn_duration.labels(pid, final.adapter_version).observe(latency)
            self.metrics.turn_first_token.labels(pid, final.adapter_version).observe(first)
            st.delivered = True
            yield event(turn_completed=cpb.TurnCompleted(turn=turn_to_proto(row)))
            return
        await asyncio.to_thread(self.store.add_director_counts, st.conv_id, retries, fallbacks, rejections,
                                st.round_key)

    async def user_turn(self, st: RoundState, user: dpb.UserSimulation,
                        deadline: Callable[[], float | None] | None = None) -> AsyncIterator[cpb.ConversationEvent]:
        """Yield the events of one simulated-user turn (nothing is stored when its reply is empty). The message goes
        through the safety gate like a live one; on risk its events are stored with it, counted, added to
        ``st.safety_categories``, and the :class:`~mascot.gateway.safety.Detection` is left in ``st.user_risk``
        (None otherwise)."""
        t0 = time.perf_counter()
        st.user_risk = None
        index = st.next_index()
        yield event(turn_started=cpb.TurnStarted(index=index, role=dpb.ROLE_USER))
        req = spb.GenerateReplyRequest(user_simulation=user, history=history_to_proto(self.window(st)),
                                       context=[dpb.ContextUtterance(speaker=s, content=c) for s, c in st.context],
                                       roster_persona_ids=[c.id for c in st.roster], seed=st.seed * 7919 + index * 13)
        reply = Reply()
        async for ev in self._speak(st, index, req, reply, deadline):
            yield ev
        final = reply.final
        if final is not None and final.text.strip():
            detection = await self.detect(final.text)
            rej = [{"persona_id": "", "attempt": r.attempt, "reason": r.reason, "text": r.text}
                   for r in final.rejections]
            guard = {"rejections": rej, "cut_reason": final.cut_reason} if rej or final.cut_reason else None
            row = await self._store(st.conv_id, NewTurn(
                role="user", text=final.text, think=final.think, adapter_version=final.adapter_version,
                latency_s=time.perf_counter() - t0, first_token_s=final.first_token.ToTimedelta().total_seconds(),
                round_key=st.round_key, guard=guard), safety_events=detection.events() if detection else None)
            st.history.append(HistoryTurn("user", final.text))
            if detection is not None:  # counted with the store write, before a client that leaves can stop us
                self.count_safety(detection.categories, detection.tier)
                if detection.tier == "crisis":
                    st.safety_categories.update(detection.categories)
                st.user_risk = detection
            yield event(turn_completed=cpb.TurnCompleted(turn=turn_to_proto(row)))

    async def agent_turns(self, st: RoundState, n: int, deadline: Callable[[], float | None] | None = None,
                          user: dpb.UserSimulation | None = None, user_speak_prob: float = 0.0
                          ) -> AsyncIterator[cpb.ConversationEvent]:
        """Run up to ``n`` agent turns; once done, ``st.reason`` is "completed", or "empty_replies" when a turn
        delivered nothing (the loop stops there).

        With a simulated ``user`` (self-play) the user speaks after each agent turn but the last with probability
        ``user_speak_prob`` (Bernoulli draws seeded with ``st.seed``); a simulated-user message with risk is
        answered by a safety turn and the loop ends (reason "safety")."""
        rng = random.Random(st.seed)
        for k in range(n):
            async for ev in self.agent_turn(st, deadline):
                yield ev
            if not st.delivered:
                st.reason = "empty_replies"
                return
            if user is not None and k < n - 1 and rng.random() < user_speak_prob:
                async for ev in self.user_turn(st, user, deadline):
                    yield ev
                if st.user_risk is not None and st.user_risk.tier == "check_in":
                    async for ev in self.safety_turn(st, "check_in"):
                        yield ev
                elif st.user_risk is not None:
                    async for ev in self.safety_turn(st):
                        yield ev
                    st.reason = "safety"
                    return
        st.reason = "completed"
