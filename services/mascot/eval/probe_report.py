"""The speaker probe's report: card-move compliance, distinguishability, opener diversity and the diagnostics, per
system, condition and persona, with bootstrap intervals and paired differences (``adapters`` minus ``base``).

Units: every item is one (situation, persona, condition) reply; a reply the reply checks refused entirely (nothing
delivered) counts as not compliant and is counted in ``rejected``. Intervals are 95% percentile bootstraps over
situations (:mod:`mascot.eval.stats`); the macro figures average the personas per situation first.
"""

from __future__ import annotations

import statistics
from collections import Counter, defaultdict
from typing import Any, Sequence

from mascot.core.guard import words

#: The probe's measures: name -> "higher" / "lower" is better.
PROBE_MEASURES = {"compliance": "higher", "required": "higher", "forbidden": "lower", "identifiability": "higher",
                  "relevance_user": "higher", "loop": "lower", "echo": "lower"}
DEFINITIONS = {
    "compliance": "share of replies with a required card move and no forbidden one (mascot.core.moves)",
    "required": "share of replies with at least one required card move",
    "forbidden": "share of replies with at least one forbidden card move",
    "distinguishability": "5-fold cross-validated macro accuracy of a word/character n-gram logistic regression "
                          "telling the personas apart, folds grouped by situation (chance 1/N)",
    "opener_top_share": "share of a persona's replies opening with its most common first four words",
    "identifiability": "share of replies whose nearest persona card by MiniLM cosine is the speaker's own (a "
                       "training-signal diagnostic: the metrics judge's persona criterion uses the same margin)",
    "relevance_user": "MiniLM cosine between the reply and the user's message",
    "loop": "share of replies with a word 4-gram three times or a repeated sentence",
    "echo": "share of replies sharing a word 8-gram with the persona's prompt, card or directive",
}


def score_rows(rows: Sequence[dict], roster: Sequence[Any], embed: Any = None) -> list[dict]:
    """Per reply: the move verdict, opener, words, loop and echo flags and (with ``embed``) the MiniLM figures.

    Args:
        rows: ``replies.jsonl`` records (``persona_id``, ``text``, ``user``, ``directive``).
        roster: The persona cards (their ``moves`` and identity texts).
        embed: ``embed(texts) -> [n, d]`` L2-normalised embeddings, or None to skip identifiability and relevance.

    Returns:
        The rows with ``required`` / ``forbidden`` (lists of fired detector names), ``compliant``, ``opener``,
        ``words``, ``loop``, ``echo``, ``identified`` and ``relevance_user`` (None without ``embed``) added.
    """
    from mascot.core.embedding import identify, identity_text
    from mascot.core.moves import assess, opener
    from mascot.eval.defects import echo_sources, is_echo, is_loop

    cards = {c.id: c for c in roster}
    sources = echo_sources(roster)
    out = []
    for r in rows:
        card = cards[r["persona_id"]]
        text = r.get("text") or ""
        v = assess(card.moves, text, r.get("user", "")) if card.moves and text.strip() else None
        d = r.get("directive") or {}
        out.append({**r, "required": list(v.required) if v else [], "forbidden": list(v.forbidden) if v else [],
                    "compliant": bool(v and v.compliant) if card.moves else None, "opener": opener(text),
                    "words": len(words(text)), "loop": bool(text.strip()) and is_loop(text),
                    "echo": bool(text.strip()) and is_echo(text, [*sources.get(card.id, []), d.get("action", ""),
                                                                  d.get("tone", "")]),
                    "identified": None, "relevance_user": None})
    if embed is not None:
        import numpy as np

        ids = [c.id for c in roster]
        card_emb = np.asarray(embed([identity_text(c) for c in roster]))
        live = [k for k, r in enumerate(out) if (r.get("text") or "").strip()]
        if live:
            rep = np.asarray(embed([out[k]["text"] for k in live]))
            usr = np.asarray(embed([out[k].get("user", "") for k in live]))
            nearest, _ = identify(rep, card_emb)
            for j, k in enumerate(live):
                out[k]["identified"] = ids[nearest[j]] == out[k]["persona_id"]
                out[k]["relevance_user"] = round(float(rep[j] @ usr[j]), 6)
    return out


def _mean_ci(vals: list[float], seed: int) -> dict:
    from mascot.eval.stats import bootstrap_mean

    return bootstrap_mean(vals, seed=seed)


def build_probe_report(rows: Sequence[dict], roster: Sequence[Any], systems: Sequence[str],
                       conditions: Sequence[str], seed: int = 0, trained: dict | None = None,
                       embed: Any = "minilm") -> dict:
    """The probe report dict (blocking: loads MiniLM unless ``embed`` is given or None).

    Args:
        rows: Every reply record of the run.
        roster: Persona cards, in roster order.
        systems: ``base`` and optionally ``adapters``.
        conditions: The run's conditions.
        seed: Bootstrap / classifier seed.
        trained: ``{persona_id: {"name", ...}}`` served as ``adapters``.
        embed: An ``embed(texts)`` function, ``"minilm"`` for the bundled MiniLM, or None for no MiniLM figures.

    Returns:
        ``{"roster", "systems", "conditions", "definitions", "better", "trained_adapters", "results": {system:
        {condition: {...}}}, "paired": {condition: {...}}}``.
    """
    from mascot.eval.distinguish import distinguishability, opener_diversity
    from mascot.eval.stats import paired_difference

    if embed == "minilm":
        from mascot.eval.automatic import EmbeddingRedundancy

        embed = EmbeddingRedundancy().embed
    scored = score_rows(rows, roster, embed)
    ids = [c.id for c in roster]
    with_moves = [c.id for c in roster if c.moves]
    by: dict[tuple, dict] = {(r["system"], r["condition"], r["situation_id"], r["persona_id"]): r for r in scored}
    situations = list(dict.fromkeys(r["situation_id"] for r in scored))
    results: dict[str, dict] = {}
    for s in systems:
        results[s] = {}
        for c in conditions:
            mine = [r for r in scored if r["system"] == s and r["condition"] == c]
            per: dict[str, Any] = {}
            for pid in ids:
                rs = [r for r in mine if r["persona_id"] == pid]
                live = [r for r in rs if (r.get("text") or "").strip()]
                fired_req = Counter(d for r in rs for d in r["required"])
                fired_for = Counter(d for r in rs for d in r["forbidden"])
                per[pid] = {
                    "n": len(rs), "rejected": sum(1 for r in rs if r.get("rejected")),
                    "compliance": _mean_ci([float(bool(r["compliant"])) for r in rs], seed) if pid in with_moves
                    else None,
                    "required": _mean_ci([float(bool(r["required"])) for r in rs], seed) if pid in with_moves
                    else None,
                    "forbidden": _mean_ci([float(bool(r["forbidden"])) for r in rs], seed) if pid in with_moves
                    else None,
                    "required_by_detector": dict(sorted(fired_req.items())),
                    "forbidden_by_detector": dict(sorted(fired_for.items())),
                    "identifiability": _mean_ci([float(r["identified"]) for r in live if r["identified"] is not None],
                                                seed),
                    "relevance_user": _mean_ci([r["relevance_user"] for r in live if r["relevance_user"] is not None],
                                               seed),
                    "median_words": statistics.median([r["words"] for r in live]) if live else None,
                    "loop": sum(1 for r in live if r["loop"]), "echo": sum(1 for r in live if r["echo"]),
                }
            # macro over personas, per situation first
            macro: dict[str, Any] = {}
            for key in ("compliance", "required", "forbidden"):
                vals = []
                for sid in situations:
                    xs = [by[(s, c, sid, p)] for p in with_moves if (s, c, sid, p) in by]
                    if xs:
                        flag = {"compliance": lambda r: bool(r["compliant"]), "required": lambda r: bool(r["required"]),
                                "forbidden": lambda r: bool(r["forbidden"])}[key]
                        vals.append(sum(flag(r) for r in xs) / len(xs))
                macro[key] = _mean_ci(vals, seed)
            live = [r for r in mine if (r.get("text") or "").strip()]
            for key, value in (("identifiability", lambda r: None if r["identified"] is None else
                                float(r["identified"])), ("relevance_user", lambda r: r["relevance_user"])):
                per_sit = []
                for sid in situations:
                    xs = [value(by[(s, c, sid, p)]) for p in ids if (s, c, sid, p) in by]
                    xs = [x for x in xs if x is not None]
                    if xs:
                        per_sit.append(sum(xs) / len(xs))
                macro[key] = _mean_ci(per_sit, seed)
            texts_by = defaultdict(list)
            for r in live:
                texts_by[r["persona_id"]].append(r["text"])
            results[s][c] = {
                "n": len(mine), "rejected": sum(1 for r in mine if r.get("rejected")), "macro": macro,
                "distinguishability": distinguishability([r["text"] for r in live], [r["persona_id"] for r in live],
                                                         [r["situation_id"] for r in live], seed=seed),
                "openers": opener_diversity({p: texts_by.get(p, []) for p in ids}),
                "loops": sum(1 for r in live if r["loop"]), "echoes": sum(1 for r in live if r["echo"]),
                "per_persona": per,
            }
    paired: dict[str, Any] = {}
    if "adapters" in systems and "base" in systems:
        for c in conditions:
            block: dict[str, Any] = {}
            for pid in ids:
                keys = [(sid, pid) for sid in situations if ("base", c, sid, pid) in by and ("adapters", c, sid, pid)
                        in by]
                a = [by[("adapters", c, sid, p)] for sid, p in keys]
                b = [by[("base", c, sid, p)] for sid, p in keys]
                rel = [(x["relevance_user"], y["relevance_user"]) for x, y in zip(a, b)
                       if x["relevance_user"] is not None and y["relevance_user"] is not None]
                moved = pid in with_moves
                block[pid] = {
                    "compliance": paired_difference([float(bool(r["compliant"])) for r in a],
                                                    [float(bool(r["compliant"])) for r in b], seed=seed)
                    if moved else None,
                    "forbidden": paired_difference([float(bool(r["forbidden"])) for r in a],
                                                   [float(bool(r["forbidden"])) for r in b], seed=seed)
                    if moved else None,
                    "relevance_user": paired_difference([x for x, _ in rel], [y for _, y in rel], seed=seed),
                }

            def per_situation(key: str, cond: str = c) -> tuple[list[float], list[float]]:
                a, b = [], []
                for sid in situations:
                    pair = []
                    for system in ("adapters", "base"):
                        xs = [by[(system, cond, sid, p)] for p in with_moves if (system, cond, sid, p) in by]
                        pair.append(sum(bool(r["compliant"] if key == "compliance" else r[key]) for r in xs) / len(xs)
                                    if xs else None)
                    if None not in pair:
                        a.append(pair[0])
                        b.append(pair[1])
                return a, b

            block["macro"] = {k: paired_difference(*per_situation(k), seed=seed) for k in ("compliance", "forbidden")}
            paired[c] = block
    return {"probe": "speakers", "roster": ids, "systems": list(systems), "conditions": list(conditions),
            "situations": len(situations), "seed": seed, "better": dict(PROBE_MEASURES),
            "definitions": dict(DEFINITIONS),
            "trained_adapters": {pid: v["name"] for pid, v in (trained or {}).items()},
            "moves": {c.id: c.moves.model_dump() if c.moves else None for c in roster},
            "results": results, "paired": paired}


def _ci(stat: Any, digits: int = 2) -> str:
    if not stat or stat.get("mean") is None:
        return "–"
    if stat.get("lo") is None:
        return f"{stat['mean']:.{digits}f}"
    return f"{stat['mean']:.{digits}f} [{stat['lo']:.{digits}f}, {stat['hi']:.{digits}f}]"


def _diff(stat: Any) -> str:
    if not stat or stat.get("mean_diff") is None:
        return "–"
    lo, hi = stat.get("lo"), stat.get("hi")
    tail = f" [{lo:+.3f}, {hi:+.3f}]" if lo is not None else ""
    return f"{stat['mean_diff']:+.3f}{tail} p={stat['p']}"


def render_probe_markdown(report: dict) -> str:
    """``probe-report.md``: one table per condition (rows: personas, then the macro row), distinguishability and
    opener lines per system, and the paired table when adapters ran."""
    lines = ["# Speaker probe", "",
             f"{report['situations']} situations x {len(report['roster'])} personas x "
             f"{len(report['conditions'])} condition(s) ({', '.join(report['conditions'])}); systems: "
             f"{', '.join(report['systems'])}. Intervals: 95% bootstrap over situations.", ""]
    if report.get("trained_adapters"):
        lines += ["Adapters served: " + ", ".join(f"{k} = {v}" for k, v in report["trained_adapters"].items()), ""]
    missing = [p for p in report["roster"] if p not in (report.get("trained_adapters") or {})]
    if "adapters" in report["systems"] and missing:
        lines += [f"No adapter in the store for {', '.join(missing)}: those personas answer with the base model in "
                  "both systems.", ""]
    lines += ["Definitions:", ""] + [f"- **{k}**: {v}" for k, v in report["definitions"].items()] + [""]
    for c in report["conditions"]:
        lines += [f"## Condition: {c}", ""]
        head = ["persona"]
        for s in report["systems"]:
            head += [f"{s} compliance", f"{s} required", f"{s} forbidden", f"{s} opener top", f"{s} MiniLM id.",
                     f"{s} relevance", f"{s} words"]
        lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for pid in [*report["roster"], "macro"]:
            row = [pid if pid != "macro" else "**macro**"]
            for s in report["systems"]:
                res = report["results"][s][c]
                if pid == "macro":
                    m = res["macro"]
                    op = res["openers"]["max_top_share"]
                    row += [_ci(m["compliance"]), _ci(m["required"]), _ci(m["forbidden"]),
                            f"max {op:.2f}" if op is not None else "–", _ci(m["identifiability"]),
                            _ci(m["relevance_user"]), ""]
                else:
                    p = res["per_persona"][pid]
                    op = res["openers"]["per_persona"].get(pid, {})
                    row += [_ci(p["compliance"]), _ci(p["required"]), _ci(p["forbidden"]),
                            f"{op['top_share']:.2f}" if op.get("top_share") is not None else "–",
                            _ci(p["identifiability"]), _ci(p["relevance_user"]),
                            f"{p['median_words']:g}" if p["median_words"] is not None else "–"]
            lines.append("| " + " | ".join(row) + " |")
        lines.append("")
        for s in report["systems"]:
            res = report["results"][s][c]
            d = res["distinguishability"]
            if d["accuracy"] is None:
                lines.append(f"- {s}: distinguishability not computed ({d.get('reason', '')})")
            else:
                lines.append(f"- {s}: distinguishability {d['accuracy']:.3f} [{d['lo']:.3f}, {d['hi']:.3f}] "
                             f"(chance {d['chance']:.2f}, {d['n']} replies, {d['folds']} folds; per persona "
                             + ", ".join(f"{k} {v:.2f}" for k, v in d["per_persona"].items() if v is not None) + ")"
                             + (f"; left out (fewer than 10 replies): {', '.join(d['left_out'])}"
                                if d.get("left_out") else ""))
            op = res["openers"]
            if op["worst"]:
                lines.append(f"  - most repeated opener: {op['worst']} \"{op['per_persona'][op['worst']]['opener']}\" "
                             f"in {op['max_top_share']:.0%} of its replies; rejected replies {res['rejected']}, "
                             f"loops {res['loops']}, echoes {res['echoes']}")
        lines.append("")
        if c in report.get("paired", {}):
            pb = report["paired"][c]
            lines += [f"### adapters minus base ({c}), paired by situation", "",
                      "| persona | compliance | forbidden | relevance |", "|---|---|---|---|"]
            for pid in report["roster"]:
                lines.append(f"| {pid} | {_diff(pb[pid]['compliance'])} | {_diff(pb[pid]['forbidden'])} | "
                             f"{_diff(pb[pid]['relevance_user'])} |")
            lines.append(f"| **macro** | {_diff(pb['macro']['compliance'])} | {_diff(pb['macro']['forbidden'])} | |")
            lines.append("")
    return "\n".join(lines) + "\n"


def write_probe_plots(report: dict, out_dir: Any) -> list:
    """``probe-adherence-<condition>.png`` per condition: move compliance per persona and system with intervals,
    distinguishability in the title (:func:`mascot.eval.report.adherence_chart`). Returns the paths written."""
    from pathlib import Path

    from mascot.eval.report import adherence_chart

    written = []
    for c in report["conditions"]:
        series = {s: {p: v["compliance"] for p, v in report["results"][s][c]["per_persona"].items()}
                  for s in report["systems"]}
        dist = [f"{s} {d['accuracy']:.2f} (chance {d['chance']:.2f})" for s in report["systems"]
                if (d := report["results"][s][c]["distinguishability"])["accuracy"] is not None]
        title = f"Speaker probe ({c}): card-move compliance" + (
            f"\ndistinguishability: {', '.join(dist)}" if dist else "")
        path = adherence_chart(series, report["roster"], title, Path(out_dir) / f"probe-adherence-{c}.png")
        if path is not None:
            written.append(path)
    return written
