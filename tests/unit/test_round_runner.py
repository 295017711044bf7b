"""The round runner and the turn loop with in-process director and speaker stubs (no model, no gRPC server): the
streams carry ConversationEvents only, and what a turn or a round came to (delivered, end reason, a risky
simulated-user message) is read from the RoundState, the store and the metrics."""

from __future__ import annotations

import uuid

import pytest

from mascot.api.conversation.v1 import conversation_pb2 as cpb
from mascot.api.dialogue.v1 import dialogue_pb2 as dpb
from mascot.api.director.v1 import director_pb2 as dirpb
from mascot.api.speaker.v1 import speaker_pb2 as spb
from mascot.core.dialogue import HistoryTurn
from mascot.core.metrics import Metrics
from mascot.core.personas import PersonaCatalog
from mascot.gateway.round import RoundRunner
from mascot.gateway.store import Store
from mascot.gateway.turn_loop import RoundState, TurnLoop
from tests.helpers.config import make_config

ROSTER = ["anchor", "beacon", "catalyst"]
RISKY = "I want to end my life."


class Director:
    """NextDirective: the first roster persona not excluded."""

    def __init__(self):
        self.calls = 0

    async def NextDirective(self, req, timeout=None):
        self.calls += 1
        pid = next(p for p in req.persona_ids if p not in req.exclude_persona_ids)
        return dirpb.NextDirectiveResponse(directive=dpb.Directive(
            persona_id=pid, action="Ask one question.", tone="Curious", source=dpb.DIRECTIVE_SOURCE_MODEL))


class Speaker:
    """GenerateReply: ``agent`` for personas, ``user`` for the simulated user, streamed as two deltas and a final."""

    def __init__(self, agent="A reply here.", user="I see."):
        self.agent, self.user = agent, user

    def GenerateReply(self, req, timeout=None):
        text = self.user if req.HasField("user_simulation") else self.agent

        async def stream():
            half = len(text) // 2
            for part in (text[:half], text[half:]):
                yield spb.GenerateReplyResponse(delta=spb.ReplyDelta(text=part))
            yield spb.GenerateReplyResponse(final=spb.ReplyFinal(text=text, rejected=not text.strip()))
        return stream()


@pytest.fixture
def parts(tmp_path):
    cfg = make_config(tmp_path)
    store, catalog, metrics = Store(cfg.store.url), PersonaCatalog.load(cfg.personas.extra_files), Metrics()

    def make(speaker):
        loop = TurnLoop(store, catalog, Director(), speaker, cfg, metrics)
        return loop, RoundRunner(store, catalog, loop, cfg, metrics)

    def conversation():
        return store.create_conversation(str(uuid.uuid4()), "support", ROSTER, "", [])

    yield cfg, store, catalog, metrics, make, conversation
    store.engine.dispose()


def rounds(metrics, reason):
    return metrics.registry.get_sample_value("mascot_rounds_total", {"mode": "support", "reason": reason}) or 0


def active(metrics):
    return metrics.registry.get_sample_value("mascot_conversations_active", {"mode": "support"}) or 0


def kinds(events):
    return [e.WhichOneof("event") for e in events]


async def drain(stream):
    return [item async for item in stream]


async def test_empty_replies_end_the_loop_with_the_reason_on_the_state_and_only_events_in_the_stream(parts):
    cfg, store, catalog, _, make, conversation = parts
    loop, _ = make(Speaker(agent="   "))
    conv = conversation()
    _, user_row = store.start_round(conv.id, "k1", "Hello there.")
    st = RoundState(conv_id=conv.id, mode="support", roster=[catalog.get(i) for i in ROSTER],
                    history=[HistoryTurn("user", "Hello there.")], context=[], round_key="k1", seed=1,
                    first_index=user_row.idx)
    items = await drain(loop.agent_turns(st, 3))
    assert all(type(i) is cpb.ConversationEvent for i in items)
    # each of the guard.max_personas personas asked once (its deltas forwarded); nothing stored, so no TurnCompleted
    assert [k for k in kinds(items) if k != "turn_delta"] == ["turn_started"] * min(cfg.guard.max_personas,
                                                                                   len(ROSTER))
    assert (st.reason, st.delivered, st.agent_turns) == ("empty_replies", False, 0)
    assert store.count_turns(conv.id) == 1


async def test_a_stream_closed_right_after_round_started_is_counted_as_cancelled(parts):
    """The client goes away as soon as it has RoundStarted (the generator is closed at that first yield): the round
    is stored, counted once as ``cancelled`` and no longer active; before, a close at that point counted nothing."""
    _, store, _, metrics, make, conversation = parts
    _, runner = make(Speaker())
    conv = conversation()
    stream = runner.message(conv, [], "k1", "Hello there.")
    first = await stream.__anext__()
    assert first.WhichOneof("event") == "round_started" and active(metrics) == 1
    await stream.aclose()
    assert rounds(metrics, "cancelled") == 1 and active(metrics) == 0
    assert store.get_round(conv.id, "k1").state != "done"  # stored, unfinished: a retry with the key resumes it


async def test_a_round_of_empty_replies_is_stored_counted_and_completed_with_empty_replies(parts):
    _, store, _, metrics, make, conversation = parts
    _, runner = make(Speaker(agent=""))
    conv = conversation()
    events = await drain(runner.message(conv, [], "k1", "Hello there."))
    assert all(type(e) is cpb.ConversationEvent for e in events)
    assert kinds(events)[0] == "round_started" and kinds(events)[-1] == "round_completed"
    assert events[-1].round_completed.reason == cpb.ROUND_END_REASON_EMPTY_REPLIES
    assert events[-1].round_completed.agent_turns == 0
    rnd = store.get_round(conv.id, "k1")
    assert (rnd.state, rnd.reason, rnd.agent_turns) == ("done", "empty_replies", 0)
    assert rounds(metrics, "empty_replies") == 1 and active(metrics) == 0
    # a retry with the key replays the finished round, and is not counted again
    again = await drain(runner.message(conv, [], "k1", "Hello there."))
    assert again[0].round_started.replayed and again[-1].round_completed == events[-1].round_completed
    assert rounds(metrics, "empty_replies") == 1


async def test_delivered_turns_complete_the_round(parts):
    cfg, store, _, metrics, make, conversation = parts
    _, runner = make(Speaker())
    conv = conversation()
    events = await drain(runner.message(conv, [], "k1", "Hello there."))
    n = cfg.dialogue.agent_turns_per_round
    assert kinds(events) == ["round_started", *["turn_started", "turn_delta", "turn_delta", "turn_completed"] * n,
                             "round_completed"]
    assert events[-1].round_completed.reason == cpb.ROUND_END_REASON_COMPLETED
    assert events[-1].round_completed.agent_turns == n
    assert [e.turn_completed.turn.index for e in events if e.HasField("turn_completed")] == list(range(1, n + 1))
    assert store.get_round(conv.id, "k1").reason == "completed"
    assert rounds(metrics, "completed") == 1 and active(metrics) == 0


async def test_a_risky_simulated_user_is_recorded_on_the_state_and_answered_by_a_safety_turn(parts):
    _, store, catalog, _, make, conversation = parts
    loop, _ = make(Speaker(user=RISKY))
    conv = conversation()
    store.start_round(conv.id, "selfplay", "A rough week.")
    st = RoundState(conv_id=conv.id, mode="support", roster=[catalog.get(i) for i in ROSTER],
                    history=[HistoryTurn("user", "A rough week.")], context=[], round_key="selfplay", seed=3)
    items = await drain(loop.agent_turns(st, 4, user=dpb.UserSimulation(situation="A hard week."),
                                         user_speak_prob=1.0))
    assert all(type(i) is cpb.ConversationEvent for i in items)
    assert st.reason == "safety" and st.user_risk is not None
    assert st.safety_categories == set(st.user_risk.categories)
    done = [e.turn_completed.turn for e in items if e.HasField("turn_completed")]
    assert [(t.role, t.safety) for t in done] == [(dpb.ROLE_AGENT, False), (dpb.ROLE_USER, False),
                                                  (dpb.ROLE_AGENT, True)]
    assert st.agent_turns == 2


async def test_self_play_with_a_risky_opening_is_one_safety_turn(parts):
    _, store, _, metrics, make, conversation = parts
    _, runner = make(Speaker())
    conv = conversation()
    events = await drain(runner.self_play(conv, RISKY, dpb.UserSimulation(situation="A hard week."), 4, 1.0, 7))
    assert kinds(events) == ["round_started", "turn_started", "turn_delta", "turn_completed", "round_completed"]
    assert events[-1].round_completed.reason == cpb.ROUND_END_REASON_SAFETY
    assert events[-2].turn_completed.turn.safety
    assert store.get_round(conv.id, "selfplay").reason == "safety"
    assert rounds(metrics, "safety") == 1 and active(metrics) == 0


async def test_a_round_closed_mid_stream_is_counted_cancelled_once(parts):
    _, store, _, metrics, make, conversation = parts
    _, runner = make(Speaker())
    conv = conversation()
    stream = runner.message(conv, [], "k1", "Hello there.")
    seen = [await anext(stream), await anext(stream)]
    assert kinds(seen) == ["round_started", "turn_started"]
    assert active(metrics) == 1
    await stream.aclose()  # what the server does to a stream whose client went away
    assert rounds(metrics, "cancelled") == 1 and rounds(metrics, "failed") == 0 and active(metrics) == 0
    assert store.get_round(conv.id, "k1").state == "running"


@pytest.mark.parametrize("where", ["second_turn", "finish"])
async def test_a_full_disk_mid_round_says_which_turns_are_stored(parts, monkeypatch, where):
    """An ENOSPC ``OSError`` from the store after the message and one agent turn were stored (or after every turn,
    when the round's end is recorded): RESOURCE_EXHAUSTED (:class:`StoreFull`, with retry-after) whose message names
    what is stored and what is not, and the store holds exactly that."""
    import errno

    from mascot.gateway.store import StoreFull

    cfg, store, _, _, make, conversation = parts
    _, runner = make(Speaker())
    conv = conversation()
    append = store.append_turn

    def append_once(conv_id, turn, *a, **kw):
        if where == "second_turn" and store.count_turns(conv_id) == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        return append(conv_id, turn, *a, **kw)

    def no_finish(*a, **kw):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(store, "append_turn", append_once)
    if where == "finish":
        monkeypatch.setattr(store, "finish_round", no_finish)
    with pytest.raises(StoreFull) as err:
        await drain(runner.message(conv, [], "k1", "Hello there."))
    msg, n = err.value.message, cfg.dialogue.agent_turns_per_round
    assert err.value.retry_after_s == 60 and "nothing" not in msg
    if where == "second_turn":
        assert ("disk is full: your message is stored (turn 0) with the round's turns up to turn 1 (1 agent turn(s), "
                "each sent as TurnCompleted); turn 2, the one in progress, and the rest of the round were not stored"
                in msg), msg
        assert store.count_turns(conv.id) == 2
    else:
        assert (f"your message is stored (turn 0) with all {n} agent turn(s) of the round (each sent as "
                "TurnCompleted); only the round's end was not recorded" in msg), msg
        assert store.count_turns(conv.id) == 1 + n
    assert "retry with the same idempotency_key: it replays the stored turns and finishes the round" in msg
    assert store.get_round(conv.id, "k1").state == "running"


async def test_a_full_disk_before_the_message_is_stored_says_nothing_was(parts, monkeypatch):
    import errno

    from mascot.gateway.store import StoreFull

    _, store, _, _, make, conversation = parts
    _, runner = make(Speaker())
    conv = conversation()

    def full(*a, **kw):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(store, "start_round", full)
    with pytest.raises(StoreFull, match="nothing of this message was stored.*retry with the same idempotency_key"):
        await drain(runner.message(conv, [], "k1", "Hello there."))
    assert store.count_turns(conv.id) == 0
