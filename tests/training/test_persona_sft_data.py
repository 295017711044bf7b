"""Phase 1's SFT data stage (teacher hints, directive mix, eligibility, selection), the move reward and budget
penalty of GRPO, cross-persona pairs and the reward model's accuracy interval: pure logic on the real cards and
detectors (the stage itself runs in the phase 1 smoke test and, on the real model, in the CPU recipe test)."""

from __future__ import annotations

from dataclasses import replace

import collections

import pytest

from mascot.core.dialogue import FALLBACK_ACTION
from mascot.core.moves import assess
from mascot.core.personas import PersonaCatalog
from mascot_training.persona import sft_data as sd
from mascot_training.persona.config import GrpoConfig, PersonaAlignmentConfig


@pytest.fixture(scope="module")
def catalog() -> PersonaCatalog:
    return PersonaCatalog.load()


def test_every_teacher_example_does_its_cards_moves(catalog: PersonaCatalog) -> None:
    """An example that broke its own card would teach the wrong move: each complies and fits the length."""
    hints = sd.load_hints()
    assert set(hints) == {c.id for c in catalog.in_set("support")}
    for pid, h in hints.items():
        card = catalog.get(pid)
        assert len(h.examples) >= 4 and h.hint
        for user, reply in h.examples:
            v = assess(card.moves, reply, user)
            assert v.compliant, (pid, reply, v)
            assert len(reply.split()) <= card.max_answer_words
            assert sd.eligible(card, reply, user) == (True, "")


def test_teacher_messages_put_the_hint_in_the_system_text_and_examples_before_the_conversation(catalog) -> None:
    from mascot.core.dialogue import HistoryTurn
    from mascot.speaker.prompts import build_persona_messages

    card = catalog.get("action_guide")
    plain = build_persona_messages(card, [HistoryTurn("user", "I lost my keys.")], [], FALLBACK_ACTION,
                                   card.default_tone, {})
    hints = sd.load_hints()
    hint = replace(hints["action_guide"], shots=2)
    msgs = sd.teacher_messages(plain, hint, "s1|action_guide|first|0")
    assert msgs[0]["content"] == plain[0]["content"] + "\n\n" + hint.hint
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "user", "assistant", "user"]
    assert msgs[-1] == plain[-1]
    shown = {(msgs[1]["content"], msgs[2]["content"]), (msgs[3]["content"], msgs[4]["content"])}
    assert shown <= set(hint.examples)
    # the bundled file shows the Action Guide and the Listener four examples, the others two
    assert {p: h.shots for p, h in hints.items()} == {"empathetic_listener": 4, "anchor": 2, "catalyst": 2,
                                                      "action_guide": 4, "beacon": 2}
    four = sd.teacher_messages(plain, hints["action_guide"], "s1|action_guide|first|0")
    assert [m["role"] for m in four] == ["system", *["user", "assistant"] * 4, "user"]
    assert len({m["content"] for m in four[1:-1:2]}) == 4  # four different examples
    # other contexts see other examples
    firsts = {sd.teacher_messages(plain, hint, f"s{i}")[1]["content"] for i in range(30)}
    assert len(firsts) >= 3


def test_hints_file_errors_name_the_file_and_persona(tmp_path) -> None:
    bad = tmp_path / "h.yaml"
    bad.write_text("personas:\n  anchor: {examples: []}\n")
    with pytest.raises(ValueError, match=r"h\.yaml: persona 'anchor' needs a non-empty 'hint'"):
        sd.load_hints(bad)
    one = "examples: [{user: u, reply: r}]"
    for shots in ("0", "9", "2", "true", "1.5"):
        bad.write_text(f"personas:\n  anchor: {{hint: h, {one}, shots: {shots}}}\n")
        with pytest.raises(ValueError, match=r"h\.yaml: persona 'anchor': 'shots' must be a whole number"):
            sd.load_hints(bad)
    bad.write_text(f"personas:\n  anchor: {{hint: h, {one}, shots: 1}}\n")
    assert sd.load_hints(bad)["anchor"].shots == 1
    bad.write_text("personas:\n  anchor: {hint: x, examples: [{user: a}]}\n")
    with pytest.raises(ValueError, match="list of {user, reply}"):
        sd.load_hints(bad)
    with pytest.raises(ValueError, match="cannot read"):
        sd.load_hints(tmp_path / "missing.yaml")


def test_directives_mix_the_fallback_and_the_directors_vocabulary(catalog: PersonaCatalog) -> None:
    card = catalog.get("beacon")
    got = [sd.choose_directive(card, f"s{i}|beacon|first", 0.3) for i in range(400)]
    assert got == [sd.choose_directive(card, f"s{i}|beacon|first", 0.3) for i in range(400)]  # fixed by key
    fallback = sum(a == FALLBACK_ACTION for a, _ in got)
    assert 0.22 < fallback / 400 < 0.38
    assert all(t == card.default_tone for a, t in got if a == FALLBACK_ACTION)
    others = [(a, t) for a, t in got if a != FALLBACK_ACTION]
    assert {a for a, _ in others} == set(sd.ACTIONS) and {t for _, t in others} <= set(sd.TONES)
    tones = collections.Counter(t for _, t in others)
    assert tones.most_common(1)[0][0] == "Gentle and calm"  # the director's favourite, as served
    assert all(a == FALLBACK_ACTION for a, _ in (sd.choose_directive(card, f"k{i}", 1.0) for i in range(20)))


def test_eligibility_uses_the_cards_detectors(catalog: PersonaCatalog) -> None:
    user = "My car broke down on the way to my interview."
    guide, catalyst, listener = catalog.get("action_guide"), catalog.get("catalyst"), catalog.get("empathetic_listener")
    assert sd.eligible(guide, "That is stressful. Call the garage tomorrow and email the interviewer tonight.",
                       user) == (True, "")
    assert sd.eligible(guide, "That sounds so stressful, I'm sorry.", user) == (False, "no_required_move")
    ok, why = sd.eligible(catalyst, "I'm so sorry, that must have been awful.", user)
    assert not ok and why.startswith("forbidden:") and "pure_validation" in why
    assert sd.eligible(listener, "word " * 61, user) == (False, "too_long")
    assert sd.eligible(guide, "  ", user) == (False, "empty")
    # the smoke setting keeps any delivered text within the card's length
    assert sd.eligible(guide, "That sounds so stressful, I'm sorry.", user, require_moves=False) == (True, "")


def _group(pid: str, texts: list[tuple[str, str, bool]], user: str = "my exam went badly today") -> dict:
    return {"persona_id": pid, "user": user,
            "candidates": [{"prompt": kind, "text": t, "eligible": ok} for t, kind, ok in texts]}


def test_selection_ranks_by_reuse_then_plain_prompt_and_caps_openers() -> None:
    g = _group("catalyst", [("What part of it hurt most?", "teacher", True),
                            ("What did the exam ask of you today?", "teacher", True),
                            ("What did the exam ask today?", "plain", True),
                            ("Not eligible at all about the exam today", "plain", False)])
    # the two that reuse "exam" and "today" tie on reuse; the plain-prompt one wins the tie
    assert sd.select([g], keep=1, max_opener_share=1.0) == [(0, 2)]
    # keep=2 takes distinct openers only: both "what did the exam" candidates share one
    assert sd.select([g], keep=2, max_opener_share=1.0) == [(0, 2), (0, 0)]
    # the opener cap: 10 groups whose best reply opens alike; a 0.2 share of 10 kept -> at most 2 of that opener
    groups = [_group("beacon", [("Tell me more about your exam today.", "plain", True),
                                (f"Brave move {i}: your courage shows, tell me more about the exam.", "teacher", True)])
              for i in range(10)]
    kept = sd.select(groups, keep=1, max_opener_share=0.2)
    openers = collections.Counter(groups[gi]["candidates"][ci]["text"].split()[0] for gi, ci in kept)
    assert len(kept) == 10 and openers["Tell"] == 2 and openers["Brave"] == 8


def test_move_reward_and_the_grpo_reward_terms(catalog: PersonaCatalog) -> None:
    from mascot_training.common.rewards import move_reward
    from mascot_training.persona import persona_grpo as pg

    user = "My car broke down on the way to my interview."
    guide = catalog.get("action_guide")
    step = "That is stressful. Call the garage tomorrow and email the interviewer tonight."
    none = "That sounds so stressful, I'm sorry."
    assert move_reward(guide.moves, step, user) == 1.0 and move_reward(guide.moves, none, user) == 0.0
    catalyst = catalog.get("catalyst")
    assert move_reward(catalyst.moves, "I'm so sorry, that must have been awful.", user, 1.0, 2.0) == -2.0
    assert move_reward(None, step, user) == 0.0 and move_reward(guide.moves, " ", user) == 0.0

    g = GrpoConfig(w_move=2.0, budget_penalty=0.5, max_completion_length=8,
                   format={"think": False, "l_max": 200, "l_max_from_card": True})
    f = pg.make_reward_func(None, catalog, g)
    hist = [{"role": "user", "text": user, "persona_id": ""}]
    long = "Call the garage now. " + "and then " * 40 + "rest."
    out = f(prompts=[[{"role": "user", "content": "x"}]] * 3, completions=[step, none, long],
            completion_ids=[[1] * 3, [1] * 3, [1] * 8], persona_id=["action_guide"] * 3, history=[hist] * 3,
            context=[[]] * 3, action=[FALLBACK_ACTION] * 3, tone=["Calm"] * 3)
    from mascot_training.common.rewards import format_reward

    assert out[0] == pytest.approx(1.0 + 2.0 * 1.0)  # format 1 (short) + w_move * 1
    assert out[1] == pytest.approx(1.0)  # no move: format only
    # the card's L_max (80 words) applies, the step counts, and the full token budget costs the penalty
    assert out[2] == pytest.approx(format_reward(long, l_max=80, think=False) + 2.0 - 0.5)
    assert f.stats["move"] == [pytest.approx(2 / 3)] and f.stats["cut"] == [pytest.approx(1 / 3)]


def test_template_collapse_is_flagged_once_one_opener_takes_the_window(catalog: PersonaCatalog) -> None:
    from mascot_training.persona import persona_grpo as pg

    g = GrpoConfig(format={"think": False}, collapse_stop={"enabled": True, "window": 8, "max_opener_share": 0.75})
    f = pg.make_reward_func(None, catalog, g)
    hist = [{"role": "user", "text": "I passed.", "persona_id": ""}]

    def step(texts: list[str]) -> None:
        n = len(texts)
        f(prompts=[[{"role": "user", "content": "x"}]] * n, completions=texts, completion_ids=[[1]] * n,
          persona_id=["beacon"] * n, history=[hist] * n, context=[[]] * n)

    step([f"Reply number {i} is different." for i in range(4)] + ["Tell me more about it."] * 4)
    assert "collapse" not in f.state  # 4 of 8
    step(["Tell me more about it."] * 4)
    assert f.state["collapse"] == {"opener": "tell me more about", "share": 1.0}


def test_cross_pairs_prefer_the_cards_move_against_a_reply_without_it(catalog: PersonaCatalog) -> None:
    from mascot_training.persona.pairs import cross_pairs

    hist = [{"role": "user", "persona_id": None, "text": "I lost my job today."}]

    def grp(pid: str, cands: list[str], refused=None) -> dict:
        return {"group_id": f"s1|{pid}", "situation_id": "s1", "persona_id": pid, "history": hist, "context": [],
                "candidates": cands, "refused": refused or [""] * len(cands)}

    groups = [grp("action_guide", ["I'm sorry.", "Update your CV tonight and call a friend tomorrow."]),
              grp("anchor", ["I'm here with you; anyone would feel shaken.", "Write a list of jobs."],
                  refused=["", "echo"]),
              grp("catalyst", ["What did this job mean to you?"])]
    judged = {g["group_id"]: {"means": [3.0] * len(g["candidates"])} for g in groups}
    rows = cross_pairs(groups, judged, per_group=2, heldout_fraction=0.2)
    guide = [r for r in rows if r["persona_id"] == "action_guide"]
    assert len(guide) == 2 and {r["kind"] for r in rows} == {"cross"}
    # the Action Guide's step is chosen; the refused anchor candidate is never used
    assert all(r["chosen"].startswith("Update your CV") for r in guide)
    assert {r["rejected"] for r in guide} == {"I'm here with you; anyone would feel shaken.",
                                              "What did this job mean to you?"}
    assert all(r["rejected"] != "Write a list of jobs." for r in rows)
    assert all(r["rejected_persona"] != r["persona_id"] and r["margin"] is None for r in rows)
    assert cross_pairs(groups, judged, per_group=0, heldout_fraction=0.2) == []


def test_accuracy_interval_is_wilsons() -> None:
    from mascot_training.persona.persona_rm import accuracy_interval

    a = accuracy_interval(14, 23)
    assert a["accuracy"] == pytest.approx(0.609, abs=1e-3) and a["pairs"] == 23
    assert a["interval"] == pytest.approx([0.408, 0.778], abs=2e-3)  # contains 0.5: not better than chance
    assert accuracy_interval(0, 0) == {"accuracy": None, "pairs": 0, "interval": None}
    assert accuracy_interval(90, 100)["interval"][0] > 0.8


def test_config_checks_the_sft_chain() -> None:
    from mascot_training.persona.config import validate

    cfg = PersonaAlignmentConfig(sft_data={"enabled": True})
    assert any("sft_data.enabled needs sft.enabled" in p for p in validate(cfg))
    cfg = PersonaAlignmentConfig(persona_grpo={"enabled": False})
    assert any("needs sft.enabled" in p for p in validate(cfg))
    with pytest.raises(ValueError, match="k_teacher \\+ k_plain"):
        PersonaAlignmentConfig(sft_data={"k_teacher": 0, "k_plain": 0})
