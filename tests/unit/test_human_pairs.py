"""Human preference study export/import: real krippendorff and scipy, no mocks."""

import csv
import json

import krippendorff
import numpy as np
import pytest
from scipy.stats import binomtest

from mascot.eval.human import export_pairs, import_pairs, load_transcripts, nominal_alpha, render_dialogue

TARGET = "mascot"
SYSTEMS = [TARGET, "few-shot-cot", "multiagentesc"]
SIDS = [f"hit:{i}_conv:{2 * i}" for i in range(1, 5)]
PLANT = '<script>alert("pwned")</script>'


def _record(system, k, sid):
    turns = [{"index": 0, "role": "user", "persona_id": None, "text": f"I lost my keys again ({sid})."}]
    if system == TARGET:
        turns += [{"index": 1, "role": "agent", "persona_id": "anchor", "text": "That sounds stressful."},
                  {"index": 2, "role": "agent", "persona_id": "action_guide", "text": "Try a hook by the door."}]
    else:
        text = PLANT if (system == "few-shot-cot" and k == 1) else f"Reply {k} from a baseline: keep calm."
        turns += [{"index": 1, "role": "agent", "persona_id": None, "text": text}]
    return {"system": system, "situation_id": sid, "split": "negative", "mode": "support",
            "situation": f"Situation {k}: keys & doors", "emotion": "annoyed", "personas": ["anchor"], "turns": turns}


@pytest.fixture
def eval_dir(tmp_path):
    d = tmp_path / "eval"
    d.mkdir()
    lines = [json.dumps(_record(s, k, sid)) for s in SYSTEMS for k, sid in enumerate(SIDS)]
    (d / "transcripts.jsonl").write_text("\n".join(lines) + "\n\n", encoding="utf-8")
    return d


def _read_csv(path):
    with path.open(encoding="utf-8", newline="") as f:
        return list(csv.DictReader(f))


def _export(eval_dir, out, seed=0, **kw):
    return export_pairs(eval_dir, out, target=TARGET, seed=seed, threeway=SYSTEMS, **kw)


def _key(out):
    return json.loads((out / "key.json").read_text(encoding="utf-8"))


def test_export_writes_blinded_files(eval_dir, tmp_path):
    out = tmp_path / "study"
    res = _export(eval_dir, out)
    assert res["pairs"] == 8 and res["threeway"] == 4 and res["template_rows"] == 12 * 3
    assert res["per_system"] == {"few-shot-cot": 4, "multiagentesc": 4} and res["warnings"] == []
    for name in ("pairs.csv", "threeway.csv", "ratings_template.csv", "form.html", "key.json"):
        assert (out / name).is_file()
    assert not list(out.glob("*.tmp"))

    key = _key(out)
    assert "do not show to raters" in key["note"]
    items = key["items"]
    data = load_transcripts(eval_dir)
    pairs = _read_csv(out / "pairs.csv")
    assert [r["item_id"] for r in pairs] == [f"p{i:04d}" for i in range(1, 9)]
    for row in pairs:  # the key unblinds: A and B are the dialogues of the systems it names
        it = items[row["item_id"]]
        assert it["kind"] == "pair" and TARGET in (it["a"], it["b"])
        assert row["dialogue_a"] == render_dialogue(data[it["a"]][it["situation_id"]]["turns"])
        assert row["dialogue_b"] == render_dialogue(data[it["b"]][it["situation_id"]]["turns"])
        assert row["situation"] == data[TARGET][it["situation_id"]]["situation"]
    pair_items = [it for it in items.values() if it["kind"] == "pair"]
    assert {(it["situation_id"], (set((it["a"], it["b"])) - {TARGET}).pop()) for it in pair_items} == \
        {(sid, other) for sid in SIDS for other in SYSTEMS[1:]}
    assert {it["a"] == TARGET for it in pair_items} == {True, False}  # order randomised both ways
    for row in _read_csv(out / "threeway.csv"):
        it = items[row["item_id"]]
        assert it["kind"] == "threeway" and sorted((it["a"], it["b"], it["c"])) == sorted(SYSTEMS)
        assert row["dialogue_c"] == render_dialogue(data[it["c"]][it["situation_id"]]["turns"])
    assert "User: I lost my keys" in pairs[0]["dialogue_a"]
    assert any("Action Guide: Try a hook" in r["dialogue_a"] + r["dialogue_b"] for r in pairs)

    template = _read_csv(out / "ratings_template.csv")
    assert {(r["item_id"], r["rater"]) for r in template} == {(i, str(r)) for i in items for r in (1, 2, 3)}
    assert all(r["choice"] == "" for r in template)

    for name in ("pairs.csv", "threeway.csv", "ratings_template.csv", "form.html"):
        text = (out / name).read_text(encoding="utf-8").lower()
        assert not [s for s in SYSTEMS if s in text], name

    form = (out / "form.html").read_text(encoding="utf-8")
    assert PLANT not in form and "&lt;script&gt;alert(&quot;pwned&quot;)&lt;/script&gt;" in form
    assert "keys &amp; doors" in form
    assert "http" not in form and "<link" not in form  # self-contained
    assert form.count('type="radio"') == 8 * 3 + 4 * 4 and form.count('<section class="item"') == 12
    assert "item_id,rater,choice" in form


def test_seed_determines_files(eval_dir, tmp_path):
    _export(eval_dir, tmp_path / "a", seed=0)
    _export(eval_dir, tmp_path / "b", seed=0)
    _export(eval_dir, tmp_path / "c", seed=1)
    for name in ("pairs.csv", "threeway.csv", "ratings_template.csv", "form.html", "key.json"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
    order = {d: [(it["situation_id"], it["a"], it["b"]) for it in _key(tmp_path / d)["items"].values()]
             for d in "ac"}
    assert order["a"] != order["c"] and sorted(order["a"]) != sorted(order["c"])  # A/B order, not only item order


def test_export_refuses_to_replace_a_different_study(eval_dir, tmp_path):
    out = tmp_path / "study"
    _export(eval_dir, out, seed=0)
    _export(eval_dir, out, seed=0)  # same export again: fine
    with pytest.raises(FileExistsError, match="key.json"):
        _export(eval_dir, out, seed=5)
    res = export_pairs(eval_dir, out, target=TARGET, seed=5, overwrite=True)
    assert res["threeway"] == 0 and not (out / "threeway.csv").exists()


def test_export_options(eval_dir, tmp_path):
    res = export_pairs(eval_dir, tmp_path / "s", against=["multiagentesc"], limit=2, raters=1)
    assert res["pairs"] == 2 and res["per_system"] == {"multiagentesc": 2} and "at least 3" in res["warnings"][0]
    assert len(_read_csv(tmp_path / "s" / "ratings_template.csv")) == 2


def _letter(item, outcome):
    if outcome == "tie":
        return "tie"
    want = TARGET if outcome == "win" else ({item["a"], item["b"]} - {TARGET}).pop()
    return "A" if item["a"] == want else "B"


# situation index -> outcome per rater ("1", "2", "3"); None = left empty
AGREE = {0: "win", 1: "win", 2: "loss", 3: "tie"}
SPLIT = {"1": ["win", "win", "win", "loss"], "2": ["win", "loss", "win", "tie"], "3": ["win", "win", "tie", None]}


def _fill(out, tmp_path):
    items = _key(out)["items"]
    rows = {"1": [], "2": [], "3": []}
    matrix = {}  # multiagentesc items: rater -> item -> blinded letter
    for iid, it in sorted(items.items()):
        k = SIDS.index(it["situation_id"])
        for rater in rows:
            if it["kind"] == "threeway":
                want = "few-shot-cot" if (rater == "3" and k == 0) else TARGET
                choice = "tie" if k == 3 else "ABC"[[it["a"], it["b"], it["c"]].index(want)]
            elif "few-shot-cot" in (it["a"], it["b"]):
                choice = _letter(it, AGREE[k])
            else:
                outcome = SPLIT[rater][k]
                choice = "" if outcome is None else _letter(it, outcome)
                matrix.setdefault(rater, {})[iid] = choice
            rows[rater].append((iid, rater, choice))
    f1, f2 = tmp_path / "r12.csv", tmp_path / "r3.csv"
    for path, raters in ((f1, ("1", "2")), (f2, ("3",))):
        with path.open("w", encoding="utf-8", newline="") as f:
            w = csv.writer(f)
            w.writerow(["item_id", "rater", "choice"])
            for r in raters:
                w.writerows(rows[r])
    return [f1, f2], matrix


def test_import_reports_planted_counts(eval_dir, tmp_path):
    out = tmp_path / "study"
    _export(eval_dir, out)
    files, matrix = _fill(out, tmp_path)
    res = import_pairs(out, files)

    fsc = res["pairs"]["few-shot-cot"]
    assert (fsc["wins"], fsc["losses"], fsc["ties"], fsc["n"], fsc["missing"]) == (6, 3, 3, 12, 0)
    assert fsc["win_rate"] == 6 / 9 and fsc["preference_rate"] == (6 + 0.5 * 3) / 12
    assert fsc["p_value"] == binomtest(6, 9, 0.5).pvalue
    assert fsc["alpha"] == 1.0 and fsc["alpha_note"] is None

    mae = res["pairs"]["multiagentesc"]
    assert (mae["wins"], mae["losses"], mae["ties"], mae["n"], mae["missing"]) == (7, 2, 2, 11, 1)
    assert mae["p_value"] == binomtest(7, 9, 0.5).pvalue
    assert mae["items"] == 4 and mae["items_rated"] == 4 and mae["min_raters_per_item"] == 2
    ids = sorted(matrix["1"])
    codes = {"A": 0.0, "B": 1.0, "tie": 2.0, "": np.nan}
    data = [[codes[matrix[r][i]] for i in ids] for r in ("1", "2", "3")]
    expected = krippendorff.alpha(reliability_data=data, level_of_measurement="nominal")
    assert mae["alpha"] == pytest.approx(float(expected), abs=1e-12) and 0 < mae["alpha"] < 1

    tw = res["threeway"][" vs ".join(sorted(SYSTEMS))]
    assert tw["first_choice"] == {TARGET: 8, "few-shot-cot": 1, "multiagentesc": 0} and tw["ties"] == 3
    assert tw["share"][TARGET] == 8 / 12 and tw["tie_share"] == 3 / 12

    assert res["raters"] == ["1", "2", "3"] and res["missing"] == 1 and res["judgements"] == 8 * 3 + 4 * 3 - 1
    assert len(res["warnings"]) == 1 and "fewer than 3" in res["warnings"][0]
    assert json.loads((out / "preference.json").read_text(encoding="utf-8")) == json.loads(json.dumps(res))


def test_alpha_undefined_cases():
    assert nominal_alpha({("p1", "1"): "A", ("p2", "1"): "B"}) == (None, "no item has ratings from 2 or more raters")
    alpha, note = nominal_alpha({("p1", "1"): "A", ("p1", "2"): "A"})
    assert alpha is None and "same value" in note


def _bad_ratings(tmp_path, body):
    path = tmp_path / "bad.csv"
    path.write_text("item_id,rater,choice\n" + body, encoding="utf-8")
    return path


@pytest.mark.parametrize("body, match", [
    ("p0001,1,A\np9999,1,A\n", r"bad\.csv:3: unknown item id 'p9999'"),
    ("p0001,1,A\np0002,1,X\n", r"bad\.csv:3: choice 'X' for item p0002 is not one of A, B, tie"),
    ("p0001,1,C\n", r"bad\.csv:2: choice 'C'"),
    ("t0001,1,D\n", r"bad\.csv:2: choice 'D' for item t0001 is not one of A, B, C, tie"),
    ("p0001,1,A\np0001,1,B\n", r"bad\.csv:3: rater '1' already rated item p0001 at .*bad\.csv:2"),
    ("p0001,,A\n", r"bad\.csv:2: empty rater"),
])
def test_import_rejects_bad_rows(eval_dir, tmp_path, body, match):
    out = tmp_path / "study"
    _export(eval_dir, out)
    with pytest.raises(ValueError, match=match):
        import_pairs(out, [_bad_ratings(tmp_path, body)])
    assert not (out / "preference.json").exists()


def test_import_missing_files(eval_dir, tmp_path):
    with pytest.raises(FileNotFoundError, match=r"nowhere[/\\]key\.json: not found"):
        import_pairs(tmp_path / "nowhere", [_bad_ratings(tmp_path, "")])
    out = tmp_path / "study"
    _export(eval_dir, out)
    with pytest.raises(FileNotFoundError, match="absent.csv"):
        import_pairs(out, [tmp_path / "absent.csv"])
    (tmp_path / "nohdr.csv").write_text("id,who,pick\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"nohdr\.csv:1: missing column\(s\) item_id, rater, choice"):
        import_pairs(out, [tmp_path / "nohdr.csv"])
    with pytest.raises(ValueError, match="no ratings file"):
        import_pairs(out, [])
    # case and blank rows are tolerated; the only rated row counts
    res = import_pairs(out, [_bad_ratings(tmp_path, "\n,,\np0001, 1 , tie \n")])
    assert res["judgements"] == 1 and sum(p["ties"] for p in res["pairs"].values()) == 1


def test_export_rejects_bad_inputs(eval_dir, tmp_path):
    with pytest.raises(FileNotFoundError, match="transcripts.jsonl"):
        export_pairs(tmp_path / "empty", tmp_path / "s")
    with pytest.raises(ValueError, match="no dialogues for target system 'sft'.*few-shot-cot, mascot, multiagentesc"):
        export_pairs(eval_dir, tmp_path / "s", target="sft")
    with pytest.raises(ValueError, match="compared system.*zero-shot"):
        export_pairs(eval_dir, tmp_path / "s", against=["zero-shot"])
    with pytest.raises(ValueError, match="exactly 3 distinct"):
        export_pairs(eval_dir, tmp_path / "s", threeway=["mascot", "few-shot-cot"])
    with pytest.raises(ValueError, match="raters must be"):
        export_pairs(eval_dir, tmp_path / "s", raters=0)
    path = eval_dir / "transcripts.jsonl"
    lines = path.read_text(encoding="utf-8").splitlines()
    path.write_text("\n".join([lines[0], "{not json", *lines[1:]]), encoding="utf-8")
    with pytest.raises(ValueError, match=r"transcripts\.jsonl:2: not valid JSON"):
        export_pairs(eval_dir, tmp_path / "s")
    path.write_text("\n".join([lines[0], lines[0]]), encoding="utf-8")
    with pytest.raises(ValueError, match=r"transcripts\.jsonl:2: system 'mascot' has situation .* twice"):
        export_pairs(eval_dir, tmp_path / "s")
    assert not (tmp_path / "s").exists()
