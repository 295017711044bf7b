"""Human preference study: blinded export of comparison items, and import of the filled ratings.

Protocol: blinded pairwise A/B with randomised
order, ties allowed and reported separately, at least 3 raters per item, Krippendorff's alpha. The platform exports
the items and analyses the returned ratings; it does not host the study. The paper reports only "% preference".

Files written by :func:`export_pairs` into the study directory (every one atomically, temp file + ``os.replace``):

- ``pairs.csv``: ``item_id, situation, dialogue_a, dialogue_b`` (shown to raters).
- ``threeway.csv``: ``item_id, situation, dialogue_a, dialogue_b, dialogue_c`` (only with ``threeway``).
- ``ratings_template.csv``: ``item_id, rater, choice``; one row per item and rater, choice empty.
- ``form.html``: a self-contained form that downloads answers in the ``ratings_template.csv`` format.
- ``key.json``: which system is A / B (/ C) per item. It unblinds the study: never show it to raters.

:func:`import_pairs` reads ``key.json`` plus the filled ratings CSVs and writes ``preference.json``.
"""

from __future__ import annotations

import csv
import html
import io
import json
import os
import random
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import krippendorff
import numpy as np

from mascot.core.files import atomic_write_text

TRANSCRIPTS = "transcripts.jsonl"
KEY_FILE = "key.json"
RESULT_FILE = "preference.json"
RATING_COLUMNS = ("item_id", "rater", "choice")
CHOICES = {"pair": ("A", "B", "tie"), "threeway": ("A", "B", "C", "tie")}
#: the docs: at least 3 raters per item.
MIN_RATERS = 3


# ---------------------------------------------------------------------------------------------------- helpers


def _write_atomic(path: Path, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically (:func:`mascot.core.files.atomic_write_text`)."""
    atomic_write_text(path, text)


def _csv_text(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(header)
    w.writerows(rows)
    return buf.getvalue()


def _letters(n: int) -> list[str]:
    return ["A", "B", "C"][:n]


def render_dialogue(turns: Sequence[Mapping[str, Any]], names: Mapping[str, str] | None = None) -> str:
    """Render a transcript's turns as plain text lines for raters.

    User turns become ``User: <text>``; agent turns ``<display name>: <text>``, the display name being
    ``names[persona_id]`` (e.g. ``{"anchor": "The Anchor"}`` from the persona catalog), else the id title-cased
    (``action_guide`` -> ``Action Guide``), else ``Assistant`` when the turn has no persona. Turns of any other role
    (e.g. director directives) are not shown. Turns are ordered by ``index`` when every turn has one.

    Args:
        turns: ``[{"index", "role", "persona_id", "text"}, ...]`` as in ``transcripts.jsonl``.
        names: Optional ``{persona_id: display name}``.

    Returns:
        One line per shown turn joined by newlines (a turn's own newlines are kept); ``(no turns)`` when empty.
    """
    names = names or {}
    if all(isinstance(t.get("index"), int) for t in turns):
        turns = sorted(turns, key=lambda t: t["index"])
    lines = []
    for t in turns:
        text = str(t.get("text") or "").strip()
        if t.get("role") == "user":
            lines.append(f"User: {text}")
        elif t.get("role") == "agent":
            pid = t.get("persona_id")
            tag = names.get(pid) or (str(pid).replace("_", " ").title() if pid else "Assistant")
            lines.append(f"{tag}: {text}")
    return "\n".join(lines) if lines else "(no turns)"


def load_transcripts(eval_dir: str | os.PathLike) -> dict[str, dict[str, dict]]:
    """Read ``eval_dir/transcripts.jsonl`` into ``{system: {situation_id: record}}``.

    Blank lines are skipped. Each other line must be a JSON object with non-empty string ``system`` and
    ``situation_id``, a string ``situation`` and a list ``turns`` of objects with string ``role`` and ``text``.

    Raises:
        FileNotFoundError: ``eval_dir`` or its ``transcripts.jsonl`` does not exist.
        ValueError: a malformed line, or the same (system, situation_id) twice; the message names file and line.
    """
    path = Path(eval_dir) / TRANSCRIPTS
    if not path.is_file():
        raise FileNotFoundError(f"{path}: not found; pass the evaluation output directory that contains "
                                f"{TRANSCRIPTS} (one JSON object per dialogue)")
    out: dict[str, dict[str, dict]] = {}
    seen: dict[tuple[str, str], int] = {}
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{where}: not valid JSON ({e.msg}, column {e.colno}); each line must be one "
                                 f"JSON object") from None
            if not isinstance(rec, dict):
                raise ValueError(f"{where}: expected a JSON object, got {type(rec).__name__}")
            for field in ("system", "situation_id"):
                if not isinstance(rec.get(field), str) or not rec[field].strip():
                    raise ValueError(f"{where}: field '{field}' must be a non-empty string")
            if not isinstance(rec.get("situation"), str):
                raise ValueError(f"{where}: field 'situation' must be a string (the situation or query text)")
            turns = rec.get("turns")
            if not isinstance(turns, list) or not all(
                    isinstance(t, dict) and isinstance(t.get("role"), str) and isinstance(t.get("text"), str)
                    for t in turns):
                raise ValueError(f"{where}: field 'turns' must be a list of objects with string 'role' and 'text'")
            k = (rec["system"], rec["situation_id"])
            if k in seen:
                raise ValueError(f"{where}: system '{k[0]}' has situation '{k[1]}' twice (first at line "
                                 f"{seen[k]}); keep one dialogue per system and situation")
            seen[k] = lineno
            out.setdefault(rec["system"], {})[rec["situation_id"]] = rec
    if not out:
        raise ValueError(f"{path}: no dialogues in the file")
    return out


def _sample(rng: random.Random, sids: list[str], limit: int | None) -> list[str]:
    return sorted(rng.sample(sids, limit)) if limit is not None and len(sids) > limit else sids


# ---------------------------------------------------------------------------------------------------- form.html

_CSS = """body{font-family:sans-serif;margin:1.5em;max-width:110em}
.item{border:1px solid #999;border-radius:6px;padding:1em;margin:1em 0}
.sit{background:#f3f3f3;padding:.5em;white-space:pre-wrap}
.cols{display:grid;gap:1em;grid-template-columns:repeat(var(--n),1fr)}
.dlg{border:1px solid #ccc;padding:.5em;white-space:pre-wrap}
.choice label{margin-right:1.5em}"""

_JS = """function cell(s){s=String(s);return /[",\\r\\n]/.test(s)?'"'+s.replace(/"/g,'""')+'"':s;}
function downloadAnswers(){
 var rater=document.getElementById('rater').value.trim();
 if(!rater){alert('Enter your rater name first.');return;}
 var lines=['item_id,rater,choice'],missing=0;
 document.querySelectorAll('section.item').forEach(function(sec){
  var id=sec.getAttribute('data-item'),sel=sec.querySelector('input[type=radio]:checked');
  if(!sel)missing++;
  lines.push([cell(id),cell(rater),cell(sel?sel.value:'')].join(','));
 });
 if(missing&&!confirm(missing+' item(s) have no answer. Download anyway?'))return;
 var a=document.createElement('a');
 a.href=URL.createObjectURL(new Blob([lines.join('\\r\\n')+'\\r\\n'],{type:'text/csv'}));
 a.download='ratings_'+rater.replace(/[^A-Za-z0-9_-]+/g,'_')+'.csv';
 document.body.appendChild(a);a.click();document.body.removeChild(a);
}"""


def _form_html(items: list[dict]) -> str:
    e = html.escape
    parts = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
             "<title>Dialogue preference study</title>",
             f"<style>{_CSS}</style></head><body>", "<h1>Dialogue preference study</h1>",
             "<p>For each item, read the situation and the dialogues, then choose the dialogue you prefer overall, or "
             "<em>tie</em> if you have no preference. When done, enter your rater name and press the download "
             "button; send the downloaded CSV file back.</p>",
             '<p><label>Rater name: <input id="rater" type="text" autocomplete="off"></label></p>']
    for it in items:
        iid, letters = e(it["item_id"]), _letters(len(it["dialogues"]))
        parts.append(f'<section class="item" data-item="{iid}"><h2>Item {iid}</h2>')
        parts.append(f'<div class="sit"><strong>Situation:</strong> {e(it["situation"])}</div>')
        parts.append(f'<div class="cols" style="--n:{len(letters)}">')
        parts += [f'<div class="dlg"><h3>Dialogue {x}</h3>{e(d)}</div>' for x, d in zip(letters, it["dialogues"])]
        parts.append('</div><p class="choice">Preferred: ')
        parts += [f'<label><input type="radio" name="{iid}" value="{v}"> {v}</label>'
                  for v in CHOICES[it["kind"]]]
        parts.append("</p></section>")
    parts += ['<p><button type="button" onclick="downloadAnswers()">Download answers (CSV)</button></p>',
              f"<script>{_JS}</script>", "</body></html>", ""]
    return "\n".join(parts)


# ---------------------------------------------------------------------------------------------------- export


def export_pairs(eval_dir: str | os.PathLike, out_dir: str | os.PathLike, *, target: str = "mascot",
                 against: list[str] | None = None, seed: int = 0, raters: int = 3,
                 threeway: list[str] | None = None, limit: int | None = None,
                 names: Mapping[str, str] | None = None, overwrite: bool = False) -> dict:
    """Export blinded comparison items for a human preference study.

    One pairwise item per situation present for both ``target`` and a compared system; with ``threeway`` (exactly
    3 systems) also one three-way item per situation present for all three. All randomness comes from one
    ``random.Random(seed)``: the ``limit`` sample, the A/B(/C) order within each item and the item order (so items of
    one comparison are interleaved with the others). Item ids are opaque (``p0001``…, ``t0001``…); the systems are
    named only in ``key.json``. The same inputs and seed give byte-identical files.

    Args:
        eval_dir: Evaluation output directory with ``transcripts.jsonl``.
        out_dir: Study directory to write (created if missing).
        target: The system compared against every other one.
        against: Systems to compare with; default every other system present (sorted). Duplicates are dropped.
        seed: Seed of the randomisation.
        raters: Rater rows per item in ``ratings_template.csv``, >= 1 (the docs asks for >= 3; fewer
            adds a warning).
        threeway: Optional 3 distinct systems for three-way items (choice A/B/C/tie).
        limit: Optional maximum number of situations per comparison (a seeded sample), >= 1.
        names: Optional ``{persona_id: display name}`` for speaker tags (see :func:`render_dialogue`).
        overwrite: Replace an earlier export in ``out_dir`` whose ``key.json`` differs. Without it that raises,
            because ratings collected for the earlier items would be unblinded with the wrong key.

    Returns:
        ``{"out_dir": str, "pairs": int (pairwise items), "threeway": int (three-way items), "per_system":
        {system: pairwise items}, "situations": {system: situations available for that comparison}, "raters": int,
        "template_rows": int, "files": [file names], "skipped": {system: reason}, "warnings": [str]}``.

    Raises:
        FileNotFoundError: no ``transcripts.jsonl`` in ``eval_dir``.
        ValueError: a malformed transcript line; ``target``, a system in ``against`` or in ``threeway`` absent; a
            requested comparison with no common situation; bad ``raters``/``limit``/``threeway``; nothing to export.
        FileExistsError: ``out_dir`` holds a different export and ``overwrite`` is false.
    """
    if isinstance(raters, bool) or not isinstance(raters, int) or raters < 1:
        raise ValueError(f"raters must be an integer >= 1 (3 or more recommended), got {raters!r}")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise ValueError(f"limit must be an integer >= 1 or None (no limit), got {limit!r}")
    data = load_transcripts(eval_dir)
    src = Path(eval_dir) / TRANSCRIPTS
    present = sorted(data)
    if target not in data:
        raise ValueError(f"{src}: no dialogues for target system '{target}'; systems present: "
                         f"{', '.join(present)}; choose the target among them")
    warnings: list[str] = []
    skipped: dict[str, str] = {}
    if against is None:
        others = [s for s in present if s != target]
    else:
        others = list(dict.fromkeys(against))
        bad = [s for s in others if s not in data]
        if bad:
            raise ValueError(f"{src}: no dialogues for compared system(s) {', '.join(bad)}; systems present: "
                             f"{', '.join(present)}")
        if target in others:
            raise ValueError(f"the compared systems include the target '{target}'; remove it from against")
    rng = random.Random(seed)
    items: list[dict] = []
    per_system: dict[str, int] = {}
    situations: dict[str, int] = {}
    for other in others:
        common = sorted(set(data[target]) & set(data[other]))
        if not common:
            if against is not None:
                raise ValueError(f"{src}: systems '{target}' and '{other}' share no situation_id; evaluate both on "
                                 f"the same situations or drop '{other}' from against")
            skipped[other] = f"no situation_id in common with '{target}'"
            continue
        situations[other] = len(common)
        chosen = _sample(rng, common, limit)
        per_system[other] = len(chosen)
        for sid in chosen:
            order = [target, other]
            rng.shuffle(order)
            items.append({"kind": "pair", "situation_id": sid, "systems": order,
                          "situation": data[target][sid]["situation"]})
    tw_items: list[dict] = []
    if threeway is not None:
        if len(threeway) != 3 or len(set(threeway)) != 3:
            raise ValueError(f"threeway needs exactly 3 distinct systems, got {list(threeway)!r}")
        bad = [s for s in threeway if s not in data]
        if bad:
            raise ValueError(f"{src}: no dialogues for three-way system(s) {', '.join(bad)}; systems present: "
                             f"{', '.join(present)}")
        common = sorted(set(data[threeway[0]]) & set(data[threeway[1]]) & set(data[threeway[2]]))
        if not common:
            raise ValueError(f"{src}: systems {', '.join(threeway)} share no situation_id; three-way items need "
                             f"dialogues of all three on the same situations")
        for sid in _sample(rng, common, limit):
            order = list(threeway)
            rng.shuffle(order)
            tw_items.append({"kind": "threeway", "situation_id": sid, "systems": order,
                             "situation": data[threeway[0]][sid]["situation"]})
    if not items and not tw_items:
        raise ValueError(f"{src}: nothing to export: no system other than '{target}' shares a situation with it")
    rng.shuffle(items)
    rng.shuffle(tw_items)
    width = max(4, len(str(max(len(items), len(tw_items)))))
    for prefix, group in (("p", items), ("t", tw_items)):
        for i, it in enumerate(group, 1):
            it["item_id"] = f"{prefix}{i:0{width}d}"
            it["dialogues"] = [render_dialogue(data[s][it["situation_id"]]["turns"], names) for s in it["systems"]]
    key = {"note": "do not show to raters: this file unblinds the study",
           "target": target, "seed": seed, "raters": raters, "limit": limit, "threeway": list(threeway or []),
           "items": {it["item_id"]: {"kind": it["kind"], **dict(zip("abc", it["systems"])),
                                     "situation_id": it["situation_id"]} for it in items + tw_items}}
    key_text = json.dumps(key, indent=2, ensure_ascii=False) + "\n"
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    key_path = out / KEY_FILE
    if key_path.exists() and not overwrite and key_path.read_text(encoding="utf-8") != key_text:
        raise FileExistsError(f"{key_path}: a different study was already exported here; ratings collected for it "
                              f"would be unblinded with the wrong key. Choose a new output directory, or overwrite "
                              f"the old export on purpose (overwrite=True)")
    if raters < MIN_RATERS:
        warnings.append(f"{raters} rater(s) per item asks for at least {MIN_RATERS}")
    files = ["pairs.csv", "ratings_template.csv", "form.html", KEY_FILE]
    _write_atomic(out / "pairs.csv", _csv_text(("item_id", "situation", "dialogue_a", "dialogue_b"),
                                               ([it["item_id"], it["situation"], *it["dialogues"]] for it in items)))
    if tw_items:
        files.insert(1, "threeway.csv")
        _write_atomic(out / "threeway.csv", _csv_text(
            ("item_id", "situation", "dialogue_a", "dialogue_b", "dialogue_c"),
            ([it["item_id"], it["situation"], *it["dialogues"]] for it in tw_items)))
    else:
        (out / "threeway.csv").unlink(missing_ok=True)  # a stale file from an overwritten export
    template = [(it["item_id"], r, "") for it in items + tw_items for r in range(1, raters + 1)]
    _write_atomic(out / "ratings_template.csv", _csv_text(RATING_COLUMNS, template))
    _write_atomic(out / "form.html", _form_html(items + tw_items))
    _write_atomic(key_path, key_text)
    return {"out_dir": str(out), "pairs": len(items), "threeway": len(tw_items), "per_system": per_system,
            "situations": situations, "raters": raters, "template_rows": len(template), "files": files,
            "skipped": skipped, "warnings": warnings}


# ---------------------------------------------------------------------------------------------------- import


def nominal_alpha(ratings: Mapping[tuple[str, str], str]) -> tuple[float | None, str | None]:
    """Krippendorff's alpha, nominal level, over items x raters.

    Uses ``krippendorff.alpha(reliability_data=[raters, items], level_of_measurement="nominal")`` (PyPI
    ``krippendorff`` 0.9.0; missing ratings are NaN, and items rated by fewer than 2 raters do not enter the
    coincidence matrix, as in Krippendorff's definition).

    Args:
        ratings: ``{(item_id, rater): value}`` with string values (the blinded choices).

    Returns:
        ``(alpha, None)``, alpha in [-1, 1]; or ``(None, reason)`` when alpha is undefined: no item has 2 or more
        ratings, or every rating on such items is the same value (no variation, expected disagreement 0).
    """
    per_item: dict[str, list[str]] = {}
    for (item, _), v in ratings.items():
        per_item.setdefault(item, []).append(v)
    pairable = [vs for vs in per_item.values() if len(vs) >= 2]
    if not pairable:
        return None, "no item has ratings from 2 or more raters"
    if len({v for vs in pairable for v in vs}) < 2:
        return None, "every rating is the same value, so alpha is undefined (no variation)"
    items = sorted(per_item)
    raters = sorted({r for _, r in ratings})
    codes = {v: float(i) for i, v in enumerate(sorted(set(ratings.values())))}
    matrix = np.full((len(raters), len(items)), np.nan)
    ri, ii = {r: i for i, r in enumerate(raters)}, {it: i for i, it in enumerate(items)}
    for (item, rater), v in ratings.items():
        matrix[ri[rater], ii[item]] = codes[v]
    return float(krippendorff.alpha(reliability_data=matrix, level_of_measurement="nominal")), None


def _load_key(out_dir: Path) -> tuple[Path, dict]:
    path = out_dir / KEY_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path}: not found; import needs the {KEY_FILE} written by the export, so pass the "
                                f"directory the items were exported to")
    try:
        key = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}:{e.lineno}: not valid JSON ({e.msg}); re-export or restore the file") from None
    items = key.get("items") if isinstance(key, dict) else None
    if not isinstance(key, dict) or not isinstance(key.get("target"), str) or not isinstance(items, dict):
        raise ValueError(f"{path}: expected an object with 'target' and 'items' as written by the export")
    for iid, it in items.items():
        kind = it.get("kind") if isinstance(it, dict) else None
        need = "ab" if kind == "pair" else "abc" if kind == "threeway" else None
        if need is None or not all(isinstance(it.get(x), str) for x in need) or (
                kind == "pair" and key["target"] not in (it["a"], it["b"])):
            raise ValueError(f"{path}: item '{iid}' is malformed (needs kind pair with a/b including the target, "
                             f"or kind threeway with a/b/c); re-export or restore the file")
    return path, key


def _read_ratings(files: Sequence[str | os.PathLike], key_path: Path, items: dict) -> tuple[dict, dict]:
    """``({(item, rater): choice}, {item: missing rows})`` from the ratings CSVs, validated against the key."""
    ratings: dict[tuple[str, str], str] = {}
    where: dict[tuple[str, str], str] = {}
    missing: dict[str, int] = {}
    for f in map(Path, files):
        if not f.is_file():
            raise FileNotFoundError(f"{f}: ratings file not found")
        with f.open(encoding="utf-8-sig", newline="") as fh:
            reader = csv.DictReader(fh)
            if reader.fieldnames is None:
                raise ValueError(f"{f}: empty file; expected a header line '{','.join(RATING_COLUMNS)}'")
            header = [h.strip() for h in reader.fieldnames]
            lacking = [c for c in RATING_COLUMNS if c not in header]
            if lacking:
                raise ValueError(f"{f}:1: missing column(s) {', '.join(lacking)}; the header must contain "
                                 f"{', '.join(RATING_COLUMNS)} (as in ratings_template.csv)")
            reader.fieldnames = header
            for row in reader:
                line = f"{f}:{reader.line_num}"
                iid, rater, raw = ((row.get(c) or "").strip() for c in RATING_COLUMNS)
                if not (iid or rater or raw):
                    continue
                if iid not in items:
                    raise ValueError(f"{line}: unknown item id '{iid}'; it is not in {key_path} — were these ratings "
                                     f"made for another export? Fix the item_id or remove the row")
                if not raw:
                    missing[iid] = missing.get(iid, 0) + 1
                    continue
                allowed = CHOICES[items[iid]["kind"]]
                choice = "tie" if raw.lower() == "tie" else raw.upper()
                if choice not in allowed:
                    raise ValueError(f"{line}: choice '{raw}' for item {iid} is not one of {', '.join(allowed)}; "
                                     f"write one of them, or leave it empty if the item was not rated")
                if not rater:
                    raise ValueError(f"{line}: empty rater for item {iid}; fill the rater column (one name or "
                                     f"number per person)")
                if (iid, rater) in ratings:
                    raise ValueError(f"{line}: rater '{rater}' already rated item {iid} at {where[iid, rater]}; keep "
                                     f"one of the two rows, or give different people different rater names")
                ratings[iid, rater], where[iid, rater] = choice, line
    return ratings, missing


def _rate(num: float, den: float) -> float | None:
    return num / den if den else None


def import_pairs(out_dir: str | os.PathLike, ratings_files: Sequence[str | os.PathLike]) -> dict:
    """Unblind filled ratings and report the preference statistics; also write ``out_dir/preference.json``.

    Each ratings CSV has the columns ``item_id, rater, choice`` (other columns are ignored; a UTF-8 BOM is accepted).
    ``choice`` is ``A``, ``B`` or ``tie`` for pairwise items and ``A``, ``B``, ``C`` or ``tie`` for three-way ones
    (case-insensitive). Rows with an empty choice are not judgements and are counted as missing; fully empty rows
    are skipped. One rater may rate an item once across all files.

    Per comparison (target vs other), over the judgements (one per item and rater):

    - ``win_rate = wins / (wins + losses)``; ties are reported separately.
    - ``preference_rate = (wins + 0.5 * ties) / n`` with ``n = wins + losses + ties``: ties count as half a win.
    - ``p_value``: two-sided exact binomial test of ``wins`` out of ``wins + losses`` under p = 0.5
      (``scipy.stats.binomtest``). Judgements are treated as independent, although raters of one item are not.
    - ``alpha``: Krippendorff's alpha, nominal, on the blinded choices of that comparison's items x raters (see
      :func:`nominal_alpha`); ``None`` with ``alpha_note`` when undefined.

    Rates and the p-value are ``None`` when their denominator is 0.

    Args:
        out_dir: The study directory written by :func:`export_pairs` (holds ``key.json``).
        ratings_files: One or more filled ratings CSV paths.

    Returns:
        ``{"target": str, "key": str, "ratings_files": [str], "raters": [str], "judgements": int, "missing": int,
        "pairs": {other: {"target", "other", "items", "items_rated", "n", "wins", "losses", "ties", "missing",
        "win_rate", "preference_rate", "p_value", "alpha", "alpha_note", "min_raters_per_item"}},
        "threeway": {"A vs B vs C" (sorted names): {"systems", "items", "items_rated", "n", "first_choice":
        {system: count}, "ties", "share": {system: count / n}, "tie_share", "missing", "alpha", "alpha_note",
        "min_raters_per_item"}}, "alpha_all_pairs": float | None, "warnings": [str]}``.

    Raises:
        FileNotFoundError: ``key.json`` or a ratings file does not exist.
        ValueError: no ratings file given; malformed ``key.json``; a ratings file without the columns, with an
            unknown item id, a choice outside the item's set, an empty rater, or a rater rating an item twice
            (the message names the file and line).
    """
    from scipy.stats import binomtest  # imported here: scipy.stats is slow to import for the other CLI commands

    if not ratings_files:
        raise ValueError("no ratings file given; pass one or more filled copies of ratings_template.csv or files "
                         "downloaded from form.html")
    out = Path(out_dir)
    key_path, key = _load_key(out)
    target, items = key["target"], key["items"]
    ratings, missing = _read_ratings(ratings_files, key_path, items)
    by_item: dict[str, dict[str, str]] = {}
    for (iid, rater), c in ratings.items():
        by_item.setdefault(iid, {})[rater] = c

    def group_stats(ids: list[str]) -> dict:
        sub = {(i, r): c for i in ids for r, c in by_item.get(i, {}).items()}
        alpha, note = nominal_alpha(sub)
        return {"items": len(ids), "items_rated": sum(1 for i in ids if by_item.get(i)),
                "missing": sum(missing.get(i, 0) for i in ids), "alpha": alpha, "alpha_note": note,
                "min_raters_per_item": min(len(by_item.get(i, {})) for i in ids)}

    pairs: dict[str, dict] = {}
    pair_ids = sorted(i for i, it in items.items() if it["kind"] == "pair")
    for other in sorted({items[i]["b"] if items[i]["a"] == target else items[i]["a"] for i in pair_ids}):
        ids = [i for i in pair_ids if other in (items[i]["a"], items[i]["b"])]
        wins = losses = ties = 0
        for i in ids:
            for c in by_item.get(i, {}).values():
                if c == "tie":
                    ties += 1
                elif items[i][c.lower()] == target:
                    wins += 1
                else:
                    losses += 1
        n = wins + losses + ties
        pairs[other] = {"target": target, "other": other, "n": n, "wins": wins, "losses": losses, "ties": ties,
                        "win_rate": _rate(wins, wins + losses), "preference_rate": _rate(wins + 0.5 * ties, n),
                        "p_value": float(binomtest(wins, wins + losses, 0.5).pvalue) if wins + losses else None,
                        **group_stats(ids)}
    three: dict[str, dict] = {}
    tw_ids = sorted(i for i, it in items.items() if it["kind"] == "threeway")
    for systems in sorted({tuple(sorted((items[i]["a"], items[i]["b"], items[i]["c"]))) for i in tw_ids}):
        ids = [i for i in tw_ids if tuple(sorted((items[i]["a"], items[i]["b"], items[i]["c"]))) == systems]
        first = {s: 0 for s in systems}
        ties = 0
        for i in ids:
            for c in by_item.get(i, {}).values():
                if c == "tie":
                    ties += 1
                else:
                    first[items[i][c.lower()]] += 1
        n = sum(first.values()) + ties
        three[" vs ".join(systems)] = {"systems": list(systems), "n": n, "first_choice": first, "ties": ties,
                                       "share": {s: _rate(v, n) for s, v in first.items()},
                                       "tie_share": _rate(ties, n), **group_stats(ids)}
    alpha_all, _ = nominal_alpha({k: c for k, c in ratings.items() if items[k[0]]["kind"] == "pair"})
    warnings = []
    short = sorted(i for i in items if len(by_item.get(i, {})) < MIN_RATERS)
    if short:
        warnings.append(f"{len(short)} of {len(items)} item(s) have fewer than {MIN_RATERS} ratings "
                        f", e.g. {', '.join(short[:5])}")
    result = {"target": target, "key": str(key_path), "ratings_files": [str(f) for f in ratings_files],
              "raters": sorted({r for _, r in ratings}), "judgements": len(ratings),
              "missing": sum(missing.values()), "pairs": pairs, "threeway": three, "alpha_all_pairs": alpha_all,
              "warnings": warnings}
    _write_atomic(out / RESULT_FILE, json.dumps(result, indent=2, ensure_ascii=False, allow_nan=False) + "\n")
    return result
