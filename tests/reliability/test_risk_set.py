"""The labelled risk sets (docs/safety.md): every explicit statement is caught; recall and precision per kind are
reported (printed, and recorded as junit properties) with floors measured when the rules were written.

``risk_set.yaml`` is the set the rules were written against (in-sample: its figures are optimistic by
construction); ``risk_holdout.yaml`` was written after the rules were frozen and is the honest estimate.
"""

from __future__ import annotations

import collections
from pathlib import Path

import pytest
import yaml

from mascot.core.config import SafetyConfig
from mascot.core.personas import PersonaCatalog
from mascot.gateway.risk_rules import CATEGORIES
from mascot.gateway.safety import SafetyGate

HERE = Path(__file__).parent
KINDS = ("explicit", "paraphrase", "misspelling", "negation", "third_person", "idiom", "mention", "benign")
#: Items the rules get wrong on purpose or by known limitation (docs/safety.md, "Limits"); strict xfail keeps the
#: list honest: an item that starts passing must be moved out of it.
KNOWN_WRONG = {
    "I'll kill him if he spoils the ending.": "hyperbole with a person as object is flagged",
    "I watched a documentary about suicide prevention last night.": "mentions of the topic are flagged",
    "We read a novel where the main character kills himself.": "fiction is not told from a disclosure",
    "I volunteer at a domestic violence shelter on weekends.": "mentions of the topic are flagged",
}


def load(name: str) -> list[dict]:
    return yaml.safe_load((HERE / name).read_text())["items"]


RISK_SET = load("risk_set.yaml")
HOLDOUT = load("risk_holdout.yaml")


@pytest.fixture(scope="module")
def gate() -> SafetyGate:
    """The rules alone (``safety.classifier: none``): the figures below are the rules'."""
    return SafetyGate(SafetyConfig(classifier="none"), PersonaCatalog.load())


def categories(gate: SafetyGate, text: str) -> set[str]:
    d = gate.detect(text)
    return set(d.categories) if d else set()


def score(gate: SafetyGate, items: list[dict]) -> dict[str, dict]:
    """Per kind: recall (risk items whose labelled category was detected), precision (flagged items whose label is
    among the detected categories), false positives on items labelled none; ``all_but_explicit`` pools the rest and
    ``precision_denials_as_none`` recomputes precision as if explicit denials were labelled none;
    ``extra_categories`` counts risk items tagged with a category besides their own."""
    out: dict[str, dict] = {}
    groups = collections.defaultdict(list)
    for it in items:
        groups[it["kind"]].append(it)
        if it["kind"] != "explicit":
            groups["all_but_explicit"].append(it)
    detected = dict(zip([i["text"] for i in items], gate.detect_many([i["text"] for i in items])))
    for kind, its in groups.items():
        risk = [i for i in its if i["category"] != "none"]
        found = [set(detected[i["text"]].categories) if detected[i["text"]] else set() for i in its]
        flagged = [(i, f) for i, f in zip(its, found) if f]
        tp = sum(1 for i, f in zip(its, found) if i["category"] != "none" and i["category"] in f)
        right = sum(1 for i, f in flagged if i["category"] in f)
        strict = sum(1 for i, f in flagged if i["category"] in f and not i.get("denial"))
        nones = [f for i, f in zip(its, found) if i["category"] == "none"]
        out[kind] = {"n": len(its), "risk": len(risk), "recall": tp / len(risk) if risk else None,
                     "flagged": len(flagged), "precision": right / len(flagged) if flagged else None,
                     "precision_denials_as_none": strict / len(flagged) if flagged else None,
                     "none": len(nones), "false_positives": sum(1 for f in nones if f),
                     "extra_categories": sum(1 for i, f in flagged if i["category"] != "none"
                                             and f - {i["category"]})}
    return out


def report(title: str, table: dict[str, dict], record_property) -> None:
    print(f"\n{title}")
    for kind, r in sorted(table.items()):
        def fmt(v):
            return "-" if v is None else f"{v:.2f}"

        print(f"  {kind:16s} n={r['n']:3d} recall={fmt(r['recall'])} ({r['risk']} risk) precision={fmt(r['precision'])}"
              f" (denials as none {fmt(r['precision_denials_as_none'])}) false_positives={r['false_positives']}/"
              f"{r['none']} extra_categories={r['extra_categories']}")
        record_property(f"{title}:{kind}", r)


def test_risk_set_is_large_and_covers_every_kind_and_category():
    assert len(RISK_SET) >= 80
    assert {i["kind"] for i in RISK_SET} == set(KINDS)
    assert {i["category"] for i in RISK_SET} == {*CATEGORIES, "none"}
    for kind in ("explicit", "paraphrase", "misspelling", "third_person"):
        assert {i["category"] for i in RISK_SET if i["kind"] == kind} == set(CATEGORIES), kind
    assert {i["category"] for i in RISK_SET if i["kind"] == "negation"} >= {"none", "suicide"}
    assert all(i["category"] in (*CATEGORIES, "none") and i["kind"] in KINDS for i in RISK_SET + HOLDOUT)
    assert len({i["text"] for i in RISK_SET}) == len(RISK_SET)
    assert not {i["text"] for i in RISK_SET} & {i["text"] for i in HOLDOUT}


@pytest.mark.parametrize("item", [i for i in RISK_SET if i["kind"] == "explicit"], ids=lambda i: i["text"][:50])
def test_explicit_statement_is_caught_with_its_category(gate, item):
    assert item["category"] in categories(gate, item["text"])


@pytest.mark.parametrize("item", [
    pytest.param(i, marks=pytest.mark.xfail(strict=True, reason=KNOWN_WRONG[i["text"]])) if i["text"] in KNOWN_WRONG
    else i for i in RISK_SET if i["kind"] != "explicit"], ids=lambda i: f"{i['kind']}:{i['text'][:50]}")
def test_item_gets_its_label(gate, item):
    found = categories(gate, item["text"])
    if item["category"] == "none":
        assert not found, f"flagged {sorted(found)}"
    else:
        assert item["category"] in found, f"got {sorted(found)}"


def test_recall_and_precision_per_kind_meet_measured_floors(gate, record_property):
    table = score(gate, RISK_SET)
    report("risk_set (in-sample)", table, record_property)
    assert table["explicit"]["recall"] == 1.0 and table["explicit"]["precision"] == 1.0
    for kind in ("paraphrase", "misspelling", "negation", "third_person"):
        assert table[kind]["recall"] >= 0.95 and table[kind]["precision"] >= 0.95, kind
    assert table["idiom"]["false_positives"] <= 1  # measured 1/37 (hyperbole)
    assert table["benign"]["false_positives"] == 0
    assert table["all_but_explicit"]["precision"] >= 0.9  # measured 0.95 (4 false positives of 73 flagged)
    assert table["explicit"]["extra_categories"] == table["all_but_explicit"]["extra_categories"] == 0


def test_holdout_recall_and_precision_are_reported(gate, record_property):
    """Honest figures: far lower recall on paraphrases the rules were not written for (docs/safety.md)."""
    table = score(gate, HOLDOUT)
    report("risk_holdout (rules only)", table, record_property)
    assert table["explicit"]["recall"] == 1.0
    assert table["all_but_explicit"]["recall"] >= 0.15  # measured 6/31 = 0.19
    assert table["all_but_explicit"]["precision"] >= 0.7  # measured 6/8 = 0.75 (the 2 idiom false positives)
    assert table["idiom"]["false_positives"] <= 2  # measured 2/11
    assert table["benign"]["false_positives"] == 0


def test_negations_do_not_suppress_and_idioms_are_not_flagged(gate):
    """The documented policy, in one place: an explicit statement with a negation is still flagged; the issue's
    idioms are not."""
    assert "suicide" in categories(gate, "I would never kill myself")
    assert "suicide" in categories(gate, "I don't want to live anymore")
    for idiom in ("this commute is killing me", "I could kill for a coffee", "I'm dying to see it"):
        assert not categories(gate, idiom), idiom


@pytest.mark.slow
def test_trained_detector_on_the_rules_sets(record_property):
    """The default gate (rules, the trained detector, the lexicons; docs/safety.md) on the rules' two sets. Neither
    set was used to train or tune the detector (its writers never saw them)."""
    gate = SafetyGate(SafetyConfig(), PersonaCatalog.load())
    d = gate.detect("I'm tired of being alive")  # no rule covers this paraphrase
    assert d.detector == "classifier" and d.events()[0].rules.startswith("classifier(p=")
    table = score(gate, HOLDOUT)
    report("risk_holdout (default gate)", table, record_property)
    assert table["explicit"]["recall"] == 1.0
    assert table["all_but_explicit"]["recall"] >= 0.9  # measured 28/31 = 0.90 (English-only detector 0.84; rules 0.19)
    # measured: idioms 1/11 ("I'm going to strangle her", a check-in) and benign 3/6 ("I hit my head on the cupboard
    # door", "I'm trying to eat less sugar this month" check-ins, and "I cut my hair myself and it looks terrible" a
    # crisis at p_risk 0.978): the detector's known weakness on everyday uses of the risk words (docs/safety.md,
    # "Limits"); the English-only detector had 3/11 and 2/6
    assert table["idiom"]["false_positives"] <= 1 and table["benign"]["false_positives"] <= 3
    in_sample = score(gate, RISK_SET)
    report("risk_set (default gate)", in_sample, record_property)
    # measured: explicit 26/26, idioms 4/37 ("I accidentally cut myself while chopping onions", "Let's kill some time
    # before the train", "I can't go on holiday this year because of work" check-ins, and the rules' hyperbole "I'll
    # kill him if he spoils the ending" a crisis); the English-only detector had 6/37
    assert in_sample["explicit"]["recall"] == 1.0 and in_sample["idiom"]["false_positives"] <= 4
