"""Card moves: every detector on planted replies both ways (the move written in; the same reply with it taken out),
the cards' ``moves`` field, and refusals of bad entries at load."""

from __future__ import annotations

from pathlib import Path

import pytest

from mascot.core.moves import DETECTORS, CardMoves, MoveSpec, assess, detect, register
from mascot.core.personas import PersonaCatalog, PersonaFileError, load_persona_file

USER_FEAR = ("Me and my mom were at this grocery store and this guy started following us outside the store, it was "
             "so scary!")
USER_LOSS = "My grandmother passed away last week after a long fight with cancer."
USER_EXAM = "I have a big exam on Friday and I keep failing the practice tests."

# (detector, params, user message, reply with the move, the same reply with the move taken out)
PLANTED = [
    ("reflective_question", {"min_shared_words": 1}, USER_FEAR,
     "What do you think made the man at the grocery store follow you?", "That must have been a long day for you."),
    ("reflective_question", {}, USER_EXAM, "What do you think the practice tests are telling you?",
     "The practice tests are telling you something."),
    ("reframe", {}, USER_EXAM, "What if the practice tests are showing you where to focus, not how you'll do?",
     "The practice tests show how you'll do."),
    ("concrete_step", {}, USER_EXAM, "Tonight, write down the three topics you missed and review them tomorrow.",
     "Tonight, remember that you are more than a test score."),
    ("concrete_step", {}, USER_FEAR, "You could call the store manager and ask for the camera footage.",
     "You could stay positive and take care of yourself."),
    ("feeling_label", {}, USER_FEAR, "You must have felt so scared with him behind you.",
     "He was behind you the whole time."),
    ("feeling_label", {}, USER_EXAM, "That sounds really frustrating.", "That sounds like a plan."),
    ("paraphrase", {"min_shared_words": 1}, USER_FEAR, "It sounds like a stranger followed you and your mom.",
     "Thank you for telling me this."),
    ("presence_language", {}, USER_LOSS, "I'm here with you, and you're not alone in this.",
     "Your grandmother sounds like she meant a lot."),
    ("normalising", {}, USER_LOSS, "It's completely natural to feel this way after losing her.",
     "Losing her came after a long fight."),
    ("strength_naming", {}, USER_EXAM, "Your determination to keep practising shows.",
     "You keep doing the practice tests."),
    ("strength_naming", {}, USER_EXAM, "It took courage to tell me about the tests.", "You told me about the tests."),
    ("lesson_reframe", {}, USER_LOSS, "Her story is a reminder of how precious time with family is.",
     "Her story is about her time with family."),
    ("pure_validation", {}, USER_EXAM, "I'm so sorry, that's so hard.",
     "I'm so sorry, that's so hard. What do you think the tests show you?"),
    ("analytic_question", {}, USER_LOSS, "Why do you think she waited so long to tell you?",
     "She waited a long time to tell you."),
    ("invite_elaboration", {}, USER_EXAM, "Tell me more about how you prepare.", "I see how you prepare."),
    ("advice", {}, USER_LOSS, "You should try to talk to someone about her.", "Your grandmother meant so much."),
    ("advice", {}, USER_EXAM, "Make a study plan for Thursday.", "A study plan was made on Thursday."),
    ("direct_instruction", {}, USER_EXAM, "You need to stop worrying about the score.",
     "Worry about the score is common."),
    ("lecturing", {}, USER_EXAM, "It's important to remember that in life grades are not everything.",
     "Grades were on your mind this week."),
    ("long_list", {"max_items": 3}, USER_EXAM, "1. Sleep early\n2. Eat breakfast\n3. Review notes\n4. Call a friend",
     "1. Sleep early\n2. Eat breakfast"),
    ("long_reply", {"max_words": 10}, USER_EXAM, "This reply is certainly going to have more than ten words in it.",
     "This reply is short."),
    ("minimising", {}, USER_LOSS, "At least she is not in pain any more.", "She is not in pain any more."),
    ("celebrating_negative", {}, USER_LOSS, "That's wonderful, what a lovely story.", "That's so hard, I'm sorry."),
    ("attribution", {}, "What did they decide about the budget?", "Grad A said the budget was too small.",
     "The budget was too small."),
    ("opinion", {}, "What did they decide about the budget?", "I think the budget was too small.",
     "The budget was too small."),
    ("decision_statement", {}, "What did they decide?", "The group decided to use the rubber case.",
     "The group talked about the rubber case."),
    ("reopening", {}, "What did they decide?", "We should reconsider the rubber case.",
     "The rubber case was chosen last week."),
    ("owner_and_task", {}, "Who does what?", "Grad B will send the recordings by Monday.",
     "The recordings are ready by Monday."),
    ("vague_item", {}, "Who does what?", "Someone should send the recordings.", "Grad B sends the recordings."),
    ("risk_question", {}, "Any concerns?", "What if the battery fails during the demo?",
     "The battery is ready for the demo."),
    ("self_answered_question", {}, "Any concerns?", "Is the battery a risk? Yes, because it is old.",
     "Is the battery a risk? It is old."),
    ("personal_attack", {}, "Any concerns?", "The designer is clueless about batteries.",
     "The designer did not mention batteries."),
]


@pytest.mark.parametrize(("name", "params", "user", "with_move", "without"), PLANTED,
                         ids=[f"{p[0]}-{i}" for i, p in enumerate(PLANTED)])
def test_detector_planted_both_ways(name: str, params: dict, user: str, with_move: str, without: str) -> None:
    spec = MoveSpec(detector=name, params=params)
    assert detect(spec, with_move, user), f"{name} missed its move in {with_move!r}"
    assert not detect(spec, without, user), f"{name} fired on {without!r}, which has the move taken out"


def test_every_detector_is_planted() -> None:
    assert {p[0] for p in PLANTED} == set(DETECTORS)


def test_content_word_reuse_is_required_when_asked() -> None:
    spec = MoveSpec(detector="reflective_question", params={"min_shared_words": 1})
    assert not detect(spec, "What do you think about the weather this week?", USER_FEAR)
    assert detect(MoveSpec(detector="reflective_question"), "What do you think about the weather this week?", USER_FEAR)


def test_strength_is_the_users_own() -> None:
    spec = MoveSpec(detector="strength_naming")
    assert not detect(spec, "I'm sure your son has a lot of resilience.", USER_EXAM)  # the son's, not the user's
    assert not detect(spec, "It takes a lot of courage to be honest.", USER_EXAM)
    assert detect(spec, "You're so strong for getting through this.", USER_EXAM)


def test_a_gentle_check_in_is_not_an_analytic_question() -> None:
    spec = MoveSpec(detector="analytic_question")
    assert not detect(spec, "I'm here. How are you feeling right now?", USER_LOSS)
    assert not detect(spec, "Would you like to talk about her?", USER_LOSS)


def test_offers_of_help_are_not_reflective_questions() -> None:
    spec = MoveSpec(detector="reflective_question")
    assert not detect(spec, "Is there anything I can do to help you with the store?", USER_FEAR)
    assert not detect(spec, "How can I help you today?", USER_FEAR)


def test_celebrating_needs_a_negative_event() -> None:
    spec = MoveSpec(detector="celebrating_negative")
    assert not detect(spec, "That's wonderful!", "I just got my first job offer and I start Monday.")
    assert detect(spec, "That's wonderful!", "I lost my job on Monday.")


def test_narrated_actions_are_not_steps() -> None:
    spec = MoveSpec(detector="concrete_step")
    assert not detect(spec, "I called my sister when that happened to me.", USER_EXAM)
    assert detect(spec, "Call your sister tonight.", USER_EXAM)


def test_assess_names_what_fired() -> None:
    catalog = PersonaCatalog.load()
    listener = catalog.get("empathetic_listener")
    v = assess(listener.moves, "It sounds like the man following you was really scary. You should call the police.",
               USER_FEAR)
    assert v.required and "advice" in v.forbidden and not v.compliant
    v = assess(listener.moves, "It sounds like the man following you at the store was really scary.", USER_FEAR)
    assert v.compliant and v.forbidden == ()


def test_shipped_cards_have_moves() -> None:
    catalog = PersonaCatalog.load()
    for mode in ("support", "meeting"):
        for card in catalog.in_set(mode):
            assert card.moves is not None and card.moves.required, card.id


def _write(tmp_path: Path, moves: str) -> Path:
    p = tmp_path / "mine.yaml"
    p.write_text(f"""persona_set: mine
personas:
  - id: coach
    name: Coach
    role: Coach
    goal: Coach.
    disposition: {{openness: mid, conscientiousness: mid, extraversion: mid, agreeableness: mid, neuroticism: low}}
    allowed_moves: [ask]
    default_tone: Calm
{moves}""", encoding="utf-8")
    return p


def test_a_user_set_brings_its_own_moves(tmp_path: Path) -> None:
    cards = load_persona_file(_write(tmp_path, "    moves:\n      required: [{detector: reflective_question}]\n"))
    assert cards[0].moves == CardMoves(required=[MoveSpec(detector="reflective_question")])


@pytest.mark.parametrize(("moves", "expect"), [
    ("    moves:\n      required: [{detector: asks_nicely}]\n", "unknown detector 'asks_nicely'; use one of:"),
    ("    moves:\n      required: [{detector: concrete_step, params: {max_stepz: 2}}]\n", "max_stepz"),
    ("    moves:\n      required: [{detector: concrete_step, params: {min_steps: 4, max_steps: 2}}]\n",
     "min_steps must not exceed max_steps"),
    ("    moves:\n      required: []\n", "at least 1 item"),
    ("    moves:\n      forbidden: [{detector: advice}]\n", "required"),
])
def test_bad_moves_are_refused_with_file_persona_and_fix(tmp_path: Path, moves: str, expect: str) -> None:
    p = _write(tmp_path, moves)
    with pytest.raises(PersonaFileError) as e:
        load_persona_file(p)
    msg = str(e.value)
    assert str(p) in msg and "(persona 'coach')" in msg and expect in msg and "fix:" in msg


def test_register_refuses_a_taken_name() -> None:
    with pytest.raises(ValueError, match="already registered"):
        register("advice")(lambda inp, p: True)


def test_the_docs_table_names_every_shipped_move() -> None:
    """docs/evaluation.md's card-moves table lists, on each persona's row, every detector its card uses."""
    from tests.helpers.paths import ROOT

    doc = (ROOT / "docs" / "evaluation.md").read_text(encoding="utf-8")
    catalog = PersonaCatalog.load()
    for mode in ("support", "meeting"):
        for card in catalog.in_set(mode):
            row = next((line for line in doc.splitlines() if line.startswith(f"| {card.name} |")), None)
            assert row is not None, f"no row for {card.name}"
            cells = [c.strip() for c in row.strip().strip("|").split(" | ")]
            assert len(cells) == 3, row
            required, forbidden = cells[1], cells[2]
            for column, specs in ((required, card.moves.required), (forbidden, card.moves.forbidden)):
                for spec in specs:
                    assert f"`{spec.detector}`" in column, f"{card.name}: {spec.detector} not in its docs column"


@pytest.mark.parametrize(("name", "user", "reply", "expected"), [
    ("owner_and_task", "Who does what?", "Owner: Marketing. Task: the survey.", True),
    ("owner_and_task", "Who does what?", "Sure. I will send it.", False),
    ("owner_and_task", "Who does what?", "We agreed. Grad B will send the data.", True),
    ("opinion", "What was said?", "Grad A said we should cut the budget.", False),
    ("attribution", "What was said?", "I thought the budget was fine.", False),
    ("attribution", "What was said?", "You mentioned the budget.", False),
    ("self_answered_question", "Any concerns?", "Is it late? Well, it is a week behind.", True),
    ("celebrating_negative", USER_LOSS, "That's not great, I'm so sorry.", False),
    ("celebrating_negative", USER_LOSS, "We can celebrate her life together.", False),
    ("concrete_step", USER_EXAM, "Why not call her tonight?", True),
    ("concrete_step", USER_EXAM, "Take a deep breath and call your sister.", True),
    ("concrete_step", USER_EXAM, "That sounds hard. Try this: call your sister tonight.", True),  # after a colon
    ("concrete_step", USER_EXAM, "One small step for today: write down the topics you missed.", True),
    ("concrete_step", USER_EXAM, "Here is a rephrasing: \"I failed my exam.\"", False),
    ("concrete_step", USER_EXAM, "Remember this: take care of yourself.", False),
    ("minimising", USER_EXAM, "It was just a practice test.", True),
    ("presence_language", USER_EXAM, "I agree with you about the tests.", False),
    ("presence_language", USER_EXAM, "I'm right here with you.", True),
])
def test_review_cases(name: str, user: str, reply: str, expected: bool) -> None:
    assert detect(MoveSpec(detector=name), reply, user) is expected


def test_a_feeling_named_by_might_be_is_not_a_reframe() -> None:
    listener = PersonaCatalog.load().get("empathetic_listener")
    v = assess(listener.moves, "You might be feeling scared after the store.", USER_FEAR)
    assert v.compliant, v


def test_a_list_counts_each_item() -> None:
    spec = MoveSpec(detector="long_list", params={"max_items": 3})
    steps = "Call your sister\nWrite a list of topics\nBook a tutor\nSchedule a walk"
    assert detect(spec, steps, USER_EXAM)
    assert not detect(MoveSpec(detector="concrete_step"), steps, USER_EXAM)  # four steps: more than three
