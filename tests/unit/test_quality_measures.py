"""Judge-free dialogue-quality measures, on planted inputs whose answer is known (real MiniLM embeddings)."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest

from mascot.core.personas import PersonaCatalog
from mascot.eval.measures import MeasureContext, dialogue_measures, identification_summary, identity_text
from mascot.eval.stats import bootstrap_mean, paired_difference


@pytest.fixture(scope="module")
def embedder():
    import torch

    torch.set_num_threads(2)
    from mascot.eval.automatic import EmbeddingRedundancy

    return EmbeddingRedundancy()


@pytest.fixture(scope="module")
def roster():
    return PersonaCatalog.load().in_set("support")


@pytest.fixture(scope="module")
def mctx(roster, embedder):
    from mascot.eval.defects import echo_sources

    return MeasureContext(roster, embedder.embed, echo_sources(roster))


def _dialogue(replies: list[tuple[str, str]], user: str = "I lost my job today and I feel awful.",
              situation: str = "I was laid off from my job after ten years.") -> dict:
    turns = [{"role": "user", "persona_id": None, "text": user}]
    turns += [{"role": "agent", "persona_id": pid, "text": text} for pid, text in replies]
    return {"system": "x", "situation_id": "s", "situation": situation, "turns": turns}


def test_own_card_text_is_identified_every_time_and_shuffled_labels_fall_to_chance(mctx, roster):
    own = [(c.id, identity_text(c)) for c in roster]
    m = dialogue_measures(_dialogue(own), mctx, agent_turns=len(own))
    assert m["values"]["identifiability"] == 1.0
    assert m["values"]["identity_margin"] > 0.05
    summary = identification_summary(m["identified"], mctx.card_ids)
    assert summary["accuracy"] == 1.0 and summary["chance"] == pytest.approx(1 / len(roster))
    assert all(p["accuracy"] == 1.0 and p["n"] == 1 for p in summary["per_persona"].values())
    assert [summary["confusion"]["matrix"][i][i] for i in range(len(roster))] == [1] * len(roster)

    # The same replies, 40 of each persona, with the speaker labels shuffled: about chance (1/5).
    texts = [identity_text(c) for c in roster for _ in range(40)]
    speakers = [c.id for c in roster for _ in range(40)]
    random.Random(0).shuffle(speakers)
    identified = []
    for i in range(0, len(texts), 10):  # dialogues of 10 replies
        identified += dialogue_measures(_dialogue(list(zip(speakers[i:i + 10], texts[i:i + 10]))), mctx,
                                        10)["identified"]
    shuffled = identification_summary(identified, mctx.card_ids)
    assert 0.1 <= shuffled["accuracy"] <= 0.32, shuffled
    assert shuffled["margin"] < 0 and abs(shuffled["kappa"]) < 0.12
    assert shuffled["chance_given_shares"] == pytest.approx(0.2, abs=0.01)  # balanced speakers and cards
    assert summary["kappa"] == 1.0 and summary["balanced_accuracy"] == 1.0


def test_identical_turns_give_self_bleu_one_and_redundancy_one(mctx):
    same = "It sounds like losing your job after so long has left you feeling shaken and unsure."
    m = dialogue_measures(_dialogue([("anchor", same)] * 3), mctx, agent_turns=3)["values"]
    assert m["self_bleu"] == pytest.approx(1.0)
    assert m["embedding_redundancy"] == pytest.approx(1.0, abs=1e-5)
    assert m["near_duplicate_rate"] == pytest.approx(2 / 3)  # the 2nd and 3rd copy an earlier turn
    different = dialogue_measures(_dialogue([
        ("anchor", same), ("catalyst", "What parts of that work would you want to carry into whatever comes next?"),
        ("action_guide", "Today, write down three contacts from your old team and message one of them.")]),
        mctx, agent_turns=3)["values"]
    assert different["self_bleu"] < 0.2 and different["embedding_redundancy"] < 0.6
    assert different["near_duplicate_rate"] == 0.0


def test_a_reply_that_answers_the_user_is_more_relevant_than_one_about_something_else(mctx):
    on = dialogue_measures(_dialogue([("anchor", "Losing your job after ten years is a real shock, and feeling "
                                                 "awful about it makes sense.")]), mctx, 1)["values"]
    off = dialogue_measures(_dialogue([("anchor", "The recipe needs two cups of flour and a pinch of salt before "
                                                  "baking.")]), mctx, 1)["values"]
    assert on["relevance_user"] > off["relevance_user"] + 0.2
    assert on["relevance_situation"] > off["relevance_situation"] + 0.2


def test_defect_rates_and_early_end(mctx, roster):
    anchor = next(c for c in roster if c.id == "anchor")
    m = dialogue_measures(_dialogue([
        ("anchor", f"{anchor.goal} That is what I do."),  # copies 8+ words of its own card: an echo
        ("beacon", "You did well. You did well."),  # a repeated sentence: a loop
        ("catalyst", "   "),  # no word
    ]), mctx, agent_turns=5)["values"]
    assert m["echo_rate"] == pytest.approx(1 / 3) and m["loop_rate"] == pytest.approx(1 / 3)
    assert m["empty_rate"] == pytest.approx(1 / 3) and m["early_end"] == 1.0
    # The empty reply has no identifiability; the others do.
    assert dialogue_measures(_dialogue([("catalyst", "   ")]), mctx, 1)["values"]["identifiability"] is None


def test_chance_given_shares_accounts_for_who_speaks():
    """Two personas: one speaks 90% of the replies and every reply lands nearest its card. Accuracy 0.9 is what
    the shares alone give: kappa 0; balanced accuracy 0.5."""
    identified = [("a", "a", 0.1)] * 9 + [("b", "a", -0.1)]
    s = identification_summary(identified, ["a", "b"])
    assert s["accuracy"] == 0.9 and s["chance"] == 0.5 and s["chance_given_shares"] == 0.9
    assert s["kappa"] == 0.0  # observed agreement == chance agreement
    assert s["balanced_accuracy"] == 0.5 and s["per_persona"]["b"] == {"accuracy": 0.0, "margin": -0.1, "n": 1}


def test_safety_gate_replies_are_left_out_of_the_text_measures(mctx):
    gate = "If you are in danger, please call your local emergency number now."
    d = _dialogue([("anchor", "That sounds frightening, and I'm here with you."), ("anchor", gate), ("beacon", gate)])
    for t in d["turns"][2:]:
        t["safety"] = True
    m = dialogue_measures(d, mctx, agent_turns=3)
    assert m["values"]["self_bleu"] is None and m["values"]["embedding_redundancy"] is None  # one persona reply left
    assert len(m["identified"]) == 1 and m["values"]["near_duplicate_rate"] == pytest.approx(1 / 3)


def test_a_speaker_outside_the_roster_has_no_identifiability(mctx):
    m = dialogue_measures(_dialogue([("supporter", "I'm sorry you're going through this.")]), mctx, 1)
    assert m["identified"] == [] and m["values"]["identifiability"] is None
    assert m["values"]["relevance_user"] is not None


def test_paired_test_finds_a_planted_difference_and_none_between_a_system_and_itself():
    rng = random.Random(1)
    base = [rng.gauss(0.5, 0.2) for _ in range(60)]
    better = [x + 0.1 + rng.gauss(0, 0.05) for x in base]
    found = paired_difference(better, base)
    assert found["n"] == 60 and found["p"] < 1e-6 and 0.05 < found["lo"] < found["mean_diff"] < found["hi"] < 0.15
    same = paired_difference(base, base)
    assert same["mean_diff"] == 0.0 and same["lo"] == same["hi"] == 0.0 and same["p"] == 1.0
    # Differences that cancel out (each +e has a -e): no difference found.
    eps = [rng.gauss(0, 0.05) for _ in range(30)]
    noise = [x + e for x, e in zip(base, [*eps, *(-e for e in eps)])]
    none = paired_difference(noise, base)
    assert none["p"] > 0.01 and none["lo"] < 0 < none["hi"]
    with pytest.raises(ValueError, match="pairs"):
        paired_difference([1.0, 2.0], [1.0])
    with pytest.raises(ValueError, match="NaN"):
        paired_difference([float("nan")], [1.0])


def test_bootstrap_interval_covers_the_mean_and_is_repeatable():
    xs = [0.1 * i for i in range(20)]
    a, b = bootstrap_mean(xs, seed=3), bootstrap_mean(xs, seed=3)
    assert a == b and a["lo"] < a["mean"] < a["hi"] and a["n"] == 20
    assert bootstrap_mean([]) == {"n": 0, "mean": None, "lo": None, "hi": None}
    assert bootstrap_mean([0.4]) == {"n": 1, "mean": 0.4, "lo": None, "hi": None}
    assert bootstrap_mean([0.5] * 5) == {"n": 5, "mean": 0.5, "lo": 0.5, "hi": 0.5}


def test_measures_block_pairs_systems_by_situation(roster, embedder, tmp_path):
    """A system speaking its own cards against the same replies with the labels rotated: the paired test finds the
    identifiability gap, and the per-dialogue rows are there for every dialogue."""
    from mascot.eval.assemble import measures_block

    ids = [c.id for c in roster]
    dialogues = []
    for k in range(12):
        order = ids[k % 5:] + ids[:k % 5]
        own = [(pid, identity_text(next(c for c in roster if c.id == pid))) for pid in order]
        rotated = [(order[(i + 1) % 5], text) for i, (_, text) in enumerate(own)]
        for system, replies in (("mascot", own), ("zero-shot", rotated)):
            d = _dialogue(replies)
            d.update(system=system, situation_id=f"s{k}", split="negative")
            dialogues.append(d)
    opts = SimpleNamespace(systems=["mascot", "zero-shot"], seed=0)
    block, rows = measures_block(opts, roster, dialogues, embedder, 5, lambda *_: None)
    assert len(rows) == 24 and {r["system"] for r in rows} == {"mascot", "zero-shot"}
    assert block["systems"]["mascot"]["values"]["identifiability"]["mean"] == 1.0
    assert block["systems"]["zero-shot"]["values"]["identifiability"]["mean"] == 0.0
    diff = block["paired"]["systems"]["zero-shot"]["identifiability"]
    assert block["paired"]["reference"] == "mascot" and diff["n"] == 12 and diff["mean_diff"] == 1.0
    assert diff["p"] < 0.01
    # Same text in both systems: no difference in the text-only measures.
    assert block["paired"]["systems"]["zero-shot"]["self_bleu"]["mean_diff"] == 0.0
    assert block["paired"]["systems"]["zero-shot"]["self_bleu"]["p"] == 1.0
    # Rendered: the tables, the paired row of zero-shot, and a confusion matrix per system.
    from mascot.eval.report import render_markdown, write_plots

    report = {"mode": "support", "judges": [], "systems": {}, "measures": block}
    md = render_markdown(report)
    assert "## Measures without a judge" in md and "No LLM judge ran" in md
    head = next(line for line in md.splitlines() if line.startswith("| System | n | Move compliance"))
    row = next(line for line in md.splitlines() if line.startswith("| MASCOT | 12 |"))
    col = [c.strip() for c in head.split("|")].index("MiniLM identifiability (diagnostic) ↑")
    assert [c.strip() for c in row.split("|")][col] == "1.000 [1.000, 1.000]"
    # The classifier uses no card: each persona of both systems always says the same text (zero-shot's the card of
    # another persona), so both are told apart perfectly, though only mascot's replies sit nearest their own card.
    for system in ("mascot", "zero-shot"):
        dist = block["systems"][system]["distinguishability"]
        assert dist["accuracy"] == 1.0 and dist["chance"] == 0.2 and dist["n"] == 60
        assert block["systems"][system]["openers"]["max_top_share"] == 1.0
        assert set(block["systems"][system]["moves_per_persona"]) == set(ids)
    assert "### Persona adherence by persona" in md and "1.000 [1.000, 1.000] (chance 0.20)" in md
    zs = next(line for line in md.splitlines() if line.startswith("| Zero-Shot |") and "| +1.000 [" in line)
    assert "p=" in zs
    ident = next(line for line in md.splitlines() if line.startswith("| MASCOT | 1.000 (n=60)"))
    assert "| 1.000 | 1.000 |" in ident  # kappa and balanced accuracy
    written = {p.name for p in write_plots(report, tmp_path)}
    assert written == {"confusion_mascot.png", "confusion_zero-shot.png", "adherence.png"}


def test_judge_spread_flags_a_judge_whose_scores_do_not_vary():
    from mascot.eval.assemble import judge_spread

    def verdicts(scores):
        return {"agent": [{"a": s, "b": s} for s in scores], "collective": None, "unparseable": 0}

    judged = {("mascot", f"s{i}"): {"flat": verdicts([1, 1, 1]),
                                    "varied": verdicts([1 + (i + j) % 5 for j in range(3)]),
                                    "split": {"agent": [{"a": 4, "b": 2}] * 3, "collective": None}}
              for i in range(10)}
    spread = judge_spread(judged, ["flat", "varied", "split", "silent"])
    assert spread["flat"]["informative"] is False and spread["flat"]["std"] == 0.0
    assert spread["flat"]["criteria"]["a"] == {"n": 30, "std": 0.0, "mode": 1, "mode_share": 1.0, "flat": True}
    assert spread["varied"]["informative"] is True and spread["varied"]["std"] > 1.0
    # Always 4 on one criterion and 2 on the other: pooled it would vary, per criterion it is flat.
    assert spread["split"]["informative"] is False and "every criterion is flat" in spread["split"]["reason"]
    # No verdict at all: not informative, for that reason.
    assert spread["silent"]["informative"] is False and spread["silent"]["reason"] == "no valid verdict in the run"
    # 19 of 20 the same score: flagged although the std is not zero.
    almost = {("m", "s"): {"j": verdicts([1] * 19 + [5])}}
    assert judge_spread(almost, ["j"])["j"]["informative"] is False


def _rounds(*rounds: list[tuple[str, str]], user: str = "I lost my job today and I feel awful.") -> dict:
    """A transcript of rounds: each a user message then the round's (persona, reply) agent turns."""
    turns = []
    for replies in rounds:
        turns.append({"role": "user", "persona_id": None, "text": user})
        turns += [{"role": "agent", "persona_id": pid, "text": text} for pid, text in replies]
    return {"system": "x", "situation_id": "s", "situation": "", "turns": turns}


#: Replies whose card moves are known (the detectors of the support cards' required moves, mascot.core.moves).
HARD = "That sounds so hard."  # feeling_label
STEP = "Tonight, write down three things you want to ask your manager."  # concrete_step
HERE = "I'm here with you. Anyone would feel shaken after losing a job."  # presence_language, normalising


def test_moves_per_round_counts_the_distinct_moves_of_each_round(mctx):
    from mascot.core.moves import assess

    user = "I lost my job today and I feel awful."
    assert [set(assess(mctx.round_moves, t, user).required) for t in (HARD, STEP, HERE)] == [
        {"feeling_label"}, {"concrete_step"}, {"presence_language", "normalising"}]
    # a round of three complementary turns (4 moves), one of the same turn three times (1), one of a single turn (2)
    d = _rounds([("anchor", HARD), ("action_guide", STEP), ("beacon", HERE)],
                [("anchor", HARD), ("catalyst", HARD), ("beacon", HARD)],
                [("empathetic_listener", HERE)])
    v = dialogue_measures(d, mctx, 7)["values"]
    assert v["moves_per_round"] == pytest.approx((4 + 1 + 2) / 3)
    # redundancy within rounds: the repeated turn gives 1, the single-turn round none
    from mascot.eval.automatic import mean_pairwise_cosine

    first = mean_pairwise_cosine(mctx.embed([HARD, STEP, HERE]))
    assert first < 0.9 and v["round_redundancy"] == pytest.approx((first + 1.0) / 2)
    # the safety gate's reply and empty replies are not a persona's moves; a dialogue of one-turn rounds has no
    # round redundancy (the whole-dialogue redundancy pairs turns across rounds)
    gated = _rounds([("anchor", HERE)], [("catalyst", STEP)], [("beacon", HARD)])
    gated["turns"][1]["safety"] = True
    v = dialogue_measures(gated, mctx, 3)["values"]
    assert v["moves_per_round"] == 1.0 and v["round_redundancy"] is None and v["embedding_redundancy"] is not None


def test_round_figures_compare_systems_pair_by_pair(roster, embedder):
    """Complementary rounds against rounds of one move said three times: more moves per round and less redundancy,
    both paired differences with intervals that exclude 0."""
    from mascot.eval.assemble import measures_block

    dialogues = []
    for k in range(12):
        for system, replies in (("mascot", [("anchor", HERE), ("action_guide", STEP), ("catalyst", HARD)]),
                                ("zero-shot", [("anchor", HARD), ("beacon", HARD), ("catalyst", HARD)])):
            d = _rounds(replies, replies)
            d.update(system=system, situation_id=f"s{k}", split="negative")
            dialogues.append(d)
    opts = SimpleNamespace(systems=["mascot", "zero-shot"], seed=0)
    block, rows = measures_block(opts, roster, dialogues, embedder, 6, lambda *_: None)
    assert all("moves_per_round" in r and "round_redundancy" in r for r in rows)
    values = {s: block["systems"][s]["values"] for s in ("mascot", "zero-shot")}
    assert values["mascot"]["moves_per_round"]["mean"] == 4.0 and values["zero-shot"]["moves_per_round"]["mean"] == 1.0
    assert values["zero-shot"]["round_redundancy"]["mean"] == pytest.approx(1.0)
    moves = block["paired"]["systems"]["zero-shot"]["moves_per_round"]
    assert moves["mean_diff"] == 3.0 and moves["lo"] == moves["hi"] == 3.0
    red = block["paired"]["systems"]["zero-shot"]["round_redundancy"]
    assert red["mean_diff"] < 0 and red["hi"] < 0
    assert block["better"]["moves_per_round"] == "higher" and block["better"]["round_redundancy"] == "lower"
    from mascot.eval.report import render_markdown

    md = render_markdown({"mode": "support", "judges": [], "systems": {}, "measures": block})
    assert "Moves/round ↑" in md and "Round redundancy ↓" in md and "| 4.000 [4.000, 4.000] |" in md


def _team_dialogue(speakers: list[str], tones: list[str], sources: list[str], safety: int = -1) -> dict:
    turns = [{"role": "user", "persona_id": None, "text": "My dog died last week."}]
    for i, (pid, tone, src) in enumerate(zip(speakers, tones, sources)):
        turns.append({"role": "agent", "persona_id": pid, "text": "A reply.", "safety": i == safety,
                      "directive": {"persona_id": pid, "action": "Acknowledge the loss.", "tone": tone,
                                    "source": src}})
    return {"turns": turns}


def test_team_figures_give_planted_shares_entropy_tone_and_fallback(roster):
    import math

    from mascot.eval.measures import team_figures

    ids = [c.id for c in roster]
    tones = ["Calm and empathetic", "calm and  empathetic", "Calm and empathetic", "Warm and upbeat", "Curious"]
    sources = ["model", "model", "retry", "model", "model"]
    even = [_team_dialogue(ids, tones, sources if k % 2 else [*sources[:4], "fallback"]) for k in range(10)]
    # a safety-gate turn (the gate's template, no director's choice) is left out of everything
    even[0]["turns"].append({"role": "agent", "persona_id": "anchor", "text": "Are you safe?", "safety": True,
                             "directive": {"tone": "Calm", "source": "safety"}})
    got = team_figures(even, ids, seed=0)
    assert got["agent_turns"] == 50 and got["directives"] == 50
    assert {p: s["share"] for p, s in got["persona_shares"].items()} == dict.fromkeys(ids, 0.2)
    ent = got["persona_entropy_bits"]
    assert ent["value"] == ent["lo"] == ent["hi"] == ent["max"] == round(math.log2(5), 6)  # every dialogue even
    top = got["tone_top"]
    assert (top["tone"], top["n"], top["share"], top["distinct"]) == ("Calm and empathetic", 30, 0.6, 3)
    assert top["lo"] == top["hi"] == 0.6
    fb = got["fallback_share"]
    assert (fb["n"], fb["share"]) == (5, 0.1) and fb["lo"] < 0.1 < fb["hi"]

    # one persona speaking everywhere: share 1, entropy 0; two speakers in different proportions per dialogue
    alone = team_figures([_team_dialogue(["anchor"] * 4, ["Calm"] * 4, ["model"] * 4) for _ in range(3)], ids)
    assert alone["persona_shares"]["anchor"]["share"] == 1.0 and alone["persona_entropy_bits"]["value"] == 0.0
    assert alone["persona_shares"]["beacon"] == {"n": 0, "share": 0.0, "lo": 0.0, "hi": 0.0}
    mixed = team_figures([_team_dialogue(["anchor", "beacon", "beacon", "beacon"], ["Calm"] * 4, ["model"] * 4),
                          _team_dialogue(["anchor", "anchor", "anchor", "beacon"], ["Calm"] * 4, ["model"] * 4)], ids)
    assert mixed["persona_shares"]["anchor"]["share"] == 0.5 and mixed["persona_entropy_bits"]["value"] == 1.0
    lo, hi = mixed["persona_shares"]["anchor"]["lo"], mixed["persona_shares"]["anchor"]["hi"]
    assert lo == 0.25 and hi == 0.75  # resamples of two dialogues: both first, one each, both second
    one = team_figures(even[:1], ids)
    assert one["persona_entropy_bits"]["lo"] is None and one["tone_top"]["hi"] is None  # no interval from one
    empty = team_figures([], ids)
    assert empty["agent_turns"] == 0 and empty["persona_entropy_bits"]["value"] is None
    assert empty["tone_top"]["share"] is None and empty["fallback_share"]["share"] is None
