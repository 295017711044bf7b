"""Stage ``group_rm``: the group reward model of the docs (``group_reward.source = rm``).

The phase 1 recipe on blocks: the judge scores every block of ``rollouts/blocks.jsonl`` on the collective rubric
(the docs; in-process judges with the JudgeService code, :mod:`mascot_training.common.judges`, a content-hash cache
in the partial directory so a killed stage resumes without repeating answered calls); within each prefix's K blocks,
pairs whose mean scores differ by at least δ (largest margin first, at most ``pairs.max_per_group``,
:mod:`mascot_training.common.preference_pairs`); Bradley–Terry with TRL ``RewardTrainer``
(:mod:`mascot_training.common.reward_model`) on :func:`mascot.core.formatting.group_reward_model_text` (the input
the director's reward function scores); held-out pairwise accuracy; μ, σ of held-out scores stored in
``mascot_reward.json``.

With ``source = judge`` or ``team`` the stage records that no model is trained; ``director_grpo`` asks the judge
directly, or measures the block (:func:`mascot_training.collaborative.director_grpo.team_group_reward`).
"""

from __future__ import annotations

import logging
import statistics
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from mascot.core.dialogue import history_from_dicts
from mascot.core.personas import PersonaCatalog
from mascot_training.collaborative.config import CollaborativeConfig
from mascot_training.collaborative.simulate import Prefix
from mascot_training.common import manifest as mf
from mascot_training.common.config import active_personas
from mascot_training.common.data import in_heldout_split
from mascot_training.common.judges import judging_versions
from mascot_training.common.preference_pairs import build_pairs
from mascot_training.common.reward_model import SIGMA_FLOOR, fit_reward_model, load_rm_tokenizer

log = logging.getLogger(__name__)
STAGE = "group_rm"
MODEL_SUBDIR = "model"


def judge_specs(cfg: CollaborativeConfig) -> Any:
    """The object :func:`mascot_training.common.judges.build_stage_judges` reads (``judge``, ``model``,
    ``tiny_dir``): the group reward's judges on the run's model."""
    return SimpleNamespace(judge=cfg.phase2.group_reward.judge, model=cfg.model, tiny_dir=cfg.tiny_dir)


async def judge_blocks(judges: list, cards: list, items: list[tuple[Prefix, list]]) -> tuple[list, dict]:
    """Mean collective score per ``(prefix, block)`` item (mean over criteria and judges; None when every judge's
    answer was unparseable). Returns ``(means, {"unparseable", "judge_calls"})``."""
    from mascot.judge import rubric as rb
    from mascot.judge.judging import collective_item

    per_item: list[list[dict]] = [[] for _ in items]
    unparseable = calls = 0
    for j in judges:
        prompts = [collective_item(j.backend, cards, prefix.history, block, prefix.context) for prefix, block in items]
        verdicts = await j.judge_many(rb.COLLECTIVE, prompts)
        for i, v in enumerate(verdicts):
            calls += v.attempts
            if v.status == "ok":
                per_item[i].append(v.scores)
            else:
                unparseable += 1
    means = []
    for scores in per_item:
        vals = [x for s in scores for x in s.values()]
        means.append(sum(vals) / len(vals) if vals else None)
    return means, {"unparseable": unparseable, "judge_calls": calls}


def check_rm_length(tokenizer: Any, max_length: int, cards: list, blocks: list[list]) -> int:
    """The tokens the longest of ``blocks`` needs in the group reward model's input with the roster and no prefix
    history (what :func:`mascot.core.formatting.group_reward_model_text` never drops), plus the special-token room.

    Raises:
        ValueError: that exceeds ``max_length``; the message names ``phase2.group_reward.rm.max_length``, the length
            needed and the roster's share, so the fix is known before any block is judged.
    """
    from mascot.core.formatting import SPECIAL_TOKEN_ROOM, group_reward_text

    def count(block: list) -> int:
        return len(tokenizer(group_reward_text(cards, [], block, []))["input_ids"])

    need = max((count(b) for b in blocks), default=0) + SPECIAL_TOKEN_ROOM
    if need > max_length:
        roster = count([])
        raise ValueError(f"phase2.group_reward.rm.max_length={max_length} cannot hold the group reward model's input: "
                         f"the roster takes {roster} tokens and the longest block with it {need} (special tokens "
                         f"included); raise rm.max_length to at least {need}, or shorten speakers.max_tokens and "
                         "user.max_tokens (the rollouts are kept: the same command resumes at this stage)")
    return need


async def run(cfg: CollaborativeConfig, out: Path, *, engine: Any, base_model: str) -> dict:
    """Judge the blocks, build pairs and train the group RM into ``OUT/group_rm/model``; returns the manifest.

    Returns:
        The manifest; ``metrics``: ``source``, and for ``rm``: ``judged_blocks``, ``unparseable``, ``judge_calls``,
        ``pairs`` (train / heldout / dropped counts), ``group_rm_heldout_accuracy``, ``mu``, ``sigma``,
        ``train_loss``.

    Raises:
        ValueError: the rollouts stage has not run, ``rm.max_length`` cannot hold the longest block
            (:func:`check_rm_length`, before judging), or no pair reaches δ (the message says what to change).
    """
    out = Path(out)
    gr = cfg.phase2.group_reward
    blocks_path = out / "rollouts" / "blocks.jsonl"
    prefixes_path = out / "rollouts" / "prefixes.jsonl"
    conf = {"group_reward": gr.model_dump(mode="json"), "personas": active_personas(cfg), "run_id": cfg.run_id,
            "versions": judging_versions(gr.judge.judges)}
    if gr.source in ("judge", "team"):
        inputs: dict[str, str] = {}
        if mf.is_done(out, STAGE, conf, inputs):
            return mf.read_manifest(out / STAGE)
        with mf.stage_dir(out, STAGE, conf, inputs) as (_part, man):
            man["metrics"] = {"source": gr.source}
        return mf.read_manifest(out / STAGE)
    if not blocks_path.is_file():
        raise ValueError(f"{blocks_path} is missing: run the rollouts stage first (with group_reward.source rm)")
    base = gr.rm.base_model or base_model
    inputs = {"blocks": mf.digest_path(blocks_path), "prefixes": mf.digest_path(prefixes_path),
              "base_model": mf.digest_path(base) if Path(base).is_dir() else base}
    if mf.is_done(out, STAGE, conf, inputs):
        return mf.read_manifest(out / STAGE)
    from mascot.core.files import read_jsonl, write_jsonl
    from mascot.core.formatting import block_text
    from mascot_training.common.judges import build_stage_judges, close_judges

    catalog = PersonaCatalog.load()
    cards = [catalog.get(p) for p in active_personas(cfg)]
    names = {c.id: c.name for c in cards}
    prefixes = {d["prefix_id"]: Prefix.from_dict(d) for d in read_jsonl(prefixes_path)}
    groups = []
    for row in read_jsonl(blocks_path):
        kept = [b for b in row["blocks"] if not b["dropped"] and b["block"]]
        groups.append((prefixes[row["prefix_id"]], [history_from_dicts(b["block"]) for b in kept]))
    tokenizer = load_rm_tokenizer(base)
    check_rm_length(tokenizer, gr.rm.max_length, cards, [b for _, bs in groups for b in bs])
    with mf.stage_dir(out, STAGE, conf, inputs) as (part, man):
        judges = build_stage_judges(judge_specs(cfg), engine, f"sqlite:///{(part / 'judge-cache.db').resolve()}")
        items = [(p, b) for p, bs in groups for b in bs]
        means, jm = await judge_blocks(judges, cards, items)
        await close_judges(judges)
        rows, dropped = [], {"unjudged": 0, "identical": 0, "over_cap": 0, "groups_without_pairs": 0}
        i = 0
        for prefix, bs in groups:
            m = means[i:i + len(bs)]
            i += len(bs)
            pairs, d = build_pairs([block_text(b, names) for b in bs], m, gr.pairs.delta, gr.pairs.max_per_group)
            for k, v in d.items():
                dropped[k] += v
            dropped["groups_without_pairs"] += not pairs
            split = "heldout" if in_heldout_split(prefix.prefix_id, gr.pairs.heldout_fraction) else "train"
            rows += [(prefix, bs[w], bs[lo], margin, split) for w, lo, margin in pairs]
        write_jsonl(part / "judgements.jsonl",
                    ({"prefix_id": p.prefix_id, "mean": mv} for (p, _), mv in zip(items, means)))
        if not any(r[4] == "train" for r in rows):
            raise ValueError(f"no training pair of blocks reaches phase2.group_reward.pairs.delta={gr.pairs.delta} "
                             f"({len(rows)} held out): lower delta, raise group_reward.k or prefixes, or use a judge "
                             "that discriminates (the tiny random judge scores every block alike)")
        from datasets import Dataset
        from mascot.core.formatting import group_reward_model_text

        def text(prefix: Prefix, block: list) -> str:
            return group_reward_model_text(tokenizer, gr.rm.max_length, cards, prefix.history, block,
                                           prefix.context)[0]

        train = [(text(p, w), text(p, lo)) for p, w, lo, _, s in rows if s == "train"]
        heldout = [(text(p, w), text(p, lo)) for p, w, lo, _, s in rows if s == "heldout"]
        model_dir = part / MODEL_SUBDIR
        n_train, loss = fit_reward_model(base, tokenizer, Dataset.from_dict(
            {"chosen": [c for c, _ in train], "rejected": [r for _, r in train]}), gr.rm, cfg.phase2.seed,
            model_dir, part / "_trainer", label="group_rm", curves=part / "curves.png")
        from mascot.reward.scorer import RewardMetadata, RewardScorer, write_metadata

        write_metadata(model_dir, RewardMetadata(name=f"group-rm-{cfg.run_id}", trained=True))
        scorer = RewardScorer(model_dir, max_length=gr.rm.max_length, batch_size=gr.rm.batch_size)
        measured = heldout or train
        raw = scorer.score_texts([t for pair in measured for t in pair])
        acc = (sum(raw[2 * k] > raw[2 * k + 1] for k in range(len(heldout))) / len(heldout)) if heldout else None
        sigma = statistics.pstdev(raw) if len(raw) > 1 else 1.0
        mu, sigma = statistics.fmean(raw), (sigma if sigma > SIGMA_FLOOR else 1.0)
        write_metadata(model_dir, RewardMetadata(name=f"group-rm-{cfg.run_id}", mu=mu, sigma=sigma, trained=True))
        if not heldout:
            man["warnings"] = ["no held-out pair: mu and sigma measured on the training pairs; accuracy is null"]
        man["data_ids"] = sorted({p.situation_id for p, _ in groups})
        man["metrics"] = {"source": "rm", "judged_blocks": len(items), **jm,
                          "pairs": {"train": len(train), "heldout": len(heldout), "dropped": dropped},
                          "group_rm_heldout_accuracy": acc, "heldout_pairs": len(heldout), "train_pairs": n_train,
                          "train_loss": loss, "mu": mu, "sigma": sigma}
        man["group_rm_heldout_accuracy"] = acc
    return mf.read_manifest(out / STAGE)
