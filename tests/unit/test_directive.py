import re
from pathlib import Path

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


def test_tone_words_are_the_persona_own():
    from mascot.director.directive import tone_words

    anchor = CAT.get("anchor")
    vocab = tone_words(anchor)
    assert vocab[:2] == ["calm", "empathetic"]  # the default tone's words first, then the card's
    assert set(anchor.tone_words) <= set(vocab) and "and" not in vocab and len(vocab) == len(set(vocab))
    # a card without tone words: its default tone's words only
    bare = anchor.model_copy(update={"tone_words": []})
    assert tone_words(bare) == ["calm", "empathetic"]


def _head(name: str) -> str:
    return f"Agent: {name}\nAction: Ask what the store said when they went back\nTone: "


def test_the_tone_grammar_branches_on_the_chosen_persona():
    """Each persona's Tone is made of its own words: the grammar accepts every one of them (and its default tone) after
    its name, and refuses the words of the other personas and words of no card."""
    from mascot.director.directive import tone_words

    rx = re.compile(directive_regex(ROSTER, max_action_chars=80, max_tone_chars=32, verbs=["Ask"],
                                    persona_tones=True))
    for card in ROSTER:
        own = tone_words(card)
        assert rx.fullmatch(_head(card.name) + card.default_tone), card.id
        assert rx.fullmatch(_head(card.name) + card.default_tone + "\n"), card.id  # a newline may end the answer
        for w in own:
            assert rx.fullmatch(_head(card.name) + w.capitalize()), (card.id, w)
            other = next(x for x in own if x != w)
            assert rx.fullmatch(_head(card.name) + f"{w.capitalize()} and {other}"), (card.id, w)
            assert rx.fullmatch(_head(card.name) + f"{w.capitalize()}, {other}"), (card.id, w)
            assert not rx.fullmatch(_head(card.name) + f"{w.capitalize()} and {w}"), (card.id, w)  # no repeat
        foreign = {w for c in ROSTER if c.id != card.id for w in tone_words(c)} - set(own)
        assert foreign, card.id
        for w in foreign:
            assert not rx.fullmatch(_head(card.name) + w.capitalize()), (card.id, w)
            assert not rx.fullmatch(_head(card.name) + f"{own[0].capitalize()} and {w}"), (card.id, w)
        for tone in ("Gentle and calm, no more than 2-", "Amentaeclanteflo", own[0], "", " " + own[0].capitalize(),
                     f"{own[0].capitalize()} and {own[1]} and {own[2]}"):
            assert not rx.fullmatch(_head(card.name) + tone), (card.id, tone)
    # "Gentle and calm", the one Tone the shared vocabulary gave every persona, is now the Listener's words only
    assert not rx.fullmatch(_head("The Catalyst") + "Gentle and calm")
    assert not rx.fullmatch(_head("Action Guide") + "Gentle and calm")


def test_a_default_tone_the_words_cannot_spell_is_an_alternative_as_written():
    from mascot.director.directive import tone_words

    card = CAT.get("beacon").model_copy(update={"default_tone": "Warm, bright and upbeat"})
    rx = re.compile(tone_regex(32, tone_words(card), card.default_tone))
    assert rx.fullmatch("Warm, bright and upbeat") and rx.fullmatch("Bright and warm")
    assert not rx.fullmatch("Warm, bright and lively")
    short = re.compile(tone_regex(4, tone_words(CAT.get("anchor"))))  # words over the length bound are not offered
    assert short.fullmatch("Calm") and not short.fullmatch("Empathetic")
    with pytest.raises(ValueError, match="max_tone_chars=2"):
        tone_regex(2, tone_words(CAT.get("anchor")))


def test_the_tone_alternatives_are_in_no_list_order():
    """The grammar does not depend on the order of a card's tone words (the alternatives are sorted)."""
    card = CAT.get("catalyst")
    shuffled = card.model_copy(update={"tone_words": list(reversed(card.tone_words))})
    assert directive_regex([shuffled], max_action_chars=80, max_tone_chars=32, persona_tones=True) == \
        directive_regex([card], max_action_chars=80, max_tone_chars=32, persona_tones=True)


def test_persona_files_refuse_a_tone_word_the_grammar_cannot_spell(tmp_path):
    from mascot.core.personas import PersonaFileError, load_persona_file

    text = (Path(__file__).resolve().parents[2] / "services/mascot/core/personas/baselines.yaml").read_text()
    bad = tmp_path / "bad.yaml"
    bad.write_text(text.replace("tone_words: [supportive,", "tone_words: [Supportive and kind,"))
    with pytest.raises(PersonaFileError, match="tone_words"):
        load_persona_file(bad)


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


#: A conversation of people: the user, a friend and the friend's child (no parents, sister, neighbour or boss).
FRIEND = [HistoryTurn("user", "I have a friend that has a child who is unruly. At our home he sat on my expensive game "
                              "and broke it, and it really irked me.")]


@pytest.mark.parametrize("action, reason, named", [
    ("Offer a positive and encouraging message to the child's parents.", "directive_addressee", "the child's parents"),
    ("Tell the child's parents that the game mattered to the user.", "directive_addressee", "the child's parents"),
    ("Ask them to explain the second sentence.", "directive_addressee", "'them'"),
    ("Gently ask them how the game broke.", "directive_addressee", "'them'"),
    ("Remind yourself of your own unique gifts and talents.", "directive_addressee", "'yourself'"),
    ("Share the story of the broken game with others.", "directive_addressee", "'others'"),
    ("Validate the frustration, and tell her it will pass.", "directive_addressee", "'her'"),
    ("Ask Maria what happened after the game broke.", "directive_addressee", "'Maria'"),
    ("Acknowledge how hard it is when the user's sister takes the friend's side.", "directive_person", "'sister'"),
    ("Share a story about a neighbour who lost something precious.", "directive_person", "'neighbour'"),
    ("Acknowledge how upset the boss would be about a broken game.", "directive_person", "'boss'"),
    ("Acknowledge the user's feelings about Maria's reaction.", "directive_person", "Maria's"),
])
def test_actions_to_someone_else_or_naming_absent_people_are_refused(action, reason, named):
    from mascot.director.directive import ParsedDirective, check_content

    with pytest.raises(DirectiveError) as e:
        check_content(ParsedDirective("anchor", action, "Warm"), [c.name for c in ROSTER], FRIEND)
    assert e.value.reason == reason and named in str(e.value), str(e.value)


@pytest.mark.parametrize("action", [
    "Acknowledge how upset the user was when the child broke the game.",
    "Ask the user what the friend said afterwards.",
    "Encourage the user to talk to their friend about the game.",
    "Encourage the user to say how they feel and share it with the friend.",  # the user's steps, not the helper's
    "Reflect the user's frustration and ask them what would help.",  # "them" after the user is named
    "Ask what upset them most about the broken game.",  # "what", not "them", is what is asked
    "Validate the frustration, and gently ask the person how the kid reacted.",  # "kid" is the child
    "Offer comfort to the user about the broken game.",
    "Suggest a way to talk to the friend about paying for the game.",
])
def test_actions_to_the_user_about_people_they_mentioned_pass(action):
    from mascot.director.directive import ParsedDirective, check_content

    check_content(ParsedDirective("anchor", action, "Warm"), [c.name for c in ROSTER], FRIEND)


def test_people_of_the_seed_context_count_as_mentioned():
    from mascot.director.directive import ParsedDirective, check_content

    action = ParsedDirective("anchor", "Acknowledge how the manager's plan left the user little time.", "Warm")
    with pytest.raises(DirectiveError, match="manager"):
        check_content(action, [c.name for c in ROSTER], FRIEND)
    check_content(action, [c.name for c in ROSTER], FRIEND, context=[("Ann", "My manager wants it by Friday.")])


async def test_a_refused_addressee_is_reprompted_with_its_reason_at_the_configured_decoding():
    """A planted answer addressed to the child's parents is refused and re-asked (the refused answer not shown back);
    every attempt samples at ``director.decoding``."""
    from mascot.core.config import DirectorConfig, DirectorDecoding
    from mascot.director.decide import RETRY, decide
    from tests.helpers.engine import ScriptedEngine

    answers = iter(["Agent: The Beacon\nAction: Offer a positive message to the child's parents.\nTone: Warm",
                    "Agent: The Beacon\nAction: Acknowledge the user's patience with the child.\nTone: Warm"])
    eng = ScriptedEngine(lambda prompt: next(answers), lambda prompt: "")
    cfg = DirectorConfig(decoding=DirectorDecoding(temperature=0.5, top_p=0.8), rest_turns=0, check_content=True)
    d = await decide(eng, ROSTER, FRIEND, [], cfg, seed=3)
    assert (d.source, d.directive.action, d.rejection_reasons) == (
        RETRY, "Acknowledge the user's patience with the child.", ["directive_addressee"])
    assert "speak to the user, not to 'the child's parents'" in eng.requests[1].prompt
    assert "Offer a positive message" not in eng.requests[1].prompt
    assert [(r.sampling.temperature, r.sampling.top_p) for r in eng.requests] == [(0.5, 0.8), (0.5, 0.8)]


def test_a_shortened_copy_of_the_prompts_example_or_a_goal_is_refused_and_a_new_action_is_not():
    """The real director served "Acknowledge how empty the house feels without the dog." (the prompt's example cut
    short) in 3 of 24 dialogues with no dog: its 5-grams lie in the example, so it is a copy; Jaccard alone (0.65)
    let it through."""
    from mascot.core.guard import char_ngrams, jaccard
    from mascot.director.directive import ParsedDirective, check_content
    from mascot.director.prompts import EXAMPLE_ACTION

    names = [c.name for c in ROSTER]
    copies = (EXAMPLE_ACTION, *(c.goal for c in ROSTER))
    cut = "Acknowledge how empty the house feels without the dog."
    assert jaccard(char_ngrams(cut), char_ngrams(EXAMPLE_ACTION)) < 0.8
    for action in (cut, "Offer one to three concrete, feasible next steps."):  # the second: the Action Guide's goal
        with pytest.raises(DirectiveError) as e:
            check_content(ParsedDirective("anchor", action, "Warm"), names, [], copies)
        assert e.value.reason == "directive_copy" and "example or a helper's goal" in str(e.value)
    for action in ("Acknowledge how empty the flat feels since the move.",
                   "Ask what the user would like to keep from their old house."):
        check_content(ParsedDirective("anchor", action, "Warm"), names, [], copies)
