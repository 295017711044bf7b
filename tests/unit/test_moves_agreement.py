"""The card-move detectors agree with careful readers.

``tests/fixtures/moves/labelled_replies.jsonl`` holds 244 replies of the default model, each labelled by a reader who
was shown only the persona cards (role, goal, allowed and forbidden moves, style) and the user's message:
``required`` (the reply does at least one of the card's allowed moves) and ``forbidden`` (it does at least one of the
card's forbidden moves). 160 (ids ``r…``) are speaker-probe replies (training-split situations, both conditions, 32
per support persona) labelled by one reader; 84 (ids ``h…``) are replies from inside MASCOT dialogues of the
evaluation (20 per persona, 4 of the Anchor, whom that director rarely chose) labelled by a second reader who saw
neither the first reader's labels nor the detectors. The labels were written for this test and never changed to fit
the detectors (the detectors were changed to fit them: docs/evaluation.md gives the agreement on the second set
before that). Each persona's detectors must agree with the readers on at least 85% of its replies, for the required
and for the forbidden verdict; Cohen's kappa is printed beside it (``-s`` shows the table).
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import pytest

from mascot.core.moves import assess
from mascot.core.personas import PersonaCatalog

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "moves" / "labelled_replies.jsonl"
#: Agreement each persona's detectors must reach with the reader, per verdict.
FLOOR = 0.85


def _rows() -> list[dict]:
    return [json.loads(line) for line in FIXTURE.read_text(encoding="utf-8").splitlines() if line.strip()]


def kappa(a: list[bool], b: list[bool]) -> float | None:
    """Cohen's kappa of two binary raters (scikit-learn); None when both say the same thing throughout."""
    from sklearn.metrics import cohen_kappa_score

    if len(set(a) | set(b)) < 2:
        return None
    return float(cohen_kappa_score(a, b))


def agreement_table() -> dict[tuple[str, str], dict]:
    """``{(persona, verdict): {"n", "agree", "kappa", "reader_yes", "detector_yes"}}`` over the fixture."""
    catalog = PersonaCatalog.load()
    pairs: dict[tuple[str, str], list[tuple[bool, bool]]] = defaultdict(list)
    for r in _rows():
        v = assess(catalog.get(r["persona_id"]).moves, r["reply"], r["user"])
        pairs[(r["persona_id"], "required")].append((bool(r["required"]), v.required_present))
        pairs[(r["persona_id"], "forbidden")].append((bool(r["forbidden"]), v.forbidden_present))
    out = {}
    for key, xs in sorted(pairs.items()):
        reader, det = [x for x, _ in xs], [y for _, y in xs]
        out[key] = {"n": len(xs), "agree": sum(x == y for x, y in xs) / len(xs), "kappa": kappa(reader, det),
                    "reader_yes": sum(reader), "detector_yes": sum(det)}
    return out


def test_fixture_is_large_and_covers_every_support_persona() -> None:
    rows = _rows()
    assert len(rows) >= 150
    assert len({r["id"] for r in rows}) == len(rows)
    personas = {c.id for c in PersonaCatalog.load().in_set("support")}
    counts = {p: sum(1 for r in rows if r["persona_id"] == p) for p in personas}
    assert min(counts.values()) >= 25, counts
    for r in rows:
        assert isinstance(r["required"], bool) and isinstance(r["forbidden"], bool) and r["reply"].strip()


def test_detectors_agree_with_the_reader() -> None:
    table = agreement_table()
    print("\npersona / verdict: agreement, kappa, reader yes / detector yes (n)")
    for (pid, verdict), t in table.items():
        k = "–" if t["kappa"] is None else f"{t['kappa']:.2f}"
        print(f"{pid:20s} {verdict:9s} {t['agree']:.2f}  kappa {k:>5s}  {t['reader_yes']:3d} / {t['detector_yes']:3d} "
              f"({t['n']})")
    low = {k: round(t["agree"], 3) for k, t in table.items() if t["agree"] < FLOOR}
    assert not low, f"detectors agree with the reader on fewer than {FLOOR:.0%} of replies: {low}"


@pytest.mark.parametrize("verdict", ["required", "forbidden"])
def test_pooled_agreement_is_better_than_always_saying_the_majority(verdict: str) -> None:
    """A detector that always answered the reader's majority label would pass a per-persona floor where the reader
    almost always says one thing; pooled over personas, kappa must show real agreement."""
    catalog = PersonaCatalog.load()
    reader, det = [], []
    for r in _rows():
        v = assess(catalog.get(r["persona_id"]).moves, r["reply"], r["user"])
        reader.append(bool(r[verdict]))
        det.append(v.required_present if verdict == "required" else v.forbidden_present)
    k = kappa(reader, det)
    assert k is not None and k >= 0.6, k
