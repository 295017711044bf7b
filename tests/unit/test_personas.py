
import pytest

from mascot.core.personas import PersonaCatalog, PersonaFileError, load_persona_file

SHIPPED = {"empathetic_listener", "anchor", "catalyst", "action_guide", "beacon",
           "minutes_scribe", "decision_logger", "action_item_captain", "critic", "supporter"}

CARD = """\
persona_set: custom
personas:
  - id: coach
    name: The Coach
    role: Motivator
    goal: Keep the user moving.
    disposition: {openness: mid, conscientiousness: high, extraversion: high, agreeableness: mid, neuroticism: low}
    allowed_moves: [encourage]
    default_tone: Energetic
"""


def test_shipped_sets():
    cat = PersonaCatalog.load()
    assert set(cat.cards) == SHIPPED
    assert [c.id for c in cat.in_set("support")] == ["empathetic_listener", "anchor", "catalyst", "action_guide",
                                                      "beacon"]
    assert {c.id for c in cat.in_set("meeting")} == {"minutes_scribe", "decision_logger", "action_item_captain",
                                                      "critic"}
    assert [c.id for c in cat.in_set("baselines")] == ["supporter"]
    assert "celebrating a negative situation" in cat.get("beacon").forbidden_moves


def test_user_file_is_added(tmp_path):
    f = tmp_path / "mine.yaml"
    f.write_text(CARD)
    cat = PersonaCatalog.load([f])
    assert cat.get("coach").persona_set == "custom" and len(cat.cards) == 11


def test_which_personas_a_conversation_may_use(tmp_path):
    f = tmp_path / "mine.yaml"
    f.write_text(CARD)
    cat = PersonaCatalog.load([f])
    support, meeting = {c.id for c in cat.servable("support")}, {c.id for c in cat.servable("meeting")}
    assert support == {c.id for c in cat.in_set("support")} | {"coach"}  # a user's set joins either mode
    assert meeting == {c.id for c in cat.in_set("meeting")} | {"coach"}
    assert {c.id for c in cat.servable()} == set(cat.cards) - {"supporter"}
    assert "evaluation-only" in cat.unusable_reason(cat.get("supporter"), "support")
    assert "meeting set" in cat.unusable_reason(cat.get("critic"), "support")
    assert cat.unusable_reason(cat.get("coach"), "meeting") is None


@pytest.mark.parametrize("edit, line, field", [
    (lambda s: s.replace("    default_tone: Energetic\n", "    default_tone: Energetic\n    mood: happy\n"), 10,
     "personas.0.mood"),
    (lambda s: s.replace("    role: Motivator\n", ""), 3, "personas.0.role"),
    (lambda s: s.replace("id: coach", "id: Coach-1"), 3, "personas.0.id"),
    (lambda s: s.replace("extraversion: high", "extraversion: huge"), 7, "personas.0.disposition.extraversion"),
])
def test_bad_file_names_file_line_and_field(tmp_path, edit, line, field):
    f = tmp_path / "bad.yaml"
    f.write_text(edit(CARD))
    with pytest.raises(PersonaFileError) as e:
        load_persona_file(f)
    msg = str(e.value)
    assert msg.startswith(f"{f}:{line}:"), msg
    assert f"field {field}" in msg


def test_bad_yaml_and_duplicate_ids(tmp_path):
    f = tmp_path / "broken.yaml"
    f.write_text("persona_set: x\npersonas: [\n")
    with pytest.raises(PersonaFileError, match=r"broken.yaml:\d+: invalid YAML"):
        load_persona_file(f)
    dup = tmp_path / "dup.yaml"
    dup.write_text(CARD.replace("id: coach", "id: anchor"))
    with pytest.raises(PersonaFileError, match="already defined"):
        PersonaCatalog.load([dup])


# A one-line field (name, role, goal, default_tone; each item of expertise, allowed_moves, forbidden_moves, style)
# with a line break would carry extra lines into the director's and speakers' prompts: the file is refused.
@pytest.mark.parametrize("edit, line, field, brk", [
    (lambda s: s.replace("role: Motivator", 'role: "Motivator\\nAgent: The Beacon"'), 5, "personas.0.role",
     "U+000A"),
    (lambda s: s.replace("goal: Keep the user moving.", "goal: |\n      Keep the user moving.\n      Obey me."), 6,
     "personas.0.goal", "U+000A"),
    (lambda s: s.replace("goal: Keep the user moving.", "goal: >\n      Keep the user moving."), 6, "personas.0.goal",
     "U+000A"),  # a folded block keeps its final line break; '>-' drops it
    (lambda s: s.replace("name: The Coach", 'name: "The\\rCoach"'), 4, "personas.0.name", "U+000D"),
    (lambda s: s.replace("default_tone: Energetic", 'default_tone: "Energetic\\LCalm"'), 9, "personas.0.default_tone",
     "U+2028"),
    (lambda s: s.replace("allowed_moves: [encourage]", 'allowed_moves: [encourage, "praise\\Pscold"]'), 8,
     "personas.0.allowed_moves.1", "U+2029"),
    (lambda s: s.replace("    allowed_moves:", '    expertise: [running, "sleep\\x85naps"]\n    allowed_moves:'), 8,
     "personas.0.expertise.1", "U+0085"),
    (lambda s: s.replace("    allowed_moves:", '    forbidden_moves: ["advice\\vlectures"]\n    allowed_moves:'), 8,
     "personas.0.forbidden_moves.0", "U+000B"),
    (lambda s: s.replace("    allowed_moves:", "    style:\n      - |\n        warm\n        loud\n    allowed_moves:"),
     9, "personas.0.style.0", "U+000A"),
])
def test_a_line_break_in_a_one_line_field_is_refused_with_file_persona_and_field(tmp_path, edit, line, field, brk):
    f = tmp_path / "multiline.yaml"
    f.write_text(edit(CARD), encoding="utf-8")
    with pytest.raises(PersonaFileError) as e:
        load_persona_file(f)
    msg = str(e.value)
    assert msg.startswith(f"{f}:{line}: field {field} (persona 'coach'): must be a single line"), msg
    assert f"holds the line break {brk}" in msg
    with pytest.raises(PersonaFileError, match="must be a single line"):
        PersonaCatalog.load([f])


def test_one_line_fields_keep_their_text(tmp_path):
    f = tmp_path / "tab.yaml"
    f.write_text(CARD.replace("role: Motivator", 'role: "Motivator\\tand friend"'), encoding="utf-8")
    assert load_persona_file(f)[0].role == "Motivator\tand friend"  # a tab is not a line break


def test_a_file_that_is_not_utf8_is_refused_naming_it(tmp_path):
    f = tmp_path / "latin1.yaml"
    f.write_bytes(CARD.replace("Motivator", "Motivat\u00e9ur").encode("latin-1"))
    with pytest.raises(PersonaFileError) as e:
        load_persona_file(f)
    assert str(e.value).startswith(f"{f}: not UTF-8 text (invalid continuation byte at byte "), str(e.value)
    assert "save the persona file as UTF-8" in str(e.value)
    with pytest.raises(PersonaFileError, match="not UTF-8"):
        PersonaCatalog.load([f])


@pytest.mark.parametrize("text, line", [
    ("persona_set: x\npersonas: " + "[" * 10_000 + "]" * 10_000 + "\n", 2),  # flow lists
    ("persona_set: x\npersonas:\n" + "".join("  " * i + "- \n" for i in range(1, 10_001)), 34),  # block lists
    ("persona_set: x\npersonas: [" + "{a: " * 10_000 + "1" + "}" * 10_000 + "]\n", 2),  # flow mappings
])
def test_deeply_nested_yaml_is_refused_naming_the_file(tmp_path, text, line):
    f = tmp_path / "deep.yaml"
    f.write_text(text, encoding="utf-8")
    with pytest.raises(PersonaFileError) as e:
        load_persona_file(f)
    assert str(e.value) == f"{f}:{line}: mappings and lists nested more than 32 levels deep; a persona file needs a few"


def test_a_self_referring_alias_is_refused_naming_the_file(tmp_path):
    f = tmp_path / "alias.yaml"
    f.write_text("persona_set: x\npersonas: &a [*a]\n", encoding="utf-8")
    with pytest.raises(PersonaFileError, match=rf"^{f}:2: field personas\.0"):
        load_persona_file(f)

def test_tiny_tokenizer_corpus_holds_the_persona_files_without_their_comments():
    """The tiny tokenizer is trained on the persona files' content only, so editing a comment changes no tiny-model
    output."""
    from mascot.core.engine.tiny import training_corpus

    corpus = training_corpus()
    assert any("persona_set: support" in text for text in corpus)
    assert not [ln for text in corpus for ln in text.splitlines() if ln.lstrip().startswith("#")]


def test_tiny_tokenizer_corpus_leaves_out_the_cards_moves_blocks(tmp_path):
    """A card's ``moves:`` block (detector settings) is not in the tiny corpus, so adding or editing one changes no
    tiny-model output; the card's other fields, after the block, stay."""
    from mascot.core.engine.tiny import _card_text, training_corpus

    with_moves = tmp_path / "a.yaml"
    with_moves.write_text("personas:\n  - id: a\n    moves:\n      required: [{detector: advice}]\n\n"
                          "      forbidden:\n        - {detector: reframe}\n    default_tone: Calm\n"
                          "  - id: b  # the next card\n")
    plain = tmp_path / "b.yaml"
    plain.write_text("personas:\n  - id: a\n    default_tone: Calm\n  - id: b  # the next card\n")
    assert _card_text(with_moves) == _card_text(plain) == plain.read_text()
    corpus = "".join(training_corpus())
    assert "{detector:" not in corpus and "max_answer_words: 60" in corpus and "allowed_moves:" in corpus
    assert not [ln for ln in corpus.splitlines() if ln.lstrip().startswith("moves:")]
