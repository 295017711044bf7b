"""``pairs`` stage: preference pairs from judged candidates.

Within each group (context x, persona ρ) keep every ordered pair (y_w, y_l) whose judge means differ by at least
δ (default 0.5), largest margin first, at most ``max_per_group`` (default 4); candidates with no valid judgement
(``unjudged``), candidates the reply checks refused (``refused``) and pairs with identical texts are skipped
(:func:`mascot_training.common.preference_pairs.build_pairs`). With δ = 0 (smoke runs, whose untrained judge
scores every candidate alike) a tie is kept once, in index order, and its direction is arbitrary: plumbing, not
preference. Whole situations (all their personas' groups) go to the held-out split by hash of the situation id
(fraction ``heldout_fraction``), used to measure the reward model and its μ, σ on user messages it never trained
on. Counts of everything dropped are reported.
"""

from __future__ import annotations

from pathlib import Path

from mascot.core.files import read_jsonl, write_jsonl
from mascot_training.common.data import in_heldout_split
from mascot_training.common.manifest import digest_path, is_done, read_manifest, stage_dir
from mascot_training.common.preference_pairs import build_pairs


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
                         "rejected": g["candidates"][lo], "margin": margin, "split": split})
    if not rows:
        raise ValueError("no pair reaches the margin delta; lower pairs.delta, raise sample.k, or use a judge that "
                         "discriminates (the tiny random judge often scores every candidate alike)")
    with stage_dir(out, "pairs", conf, inputs) as (part, manifest):
        write_jsonl(part / "pairs.jsonl", rows)
        manifest["data_ids"] = sorted({r["situation_id"] for r in rows})
        manifest["metrics"] = {"pairs": len(rows), "train": sum(r["split"] == "train" for r in rows),
                               "heldout": sum(r["split"] == "heldout" for r in rows), "dropped": totals}
    return read_manifest(out / "pairs")
