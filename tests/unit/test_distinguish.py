"""Distinguishability (the cross-validated bag-of-words persona classifier) and opener diversity on planted replies:
shuffled persona labels fall to chance, a persona-specific first word rises near 1, and folds never split a
situation."""

from __future__ import annotations

import random

import pytest

from mascot.eval.distinguish import distinguishability, opener_diversity

PERSONAS = ["listener", "anchor", "catalyst", "guide", "beacon"]
SENTENCES = [
    "I'm so sorry to hear about what happened with your {x}.", "That sounds really hard, and your {x} matters.",
    "It must have been a long week with the {x}.", "Thank you for telling me about the {x}.",
    "I can imagine how the {x} made you feel.", "What a day you had with the {x}.",
    "It is a lot to carry, the {x} and everything else.", "I hope the {x} gets easier soon.",
]
TOPICS = ["dog", "exam", "job", "sister", "car", "house", "trip", "neighbour", "party", "garden", "phone", "class"]


def _replies(seed: int, n_situations: int = 40) -> tuple[list[str], list[str], list[str]]:
    """Every persona answers every situation with two generic sentences about its topic (no persona signal)."""
    rng = random.Random(seed)
    texts, labels, groups = [], [], []
    for s in range(n_situations):
        topic = TOPICS[s % len(TOPICS)]
        for p in PERSONAS:
            texts.append(" ".join(rng.choice(SENTENCES).format(x=topic) for _ in range(2)))
            labels.append(p)
            groups.append(f"sit{s}")
    return texts, labels, groups


def test_generic_replies_sit_at_chance() -> None:
    texts, labels, groups = _replies(0)
    res = distinguishability(texts, labels, groups, seed=0)
    assert res["chance"] == pytest.approx(0.2)
    assert res["accuracy"] < 0.32 and res["lo"] <= 0.2 + 0.05
    assert res["folds"] == 5 and res["n"] == 200 and res["left_out"] == []


def test_shuffled_labels_fall_to_chance() -> None:
    texts, labels, groups = _replies(1)
    marked = [f"{lab.upper()}WORD {t}" for t, lab in zip(texts, labels)]
    assert distinguishability(marked, labels, groups, seed=0)["accuracy"] > 0.95
    shuffled = labels[:]
    random.Random(7).shuffle(shuffled)
    res = distinguishability(marked, shuffled, groups, seed=0)
    assert res["accuracy"] < 0.32


def test_a_persona_specific_first_word_is_found() -> None:
    texts, labels, groups = _replies(2)
    words = {"listener": "Hmm,", "anchor": "Breathe.", "catalyst": "Wonder:", "guide": "Step:", "beacon": "Wow!"}
    res = distinguishability([f"{words[lab]} {t}" for t, lab in zip(texts, labels)], labels, groups, seed=0)
    assert res["accuracy"] > 0.95 and res["lo"] > 0.9
    assert all(v > 0.9 for v in res["per_persona"].values())


def test_folds_are_grouped_by_situation() -> None:
    # two replies per (situation, persona), both carrying a random token of that pair only: folds that split a
    # situation would put one in training and classify the other by its token; grouped folds never can
    rng = random.Random(3)
    texts, labels, groups = [], [], []
    for s in range(40):
        for p in PERSONAS:
            token = "".join(rng.choice("bcdfghjklmnpqrstvwz") for _ in range(8))
            for _ in range(2):
                texts.append(f"{token} " + rng.choice(SENTENCES).format(x="day"))
                labels.append(p)
                groups.append(f"sit{s}")
    res = distinguishability(texts, labels, groups, seed=0)
    assert res["accuracy"] < 0.32


def test_rare_personas_are_left_out_and_too_little_data_is_said() -> None:
    texts, labels, groups = _replies(4)
    keep = [i for i, lab in enumerate(labels) if lab != "guide" or groups[i] in ("sit0", "sit1")]
    res = distinguishability([texts[i] for i in keep], [labels[i] for i in keep], [groups[i] for i in keep])
    assert res["left_out"] == ["guide"] and res["chance"] == pytest.approx(0.25)
    res = distinguishability(["a b c"] * 3, ["x", "y", "x"], ["s", "s", "s"])
    assert res["accuracy"] is None and "needs 2+ personas" in res["reason"]
    with pytest.raises(ValueError, match="differ in length"):
        distinguishability(["a"], ["x", "y"], ["s"])


def test_opener_diversity() -> None:
    res = opener_diversity({"a": ["I'm so sorry to hear that.", "I'm so sorry to hear this.", "What a day."],
                            "b": ["One.", "Two.", "Three."], "c": []})
    assert res["per_persona"]["a"] == {"n": 3, "top_share": pytest.approx(0.6667), "opener": "i'm so sorry to"}
    assert res["per_persona"]["b"]["top_share"] == pytest.approx(0.3333)
    assert res["per_persona"]["c"]["top_share"] is None
    assert res["worst"] == "a" and res["max_top_share"] == pytest.approx(0.6667)
