
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
