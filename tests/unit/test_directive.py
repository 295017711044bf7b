import re

import pytest

from mascot.core.dialogue import HistoryTurn, consecutive_turns, fallback_persona
from mascot.core.personas import PersonaCatalog
from mascot.director.directive import (DirectiveError, check_cap, directive_regex, fallback_directive, tone_regex,
                                       parse_directive)

CAT = PersonaCatalog.load()
ROSTER = CAT.in_set("support")


def test_parse_valid_and_case_insensitive_fields():
    d = parse_directive("agent: The Anchor\nACTION: Validate the guilt.\nTone: Calm", ROSTER)
    assert (d.persona_id, d.action, d.tone) == ("anchor", "Validate the guilt.", "Calm")


@pytest.mark.parametrize("name", ["Anchor", "the anchor", "THE ANCHOR", "anchor"])
def test_leading_the_optional_and_name_case(name):
    assert parse_directive(f"Agent: {name}\nAction: a\nTone: b", ROSTER).persona_id == "anchor"


def test_text_after_think_is_parsed():
    d = parse_directive("<think>Agent: Beacon\nnot this</think>\nAgent: Catalyst\nAction: Ask.\nTone: Curious", ROSTER)
    assert d.persona_id == "catalyst"


@pytest.mark.parametrize("text, fragment", [
    ("Agent: Nobody\nAction: a\nTone: b", "not one of the agents"),
    ("Agent: The Anchor and The Beacon\nAction: a\nTone: b", "several"),
    ("Agent: The Anchor\nTone: b\nAction: a", "in that order"),
    ("Agent: The Anchor\nAction: a", "exactly three lines"),
    ("Agent: The Anchor\nAction: a\nTone: b\nAgent: Beacon", "exactly three lines"),
    ("Agent: The Anchor\nAction:   \nTone: b", "Action line is empty"),
    ("Agent: The Anchor\nAction: a\nTone:", "Tone line is empty"),
    ("Agent: \nAction: a\nTone: b", "Agent line is empty"),
    ("Sure! Agent: The Anchor\nAction: a\nTone: b", "every line"),
    ("", "exactly three lines"),
])
def test_invalid_directives(text, fragment):
    with pytest.raises(DirectiveError, match=re.escape(fragment)):
        parse_directive(text, ROSTER)


def test_inactive_persona_is_rejected():
    with pytest.raises(DirectiveError):
        parse_directive("Agent: The Beacon\nAction: a\nTone: b", [CAT.get("anchor"), CAT.get("catalyst")])


def test_cap_counts_trailing_turns_and_user_turn_resets():
    h = [HistoryTurn("user", "hi"), HistoryTurn("agent", "x", "anchor"), HistoryTurn("agent", "y", "anchor")]
    assert consecutive_turns(h, "anchor") == 2
    with pytest.raises(DirectiveError, match="2 turns in a row"):
        check_cap("anchor", h, 2)
    check_cap("beacon", h, 2)
    check_cap("anchor", h + [HistoryTurn("user", "more")], 2)


def test_fallback_least_recent_respecting_cap():
    h = [HistoryTurn("user", "hi")] + [HistoryTurn("agent", "t", p) for p in
                                       ("empathetic_listener", "anchor", "catalyst", "action_guide")]
    assert fallback_persona(ROSTER, h, 2).id == "beacon"  # never spoke
    h.append(HistoryTurn("agent", "t", "beacon"))
    assert fallback_persona(ROSTER, h, 2).id == "empathetic_listener"  # spoke least recently
    capped = [HistoryTurn("agent", "t", "anchor")] * 2
    assert fallback_persona([CAT.get("anchor")], capped, 2) is None
    assert fallback_persona(ROSTER, h, 2, exclude=["empathetic_listener"]).id == "anchor"
    fd = fallback_directive(CAT.get("anchor"))
    assert fd.action == "Respond to the user's latest message in your role" and fd.tone == "Calm and empathetic"


def test_directive_regex_accepts_roster_names_only():
    rx = re.compile(directive_regex(ROSTER, max_action_chars=40, max_tone_chars=10))
    assert rx.fullmatch("Agent: The Anchor\nAction: Validate it.\nTone: Calm")
    assert not rx.fullmatch("Agent: Bob\nAction: Validate it.\nTone: Calm")
    assert not rx.fullmatch("Agent: The Anchor\nAction: " + "x" * 41 + "\nTone: Calm")
    verbs = re.compile(directive_regex(ROSTER, max_action_chars=60, max_tone_chars=10, verbs=["Ask", "Invite"]))
    assert verbs.fullmatch("Agent: The Anchor\nAction: Ask what scared them most.\nTone: Calm")
    assert verbs.fullmatch("Agent: The Anchor\nAction: Invite them to say more\nTone: Calm")
    # two sentences
    assert not verbs.fullmatch("Agent: The Anchor\nAction: Ask what scared them. I am happy.\nTone: Calm")
    # a verb not offered
    assert not verbs.fullmatch("Agent: The Anchor\nAction: Validate the fear they felt.\nTone: Calm")
    with_think = re.compile(directive_regex(ROSTER, max_action_chars=40, max_tone_chars=10, max_think_chars=20))
    assert with_think.fullmatch("<think>hmm</think>\nAgent: Action Guide\nAction: a\nTone: b")


def test_directive_regex_leaves_every_persona_reachable_after_a_leading_the():
    """A model's first name token is often "The": every persona stays reachable after it (and without it), and the
    parser maps both spellings to the persona, so constrained decoding cannot lock out the names without "The"."""
    rx = re.compile(directive_regex(ROSTER, max_action_chars=40, max_tone_chars=10))
    for card in ROSTER:
        bare = card.name[4:] if card.name.startswith("The ") else card.name
        for spelled in (f"The {bare}", bare):
            text = f"Agent: {spelled}\nAction: Validate it.\nTone: Calm"
            assert rx.fullmatch(text), text
            assert parse_directive(text, ROSTER).persona_id == card.id
    assert {c.name.startswith("The ") for c in ROSTER} == {True, False}  # the roster mixes both spellings
    assert not rx.fullmatch("Agent: The The Anchor\nAction: Validate it.\nTone: Calm")


@pytest.mark.parametrize("action, reason", [
    ("Acknowledge how brave you are, and I'm so proud of you.", "directive_voice"),
    ("Offer my support for the move to the new neighbourhood.", "directive_voice"),
    ("The Anchor", "directive_name"),
    ("Reflect back, 'I'm so sorry to hear that.", "directive_voice"),  # a quote before "I'm" hid it
])
def test_content_rules_refuse_first_person_and_name_only_actions(action, reason):
    from mascot.director.directive import ParsedDirective, check_content

    with pytest.raises(DirectiveError) as e:
        check_content(ParsedDirective("anchor", action, "Warm"), [c.name for c in ROSTER], [])
    assert e.value.reason == reason


def test_content_rules_accept_an_instruction_about_the_person():
    from mascot.director.directive import ACTION_VERBS, ParsedDirective, check_content

    check_content(ParsedDirective("anchor", "Acknowledge how brave the person was to speak up.", "Warm"),
                  [c.name for c in ROSTER], [])
    assert "Thank" not in ACTION_VERBS and "Invite" not in ACTION_VERBS  # they lead a small model into a reply


def test_tone_is_one_to_four_words_under_the_grammar():
    rx = re.compile(directive_regex(ROSTER, max_action_chars=80, max_tone_chars=32, verbs=["Ask"]))
    head = "Agent: The Anchor\nAction: Ask what the store said when they went back\nTone: "
    for tone in ("Gentle and calm", "Warm, curious", "Calm", "Soft and kind"):
        assert rx.fullmatch(head + tone), tone
    for tone in ("Gentle and calm, no more than 2-", "Gentle and calm, and I'm going!", "", " calm",
                 "calm and warm and kind", "Gentle and calm, no-teesace"):
        assert not rx.fullmatch(head + tone), tone


def test_tone_words_come_from_the_vocabulary_under_the_grammar():
    from mascot.director.directive import TONE_WORDS, tone_words

    vocab = tone_words(ROSTER)
    assert set(TONE_WORDS) <= set(vocab) and "attentive" in vocab and "and" not in vocab
    assert len(vocab) == len(set(vocab))
    rx = re.compile(directive_regex(ROSTER, max_action_chars=80, max_tone_chars=32, verbs=["Ask"], tones=vocab))
    head = "Agent: The Anchor\nAction: Ask what the store said when they went back\nTone: "
    for tone in ("Gentle and calm", "Warm, curious", "Calm", "Practical and encouraging", "Soft, kind and steady"):
        assert rx.fullmatch(head + tone), tone
    for tone in ("Gentle and uncertain, Amentaeclanteflo", "likekinggameyard", "Gentle and calm, no more than 2-",
                 "calm", "Calm and warm and kind and soft", "Gentle and", "Calmx"):
        assert not rx.fullmatch(head + tone), tone
    short = re.compile(tone_regex(4, vocab))  # words over the length bound are not offered
    assert short.fullmatch("Calm, kind") and not short.fullmatch("Gentle")
    with pytest.raises(ValueError, match="max_tone_chars=2"):
        tone_regex(2, vocab)


def test_the_is_no_helper_name_word_in_the_content_rules():
    from mascot.director.directive import ParsedDirective, check_content

    check_content(ParsedDirective("anchor", "Acknowledge the user's experience.", "Warm"), [c.name for c in ROSTER], [])


@pytest.mark.parametrize("tone, named", [
    ("Empathetic Listener", True), ("The Anchor", True), ("Anchor", True), ("the Empathetic Listener and Beacon", True),
    ("Empathetic, empathetic, empathetic", False), ("Empathetic and calm", False), ("Calm and steady", False),
])
def test_a_tone_is_refused_only_when_it_names_a_helper(tone, named):
    """A word of a helper's name used as a tone word ("Empathetic") is a tone; the whole name is not."""
    from mascot.director.directive import ParsedDirective, check_content

    action = "Acknowledge how brave the person was to speak up."
    if named:
        with pytest.raises(DirectiveError) as e:
            check_content(ParsedDirective("anchor", action, tone), [c.name for c in ROSTER], [])
        assert e.value.reason == "directive_name" and "Tone" in str(e.value)
    else:
        check_content(ParsedDirective("anchor", action, tone), [c.name for c in ROSTER], [])
