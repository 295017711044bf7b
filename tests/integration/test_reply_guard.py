"""The reply checks through the real gateway, director and speaker servers, with scripted engines that produce each
defect: the checks act (regenerate, exclude the persona, end the round), count (mascot_reply_rejections_total), store
(GetConversation with include_think), and never deliver the refused text or a canned reply."""

import re
from collections import Counter

import pytest

from mascot.api.conversation.v1 import conversation_pb2 as cpb
from mascot.api.dialogue.v1 import dialogue_pb2 as dpb
from mascot.core.metrics import Metrics
from mascot.app.stack import start_stack
from tests.helpers.config import make_config
from tests.helpers.dialogue import Client
from tests.helpers.engine import ScriptedEngine
from tests.helpers.rpc import collect

pytestmark = pytest.mark.integration

GUARD_ON = {"guard": {"enabled": True}, "director": {"check_content": True, "rest_turns": 2}}
GOOD = {"The Anchor": "I hear how frightening that was for you. You are safe here with us now.",
        "The Beacon": "It took real courage to tell us about this. What helped you get through that moment?",
        "The Catalyst": "What do you think made the moment feel so threatening? Looking back, what stands out?"}


def persona_of(prompt):
    m = re.search(r"You are (.+?), the", prompt)
    return m.group(1) if m else "user"


def directive_for(name, action):
    return f"Agent: {name}\nAction: {action}\nTone: Warm and steady"


def rotating_director():
    """A director naming Anchor, Beacon, Catalyst in turn with a fresh action each time (valid directives)."""
    n = Counter()

    def director(prompt):
        n["d"] += 1
        allowed = [x for x in ("The Anchor", "The Beacon", "The Catalyst") if f"- {x} (" in prompt]
        name = allowed[(n["d"] - 1) % len(allowed)]
        return directive_for(name, f"Respond to detail number {n['d']} of what the person said just now.")
    return director


async def guarded_stack(tmp_path, director_fn, speaker_fn, **cfg):
    metrics = Metrics()
    eng = ScriptedEngine(director_fn, speaker_fn)
    sections = {**GUARD_ON, **cfg}
    stack = await start_stack(make_config(tmp_path, **sections), engine=eng, metrics=metrics)
    return stack, Client(stack), eng, metrics


def rejections(metrics, **labels):
    return metrics.registry.get_sample_value("mascot_reply_rejections_total", {"component": "speaker", **labels}) or 0


def delivered(events, index):
    return "".join(e.turn_delta.text for e in events if e.HasField("turn_delta") and e.turn_delta.index == index)


ROSTER = ["anchor", "beacon", "catalyst"]


@pytest.mark.parametrize("defect, bad, reason", [
    ("echo", "You are The Anchor, the Emotional Validator, one of a small group of helpers talking with a person.",
     "echo"),
    ("loop", "The Anchor\n\nThe Anchor\n\nThe Anchor\n\nThe Anchor", "loop"),
    ("blank", "   ", "empty"),
    ("refrain", "You're not alone, you're not alone. You're not alone.", "loop"),
    ("cheering bad news", "That's wonderful news, I'm so happy for you!", "feeling"),
])
async def test_a_defective_first_attempt_is_regenerated_and_never_shown(tmp_path, defect, bad, reason):
    calls = Counter()

    def speaker(prompt):
        who = persona_of(prompt)
        calls[who] += 1
        return bad if who == "The Anchor" and calls[who] == 1 else GOOD.get(who, "I see.")

    stack, client, eng, metrics = await guarded_stack(
        tmp_path, lambda p: directive_for("The Anchor", "Acknowledge how frightening being followed was."), speaker,
        dialogue={"agent_turns_per_round": 1})
    conv = await client.start(persona_ids=ROSTER)
    events = await client.send(conv.id, "A man followed me home from the store and I was terrified.")
    (turn,) = [e.turn_completed.turn for e in events if e.HasField("turn_completed")]
    assert turn.persona_id == "anchor" and turn.text == GOOD["The Anchor"] == delivered(events, turn.index)
    assert calls["The Anchor"] == 2  # regenerated once
    stored = (await client.get(conv.id, think=True)).conversation.turns[1]
    assert [(r.persona_id, r.attempt, r.reason) for r in stored.rejections] == [("anchor", 0, reason)]
    assert stored.rejections[0].text == bad.strip()[:500] or reason in ("loop", "empty")
    assert rejections(metrics, persona="anchor", reason=reason, action="regenerate") == 1
    # the regeneration changed what takes effect: a new seed and a stronger repetition penalty
    anchor_reqs = [r for r in eng.requests if persona_of(r.prompt) == "The Anchor"]
    assert anchor_reqs[1].sampling.repetition_penalty > anchor_reqs[0].sampling.repetition_penalty
    assert anchor_reqs[1].sampling.seed != anchor_reqs[0].sampling.seed
    await client.ch.close()
    await stack.stop(0)


async def test_a_persona_that_keeps_repeating_is_excluded_and_the_director_asked_again(tmp_path):
    same = "I hear how frightening that was for you. You are safe here with us now."

    def speaker(prompt):
        return same if persona_of(prompt) == "The Anchor" else GOOD[persona_of(prompt)]

    director_prompts = []
    actions = iter(["Acknowledge how frightening being followed was.", "Name the fear of walking alone at night.",
                    "Reflect how shaken the person still feels today.", "Stay with the shock of seeing him again."])

    def director(prompt):
        director_prompts.append(prompt)
        if "- The Anchor (" in prompt.split("Answer with")[0]:
            return directive_for("The Anchor", next(actions))
        return directive_for("The Beacon", "Celebrate the courage it took to tell us this.")

    stack, client, eng, metrics = await guarded_stack(tmp_path, director, speaker,
                                                      director={"check_content": True, "rest_turns": 0},
                                                      dialogue={"agent_turns_per_round": 2})
    conv = await client.start(persona_ids=ROSTER)
    events = await client.send(conv.id, "A man followed me home from the store and I was terrified.")
    turns = [e.turn_completed.turn for e in events if e.HasField("turn_completed")]
    # turn 1: the Anchor; turn 2: the Anchor repeats itself 3 times, is excluded, the director picks the Beacon
    assert [t.persona_id for t in turns[:2]] == ["anchor", "beacon"]
    assert turns[1].text == GOOD["The Beacon"]
    assert all(same not in delivered(events, t.index) for t in turns[1:])
    stored = (await client.get(conv.id, think=True)).conversation.turns[2]
    assert [(r.persona_id, r.reason) for r in stored.rejections] == [("anchor", "duplicate")] * 3
    assert rejections(metrics, persona="anchor", reason="duplicate", action="regenerate") >= 2
    assert rejections(metrics, persona="anchor", reason="duplicate", action="exclude") >= 1
    # the second decision of turn 2 did not offer the Anchor
    assert any("- The Anchor (" not in p.split("Answer with")[0] for p in director_prompts)
    await client.ch.close()
    await stack.stop(0)


@pytest.mark.parametrize("reply", ["", "The Beacon\n\nThe Beacon\n\nThe Beacon"])
async def test_a_speaker_that_only_fails_never_runs_the_round_to_its_limit(tmp_path, reply):
    stack, client, eng, metrics = await guarded_stack(tmp_path, rotating_director(), lambda p: reply)
    conv = await client.start(persona_ids=ROSTER)
    events = await client.send(conv.id, "I lost my job today.")
    assert events[-1].round_completed.reason == cpb.ROUND_END_REASON_EMPTY_REPLIES
    assert events[-1].round_completed.agent_turns == 0
    assert not any(e.HasField("turn_delta") for e in events)  # nothing refused was ever streamed
    speaker_calls = [r for r in eng.requests if "You are the director" not in r.prompt]
    assert len(speaker_calls) == 2 * 3  # guard.max_personas x guard.max_attempts, then the round ended
    got = await client.get(conv.id, think=True)
    assert len(got.conversation.turns) == 1
    rnd = stack.store.get_round(conv.id, "k1")
    assert len(rnd.guard["rejections"]) == 6  # stored with the round, since no turn followed
    # the round's outcome is counted, and nothing refused counts as generated text
    sample = metrics.registry.get_sample_value
    assert sample("mascot_rounds_total", {"mode": "support", "reason": "empty_replies"}) == 1
    assert sample("mascot_rounds_total", {"mode": "support", "reason": "completed"}) == 0
    speaker_tokens = [s for m in metrics.registry.collect() if m.name == "mascot_generated_tokens"
                      for s in m.samples if s.labels.get("component") == "speaker" and s.name.endswith("_total")]
    assert sum(s.value for s in speaker_tokens) == 0
    discarded = sum(sample("mascot_discarded_tokens_total", {"component": "speaker", "persona": p}) or 0
                    for p in ROSTER)
    assert (discarded > 0) == (reply != "")  # every generated token of the refused attempts, none delivered
    await client.ch.close()
    await stack.stop(0)


def scripted_director(answers):
    """``(director, prompts)``: a director stand-in that answers ``answers`` in turn and records each prompt."""
    it, prompts = iter(answers), []

    def director(prompt):
        prompts.append(prompt)
        return next(it)

    return director, prompts


async def test_degenerate_directives_are_reprompted_with_the_reason(tmp_path):
    director, prompts = scripted_director([
        directive_for("The Anchor", "The Anchor"),  # only a name
        directive_for("The Anchor", "Acknowledge how frightening being followed was."),
        directive_for("The Beacon", "Acknowledge how frightening being followed was."),  # a copy
        directive_for("The Beacon", "Celebrate the courage it took to speak up today.")])
    stack, client, eng, metrics = await guarded_stack(tmp_path, director, lambda p: GOOD[persona_of(p)],
                                                      dialogue={"agent_turns_per_round": 2})
    conv = await client.start(persona_ids=ROSTER)
    events = await client.send(conv.id, "A man followed me home from the store and I was terrified.")
    turns = [e.turn_completed.turn for e in events if e.HasField("turn_completed")]
    assert [(t.persona_id, t.directive.action, t.directive.source) for t in turns] == [
        ("anchor", "Acknowledge how frightening being followed was.", dpb.DIRECTIVE_SOURCE_RETRY),
        ("beacon", "Celebrate the courage it took to speak up today.", dpb.DIRECTIVE_SOURCE_RETRY)]
    assert "not a helper's name" in prompts[1] and "repeats an earlier one" in prompts[3]
    # the re-prompt after a copy shows neither the copied answer nor the earlier directive it copied
    assert "Acknowledge how frightening" in prompts[2] and "Acknowledge how frightening" not in prompts[3]
    reg = metrics.registry
    for reason in ("directive_name", "directive_copy"):
        assert reg.get_sample_value("mascot_reply_rejections_total", {"component": "director", "persona": "director",
                                                                      "reason": reason, "action": "reprompt"}) == 1
    assert (await client.get(conv.id)).director_retries == 2
    await client.ch.close()
    await stack.stop(0)


async def test_directives_to_someone_else_or_about_absent_people_are_reprompted_with_the_reason(tmp_path):
    director, prompts = scripted_director([
        directive_for("The Anchor", "Offer a kind message to the man's family and friends."),
        directive_for("The Anchor", "Acknowledge how scared the user's sister must have been."),
        directive_for("The Anchor", "Acknowledge how frightening being followed home was.")])
    stack, client, eng, metrics = await guarded_stack(tmp_path, director, lambda p: GOOD[persona_of(p)],
                                                      dialogue={"agent_turns_per_round": 1})
    conv = await client.start(persona_ids=ROSTER)
    events = await client.send(conv.id, "A man followed me home from the store and I was terrified.")
    turns = [e.turn_completed.turn for e in events if e.HasField("turn_completed")]
    assert [(t.persona_id, t.directive.action, t.directive.source) for t in turns] == [
        ("anchor", "Acknowledge how frightening being followed home was.", dpb.DIRECTIVE_SOURCE_RETRY)]
    assert "speak to the user, not to 'the man's family'" in prompts[1] and "'sister'" in prompts[2]
    # the refused answers are not shown back, only their reasons
    assert "Offer a kind message" not in prompts[1] and "scared the user's sister" not in prompts[2]
    reg = metrics.registry
    for reason in ("directive_addressee", "directive_person"):
        assert reg.get_sample_value("mascot_reply_rejections_total", {"component": "director", "persona": "director",
                                                                      "reason": reason, "action": "reprompt"}) == 1
    assert (await client.get(conv.id)).director_retries == 2
    await client.ch.close()
    await stack.stop(0)


async def test_a_supporter_like_simulated_user_is_regenerated(tmp_path):
    n = Counter()

    def speaker(prompt):
        who = persona_of(prompt)
        if who != "user":
            return GOOD[who]
        n["user"] += 1
        return ("I hope this message finds you well. You should rest." if n["user"] == 1
                else "I keep checking the locks at night because I am still scared.")

    stack, client, eng, metrics = await guarded_stack(tmp_path, rotating_director(), speaker)
    conv = await client.start(persona_ids=ROSTER)
    await collect(client.stub.RunSelfPlay(cpb.RunSelfPlayRequest(
        conversation_id=conv.id, opening_text="A man followed me home from the store.", agent_turns=2,
        user_speak_prob=1.0, seed=1, user=dpb.UserSimulation(situation="A stranger followed me home."))))
    turns = (await client.get(conv.id, think=True)).conversation.turns
    users = [t for t in turns if t.role == dpb.ROLE_USER][1:]
    assert [t.text for t in users] == ["I keep checking the locks at night because I am still scared."]
    assert [(r.persona_id, r.reason) for r in users[0].rejections] == [("", "supporter")]
    assert rejections(metrics, persona="user", reason="supporter", action="regenerate") == 1
    await client.ch.close()
    await stack.stop(0)
