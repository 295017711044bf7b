"""The safety gate through the real gRPC API (servers on 127.0.0.1:0): safety turns in live chat and self-play, the
persistent flag (GetConversation), reply screening, stored events and the metric (docs/safety.md)."""

from __future__ import annotations

import re

import pytest

from mascot.api.conversation.v1 import conversation_pb2 as cpb
from mascot.api.dialogue.v1 import dialogue_pb2 as dpb
from mascot.core.config import SafetyConfig
from mascot.core.personas import PersonaCatalog
from mascot.gateway import languages
from mascot.gateway.safety import CHECKIN_ACTION, SAFETY_ACTION, SafetyGate
from mascot.app.stack import start_stack
from tests.helpers import dialogue
from tests.helpers.config import make_config
from tests.helpers.engine import ScriptedEngine
from tests.helpers.rpc import collect

pytestmark = pytest.mark.integration

DIRECTOR = "Agent: The Catalyst\nAction: Ask one question.\nTone: Curious"
SECRECY = re.compile(r"secret|between us|between you and me|won't tell|confidential", re.I)
#: The gate as the stacks below build it (default ``safety`` config): the expected texts.
GATE = SafetyGate(SafetyConfig(), PersonaCatalog.load())


class Client(dialogue.Client):
    """The shared gateway client, plus self-play, the safety metric and the stored safety events."""

    async def get(self, conv_id):
        return (await super().get(conv_id)).conversation

    async def self_play(self, conv_id, opening, **kw):
        kw.setdefault("user", dpb.UserSimulation(situation="A hard week.", emotion="sad"))
        return await collect(self.stub.RunSelfPlay(cpb.RunSelfPlayRequest(conversation_id=conv_id,
                                                                          opening_text=opening, **kw)))

    def metric(self, category: str) -> float:
        return self.stack.metrics.registry.get_sample_value("mascot_safety_events_total",
                                                            {"category": category}) or 0.0

    def events(self, conv_id):
        return self.stack.store.safety_events(conv_id)


class Scripted:
    """Scripted director and speaker; ``reply`` and ``user_reply`` can be changed between rounds."""

    def __init__(self, reply="A reply.", user_reply="I see."):
        self.reply, self.user_reply = reply, user_reply

    def speaker(self, prompt: str) -> str:
        user_sim = prompt.startswith("<|system|>You are chatting with a few supportive helpers")
        return self.user_reply if user_sim else self.reply


@pytest.fixture
async def scripted(tmp_path):
    script = Scripted()
    eng = ScriptedEngine(lambda p: DIRECTOR, script.speaker)
    stack = await start_stack(make_config(tmp_path, safety={"classifier": "minilm"}), engine=eng)
    client = Client(stack)
    client.script, client.engine = script, eng
    yield client
    await client.ch.close()
    await stack.stop(0)


def kinds(events):
    return [e.WhichOneof("event") for e in events]


def agent_turns(events):
    return [e.turn_completed.turn for e in events if e.HasField("turn_completed")
            and e.turn_completed.turn.role == dpb.ROLE_AGENT]


def deltas(events, index):
    return "".join(e.turn_delta.text for e in events if e.HasField("turn_delta") and e.turn_delta.index == index)


def director_calls(engine):
    return sum(1 for r in engine.requests if "You are the director" in r.prompt)


async def test_risky_message_gets_one_safety_turn_and_the_round_ends(scripted):
    conv = await scripted.start()
    before = scripted.metric("suicide")
    events = await scripted.send(conv.id, "I want to kill myself.")
    assert kinds(events) == ["round_started", "turn_started", "turn_delta", "turn_completed", "round_completed"]
    started = events[1].turn_started
    assert started.role == dpb.ROLE_AGENT and started.index == 1
    assert started.directive.persona_id == "anchor" and started.directive.source == dpb.DIRECTIVE_SOURCE_SAFETY
    assert started.directive.raw == "" and started.directive.action == SAFETY_ACTION
    turn = events[3].turn_completed.turn
    assert turn.safety and turn.persona_id == "anchor" and turn.directive.source == dpb.DIRECTIVE_SOURCE_SAFETY
    assert turn.text == GATE.safety_text() == deltas(events, 1)
    assert "Thank you for telling me" in turn.text  # acknowledges
    assert "call your local emergency number" in turn.text and "988" in turn.text and "116 123" in turn.text
    assert "someone you trust" in turn.text  # encourages reaching a person
    assert not SECRECY.search(turn.text)  # never promises secrecy
    done = events[-1].round_completed
    assert done.reason == cpb.ROUND_END_REASON_SAFETY and done.agent_turns == 1
    assert scripted.engine.requests == []  # neither the director nor a speaker ran
    assert scripted.metric("suicide") == before + 1


async def test_safety_event_is_stored_with_the_flag_and_without_user_text(scripted):
    conv = await scripted.start()
    await scripted.send(conv.id, "I've been cutting myself and I want to die.")
    got = await scripted.get(conv.id)
    assert got.safety_flagged and list(got.safety_categories) == ["suicide", "self_harm"]
    assert [t.safety for t in got.turns] == [False, True]  # the gate's own turn is the safety turn
    rows = scripted.events(conv.id)
    # the rules and the trained detector agree (the detector's probability is the evidence, never the text)
    assert [(r.kind, r.category, r.turn_idx, r.detector) for r in rows] == [
        ("user_risk", "suicide", 0, "rules+classifier"), ("user_risk", "self_harm", 0, "rules+classifier")]
    assert all(r.rules and "cutting" not in r.rules.replace("cutting_again", "") for r in rows)


async def test_metric_counts_each_category_once_per_message(scripted):
    conv = await scripted.start()
    before = {c: scripted.metric(c) for c in ("abuse", "harm_to_others", "eating_disorder")}
    await scripted.send(conv.id, "My husband hits me and I want to kill him.")
    await scripted.send(conv.id, "I make myself throw up after every meal.", key="k2")
    assert scripted.metric("abuse") == before["abuse"] + 1
    assert scripted.metric("harm_to_others") == before["harm_to_others"] + 1
    assert scripted.metric("eating_disorder") == before["eating_disorder"] + 1
    # first-found order; categories found in one message in CATEGORIES order
    assert list((await scripted.get(conv.id)).safety_categories) == ["harm_to_others", "abuse", "eating_disorder"]


async def test_flag_persists_after_retraction_and_later_replies_are_screened(scripted):
    conv = await scripted.start()
    await scripted.send(conv.id, "I don't want to be alive anymore.")
    scripted.script.reply = "Honestly, you're overreacting."
    before = scripted.metric("reply_dismissive")
    events = await scripted.send(conv.id, "Just kidding, I'm fine. Forget I said that.", key="k2")
    assert events[-1].round_completed.reason == cpb.ROUND_END_REASON_COMPLETED
    turns = agent_turns(events)
    assert len(turns) == 3 and director_calls(scripted.engine) >= 3  # a normal round, director included
    assert all(t.safety and t.text == GATE.follow_up_text() for t in turns)
    assert all("overreacting" not in e.turn_delta.text for e in events if e.HasField("turn_delta"))
    for t in turns:
        assert deltas(events, t.index) == t.text  # the screened text is the only text sent
    assert scripted.metric("reply_dismissive") == before + 3
    got = await scripted.get(conv.id)
    assert got.safety_flagged and list(got.safety_categories) == ["suicide"]  # the retraction did not clear it
    scripted.script.reply = "That sounds like a lot to hold. I'm here."
    events = await scripted.send(conv.id, "Thanks for listening.", key="k3")
    turns = agent_turns(events)
    assert [t.text for t in turns] == ["That sounds like a lot to hold. I'm here."] * 3
    assert not any(t.safety for t in turns)
    assert (await scripted.get(conv.id)).safety_flagged
    kinds_stored = [(r.kind, r.category) for r in scripted.events(conv.id)]
    assert kinds_stored == [("user_risk", "suicide")] + [("reply_screened", "reply_dismissive")] * 3


async def test_diet_advice_is_replaced_after_an_eating_disorder_disclosure(scripted):
    scripted.script.reply = "Try counting calories and skipping dinner for a while."
    control = await scripted.start()
    plain = agent_turns(await scripted.send(control.id, "I had a long day at work."))
    assert plain[0].text == "Try counting calories and skipping dinner for a while." and not plain[0].safety

    conv = await scripted.start()
    await scripted.send(conv.id, "I've been starving myself to lose weight.")
    before = scripted.metric("reply_diet_advice")
    events = await scripted.send(conv.id, "What should I do?", key="k2")
    turns = agent_turns(events)
    assert len(turns) == 3 and all(t.safety and t.text == GATE.follow_up_text() for t in turns)
    assert all("calories" not in e.turn_delta.text for e in events if e.HasField("turn_delta"))
    assert scripted.metric("reply_diet_advice") == before + 3
    stored = (await scripted.get(conv.id)).turns
    assert [t.text for t in stored[-3:]] == [t.text for t in turns]
    screened = [r for r in scripted.events(conv.id) if r.kind == "reply_screened"]
    assert [(r.category, r.turn_idx) for r in screened] == [("reply_diet_advice", i) for i in (3, 4, 5)]

    other = await scripted.start()  # diet talk is screened only after an eating-disorder disclosure
    await scripted.send(other.id, "I want to kill myself.")
    turns = agent_turns(await scripted.send(other.id, "ok", key="k2"))
    assert turns[0].text == "Try counting calories and skipping dinner for a while." and not turns[0].safety


async def test_idioms_and_denials_are_not_flagged_and_masked_intent_is(scripted):
    conv = await scripted.start()
    before = scripted.metric("suicide")
    for i, idiom in enumerate(["This commute is killing me.", "I could kill for a coffee.", "I'm dying to see it."]):
        events = await scripted.send(conv.id, idiom, key=f"i{i}")
        assert events[-1].round_completed.reason == cpb.ROUND_END_REASON_COMPLETED
    assert not (await scripted.get(conv.id)).safety_flagged and scripted.metric("suicide") == before
    # a plain denial is a look-alike (docs/safety.md); a denial that carries the plan is not
    events = await scripted.send(conv.id, "I would never kill myself, but I'm exhausted.", key="neg")
    assert events[-1].round_completed.reason == cpb.ROUND_END_REASON_COMPLETED
    events = await scripted.send(conv.id, "I'm not going to do anything stupid. The pills are just counted out, that's "
                                          "all.", key="masked")
    assert events[-1].round_completed.reason == cpb.ROUND_END_REASON_SAFETY


async def test_third_person_risk_is_flagged(scripted):
    conv = await scripted.start()
    events = await scripted.send(conv.id, "My friend told me she wants to kill herself.")
    assert events[-1].round_completed.reason == cpb.ROUND_END_REASON_SAFETY
    assert list((await scripted.get(conv.id)).safety_categories) == ["suicide"]


async def test_safety_persona_per_mode_and_for_a_roster_without_it(scripted):
    meeting = await scripted.start(mode=cpb.MODE_MEETING)
    turn = agent_turns(await scripted.send(meeting.id, "Honestly I want to kill myself after this meeting."))[0]
    assert turn.persona_id == "minutes_scribe" and turn.safety
    small = await scripted.start(persona_ids=["catalyst", "beacon"])
    turn = agent_turns(await scripted.send(small.id, "My dad beats me."))[0]
    assert turn.persona_id == "catalyst" and turn.directive.source == dpb.DIRECTIVE_SOURCE_SAFETY


async def test_retry_of_a_safety_round_is_replayed_and_not_counted_twice(scripted):
    conv = await scripted.start()
    first = await scripted.send(conv.id, "I want to end my life.")
    after_first = scripted.metric("suicide")
    again = await scripted.send(conv.id, "I want to end my life.")
    assert again[0].round_started.replayed
    assert [t.text for t in agent_turns(again)] == [t.text for t in agent_turns(first)]
    assert again[-1].round_completed.reason == cpb.ROUND_END_REASON_SAFETY
    assert scripted.metric("suicide") == after_first and len(scripted.events(conv.id)) == 1
    assert len((await scripted.get(conv.id)).turns) == 2


async def test_interrupted_safety_round_resumes_with_the_safety_turn(scripted):
    conv = await scripted.start()
    text = "I keep thinking about going to sleep and never waking up."
    detection = GATE.detect(text)
    scripted.stack.store.start_round(conv.id, "k1", text, detection.events())  # the gateway died right here
    events = await scripted.send(conv.id, text)
    assert events[0].round_started.replayed
    assert [t.safety for t in agent_turns(events)] == [True]
    assert events[-1].round_completed.reason == cpb.ROUND_END_REASON_SAFETY
    assert director_calls(scripted.engine) == 0


async def test_self_play_risky_opening_gets_a_safety_turn(scripted):
    conv = await scripted.start()
    before = scripted.metric("suicide")
    events = await scripted.self_play(conv.id, "I want to end my life.", agent_turns=4, user_speak_prob=1.0)
    turns = agent_turns(events)
    assert len(turns) == 1 and turns[0].safety and turns[0].persona_id == "anchor"
    assert turns[0].directive.source == dpb.DIRECTIVE_SOURCE_SAFETY
    assert events[-1].round_completed.reason == cpb.ROUND_END_REASON_SAFETY
    assert events[-1].round_completed.agent_turns == 1
    assert scripted.engine.requests == [] and scripted.metric("suicide") == before + 1
    got = await scripted.get(conv.id)
    assert got.safety_flagged and [t.role for t in got.turns] == [dpb.ROLE_USER, dpb.ROLE_AGENT]


async def test_self_play_simulated_user_risk_ends_the_run_with_a_safety_turn(scripted):
    scripted.script.user_reply = "Honestly, I just want to die."
    conv = await scripted.start()
    events = await scripted.self_play(conv.id, "I had a rough week.", agent_turns=4, user_speak_prob=1.0)
    got = await scripted.get(conv.id)
    roles = [t.role for t in got.turns]
    assert roles == [dpb.ROLE_USER, dpb.ROLE_AGENT, dpb.ROLE_USER, dpb.ROLE_AGENT]
    assert not got.turns[1].safety and got.turns[3].safety and got.turns[3].persona_id == "anchor"
    assert events[-1].round_completed.reason == cpb.ROUND_END_REASON_SAFETY
    assert events[-1].round_completed.agent_turns == 2
    assert got.safety_flagged and list(got.safety_categories) == ["suicide"]
    assert [(r.kind, r.turn_idx) for r in scripted.events(conv.id)] == [("user_risk", 2)]


async def test_delete_conversation_erases_its_safety_events(scripted):
    conv = await scripted.start()
    await scripted.send(conv.id, "My boyfriend chokes me during fights.")
    assert scripted.events(conv.id)
    await scripted.stub.DeleteConversation(cpb.DeleteConversationRequest(conversation_id=conv.id))
    assert scripted.events(conv.id) == []


async def test_live_stack_with_the_tiny_model(engine, tmp_path):
    """The tiny random model end to end: safety turn, retraction, flag kept, screened rounds stream only the
    screened text; and self-play with a risky opening."""
    stack = await start_stack(make_config(tmp_path), engine=engine)
    client = Client(stack)
    try:
        conv = await client.start(persona_ids=["anchor", "catalyst", "beacon"])
        events = await client.send(conv.id, "i wanna k1ll myself")
        assert events[-1].round_completed.reason == cpb.ROUND_END_REASON_SAFETY
        events = await client.send(conv.id, "Sorry, I didn't mean that. I'm okay.", key="k2")
        assert events[-1].round_completed.reason == cpb.ROUND_END_REASON_COMPLETED
        for t in agent_turns(events):
            assert deltas(events, t.index) == t.text  # one delta per screened reply, equal to what was stored
        got = await client.get(conv.id)
        assert got.safety_flagged and list(got.safety_categories) == ["suicide"]
        assert len(got.turns) == 6 and got.turns[1].safety
        assert client.metric("suicide") == 1.0

        sp = await client.start()
        events = await client.self_play(sp.id, "My friend posted that she's going to jump off the bridge tonight.",
                                        agent_turns=3, user_speak_prob=0.0)
        assert events[-1].round_completed.reason == cpb.ROUND_END_REASON_SAFETY
        assert (await client.get(sp.id)).safety_flagged and client.metric("suicide") == 2.0
    finally:
        await client.ch.close()
        await stack.stop(0)


# ------------------------------------------------------------------ tiers (the trained detector)
@pytest.fixture
async def tiers(tmp_path):
    """A stack whose detector puts every model-only risk in the check-in tier (crisis threshold 0.999): the real
    shipped detector, thresholds moved so that the tier does not depend on a probability's third decimal."""
    script = Scripted()
    eng = ScriptedEngine(lambda p: DIRECTOR, script.speaker)
    stack = await start_stack(make_config(tmp_path, safety={"classifier": "minilm", "crisis_threshold": 0.999,
                                                            "checkin_threshold": 0.3}),
                              engine=eng)
    client = Client(stack)
    client.script, client.engine = script, eng
    yield client
    await client.ch.close()
    await stack.stop(0)


def tier_metric(client, name: str, tier: str) -> float:
    return client.stack.metrics.registry.get_sample_value(name, {"tier": tier}) or 0.0


async def test_check_in_turn_is_streamed_and_stored_before_the_round_goes_on(tiers):
    conv = await tiers.start()
    before = tier_metric(tiers, "mascot_safety_turns_total", "check_in")
    text = "I won't be around for Christmas, so don't bother buying me anything."  # the model alone, p 0.88
    events = await tiers.send(conv.id, text)
    turns = agent_turns(events)
    assert events[-1].round_completed.reason == cpb.ROUND_END_REASON_COMPLETED
    assert events[-1].round_completed.agent_turns == 4  # the check-in, then the round's 3 agent turns
    first = turns[0]
    assert first.safety and first.persona_id == "anchor" and first.directive.source == dpb.DIRECTIVE_SOURCE_SAFETY
    assert first.directive.action == CHECKIN_ACTION and first.text == GATE.check_in_text() == deltas(events, 1)
    assert "Are you safe right now?" in first.text and not SECRECY.search(first.text)
    assert [t.text for t in turns[1:]] == ["A reply."] * 3 and not any(t.safety for t in turns[1:])
    assert director_calls(tiers.engine) >= 3
    rows = tiers.events(conv.id)
    assert rows and all(r.kind == "user_checkin" and r.turn_idx == 0 for r in rows)
    assert any(r.rules.startswith("classifier(p=") for r in rows)
    got = await tiers.get(conv.id)
    assert not got.safety_flagged and [t.safety for t in got.turns] == [False, True, False, False, False]
    assert tier_metric(tiers, "mascot_safety_turns_total", "check_in") == before + 1
    assert tier_metric(tiers, "mascot_safety_detections_total", "check_in") >= 1
    # a retry of the same message replays the stored round: one check-in, never two
    again = await tiers.send(conv.id, text)
    assert [t.text for t in agent_turns(again)] == [t.text for t in turns]
    assert len((await tiers.get(conv.id)).turns) == 5


async def test_crisis_template_replaces_the_round_when_rules_and_model_agree(tiers):
    conv = await tiers.start()
    events = await tiers.send(conv.id, "I want to kill myself tonight, I have the pills ready.")
    assert events[-1].round_completed.reason == cpb.ROUND_END_REASON_SAFETY
    turns = agent_turns(events)
    assert len(turns) == 1 and turns[0].text == GATE.safety_text() and turns[0].directive.action == SAFETY_ACTION
    rows = tiers.events(conv.id)
    assert {r.kind for r in rows} == {"user_risk"} and rows[0].detector == "rules+classifier"
    assert tiers.engine.requests == []
    assert (await tiers.get(conv.id)).safety_flagged


async def test_other_language_disclosure_gets_the_safety_turn(scripted):
    conv = await scripted.start()
    events = await scripted.send(conv.id, "Ya no quiero vivir, me quiero morir.")
    assert events[-1].round_completed.reason == cpb.ROUND_END_REASON_SAFETY
    assert "findahelpline.com" in agent_turns(events)[0].text  # international lines
    assert any("es_want_die" in r.rules for r in scripted.events(conv.id))


async def test_the_language_head_reads_other_languages_on_a_real_stack(scripted):
    """Spanish read by the language head: a haircut told with a self-harm verb (the ``es_self_harm`` lexicon fires;
    the gate of 06fc805 gave it a check-in) gets the normal round and no safety event; farewells and a day chosen,
    with no risk word a lexicon knows, get the crisis template, stored with the head's reading and category."""
    conv = await scripted.start()
    haircut = "me corté el pelo yo misma y ahora parezco un champiñón"
    assert [h.rule for h in languages.lexicon_hits(haircut)] == ["es_self_harm"]
    events = await scripted.send(conv.id, haircut)
    assert events[-1].round_completed.reason == cpb.ROUND_END_REASON_COMPLETED
    assert not any(t.safety for t in agent_turns(events)) and scripted.events(conv.id) == []
    farewell = ("ya dejé escritas las cartas para mis hijos y le regalé el perro a mi hermana, el viernes termino "
                "con todo")
    assert languages.lexicon_hits(farewell) == []
    conv = await scripted.start()
    events = await scripted.send(conv.id, farewell)
    assert events[-1].round_completed.reason == cpb.ROUND_END_REASON_SAFETY
    assert "findahelpline.com" in agent_turns(events)[0].text
    rows = scripted.events(conv.id)
    assert [r.kind for r in rows] == ["user_risk"] and rows[0].detector == "classifier"
    assert rows[0].rules.startswith("classifier(p=") and rows[0].category == "suicide"


async def test_unread_language_is_counted(scripted):
    conv = await scripted.start()
    before = scripted.stack.metrics.registry.get_sample_value("mascot_safety_unread_total", {"language": "ru"}) or 0
    await scripted.send(conv.id, "Я больше не могу так жить, мне очень плохо")
    assert scripted.stack.metrics.registry.get_sample_value("mascot_safety_unread_total",
                                                            {"language": "ru"}) == before + 1
