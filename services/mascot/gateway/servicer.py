"""ConversationService: request validation, caller checks, admission control and the one-round-per-conversation
lock, then one call to :class:`~mascot.gateway.round.RoundRunner` per SendMessage or RunSelfPlay stream (which runs
the round: safety gate, store, turn loop, metrics); proto conversion of stored conversations."""

from __future__ import annotations

import asyncio
import re
import uuid
from contextlib import aclosing
from typing import Any, AsyncIterator

from mascot.api.conversation.v1 import conversation_pb2 as cpb
from mascot.api.conversation.v1 import conversation_pb2_grpc as cpb_grpc
from mascot.api.dialogue.v1 import dialogue_pb2 as dpb
from mascot.core.dialogue import CONTROL_CHARS, MAX_ROSTER, has_visible_text, roster_from_ids
from mascot.core.enums import enum_name
from mascot.core.errors import FailedPrecondition, InvalidArgument, NotFound, ResourceExhausted, Unavailable
from mascot.core.personas import PersonaCatalog
from mascot.gateway.round import SELF_PLAY_KEY, RoundRunner
from mascot.gateway.security import CallerAuth, RateLimiter, peer_host
from mascot.gateway.store import CLOSED_BY_MESSAGE, CLOSED_BY_RESTART, CLOSED_BY_STREAM, Store, text_digest
from mascot.gateway.turn_loop import TurnLoop, turn_to_proto

MODES = {n: enum_name(cpb.Mode, n) for n in cpb.Mode.values() if n != cpb.MODE_UNSPECIFIED}
MODE_VALUES = {v: k for k, v in MODES.items()}
MAX_KEY_CHARS = 128
MAX_PERSONA_ID_CHARS = 64

#: Most turns one GetConversation page holds (``page_size`` is capped here).
MAX_PAGE_TURNS = 1000


def _check_user_simulation(user: Any, max_chars: int) -> None:
    """Refuse a simulated user that cannot be used, before anything is stored (INVALID_ARGUMENT): a situation over
    ``max_chars`` code points (``dialogue.max_message_chars``; checked first, before any per-character work), one
    without visible text, control characters in the situation or emotion, an emotion over 64 characters, an MBTI
    type that is not four letters from E/I, S/N, T/F, J/P, or a Big Five level outside the TraitLevel enum."""
    from mascot.api.dialogue.v1 import dialogue_pb2 as dpb_
    from mascot.core.personas.personality import personality_text

    if len(user.situation) > max_chars:
        raise InvalidArgument(f"user.situation is longer than {max_chars} characters (dialogue.max_message_chars)")
    if not has_visible_text(user.situation):
        raise InvalidArgument("user.situation is required for the simulated user")
    _no_controls(user.situation, "user.situation")
    if len(user.emotion) > 64:
        raise InvalidArgument("user.emotion is longer than 64 characters (an EmpatheticDialogues label, or empty)")
    _no_controls(user.emotion, "user.emotion")
    if user.WhichOneof("personality") == "mbti":
        try:
            personality_text(mbti=user.mbti)
        except ValueError as e:
            raise InvalidArgument(f"user.mbti: {e}") from None
    elif user.WhichOneof("personality") == "big_five":
        levels = set(dpb_.TraitLevel.values())
        bad = [f.name for f, v in user.big_five.ListFields() if v not in levels]
        if bad:
            raise InvalidArgument(f"user.big_five.{bad[0]} is not a TraitLevel (TRAIT_LEVEL_LOW or TRAIT_LEVEL_HIGH)")


def _no_controls(text: str, field: str) -> str:
    m = CONTROL_CHARS.search(text)
    if m:
        raise InvalidArgument(f"{field} contains the control character U+{ord(m.group()):04X}; only tab, newline and "
                              "carriage return are allowed")
    return text


def _nonblank(text: str, field: str, limit: int) -> str:
    """Validate user text before any model work or storage: at most ``limit`` characters (code points; checked
    first, before any per-character work), at least one visible character
    (:func:`~mascot.core.dialogue.has_visible_text`), no control characters. Emoji, any script, right-to-left and
    combining text pass unchanged (stored verbatim, never normalised).

    Raises:
        InvalidArgument: over ``limit``, no visible text (empty, or only whitespace, control, format, private-use or
            non-characters), or a control character other than tab, newline and carriage return.
    """
    if len(text) > limit:
        raise InvalidArgument(f"{field} has {len(text)} characters; the limit is {limit} (dialogue.max_message_chars)")
    if not has_visible_text(text):
        raise InvalidArgument(f"the message has no visible text: {field} is empty or holds only whitespace, control, "
                              "format (zero-width), private-use or non-characters; send some words or emoji")
    return _no_controls(text, field)


class ConversationServicer(cpb_grpc.ConversationServiceServicer):
    """The gateway's public API.

    Args:
        store: Conversation store.
        catalog: Persona cards.
        loop: The :class:`TurnLoop` (holds the director and speaker stubs); rounds run on it through a
            :class:`~mascot.gateway.round.RoundRunner`.
        cfg: :class:`~mascot.core.config.MascotConfig`.
        metrics: :class:`~mascot.core.metrics.Metrics`.
        auth: Caller tokens; default from ``cfg.security`` (docs/security.md).
        limiter: Per-caller rate limit; default from ``cfg.security``.
        starts: Per-caller limit of new conversations; default from ``cfg.security``
            (:meth:`RateLimiter.conversations`).

    Raises:
        ValueError: ``security.caller_auth`` is on without readable tokens.
    """

    def __init__(self, store: Store, catalog: PersonaCatalog, loop: TurnLoop, cfg: Any, metrics: Any, *,
                 auth: CallerAuth | None = None, limiter: RateLimiter | None = None,
                 starts: RateLimiter | None = None) -> None:
        self.store, self.catalog, self.loop, self.cfg, self.metrics = store, catalog, loop, cfg, metrics
        self.rounds = RoundRunner(store, catalog, loop, cfg, metrics)
        self.auth = auth if auth is not None else CallerAuth.from_config(cfg.security)
        self.limiter = limiter if limiter is not None else RateLimiter.from_config(cfg.security)
        self.starts = starts if starts is not None else RateLimiter.conversations(cfg.security)
        # conversation id -> (idempotency key, text digest) of the round in progress
        self._running: dict[str, tuple[str, str]] = {}
        # SendMessage / RunSelfPlay streams admitted and not finished (limits.max_active_rounds)
        self._active_rounds = 0
        self._caller_rounds: dict[str, int] = {}  # the same per caller key (limits.max_rounds_per_caller)
        self.pinner = None
        if cfg.adapters.store:  # new conversations are pinned from the registry, or its last good copy
            from mascot.core.adapters.reconcile import VersionPinner

            self.pinner = VersionPinner(cfg.adapters.store, cfg.adapters)

    # ------------------------------------------------------------------ helpers
    def _gate(self, context: Any, limited: bool = False) -> str:
        """Authenticate the call and, for ``limited`` calls (those that store), spend one call of the caller's rate
        limit (keyed by the caller id, or the peer address without caller tokens) before anything is read or
        stored. Returns the caller id ("" without caller tokens).

        Raises:
            Unauthenticated / PermissionDenied: a missing or unknown caller token.
            RateLimited: over the caller's rate limit (RESOURCE_EXHAUSTED with ``retry-after``).
        """
        caller = self.auth.authenticate(context)
        if limited and self.limiter.enabled:
            self.limiter.take(self._caller_key(caller, context))
        return caller

    def running_conversations(self) -> set[str]:
        """Ids of the conversations with a round running in this process (the retention sweep skips them)."""
        return set(self._running)

    async def _conversation(self, conv_id: str, context: Any = None, **window: Any) -> tuple[Any, list]:
        """The conversation and its turns (``window``: :meth:`Store.get_conversation`'s ``tail``, ``start``,
        ``limit``). With caller tokens on, a conversation of another caller is NOT_FOUND exactly as an unknown one
        (ids do not leak)."""
        if not conv_id:
            raise InvalidArgument("conversation_id is empty")
        if len(conv_id) > MAX_KEY_CHARS or CONTROL_CHARS.search(conv_id):  # cannot exist; never sent to the database
            raise NotFound("conversation_id names no conversation (StartConversation creates one)")
        found = await asyncio.to_thread(self.store.get_conversation, conv_id, **window)
        if found is None or (self.auth.enabled and found[0].owner != self.auth.authenticate(context)):
            raise NotFound(f"conversation {conv_id[:64]!r} does not exist (StartConversation creates one)")
        return found

    def _default_roster(self, mode: str) -> list[str]:
        active = self.cfg.personas.active_support if mode == "support" else self.cfg.personas.active_meeting
        return list(active) or [c.id for c in self.catalog.in_set(mode)]

    def _conv_proto(self, conv: Any, turns: list, include_think: bool = False) -> cpb.Conversation:
        from google.protobuf.timestamp_pb2 import Timestamp

        ts = Timestamp()
        ts.FromDatetime(conv.created_at)
        return cpb.Conversation(id=conv.id, mode=MODE_VALUES[conv.mode], persona_ids=conv.persona_ids,
                                source_id=conv.source_id,
                                context=[dpb.ContextUtterance(speaker=s, content=c) for s, c in conv.context],
                                turns=[turn_to_proto(t, include_think) for t in turns], create_time=ts,
                                adapter_versions=conv.adapter_versions, safety_flagged=bool(conv.safety_flagged),
                                safety_categories=list(conv.safety_categories or []))

    def _caller_key(self, caller: str, context: Any) -> str:
        """Who a call counts against (the rate limit, ``limits.max_rounds_per_caller``): the caller id, or the peer
        address without caller tokens."""
        return f"caller:{caller}" if self.auth.enabled else f"peer:{peer_host(context)}"

    def _admit(self, key: str) -> None:
        """Admission control: take one of ``limits.max_active_rounds`` round slots, and one of the caller's
        ``limits.max_rounds_per_caller``, or refuse with RESOURCE_EXHAUSTED (the boundary adds ``retry-after``) before
        anything is read or stored. The caller releases them with :meth:`_release` in a ``finally``."""
        cap, per = self.cfg.limits.max_active_rounds, self.cfg.limits.max_rounds_per_caller
        if self._active_rounds >= cap:
            raise ResourceExhausted(f"the gateway is running its limit of {cap} rounds at once; retry later (the "
                                    "retry-after metadata gives the seconds)")
        if self._caller_rounds.get(key, 0) >= per:
            raise ResourceExhausted(f"this caller already runs {per} rounds at once (limits.max_rounds_per_caller); "
                                    "retry when one ends (the retry-after metadata gives the seconds)")
        self._active_rounds += 1
        self._caller_rounds[key] = self._caller_rounds.get(key, 0) + 1

    def _release(self, key: str) -> None:
        self._active_rounds -= 1
        left = self._caller_rounds.get(key, 1) - 1
        if left > 0:
            self._caller_rounds[key] = left
        else:
            self._caller_rounds.pop(key, None)

    def _acquire(self, conv_id: str, key: str, text: str | None) -> None:
        """Mark the round of ``key`` running on ``conv_id`` in this process (``text`` None: self-play, which has no
        idempotency key of the caller's).

        Raises:
            InvalidArgument: the round of this key is running with another text (a retry could never succeed).
            Unavailable: the round of this key is running (a retry with the same key, once it ends, replays it).
            FailedPrecondition: a round of another key, or self-play, is running on this conversation.
        """
        held = self._running.get(conv_id)
        if held is not None and text is None:
            raise FailedPrecondition("self-play or a message is already running on this conversation")
        if held is not None and held[0] == key:
            if held[1] != text_digest(text):
                raise InvalidArgument("idempotency_key was already used with a different text; use a new key")
            raise Unavailable("this message is still being answered; retry with the same idempotency key")
        if held is not None:
            raise FailedPrecondition("another message of this conversation is being answered; wait for its "
                                     "RoundCompleted event")
        self._running[conv_id] = (key, text_digest(text or ""))

    async def _self_play_refusal(self, conv_id: str) -> str:
        """Why RunSelfPlay cannot run on a conversation that has turns, and what to do: a self-play run that was
        interrupted (by a gateway restart, its stream ending early, or a message) cannot be resumed."""
        fresh = "run self-play on a new conversation (StartConversation)"
        if conv_id in self._running:
            return "self-play or a message is already running on this conversation"
        rnd = await asyncio.to_thread(self.store.get_round, conv_id, SELF_PLAY_KEY)
        if rnd is None:
            return "self-play needs a conversation without turns; start a new one"
        if rnd.state == "running":
            return ("self-play on this conversation has not finished: another gateway process runs it, or that "
                    "process stopped (a gateway start then closes it as interrupted); its stored turns stay "
                    f"(GetConversation shows them); self-play cannot be resumed: {fresh}")
        if rnd.reason == "interrupted":
            why = {CLOSED_BY_RESTART: "the gateway stopped before the run finished",
                   CLOSED_BY_STREAM: "its stream ended before the run finished",
                   CLOSED_BY_MESSAGE: "a message was sent to the conversation"}.get(rnd.closed_by, "it did not finish")
            return (f"self-play on this conversation was interrupted ({why}) after {rnd.agent_turns} agent turn(s) "
                    "and cannot be resumed; its stored turns stay (GetConversation shows them, and the round ended "
                    f"with ROUND_END_REASON_INTERRUPTED); {fresh}")
        return f"self-play already ran on this conversation (it ended: {rnd.reason}); {fresh}"

    # ------------------------------------------------------------------ RPCs
    def _start_fields(self, request: cpb.StartConversationRequest, mode: str) -> tuple[list[str], list]:
        """The roster and context of a StartConversation whose entry counts are already within their limits: the
        per-entry checks (run in a worker thread, off the event loop).

        Raises:
            InvalidArgument: a persona id that is too long, unknown or not usable in ``mode``; a control character in
                ``source_id`` or the context; a context over ``dialogue.max_context_chars`` characters.
        """
        if any(len(i) > MAX_PERSONA_ID_CHARS for i in request.persona_ids):
            raise InvalidArgument(f"a persona id is longer than {MAX_PERSONA_ID_CHARS} characters; ListPersonas shows "
                                  "the known ids")
        ids = list(request.persona_ids) or self._default_roster(mode)
        for card in roster_from_ids(self.catalog, ids):
            why = self.catalog.unusable_reason(card, mode)
            if why is not None:
                raise InvalidArgument(f"{why}; ListPersonas with this mode shows the personas it takes")
        _no_controls(request.source_id, "source_id")
        ctx = [(_no_controls(c.speaker, "context speaker"), _no_controls(c.content, "context content"))
               for c in request.context]
        chars = sum(len(s) + len(c) for s, c in ctx)
        if chars > self.cfg.dialogue.max_context_chars:
            raise InvalidArgument(f"context has {chars} characters; the limit is {self.cfg.dialogue.max_context_chars} "
                                  "(dialogue.max_context_chars)")
        return ids, ctx

    async def StartConversation(self, request: cpb.StartConversationRequest, context: Any
                                ) -> cpb.StartConversationResponse:
        """Create a conversation. Counts (persona ids, context entries, ``source_id`` length) are checked first; the
        per-entry checks run in a worker thread; then one of the caller's ``security.conversations_per_minute`` is
        spent (RESOURCE_EXHAUSTED with ``retry-after`` when none is left) before anything is stored."""
        owner = self._gate(context, limited=True)
        if request.mode not in MODES:
            raise InvalidArgument("mode must be MODE_SUPPORT or MODE_MEETING")
        mode = MODES[request.mode]
        if len(request.persona_ids) > MAX_ROSTER:
            raise InvalidArgument(f"persona_ids has {len(request.persona_ids)} entries; at most {MAX_ROSTER}")
        if len(request.context) > self.cfg.dialogue.max_context_entries:
            raise InvalidArgument(f"context has {len(request.context)} entries; the limit is "
                                  f"{self.cfg.dialogue.max_context_entries} (dialogue.max_context_entries)")
        if len(request.source_id) > 256:
            raise InvalidArgument("source_id is longer than 256 characters")
        ids, ctx = await asyncio.to_thread(self._start_fields, request, mode)
        if self.starts.enabled:
            self.starts.take(self._caller_key(owner, context))
        conv_id = str(uuid.uuid4())
        pinned = {}
        if self.pinner is not None:  # pin this conversation's versions now; promotes later do not move it
            pinned = await asyncio.to_thread(self.pinner.pin, [*ids, "director"], conv_id)
        conv = await asyncio.to_thread(self.store.create_conversation, conv_id, mode, ids, request.source_id, ctx,
                                       pinned, owner)
        return cpb.StartConversationResponse(conversation=self._conv_proto(conv, []))

    async def SendMessage(self, request: cpb.SendMessageRequest, context: Any
                          ) -> AsyncIterator[cpb.SendMessageResponse]:
        who = self._caller_key(self._gate(context, limited=True), context)
        key = request.idempotency_key
        if not key or len(key) > MAX_KEY_CHARS:
            raise InvalidArgument(f"idempotency_key must be 1 to {MAX_KEY_CHARS} characters")
        _no_controls(key, "idempotency_key")
        text = _nonblank(request.text, "text", self.cfg.dialogue.max_message_chars)
        self._admit(who)
        try:
            conv, turns = await self._conversation(request.conversation_id, context,
                                                   tail=self.cfg.dialogue.history_window_turns)
            self._acquire(conv.id, key, text)
            deadline = context.time_remaining if context is not None else None
            try:
                async with aclosing(self.rounds.message(conv, turns, key, text, deadline)) as events:
                    async for ev in events:
                        yield cpb.SendMessageResponse(event=ev)
            finally:
                self._running.pop(conv.id, None)
        finally:
            self._release(who)

    async def RunSelfPlay(self, request: cpb.RunSelfPlayRequest, context: Any
                          ) -> AsyncIterator[cpb.RunSelfPlayResponse]:
        who = self._caller_key(self._gate(context, limited=True), context)
        opening = _nonblank(request.opening_text, "opening_text", self.cfg.dialogue.max_message_chars)
        if not request.HasField("user"):
            raise InvalidArgument("user.situation is required for the simulated user")
        _check_user_simulation(request.user, self.cfg.dialogue.max_message_chars)
        n = request.agent_turns or self.cfg.selfplay.agent_turns
        if not 1 <= n <= 64:
            raise InvalidArgument(f"agent_turns must be 1 to 64, got {request.agent_turns}")
        p = request.user_speak_prob if request.HasField("user_speak_prob") else self.cfg.selfplay.user_speak_prob
        if not 0.0 <= p <= 1.0:
            raise InvalidArgument(f"user_speak_prob must be in [0, 1], got {p}")
        self._admit(who)
        try:
            conv, turns = await self._conversation(request.conversation_id, context, tail=1)
            if turns:
                raise FailedPrecondition(await self._self_play_refusal(conv.id))
            self._acquire(conv.id, SELF_PLAY_KEY, None)
            try:
                async with aclosing(self.rounds.self_play(conv, opening, request.user, n, p, request.seed,
                                                          context.time_remaining)) as events:
                    async for ev in events:
                        yield cpb.RunSelfPlayResponse(event=ev)
            finally:
                self._running.pop(conv.id, None)
        finally:
            self._release(who)

    async def GetConversation(self, request: cpb.GetConversationRequest, context: Any) -> cpb.GetConversationResponse:
        self._gate(context)
        if request.page_size < 0:
            raise InvalidArgument("page_size must not be negative")
        start = 0
        if request.page_token:
            if not re.fullmatch(r"[0-9]{1,12}", request.page_token):
                raise InvalidArgument("page_token is not a next_page_token of GetConversation")
            start = int(request.page_token)
        size = min(request.page_size or MAX_PAGE_TURNS, MAX_PAGE_TURNS)
        conv, rows = await self._conversation(request.conversation_id, context, start=start, limit=size + 1)
        proto = self._conv_proto(conv, [], request.include_think)
        budget = self.cfg.server.max_message_bytes // 2 - proto.ByteSize()  # half the limit: headroom for framing
        more = len(rows) > size
        for row in rows[:size]:
            t = turn_to_proto(row, request.include_think)
            budget -= t.ByteSize() + 8
            if budget < 0 and proto.turns:
                more = True
                break
            proto.turns.append(t)
        next_token = str(proto.turns[-1].index + 1) if more and proto.turns else ""
        return cpb.GetConversationResponse(conversation=proto, director_retries=conv.director_retries,
                                           director_fallbacks=conv.director_fallbacks, next_page_token=next_token)

    async def DeleteConversation(self, request: cpb.DeleteConversationRequest, context: Any
                                 ) -> cpb.DeleteConversationResponse:
        """Erase the conversation with every turn, round and safety event (docs/security.md)."""
        self._gate(context)
        conv, _ = await self._conversation(request.conversation_id, context, tail=1)
        if conv.id in self._running:
            raise FailedPrecondition("a round of this conversation is running; delete it after RoundCompleted")
        await asyncio.to_thread(self.store.delete_conversation, conv.id)
        return cpb.DeleteConversationResponse()

    async def ListPersonas(self, request: cpb.ListPersonasRequest, context: Any) -> cpb.ListPersonasResponse:
        self._gate(context)
        if request.mode and request.mode not in MODES:
            raise InvalidArgument(f"unknown mode {request.mode}")
        cards = self.catalog.servable(MODES[request.mode] if request.mode else None)
        return cpb.ListPersonasResponse(personas=[dpb.Persona(
            id=c.id, name=c.name, role=c.role, goal=c.goal, default_tone=c.default_tone, persona_set=c.persona_set,
            max_answer_words=c.max_answer_words) for c in cards])
