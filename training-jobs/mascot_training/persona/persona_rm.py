"""Stage ``persona_rm``: one Bradley–Terry reward model for all personas.

Input ``OUT/pairs/pairs.jsonl`` (format in :mod:`mascot_training`); output ``OUT/persona_rm/model/``: an
``AutoModelForSequenceClassification`` (``num_labels=1``) with its tokenizer and ``mascot_reward.json``.

- Loss: −log σ(r(x, y_w) − r(x, y_l)), TRL 1.16 ``RewardTrainer`` ("standard" loss: the pairs' ``margin`` is
  not passed to TRL, which would otherwise subtract it inside the sigmoid).
- Inputs: :func:`mascot.core.formatting.reward_text` (persona card + context + conversation + reply), fitted to
  ``persona_rm.max_length`` oldest-first and ended with the tokenizer's EOS by :func:`formatting.with_eos`, exactly
  as :meth:`mascot.reward.scorer.RewardScorer.build_inputs` builds them at serving time. The dataset is plain text
  (non-conversational ``chosen``/``rejected`` columns, no chat template); TRL 1.16 appends ``eos_token`` only when
  a text does not already end with it (``RewardTrainer._prepare_dataset``), so it adds nothing here, and tokenizes
  with ``tokenizer(text=...)`` (special tokens on), like the scorer.
- Held-out metrics come from a :class:`~mascot.reward.scorer.RewardScorer` loaded from the saved directory, so
  they are what serving will see: pairwise accuracy = fraction with r(chosen) > r(rejected); μ, σ = mean and
  population standard deviation of all held-out raw scores (chosen and rejected), stored for ẑ = (r − μ)/σ.
"""

from __future__ import annotations

import logging
import shutil
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from mascot.core import formatting
from mascot.core.dialogue import HistoryTurn, history_from_dicts
from mascot.core.personas import PersonaCard, PersonaCatalog

from mascot.core.files import read_jsonl
from mascot_training.common.manifest import digest_path, is_done, read_manifest, stage_dir
from mascot_training.common.reward_model import SIGMA_FLOOR, fit_reward_model, load_rm_tokenizer
from mascot_training.persona.config import PersonaAlignmentConfig

log = logging.getLogger(__name__)

STAGE = "persona_rm"
MODEL_SUBDIR = "model"
_REQUIRED = ("group_id", "situation_id", "persona_id", "history", "context", "chosen", "rejected", "split")


@dataclass(frozen=True)
class Pair:
    """One preference pair of ``pairs.jsonl``.

    Attributes:
        situation_id: Source situation id (recorded in the manifest's ``data_ids``).
        persona_id: Persona that wrote both replies.
        history: Visible history before the replies, oldest first.
        context: Seed context ``(speaker, content)`` pairs.
        chosen: Preferred visible reply y_w.
        rejected: Dispreferred visible reply y_l.
        split: ``"train"`` or ``"heldout"``.
    """

    situation_id: str
    persona_id: str
    history: tuple[HistoryTurn, ...]
    context: tuple[tuple[str, str], ...]
    chosen: str
    rejected: str
    split: str
    kind: str = "within"


def load_pairs(path: Path, catalog: PersonaCatalog) -> list[Pair]:
    """Parse and check ``pairs.jsonl``.

    Raises:
        ValueError: the file is missing, a line lacks a field, has an unknown split, or names an unknown persona.
    """
    if not path.is_file():
        raise ValueError(f"{path} does not exist: run the 'pairs' stage first (it writes pairs/pairs.jsonl from "
                         "the judge stage's judgements)")
    out = []
    for i, rec in enumerate(read_jsonl(path), start=1):
        missing = [k for k in _REQUIRED if k not in rec]
        if missing:
            raise ValueError(f"{path} line {i}: missing field(s) {missing}; rerun the 'pairs' stage")
        if rec["split"] not in ("train", "heldout"):
            raise ValueError(f"{path} line {i}: split must be 'train' or 'heldout', got {rec['split']!r}")
        if rec["persona_id"] not in catalog.cards:
            raise ValueError(f"{path} line {i}: unknown persona id {rec['persona_id']!r}; known: "
                             f"{sorted(catalog.cards)}")
        history = tuple(history_from_dicts(rec["history"]))
        context = tuple((str(s), str(c)) for s, c in rec["context"])
        out.append(Pair(str(rec["situation_id"]), rec["persona_id"], history, context, rec["chosen"],
                        rec["rejected"], rec["split"], rec.get("kind") or "within"))
    return out


def reward_input(tokenizer: Any, max_length: int, card: PersonaCard, history: Sequence[HistoryTurn], reply: str,
                 context: Sequence[tuple[str, str]], names: Mapping[str, str]) -> str:
    """The reward-model text of one reply, identical to :meth:`RewardScorer.build_inputs` (text + EOS).

    Context and history are dropped oldest first until the text fits (:func:`formatting.reward_model_text`).

    Raises:
        ValueError: the persona card and the reply alone do not fit.
    """
    return formatting.reward_model_text(tokenizer, max_length, card, history, reply, context=context, names=names)[0]


def build_dataset(pairs: Sequence[Pair], tokenizer: Any, max_length: int, catalog: PersonaCatalog
                  ) -> tuple[Any, int]:
    """The TRL training set: a ``datasets.Dataset`` with plain-text ``chosen`` and ``rejected`` columns.

    Returns:
        ``(dataset, skipped)``; ``skipped`` counts pairs whose card + reply alone exceed ``max_length``.
    """
    from datasets import Dataset

    names = {pid: c.name for pid, c in catalog.cards.items()}
    chosen, rejected, skipped = [], [], 0
    for p in pairs:
        card = catalog.get(p.persona_id)
        try:
            c = reward_input(tokenizer, max_length, card, p.history, p.chosen, p.context, names)
            r = reward_input(tokenizer, max_length, card, p.history, p.rejected, p.context, names)
        except ValueError:
            skipped += 1
            continue
        chosen.append(c)
        rejected.append(r)
    return Dataset.from_dict({"chosen": chosen, "rejected": rejected}), skipped


def heldout_metrics(model_dir: Path, pairs: Sequence[Pair], catalog: PersonaCatalog, max_length: int,
                    batch_size: int) -> dict[str, float | int | None]:
    """Score held-out pairs with the saved model through :class:`RewardScorer` (the serving path).

    Returns:
        ``{"accuracy", "pairs", "mu", "sigma", "skipped"}``; accuracy is None and μ 0, σ 1 without pairs.
        σ is the population standard deviation, replaced by 1.0 when ≤
        :data:`mascot_training.common.reward_model.SIGMA_FLOOR`.
    """
    from mascot.reward.scorer import RewardScorer

    scorer = RewardScorer(model_dir, max_length=max_length, batch_size=batch_size)
    names = {pid: c.name for pid, c in catalog.cards.items()}
    texts, skipped, kinds = [], 0, []
    for p in pairs:
        try:
            built = scorer.build_inputs(catalog.get(p.persona_id), p.history, [p.chosen, p.rejected],
                                        context=p.context, names=names)
        except ValueError:
            skipped += 1
            continue
        texts += [t for t, _ in built]
        kinds.append(p.kind)
    raw = scorer.score_texts(texts)
    n = len(raw) // 2
    if n == 0:
        return {"accuracy": None, "pairs": 0, "mu": 0.0, "sigma": 1.0, "skipped": skipped, "by_kind": {}}
    won = [raw[2 * i] > raw[2 * i + 1] for i in range(n)]
    sigma = statistics.pstdev(raw)
    by_kind = {k: accuracy_interval(sum(w for w, kk in zip(won, kinds) if kk == k), kinds.count(k))
               for k in sorted(set(kinds))}
    return {"accuracy": sum(won) / n, "pairs": n, "mu": statistics.fmean(raw),
            "sigma": sigma if sigma > SIGMA_FLOOR else 1.0, "skipped": skipped,
            "interval": accuracy_interval(sum(won), n)["interval"], "by_kind": by_kind}


def accuracy_interval(wins: int, n: int) -> dict:
    """Pairwise accuracy ``wins / n`` with its 95% Wilson score interval (scipy ``binomtest(...).proportion_ci(
    method="wilson")``): ``{"accuracy", "pairs", "interval": [low, high]}``, rounded to 3 places; accuracy and
    interval None when ``n`` is 0."""
    if n == 0:
        return {"accuracy": None, "pairs": 0, "interval": None}
    from scipy.stats import binomtest

    ci = binomtest(wins, n).proportion_ci(confidence_level=0.95, method="wilson")
    return {"accuracy": round(wins / n, 3), "pairs": n, "interval": [round(ci.low, 3), round(ci.high, 3)]}


def _base_digest(name: str) -> str:
    """Directory digest of a local base model, else the hub id itself."""
    return digest_path(name) if Path(name).is_dir() else name


def run(cfg: PersonaAlignmentConfig, out: Path, *, base_model: str) -> dict:
    """Train the persona reward model on ``out/pairs/pairs.jsonl`` and publish ``out/persona_rm/``.

    Args:
        cfg: The run config; uses ``persona_rm.*`` (base model, epochs, lr, batch size, max length),
            ``sample.seed`` (seed of the head init and data order) and ``run_id`` (model name).
        out: Run output root.
        base_model: The policy's base model (directory or hub id), used when ``persona_rm.base_model`` is empty.

    Returns:
        The stage manifest: ``metrics`` = ``{"rm_heldout_accuracy", "heldout_pairs", "train_pairs",
        "train_loss", "mu", "sigma"}`` (accuracy None when no pair is held out; μ, σ then come from the
        training pairs), ``data_ids`` = sorted situation ids, and ``rm_heldout_accuracy`` at the top level.
        When the stage already completed with the same config and inputs, its manifest is returned untouched.

    Raises:
        ValueError: pairs file missing or malformed, no training pair, or no base model named.
    """
    out = Path(out)
    rm_cfg = cfg.persona_rm
    base = rm_cfg.base_model or base_model
    if not base:
        raise ValueError("no reward-model base: set persona_rm.base_model or the run's model")
    pairs_path = out / "pairs" / "pairs.jsonl"
    if not pairs_path.is_file():
        raise ValueError(f"{pairs_path} does not exist: run the 'pairs' stage first (it writes pairs/pairs.jsonl "
                         "from the judge stage's judgements)")
    config = {**rm_cfg.model_dump(mode="json"), "seed": cfg.sample.seed, "run_id": cfg.run_id}
    inputs = {"pairs": digest_path(pairs_path), "base_model": _base_digest(base)}
    if is_done(out, STAGE, config, inputs):
        log.info("persona_rm: already done with this config and inputs; skipping")
        return read_manifest(out / STAGE)

    catalog = PersonaCatalog.load()
    pairs = load_pairs(pairs_path, catalog)
    train = [p for p in pairs if p.split == "train"]
    heldout = [p for p in pairs if p.split == "heldout"]
    if not train:
        raise ValueError(f"{pairs_path} has no pair with split 'train' ({len(heldout)} held out): lower "
                         "pairs.heldout_fraction or pairs.delta, or sample more situations")

    with stage_dir(out, STAGE, config, inputs) as (partial, manifest):
        model_dir = partial / MODEL_SUBDIR
        trainer_dir = partial / "_trainer"
        for d in (model_dir, trainer_dir):
            shutil.rmtree(d, ignore_errors=True)

        tokenizer = load_rm_tokenizer(base)
        dataset, skipped = build_dataset(train, tokenizer, rm_cfg.max_length, catalog)
        if len(dataset) == 0:
            raise ValueError(f"all {len(train)} training pairs exceed persona_rm.max_length={rm_cfg.max_length} "
                             "even without history; raise it")
        train_pairs, loss = fit_reward_model(base, tokenizer, dataset, rm_cfg, cfg.sample.seed, model_dir,
                                             trainer_dir, label="persona_rm", curves=partial / "curves.png")

        from mascot.reward.scorer import RewardMetadata, write_metadata

        write_metadata(model_dir, RewardMetadata(name=f"persona-rm-{cfg.run_id}", trained=True))
        ho = heldout_metrics(model_dir, heldout, catalog, rm_cfg.max_length, rm_cfg.batch_size)
        if ho["pairs"] == 0:
            log.warning("persona_rm: no held-out pair could be scored; mu and sigma come from the training pairs "
                        "and rm_heldout_accuracy is null (raise pairs.heldout_fraction)")
            fallback = heldout_metrics(model_dir, train, catalog, rm_cfg.max_length, rm_cfg.batch_size)
            ho = {**ho, "mu": fallback["mu"], "sigma": fallback["sigma"]}
            manifest["warnings"] = ["no held-out pairs: mu and sigma measured on the training pairs"]
        write_metadata(model_dir, RewardMetadata(name=f"persona-rm-{cfg.run_id}", mu=ho["mu"], sigma=ho["sigma"],
                                                 trained=True))
        manifest["metrics"] = {"rm_heldout_accuracy": ho["accuracy"], "heldout_pairs": ho["pairs"],
                               "heldout_interval": ho.get("interval"), "heldout_by_kind": ho.get("by_kind", {}),
                               "train_pairs": train_pairs, "train_loss": loss,
                               "mu": ho["mu"], "sigma": ho["sigma"]}
        low = (ho.get("interval") or [None])[0]
        better = low is not None and low > 0.5
        # the bar: GRPO uses the reward model only when it beats chance on held-out situations (when asked to)
        manifest["rm_better_than_chance"] = better
        manifest["rm_used_by_grpo"] = better or not rm_cfg.require_better_than_chance
        if not manifest["rm_used_by_grpo"]:
            log.warning("persona_rm: held-out accuracy %s %s is not better than chance; GRPO will use the "
                        "rule-based reward alone (persona_rm.require_better_than_chance)", ho["accuracy"],
                        ho.get("interval"))
        manifest["data_ids"] = sorted({p.situation_id for p in pairs})
        manifest["rm_heldout_accuracy"] = ho["accuracy"]
        manifest["skipped_too_long"] = {"train": skipped, "heldout": ho["skipped"]}
        manifest["model_name"] = f"persona-rm-{cfg.run_id}"
    return read_manifest(out / STAGE)
