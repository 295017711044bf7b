"""Render an evaluation report (``report.json``) as ``report.md`` and PNG charts, beside the paper's numbers.

Input: the report dict built by the evaluation runner (the ``report.json`` schema): ``seed``, ``mode``
(``"support"`` | ``"meeting"``), ``situations``, ``judges``, ``generated_at``, ``models`` (``backbone``,
``trained``, free-form extras), ``systems`` ``{system: {split: stats}}`` and, with more than one judge,
``by_judge`` ``{judge: {system: {split: stats}}}``. ``stats`` holds ``n``, ``criteria`` / ``collective``
``{key: {"mean", "std"}}``, ``overall`` / ``collective_overall`` ``{"mean", "std"}`` (judge scores on 0-100),
``automatic`` (NLI rates, Self-BLEU, distinct-1/2 in [0, 1]; embedding redundancy, a mean cosine similarity in
[-1, 1]), ``safety_turns``, ``unparseable`` and
``personas`` ``{persona: {key: mean}}``. Any mean or std may be ``None`` (no data) and is rendered as "–".

The paper's numbers beside ours come from :mod:`mascot.eval.paper`; a value
read off a figure is prefixed "~". Charts use matplotlib's Agg canvas on bare ``Figure`` objects (never
registered with pyplot, so no display is needed and nothing accumulates); every file is written to a temporary
name in its folder and moved into place with ``os.replace``.
"""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path
from typing import Any, BinaryIO, Callable, Mapping, Sequence

from mascot.api.conversation.v1 import conversation_pb2 as cpb
from mascot.core.enums import enum_names
from mascot.core.files import atomic_write
from mascot.eval import paper
from mascot.eval.paper import AGENT_COLUMNS, AGENT_KEYS, COLLECTIVE_COLUMNS, COLLECTIVE_KEYS, system_label

#: Shown for a missing value.
DASH = "–"
#: Warning printed when the models (or the NLI model) are untrained.
UNTRAINED_WARNING = "tiny random models: numbers exercise the pipeline, they are not comparable with the paper"
#: Warning printed when only the NLI model is untrained (a real backbone).
NLI_WARNING = ("the NLI model is an untrained cross-encoder, so the NLI columns are left empty "
               "(--nli-model DIR for a real one)")
MODES = enum_names(cpb.Mode)
_SPLIT_ORDER = {"support": paper.SUPPORT_SPLITS + ("all",), "meeting": paper.MEETING_SPLITS + ("all",)}
_AUTOMATIC = (("entailment", "NLI entailment"), ("neutral", "NLI neutral"), ("contradiction", "NLI contradiction"),
              ("self_bleu", "Self-BLEU"), ("distinct_1", "Distinct-1"), ("distinct_2", "Distinct-2"),
              ("embedding_redundancy", "Embedding redundancy"))
_NLI_KEYS = ("entailment", "neutral", "contradiction")


# ----------------------------------------------------------------------------------------------- small helpers

def _num(x: Any) -> float | None:
    """``x`` as a finite float, else ``None`` (``None``, bools, strings, NaN)."""
    if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x):
        return None
    return float(x)


def _ms(stat: Any) -> tuple[float | None, float | None]:
    """``(mean, std)`` of a ``{"mean", "std"}`` dict; ``(None, None)`` for anything else."""
    if not isinstance(stat, Mapping):
        return None, None
    return _num(stat.get("mean")), _num(stat.get("std"))


def _fmt(stat: Any, digits: int = 1) -> str:
    """"mean ± std", "mean" without a std, "–" without a mean."""
    m, s = _ms(stat)
    if m is None:
        return DASH
    return f"{m:.{digits}f}" if s is None else f"{m:.{digits}f} ± {s:.{digits}f}"


def _cell(stat: Any, ref: float | tuple[float, float] | None = None, digits: int = 1, approx: bool = False) -> str:
    """Our value, then "(paper X)" when the paper has a number for the same cell ("~X" if figure-read)."""
    ours = _fmt(stat, digits)
    if ref is None:
        return ours
    if isinstance(ref, tuple):
        theirs = f"{ref[0]:.{digits}f} ± {ref[1]:.{digits}f}"
    else:
        theirs = f"{'~' if approx else ''}{ref:.{digits}f}"
    return f"{ours} (paper {theirs})"


def _esc(text: Any) -> str:
    """Free text made safe for one markdown table cell."""
    return str(text).replace("|", "\\|").replace("\n", " ")


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """A GitHub markdown table (lines, followed by a blank line)."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines + [""]


def _mode(report: Mapping[str, Any]) -> str:
    """The report's mode; raises ValueError for anything but "support" or "meeting"."""
    mode = report.get("mode")
    if mode not in MODES:
        raise ValueError(f"report mode must be one of {MODES}, got {mode!r}")
    return mode


def _systems_in_order(systems: Mapping[str, Any]) -> list[str]:
    """Paper row order, then the ablations, then unknown ids sorted."""
    known = [s for s in paper.PAPER_SYSTEMS + paper.ABLATION_SYSTEMS if s in systems]
    return known + sorted(s for s in systems if s not in known)


def _splits_in_order(systems: Mapping[str, Any], mode: str) -> list[str]:
    """The mode's splits that some system has (paper order, ``all`` last), then unknown splits sorted."""
    present = {sp for by_split in systems.values() if isinstance(by_split, Mapping) for sp in by_split}
    known = [sp for sp in _SPLIT_ORDER[mode] if sp in present]
    return known + sorted(present - set(known))


def _stats(systems: Mapping[str, Any], system: str, split: str) -> Mapping[str, Any]:
    """``systems[system][split]`` or ``{}``."""
    by_split = systems.get(system)
    out = by_split.get(split) if isinstance(by_split, Mapping) else None
    return out if isinstance(out, Mapping) else {}


def _sub(stats: Mapping[str, Any], *path: str) -> Any:
    """``stats[path[0]][path[1]]...`` or ``None``."""
    cur: Any = stats
    for p in path:
        if not isinstance(cur, Mapping):
            return None
        cur = cur.get(p)
    return cur


def _split_title(split: str) -> str:
    return "All splits" if split == "all" else split.capitalize()


def _untrained_nli(report: Mapping[str, Any]) -> list[str]:
    """Names of NLI models marked ``trained: false`` anywhere in the report."""
    names: set[str] = set()
    tables = [report.get("systems") or {}] + list((report.get("by_judge") or {}).values())
    for systems in tables:
        for by_split in systems.values():
            for stats in (by_split or {}).values() if isinstance(by_split, Mapping) else ():
                nli = _sub(stats, "automatic", "nli")
                if isinstance(nli, Mapping) and nli.get("trained") is False:
                    names.add(str(nli.get("model") or "unnamed"))
    return sorted(names)


# ----------------------------------------------------------------------------------------------- markdown sections

def _header(report: Mapping[str, Any], mode: str) -> list[str]:
    models = report.get("models") or {}
    judges = [str(j) for j in report.get("judges") or []]
    lines = ["# MASCOT evaluation report", ""]
    untrained_nli = _untrained_nli(report)
    nli_why = "the NLI model is untrained (" + ", ".join(f"`{n}`" for n in untrained_nli) + ")"
    if models.get("trained") is False:
        why = ["the backbone/adapters are untrained (`models.trained` is false)"] + ([nli_why] if untrained_nli else [])
        lines += [f"> **Warning: {UNTRAINED_WARNING}.** Reason: {'; '.join(why)}.", ""]
    elif untrained_nli:
        lines += [f"> **Warning: {NLI_WARNING}.** Reason: {nli_why}.", ""]
    dataset = "EmpatheticDialogues, valence splits" if mode == "support" else "QMSum, per domain (collective only)"
    extra = {k: v for k, v in models.items() if k not in ("backbone", "trained")}
    lines += [
        f"- Mode: {mode} ({dataset})",
        f"- Judges: {', '.join(judges) or 'none (measures without a judge only)'}"
        + (" — the tables below are the mean over judges; one section per judge follows." if len(judges) > 1 else ""),
        f"- Backbone: {models.get('backbone', DASH)}"
        + {True: " (pretrained weights)", False: " (random-init weights: exercises the pipeline only)"}.get(
            models.get("trained"), ""),
    ]
    lines += [f"- Model `{k}`: {v if isinstance(v, str) else json.dumps(v, sort_keys=True)}" for k, v in extra.items()]
    lines += [
        f"- Seed: {report.get('seed', DASH)}",
        f"- Situations: {len(report.get('situations') or [])} (per split and system: see Run counts)",
        f"- Generated at: {report.get('generated_at', DASH)}",
        "- Scores are 0–100 (judge 1–5 mapped by (s − 1)/4 × 100), shown as mean ± std over dialogues; "
        "\"(paper X)\" is the paper's number for the same system, split and column ("
        "\"~\" = read off a figure). \"–\" = no data.",
        "",
    ]
    return lines


def _run_counts(systems: Mapping[str, Any], order: list[str], splits: list[str], h: str) -> list[str]:
    def counts(system: str, field: str) -> str:
        vals = [_sub(_stats(systems, system, sp), field) for sp in splits]
        return " / ".join(str(int(v)) if _num(v) is not None else DASH for v in vals)

    lines = [f"{h} Run counts", "", f"Each cell lists the splits in the order {' / '.join(splits)}.", ""]
    rows = [[system_label(s), counts(s, "n"), counts(s, "unparseable"), counts(s, "safety_turns")] for s in order]
    return lines + _table(["System", "Dialogues (n)", "Unparseable judgements", "Safety turns"], rows)


def _score_tables(systems: Mapping[str, Any], order: list[str], splits: list[str], h: str, *, title: str,
                  keys: tuple[str, ...], columns: Mapping[str, str], section: str, overall: str,
                  ref: Mapping[str, Mapping[str, Mapping[str, float]]], note: str, approx: bool = False) -> list[str]:
    """One table per split: rows = systems, columns = criteria + Overall, paper numbers beside ours."""
    lines = [f"{h} {title}", "", note, ""]
    for split in splits:
        rows = []
        for s in order:
            stats = _stats(systems, s, split)
            theirs = ref.get(split, {}).get(s, {})
            row = [system_label(s)]
            row += [_cell(_sub(stats, section, k), theirs.get(k), approx=approx) for k in keys]
            row.append(_cell(stats.get(overall), theirs.get("overall"), approx=approx))
            rows.append(row)
        lines += [f"{h}# {_split_title(split)}", ""]
        lines += _table(["System"] + [columns[k] for k in keys] + ["Overall"], rows)
    return lines


def _ablation(systems: Mapping[str, Any], mode: str, h: str) -> list[str]:
    present = [s for s in ("mascot",) + paper.ABLATION_SYSTEMS if s in systems]
    if not any(s in systems for s in paper.ABLATION_SYSTEMS):
        return []
    with_paper = mode == "support"
    note = ("Our values are on split `all`. Paper (figure, ~±1; split not stated); MASCOT-C = "
            "random speaking order (`no-director`), MASCOT-P = no persona prompts (`no-persona`); Coherence = the "
            "collective Relevance & Coherence criterion.")
    if not with_paper:
        note += " The paper's ablation is on ED, so no paper numbers are shown in meeting mode."
    rows = []
    for s in present:
        st = _stats(systems, s, "all")
        abl = paper.ABLATION.get(s, {}) if with_paper else {}
        crit = paper.ABLATION_CRITERIA.get(s, {}) if with_paper else {}
        rows.append([
            system_label(s),
            _cell(st.get("overall"), abl.get("agent_overall"), approx=True),
            _cell(_sub(st, "criteria", "empathetic_support_quality"), crit.get("empathetic_support_quality"),
                  approx=True),
            _cell(_sub(st, "criteria", "persona_consistency"), crit.get("persona_consistency"), approx=True),
            _cell(st.get("collective_overall"), abl.get("collective_overall"), approx=True),
            _cell(_sub(st, "collective", "relevance_coherence"), abl.get("coherence"), approx=True),
        ])
    header = ["Variant", "Agent-specific Overall", "Empathy", "Consistency", "Collective Overall", "Coherence"]
    return [f"{h} Ablation (paper §8.4)", "", note, ""] + _table(header, rows)


def _automatic(systems: Mapping[str, Any], order: list[str], splits: list[str], mode: str, h: str) -> list[str]:
    note = ("NLI label rates between consecutive agent turns, Self-BLEU (0–1, lower = more diverse), distinct-1/2 "
            "and embedding redundancy (mean pairwise cosine of turn embeddings), mean ± std over dialogues. "
            "Paper (ED, split not stated), "
            "shown beside our `all` split in support mode; the paper's \"Few-Shot CoT\" is our `few-shot-cot`.")
    lines = [f"{h} Automatic metrics (paper §8.7)", "", note, ""]
    for split in splits:
        rows = []
        for s in order:
            auto = _sub(_stats(systems, s, split), "automatic")
            auto = auto if isinstance(auto, Mapping) else {}
            nli = auto.get("nli") if isinstance(auto.get("nli"), Mapping) else {}
            theirs = paper.AUTOMATIC.get(s, {}) if (mode == "support" and split == "all") else {}
            model, untrained = DASH, nli.get("trained") is False
            if nli.get("model"):
                named = "untrained" in str(nli["model"])
                model = _esc(nli["model"]) + (" (untrained)" if untrained and not named else "")
            row = [system_label(s), model]
            for key, _ in _AUTOMATIC:  # an untrained NLI model's label rates are not measurements: left empty
                stat = (None if untrained else nli.get(key)) if key in _NLI_KEYS else auto.get(key)
                row.append(_cell(stat, theirs.get(key), digits=3))
            rows.append(row)
        lines += [f"{h}# {_split_title(split)}", ""]
        lines += _table(["System", "NLI model"] + [title for _, title in _AUTOMATIC], rows)
    return lines


def _reply_checks(systems: Mapping[str, Any], order: list[str], h: str) -> list[str]:
    """What the reply checks did per system over all splits: refused attempts by reason, and replies cut back."""
    rows_src = [(s, _stats(systems, s, "all").get("reply_checks")) for s in order]
    rows_src = [(s, rc) for s, rc in rows_src if isinstance(rc, Mapping)]
    if not rows_src:
        return []
    reasons = sorted({r for _, rc in rows_src for r in (rc.get("rejections") or {})})
    rows = [[system_label(s), str(int(rc.get("agent_turns", 0))), str(int(rc.get("cut", 0)))]
            + [str(int((rc.get("rejections") or {}).get(r, 0))) for r in reasons] for s, rc in rows_src]
    return [f"{h} Reply checks", "",
            "Agent turns, replies cut back to a sentence end, and refused attempts by reason (all splits); every "
            "system's replies pass the same checks.", ""] + _table(
        ["System", "Agent turns", "Cut"] + [f"Refused: {r}" for r in reasons], rows)


def _personas(systems: Mapping[str, Any], order: list[str], splits: list[str], h: str) -> list[str]:
    lines: list[str] = []
    for split in splits:
        rows_src = [(s, pid, scores) for s in order
                    for pid, scores in sorted((_stats(systems, s, split).get("personas") or {}).items())
                    if isinstance(scores, Mapping)]
        if not rows_src:
            continue
        found = {k for _, _, scores in rows_src for k in scores}
        keys = [k for k in AGENT_KEYS + COLLECTIVE_KEYS if k in found] + sorted(
            found - set(AGENT_KEYS) - set(COLLECTIVE_KEYS))
        titles = [AGENT_COLUMNS.get(k) or COLLECTIVE_COLUMNS.get(k) or k for k in keys]
        rows = [[system_label(s), _esc(pid)] + [_cell({"mean": scores.get(k)}) for k in keys]
                for s, pid, scores in rows_src]
        lines += [f"{h}# {_split_title(split)}", ""] + _table(["System", "Persona"] + titles, rows)
    if not lines:
        return []
    return [f"{h} Persona-level breakdown", "", "Mean score per persona (0–100); no paper numbers exist.", ""] + lines


def _body(systems: Mapping[str, Any], mode: str, h: str, judged: bool = True) -> list[str]:
    """Every table for one ``systems`` block; ``h`` is the heading prefix of its sections (e.g. "###"). Without a
    judge (``judged`` false) the judge-score and ablation tables are left out (they would be empty)."""
    order = _systems_in_order(systems)
    if not order:
        return ["No systems in this report.", ""]
    splits = _splits_in_order(systems, mode)
    lines = _run_counts(systems, order, splits, h)
    if not judged:
        pass
    elif mode == "support":
        lines += _score_tables(
            systems, order, splits, h, title="Agent-specific scores (paper §8.1)", keys=AGENT_KEYS,
            columns=AGENT_COLUMNS, section="criteria", overall="overall", ref=paper.AGENT_SPECIFIC,
            note="Paper (no std published); no paper numbers for split `all` or the ablations.")
        lines += _score_tables(
            systems, order, splits, h, title="Collective scores (paper §8.2)", keys=COLLECTIVE_KEYS,
            columns=COLLECTIVE_COLUMNS, section="collective", overall="collective_overall", ref=paper.COLLECTIVE,
            note="Paper: Positive and Negative splits only (no std published).")
    else:
        lines += _score_tables(
            systems, order, splits, h, title="Collective scores per QMSum domain (paper §8.3)", keys=COLLECTIVE_KEYS,
            columns=COLLECTIVE_COLUMNS, section="collective", overall="collective_overall",
            ref=paper.QMSUM_COLLECTIVE, approx=True,
            note="Paper: a dot plot (~±1), MASCOT and MultiAgentESC only. Agent-specific scores "
                 "are not computed in meeting mode.")
    if judged:
        lines += _ablation(systems, mode, h)
    lines += _automatic(systems, order, splits, mode, h)
    lines += _reply_checks(systems, order, h)
    lines += _personas(systems, order, splits, h)
    return lines


def _ci(stat: Any, digits: int = 3) -> str:
    """"mean [lo, hi]" of a ``{"mean", "lo", "hi"}`` dict; "mean" without an interval; "–" without a mean."""
    if not isinstance(stat, Mapping) or _num(stat.get("mean")) is None:
        return DASH
    m, lo, hi = _num(stat.get("mean")), _num(stat.get("lo")), _num(stat.get("hi"))
    if lo is None or hi is None:
        return f"{m:.{digits}f}"
    return f"{m:.{digits}f} [{lo:.{digits}f}, {hi:.{digits}f}]"


def _diff(stat: Any, digits: int = 3) -> str:
    """"+d [lo, hi] p=P" of a paired comparison; "–" without pairs."""
    if not isinstance(stat, Mapping) or _num(stat.get("mean_diff")) is None:
        return DASH
    m, lo, hi, p = (_num(stat.get(k)) for k in ("mean_diff", "lo", "hi", "p"))
    out = f"{m:+.{digits}f}"
    if lo is not None and hi is not None:
        out += f" [{lo:+.{digits}f}, {hi:+.{digits}f}]"
    return out + (f" p={p:.3g}" if p is not None else "")


#: Measures in the order of the report's tables, with column titles.
MEASURE_COLUMNS = (("move_compliance", "Move compliance"), ("forbidden_move_rate", "Forbidden moves"),
                   ("identifiability", "MiniLM identifiability (diagnostic)"), ("identity_margin", "Identity margin"),
                   ("relevance_user", "Relevance (user)"), ("relevance_situation", "Relevance (situation)"),
                   ("self_bleu", "Self-BLEU"), ("embedding_redundancy", "Redundancy"), ("distinct_2", "Distinct-2"),
                   ("moves_per_round", "Moves/round"), ("round_redundancy", "Round redundancy"),
                   ("echo_rate", "Echo"), ("loop_rate", "Loop"), ("near_duplicate_rate", "Near-dup"),
                   ("empty_rate", "Empty"), ("early_end", "Early end"), ("reply_words", "Words/reply"))


def _measures(report: Mapping[str, Any]) -> list[str]:
    """The judge-free measures: per-system means with intervals, identifiability per persona, paired differences."""
    block = report.get("measures")
    if not isinstance(block, Mapping):
        return []
    systems = block.get("systems") or {}
    order = _systems_in_order(systems)
    better = block.get("better") or {}
    interval = block.get("interval") or {}
    lines = ["## Measures without a judge", "",
             f"Embedding model: {block.get('embedding', DASH)}. One value per dialogue; mean and "
             f"{round(100 * (interval.get('level') or 0.95))}% {interval.get('method', 'bootstrap')} interval "
             f"[lo, hi]. Persona identity text: {', '.join(block.get('identity_fields') or [])} of each roster card "
             f"({', '.join(block.get('roster') or [])}); chance identifiability {_num(block.get('chance')) or 0:.3f}. "
             "Arrows: which direction is better.", ""]
    cols = [(k, t) for k, t in MEASURE_COLUMNS if k in better]
    groups = [cols[i:i + 7] for i in range(0, len(cols), 7)]
    arrow = {"higher": " ↑", "lower": " ↓"}
    for group in groups:
        rows = [[system_label(s), str(systems[s].get("n", DASH))]
                + [_ci((systems[s].get("values") or {}).get(k)) for k, _ in group] for s in order]
        lines += _table(["System", "n"] + [t + arrow.get(better.get(k, ""), "") for k, t in group], rows)
    lines += _team(block, order)
    lines += _adherence(block, order)
    lines += ["### MiniLM identifiability by persona (a training-signal diagnostic)", "",
              "Not an independent measure of persona: the metrics judge's persona criterion (and so a reward trained "
              "on it) uses the same MiniLM margin. "
              "Pooled over replies (the table above averages per-dialogue shares). Per persona: accuracy (share of "
              "its replies whose nearest card is its own), mean margin, n replies. Identifiability depends on who "
              "speaks: \"chance given shares\" is the agreement expected from the speaker and nearest-card shares "
              "alone, kappa is Cohen's kappa against it, balanced is the mean over the personas that spoke.", ""]
    roster = list(block.get("roster") or [])
    rows = []
    for s in order:
        ident = systems[s].get("identification") or {}
        per = ident.get("per_persona") or {}
        cells = []
        for pid in roster:
            p = per.get(pid) or {}
            a, m = _num(p.get("accuracy")), _num(p.get("margin"))
            cells.append(DASH if a is None else f"{a:.2f} ({m:+.3f}, n={p.get('n', 0)})")
        a = _num(ident.get("accuracy"))

        def num(key: str) -> str:
            v = _num(ident.get(key))
            return DASH if v is None else f"{v:.3f}"

        rows.append([system_label(s), DASH if a is None else f"{a:.3f} (n={ident.get('n', 0)})",
                     num("chance_given_shares"), num("kappa"), num("balanced_accuracy")] + cells)
    lines += _table(["System", "All", "Chance given shares", "Kappa", "Balanced"] + roster, rows)
    for key in ("paired", "paired_trained"):
        paired = block.get(key) or {}
        ref = paired.get("reference", "")
        comps = paired.get("systems") or {}
        if not comps:
            continue
        lines += [f"### Paired differences: {system_label(ref)} minus each system", "",
                  f"Per situation (same situation and seed), {ref} minus the system; mean difference, its "
                  "95% paired-bootstrap interval and the Wilcoxon signed-rank p-value. A difference in the arrow's "
                  "direction favours " + system_label(ref) + ".", ""]
        for group in groups:
            rows = [[system_label(s)] + [_diff((comps[s] or {}).get(k)) for k, _ in group]
                    for s in _systems_in_order(comps)]
            lines += _table(["System"] + [t + arrow.get(better.get(k, ""), "") for k, t in group], rows)
    return lines


def _share(stat: Any, key: str = "share", digits: int = 2) -> str:
    """"share [lo, hi]" of a ``{key, "lo", "hi"}`` dict; "–" without a value."""
    if not isinstance(stat, Mapping) or _num(stat.get(key)) is None:
        return DASH
    return _ci({"mean": stat.get(key), "lo": stat.get("lo"), "hi": stat.get("hi")}, digits)


def _team(block: Mapping[str, Any], order: list[str]) -> list[str]:
    """Who speaks and in what tone, per system: each persona's share of the agent turns, their entropy, the most
    common Tone's share and the fallback share, each with its interval."""
    systems = block.get("systems") or {}
    if not any("team" in (systems.get(s) or {}) for s in order):
        return []
    roster = list(block.get("roster") or [])
    top = next((t.get("persona_entropy_bits", {}).get("max") for s in order if (t := systems[s].get("team"))), None)
    lines = ["### Who speaks and in what tone", "",
             "Pooled over the system's dialogues, with a 95% percentile-bootstrap interval over dialogues: each "
             "persona's share of the agent turns (safety-gate turns left out), the entropy of the roster's shares in "
             f"bits (at most {_num(top) or 0:.3f}, when every persona speaks as often), the share of the most common "
             "Tone among the directives (which Tone), and the share of fallback directives.", ""]
    rows = []
    for s in order:
        t = systems[s].get("team") or {}
        shares = t.get("persona_shares") or {}
        tone = t.get("tone_top") or {}
        rows.append([system_label(s), str(t.get("agent_turns", DASH))]
                    + [_share(shares.get(pid)) for pid in roster]
                    + [_share(t.get("persona_entropy_bits"), "value"),
                       DASH if tone.get("share") is None else f"{_share(tone)} ({_esc(tone.get('tone'))})",
                       _share(t.get("fallback_share"), digits=3)])
    return lines + _table(["System", "Agent turns"] + roster + ["Entropy (bits)", "Top Tone share", "Fallback"],
                          rows)


def _adherence(block: Mapping[str, Any], order: list[str]) -> list[str]:
    """Persona adherence per system: distinguishability with chance and interval, the most repeated opener, and each
    persona's move compliance and forbidden-move rate."""
    systems = block.get("systems") or {}
    roster = list(block.get("roster") or [])
    if not any("distinguishability" in (systems.get(s) or {}) for s in order):
        return []
    lines = ["### Persona adherence by persona", "",
             "Distinguishability: a word and character n-gram logistic regression trained and tested by 5-fold "
             "cross-validation within the system's replies, folds grouped by situation; macro accuracy with a 95% "
             "bootstrap interval over situations, against chance 1/N (personas with fewer than 10 replies left out). "
             "Openers: the largest share of one persona's replies opening with the same four words (a tic that "
             "games the classifier or a detector shows here). Per persona: move compliance / forbidden-move rate, "
             "means over the dialogues it spoke in (n replies).", ""]
    rows = []
    for s in order:
        v = systems.get(s) or {}
        d = v.get("distinguishability") or {}
        acc = _num(d.get("accuracy"))
        dist = DASH if acc is None else (f"{acc:.3f} [{_num(d.get('lo')) or 0:.3f}, {_num(d.get('hi')) or 0:.3f}] "
                                         f"(chance {_num(d.get('chance')) or 0:.2f})")
        if d.get("left_out"):
            dist += f"; left out: {', '.join(d['left_out'])}"
        op = v.get("openers") or {}
        top = _num(op.get("max_top_share"))
        opener = DASH if top is None else f"{top:.2f} ({op.get('worst')})"
        cells = []
        for pid in roster:
            p = (v.get("moves_per_persona") or {}).get(pid) or {}
            c, f = _num((p.get("compliance") or {}).get("mean")), _num((p.get("forbidden") or {}).get("mean"))
            cells.append(DASH if c is None else f"{c:.2f} / {f:.2f} (n={p.get('n', 0)})")
        rows.append([system_label(s), dist, opener] + cells)
    return lines + _table(["System", "Distinguishability", "Max opener share"] + roster, rows)


def _judge_info(report: Mapping[str, Any]) -> list[str]:
    """Which model produced each judge's scores, and whether its scores varied enough to rank anything."""
    info = report.get("judge_info")
    if not isinstance(info, Mapping) or not info:
        return []
    rows, warn = [], []
    for name, j in info.items():
        std, share = _num(j.get("std")), _num(j.get("mode_share"))
        crit = j.get("criteria") or {}
        flat = [k for k, c in crit.items() if c.get("flat")]
        rows.append([_esc(name), _esc(j.get("model", DASH)), str(j.get("n", 0)),
                     DASH if std is None else f"{std:.3f}", DASH if share is None else f"{100 * share:.0f}%",
                     f"{len(flat)} of {len(crit)}", "yes" if j.get("informative") else "**no**"])
        if not j.get("informative"):
            warn.append(f"{name} ({j.get('reason') or 'flat'})")
    lines = ["## Judges", "", "Raw 1–5 scores over the whole run, per criterion: std and the share of the most common "
             "value (median over criteria); a criterion is flat when its std < 0.25 or one value makes up >= 90% of "
             "its scores.", ""]
    lines += _table(["Judge", "Model", "Scores", "Std (median)", "Top value share (median)", "Flat criteria",
                     "Informative"], rows)
    if warn:
        lines += [f"> **Uninformative judge(s): {'; '.join(warn)}.** Their tables cannot rank systems.", ""]
    return lines


def render_markdown(report: Mapping[str, Any]) -> str:
    """Render ``report.md``: a header, then the paper-style tables with the paper's numbers beside ours.

    Sections (each per split or domain): run counts (n, unparseable judgements, safety turns); in support mode the
    agent-specific table and the collective table (§8.2, paper numbers for Positive and
    Negative only); in meeting mode the per-domain collective table (§8.3, MASCOT and MultiAgentESC); the ablation
    table (§8.4) when ``no-director`` or ``no-persona`` is present; automatic metrics (§8.7); the persona-level
    breakdown. Rows follow the paper's system order, then the ablations, then unknown ids. With a ``by_judge``
    block, the mean tables come first, then one section per judge. The header carries a warning when
    ``models.trained`` is false or any NLI model is marked untrained.

    Args:
        report: The ``report.json`` dict (schema in the module docstring). Missing or ``None`` values render
            as "–"; judge scores are 0–100, automatic metrics 0–1 (embedding redundancy −1–1).

    Returns:
        The markdown text, ending with a newline.

    Raises:
        ValueError: ``report["mode"]`` is not ``"support"`` or ``"meeting"``.
    """
    mode = _mode(report)
    judges = [str(j) for j in report.get("judges") or []]
    by_judge = report.get("by_judge") or {}
    lines = _header(report, mode)
    lines += _measures(report)
    lines += _judge_info(report)
    info = report.get("judge_info") or {}

    def label(name: str) -> str:
        model = (info.get(name) or {}).get("model")
        return f"{name} = {model}" if model else name

    if by_judge:
        lines += [f"## Mean over judges ({'; '.join(label(j) for j in judges or sorted(by_judge))})", ""]
    elif judges:
        lines += [f"## Scores (judge: {'; '.join(label(j) for j in judges)})", ""]
    else:
        lines += ["## Without a judge", "", "No LLM judge ran (`--judges none`): no judge-score tables.", ""]
    lines += _body(report.get("systems") or {}, mode, "###", judged=bool(judges))
    for judge in judges + sorted(set(by_judge) - set(judges)):
        if judge in by_judge:
            lines += [f"## Judge: {label(judge)}", ""] + _body(by_judge[judge] or {}, mode, "###")
    return "\n".join(lines).rstrip("\n") + "\n"


# ----------------------------------------------------------------------------------------------- files and plots

def _atomic_write(path: Path, write: Callable[[BinaryIO], None]) -> None:
    """Write ``path`` atomically (:func:`mascot.core.files.atomic_write`)."""
    atomic_write(path, write)


def _save_figure(fig: Any, path: Path) -> Path:
    """Save ``fig`` as PNG atomically, then release it."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    try:
        FigureCanvasAgg(fig)
        fig.tight_layout()
        _atomic_write(path, lambda fh: fig.savefig(fh, format="png", dpi=100))
    finally:
        fig.clear()
    return path


def _safe_name(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", text)


def _judge_label(report: Mapping[str, Any]) -> str:
    """"judge: NAME = MODEL; ..." for chart titles ("" without judges)."""
    info = report.get("judge_info") or {}
    names = [str(j) for j in report.get("judges") or []]
    return "judge: " + "; ".join(f"{n} = {(info.get(n) or {}).get('model', '?')}" for n in names) if names else ""


def _bar_chart(systems: Mapping[str, Any], order: list[str], splits: list[str], key: str, section: str,
               out_dir: Path, judge: str = "") -> Path | None:
    """Grouped bars (systems x splits) of one criterion with std error bars, or ``None`` without data."""
    from matplotlib.figure import Figure

    values = {(s, sp): _ms(_sub(_stats(systems, s, sp), section, key)) for s in order for sp in splits}
    if all(m is None for m, _ in values.values()):
        return None
    fig = Figure(figsize=(max(6.0, 1.1 * len(order) + 2), 4.5))
    ax = fig.add_subplot()
    width = 0.8 / max(1, len(splits))
    for i, sp in enumerate(splits):
        pts = [(x, values[(s, sp)]) for x, s in enumerate(order) if values[(s, sp)][0] is not None]
        if not pts:
            continue
        xs = [x - 0.4 + width * (i + 0.5) for x, _ in pts]
        ax.bar(xs, [m for _, (m, _) in pts], width, yerr=[sd or 0.0 for _, (_, sd) in pts], capsize=2,
               label=_split_title(sp))
    ax.set_xticks(range(len(order)), [system_label(s) for s in order], rotation=30, ha="right")
    ax.set_ylim(0, 100)
    ax.set_ylabel("score (0–100)")
    ax.set_title(f"{AGENT_COLUMNS.get(key) or COLLECTIVE_COLUMNS.get(key, key)} ({key})"
                 + (f"\n{judge}" if judge else ""), fontsize="medium")
    ax.legend(fontsize="small")
    return _save_figure(fig, out_dir / f"bar_{_safe_name(key)}.png")


def _radar_chart(systems: Mapping[str, Any], system: str, splits: list[str], keys: tuple[str, ...],
                 section: str, columns: Mapping[str, str], out_dir: Path, judge: str = "") -> Path | None:
    """One polygon per split with every criterion present, or ``None`` when no split is complete."""
    from matplotlib.figure import Figure

    polygons = []
    for sp in splits:
        means = [_ms(_sub(_stats(systems, system, sp), section, k))[0] for k in keys]
        if all(m is not None for m in means):
            polygons.append((sp, means))
    if not polygons:
        return None
    angles = [2 * math.pi * i / len(keys) for i in range(len(keys))]
    fig = Figure(figsize=(5.5, 5.5))
    ax = fig.add_subplot(projection="polar")
    for sp, means in polygons:
        ax.plot(angles + angles[:1], means + means[:1], label=_split_title(sp))
        ax.fill(angles + angles[:1], means + means[:1], alpha=0.1)
    ax.set_xticks(angles, [columns[k] for k in keys])
    ax.set_ylim(0, 100)
    ax.set_title(system_label(system) + (f"\n{judge}" if judge else ""), fontsize="medium")
    ax.legend(fontsize="small", loc="lower right", bbox_to_anchor=(1.15, -0.1))
    return _save_figure(fig, out_dir / f"radar_{_safe_name(system)}.png")


def _confusion_chart(block: Mapping[str, Any], system: str, out_dir: Path) -> Path | None:
    """Row-normalised persona confusion matrix of one system (speaker × nearest card), or ``None`` without replies."""
    from matplotlib.figure import Figure

    conf = ((block.get("systems") or {}).get(system) or {}).get("identification", {}).get("confusion") or {}
    labels, matrix = list(conf.get("labels") or []), conf.get("matrix") or []
    if not labels or not any(any(r) for r in matrix):
        return None
    rows = [[c / sum(r) if sum(r) else 0.0 for c in r] for r in matrix]
    fig = Figure(figsize=(1.1 * len(labels) + 2.5, 1.0 * len(labels) + 1.8))
    ax = fig.add_subplot()
    im = ax.imshow(rows, vmin=0.0, vmax=1.0, cmap="Blues")
    for i, r in enumerate(matrix):
        for j, c in enumerate(r):
            ax.text(j, i, str(c), ha="center", va="center", fontsize="small",
                    color="white" if rows[i][j] > 0.5 else "black")
    ax.set_xticks(range(len(labels)), labels, rotation=30, ha="right")
    ax.set_yticks(range(len(labels)), labels)
    ax.set_xlabel("nearest persona card")
    ax.set_ylabel("speaker")
    acc = _num(((block.get("systems") or {}).get(system) or {}).get("identification", {}).get("accuracy"))
    ax.set_title(f"{system_label(system)}: identifiability {acc:.2f} (chance {_num(block.get('chance')) or 0:.2f})"
                 if acc is not None else system_label(system))
    fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04, label="share of the speaker's replies")
    return _save_figure(fig, out_dir / f"confusion_{_safe_name(system)}.png")


def adherence_chart(series: Mapping[str, Mapping[str, Any]], personas: list[str], title: str,
                    path: Path) -> Path | None:
    """Grouped bars of move compliance per persona (x) and system (bars), with 95% intervals as error bars.

    Args:
        series: ``{system label: {persona id: {"mean", "lo", "hi"}}}`` (a ``bootstrap_mean`` dict, or None).
        personas: Persona ids in x order.
        title: Chart title (e.g. the distinguishability of each system).
        path: Where the PNG goes (written atomically).

    Returns:
        ``path``, or None when no value is there to draw.
    """
    from matplotlib.figure import Figure

    if not any(_num((v or {}).get("mean")) is not None for per in series.values() for v in per.values()):
        return None
    fig = Figure(figsize=(1.6 * len(personas) + 2.5, 4.2))
    ax = fig.add_subplot()
    width = 0.8 / max(1, len(series))
    for j, (label, per) in enumerate(series.items()):
        xs, means, err = [], [], [[], []]
        for i, pid in enumerate(personas):
            v = per.get(pid) or {}
            m = _num(v.get("mean"))
            if m is None:
                continue
            lo, hi = _num(v.get("lo")), _num(v.get("hi"))
            xs.append(i + (j - (len(series) - 1) / 2) * width)
            means.append(m)
            err[0].append(m - lo if lo is not None else 0.0)
            err[1].append(hi - m if hi is not None else 0.0)
        ax.bar(xs, means, width=width, yerr=err, capsize=2, label=label)
    ax.set_xticks(range(len(personas)), personas, rotation=20, ha="right")
    ax.set_ylim(0, 1)
    ax.set_ylabel("move compliance (share of replies)")
    ax.set_title(title, fontsize="medium")
    ax.legend(fontsize="small")
    return _save_figure(fig, path)


def write_plots(report: Mapping[str, Any], out_dir: str | os.PathLike[str]) -> list[Path]:
    """Write the PNG charts of the report's ``systems`` block (the mean over judges) into ``out_dir``.

    Charts: ``bar_<key>.png`` for every agent criterion and collective criterion (§4.2), as
    grouped bars (systems × splits) with the std as error bars on a 0–100 axis; ``radar_<system>.png`` per
    system, with the agent criteria (support mode) or the collective criteria (meeting mode), one polygon per
    split; ``confusion_<system>.png`` per system of the ``measures`` block (speaker × nearest persona card, counts,
    shaded by the share of the speaker's replies); ``adherence.png`` (card-move compliance per persona and system,
    :func:`adherence_chart`). A chart without data (every mean ``None``; for a radar, no split
    with all criteria) is skipped. Each file is saved under a temporary name in ``out_dir`` and moved into place with
    ``os.replace``.

    Args:
        report: The ``report.json`` dict.
        out_dir: Destination folder; created if missing.

    Returns:
        The paths written, bar charts first (criterion order), then radar charts (system order).

    Raises:
        ValueError: ``report["mode"]`` is not ``"support"`` or ``"meeting"``.
        OSError: ``out_dir`` cannot be created or written.
    """
    mode = _mode(report)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    systems = report.get("systems") or {}
    order = _systems_in_order(systems)
    splits = _splits_in_order(systems, mode)
    written: list[Path] = []
    for key in AGENT_KEYS + COLLECTIVE_KEYS:
        path = _bar_chart(systems, order, splits, key, "criteria" if key in AGENT_KEYS else "collective", out,
                          _judge_label(report))
        if path is not None:
            written.append(path)
    keys, section, columns = ((AGENT_KEYS, "criteria", AGENT_COLUMNS) if mode == "support"
                              else (COLLECTIVE_KEYS, "collective", COLLECTIVE_COLUMNS))
    for system in order:
        path = _radar_chart(systems, system, splits, keys, section, columns, out, _judge_label(report))
        if path is not None:
            written.append(path)
    block = report.get("measures")
    if isinstance(block, Mapping):
        msys = block.get("systems") or {}
        for system in _systems_in_order(msys):
            path = _confusion_chart(block, system, out)
            if path is not None:
                written.append(path)
        series = {system_label(s): {p: (v.get("compliance") or {}) for p, v in
                                    ((msys[s].get("moves_per_persona") or {}).items())}
                  for s in _systems_in_order(msys)}
        dist = []
        for s in _systems_in_order(msys):
            d = msys[s].get("distinguishability") or {}
            acc = _num(d.get("accuracy"))
            if acc is not None:
                dist.append(f"{system_label(s)} {acc:.2f} (chance {_num(d.get('chance')) or 0:.2f})")
        title = "Card-move compliance per persona" + (f"\ndistinguishability: {', '.join(dist)}" if dist else "")
        path = adherence_chart(series, list(block.get("roster") or []), title, out / "adherence.png")
        if path is not None:
            written.append(path)
    return written


def write_report(report: Mapping[str, Any], out_dir: str | os.PathLike[str]) -> None:
    """Write ``report.json`` (indent 2), ``report.md`` (:func:`render_markdown`) and the charts (:func:`write_plots`).

    Every file is written atomically (temporary name in ``out_dir``, then ``os.replace``).

    Args:
        report: The ``report.json`` dict; it must be JSON-serialisable without NaN or infinity.
        out_dir: Destination folder; created if missing.

    Raises:
        ValueError: an unknown ``report["mode"]``, or a NaN/infinite value in ``report``.
        TypeError: a value that JSON cannot encode.
        OSError: ``out_dir`` cannot be created or written.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    text = json.dumps(report, indent=2, ensure_ascii=False, allow_nan=False) + "\n"
    markdown = render_markdown(report)
    _atomic_write(out / "report.json", lambda fh: fh.write(text.encode("utf-8")))
    _atomic_write(out / "report.md", lambda fh: fh.write(markdown.encode("utf-8")))
    write_plots(report, out)
