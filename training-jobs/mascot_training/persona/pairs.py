"""``pairs`` stage: preference pairs from judged candidates.

Within each group (context x, persona ρ) keep every ordered pair (y_w, y_l) whose judge means differ by at least
δ (default 0.5), largest margin first, at most ``max_per_group`` (default 4); candidates with no valid judgement
(``unjudged``), candidates the reply checks refused (``refused``) and pairs with identical texts are skipped
(:func:`mascot_training.common.preference_pairs.build_pairs`). With δ = 0 (smoke runs, whose untrained judge
scores every candidate alike) a tie is kept once, in index order, and its direction is arbitrary: plumbing, not
preference. Whole situations (all their personas' groups) go to the held-out split by hash of the situation id
(fraction ``heldout_fraction``), used to measure the reward model and its μ, σ on user messages it never trained
on. Counts of everything dropped are reported.

With ``pairs.cross_per_group`` > 0 the stage adds **cross-persona pairs** (:func:`cross_pairs`): for a context and
persona P, P's reply is chosen over another persona's reply to the same context, both scored under P's card. The
within-persona pairs compare two replies of one card and can only teach generic reply quality; the cross pairs
carry what makes a reply P's. Every row says which it is (``kind``: ``within`` / ``cross``).
"""

from __future__ import annotations

import json
from pathlib import Path

from mascot.core.files import read_jsonl, write_jsonl
from mascot_training.common.data import in_heldout_split
from mascot_training.common.manifest import digest_path, is_done, read_manifest, stage_dir
from mascot_training.common.preference_pairs import build_pairs


def _move_ok(card, text: str, user: str) -> tuple[bool, bool]:
    """``(required move present, forbidden move present)`` of ``text`` under ``card``'s moves (False, False
    without moves)."""
    if card.moves is None:
        return False, False
    from mascot.core.moves import assess

    v = assess(card.moves, text, user)
    return v.required_present, v.forbidden_present


def cross_pairs(groups: list[dict], judged: dict[str, dict], per_group: int, heldout_fraction: float) -> list[dict]:
    """Cross-persona pairs: for each group (context, persona P), P's replies chosen over other personas' replies to
    the same context (same history and seed context), both to be scored with P's card.

    P's side, best first: a reply that complies with P's card's moves, then the judge's higher mean. The other side,
    most useful first: a reply without P's required move, then one with a move P's card forbids. ``per_group`` pairs
    a group at most, each with a different rejected reply; refused and empty candidates are never used. Rows carry
    ``kind: "cross"``, ``margin: null`` and the group's held-out split.
    """
    from mascot.core.personas import PersonaCatalog

    if per_group <= 0:
        return []
    catalog = PersonaCatalog.load()
    by_ctx: dict[str, list[dict]] = {}
    for g in groups:
        key = json.dumps([g["situation_id"], g["history"], g["context"]], sort_keys=True)
        by_ctx.setdefault(key, []).append(g)
    rows = []
    for members in by_ctx.values():
        for g in members:
            card = catalog.get(g["persona_id"])
            user = next((h["text"] for h in reversed(g["history"]) if h["role"] == "user"), "")
            means = judged.get(g["group_id"], {}).get("means") or [None] * len(g["candidates"])

            def usable(grp: dict) -> list[int]:
                ref = grp.get("refused") or [""] * len(grp["candidates"])
                return [i for i, c in enumerate(grp["candidates"]) if c.strip() and not ref[i]]

            mine = []
            for i in usable(g):
                req, forb = _move_ok(card, g["candidates"][i], user)
                mine.append((not (req and not forb), -(means[i] if means[i] is not None else 0.0), i))
            mine.sort()
            if mine and not mine[0][0]:  # only P's replies that do its moves, when it has any
                mine = [m for m in mine if not m[0]]
            theirs = []
            for o in members:
                if o["persona_id"] == g["persona_id"]:
                    continue
                for i in usable(o):
                    text = o["candidates"][i]
                    req, forb = _move_ok(card, text, user)
                    theirs.append((req and not forb, not forb, o["persona_id"], i, text))
            theirs.sort(key=lambda t: (t[0], t[1], t[2], t[3]))
            if not mine or not theirs:
                continue
            split = "heldout" if in_heldout_split(g["group_id"], heldout_fraction) else "train"
            seen: set[str] = set()
            for t in theirs:
                if len(seen) >= per_group:
                    break
                chosen = g["candidates"][mine[len(seen) % len(mine)][2]]
                if t[4].strip() == chosen.strip() or t[4] in seen:
                    continue
                seen.add(t[4])
                rows.append({"group_id": g["group_id"], "situation_id": g["situation_id"],
                             "persona_id": g["persona_id"], "history": g["history"], "context": g["context"],
                             "chosen": chosen, "rejected": t[4], "margin": None, "split": split, "kind": "cross",
                             "rejected_persona": t[2]})
    return rows


def run(cfg, out: Path) -> dict:
    """Build ``OUT/pairs/pairs.jsonl`` from the sample and judge stages; returns the manifest.

    Raises:
        ValueError: an earlier stage is missing, or no pair qualifies (the message suggests what to change).
    """
    cand_p, judge_p = out / "sample" / "candidates.jsonl", out / "judge" / "judgements.jsonl"
    for p in (cand_p, judge_p):
        if not p.is_file():
            raise ValueError(f"{p} is missing: run the sample and judge stages first")
    conf = {"pairs": cfg.pairs.model_dump(mode="json")}
    inputs = {"candidates": digest_path(cand_p), "judgements": digest_path(judge_p)}
    if is_done(out, "pairs", conf, inputs):
        return read_manifest(out / "pairs")
    judged = {j["group_id"]: j for j in read_jsonl(judge_p)}
    rows, totals = [], {"unjudged": 0, "identical": 0, "over_cap": 0, "groups_without_pairs": 0, "refused": 0}
    for g in read_jsonl(cand_p):
        j = judged.get(g["group_id"])
        if j is None:
            raise ValueError(f"group {g['group_id']} has no judgement: rerun the judge stage")
        pairs, dropped = build_pairs(g["candidates"], j["means"], cfg.pairs.delta, cfg.pairs.max_per_group)
        refused = sum(1 for why in g.get("refused") or [] if why)
        dropped["unjudged"] -= refused  # counted apart: the reply checks refused them, the judge never saw them
        totals["refused"] += refused
        for k, v in dropped.items():
            totals[k] += v
        totals["groups_without_pairs"] += not pairs
        split = "heldout" if in_heldout_split(g["group_id"], cfg.pairs.heldout_fraction) else "train"
        for w, lo, margin in pairs:
            rows.append({"group_id": g["group_id"], "situation_id": g["situation_id"], "persona_id": g["persona_id"],
                         "history": g["history"], "context": g["context"], "chosen": g["candidates"][w],
                         "rejected": g["candidates"][lo], "margin": margin, "split": split, "kind": "within"})
    cross = cross_pairs(read_jsonl(cand_p), judged, cfg.pairs.cross_per_group, cfg.pairs.heldout_fraction)
    rows += cross
    if not rows:
        raise ValueError("no pair reaches the margin delta; lower pairs.delta, raise sample.k, or use a judge that "
                         "discriminates (the tiny random judge often scores every candidate alike)")
    with stage_dir(out, "pairs", conf, inputs) as (part, manifest):
        write_jsonl(part / "pairs.jsonl", rows)
        manifest["data_ids"] = sorted({r["situation_id"] for r in rows})
        manifest["metrics"] = {"pairs": len(rows), "within": len(rows) - len(cross), "cross": len(cross),
                               "train": sum(r["split"] == "train" for r in rows),
                               "heldout": sum(r["split"] == "heldout" for r in rows), "dropped": totals}
    return read_manifest(out / "pairs")
