"""Optional warm start of the director LoRA before GRPO (``director.warm_start_steps``; our addition).

Two sources of SFT rows (``director.warm_start_source``), each a prompt (the serving director chat before a
decision) and a completion (the directive as the director's chat shows it):

- ``serving``: behaviour cloning of the serving director. Every decision the rollouts stage recorded (prefix turns and
  the group RM's blocks; the constrained serving director, with retries and fallback) becomes a row. A small director
  that rarely writes a valid directive unconstrained then gives GRPO rollouts to compare.
- ``personas``: one valid directive per persona the decision may pick, per training prefix
  (:func:`persona_rows`). The base model samples under serving's grammar with ``Agent`` fixed to that persona, and a
  draw serving's checks would refuse is drawn again. The rows give every choosable persona the same weight. GRPO
  can only reinforce a persona its rollouts sample, and the untrained director gives the Action Guide and the
  Empathetic Listener almost no probability: after this warm start every persona is sampled and valid directives
  are the rule, so the reward decides whom to pick.
"""

from __future__ import annotations

import math
import shutil
from pathlib import Path
from typing import Any, Sequence

from mascot_training.collaborative.config import CollaborativeConfig
from mascot_training.collaborative.simulate import Prefix
from mascot_training.common.progress import trainer_progress

#: Rows per forward/backward pass of the warm start (the step's batch of up to 8 by gradient accumulation).
WARM_START_MICRO_BATCH = 2


def warm_start_rows(prefixes: dict[str, Prefix], block_rows: Sequence[dict], roster: Sequence[Any],
                    max_consecutive: int) -> list[dict]:
    """SFT rows ``{"prompt": director chat, "completion": [assistant directive]}`` for every serving-director
    decision of the prefixes and of the kept blocks (prompt = the serving director chat before that turn)."""
    from mascot.core.dialogue import history_from_dicts
    from mascot.director.prompts import build_messages

    rows = []

    def add(history: list, context: list, start: int = 0) -> None:
        for j, t in enumerate(history):
            if j >= start and t.role == "agent" and t.directive:
                rows.append({"prompt": build_messages(roster, history[:j], context, max_consecutive),
                             "completion": [{"role": "assistant", "content": t.directive}]})

    for p in prefixes.values():
        add(p.history, p.context)
    for row in block_rows:
        p = prefixes.get(row["prefix_id"])
        if p is None:
            continue
        for b in row["blocks"]:
            if not b["dropped"]:
                add(list(p.history) + history_from_dicts(b["block"]), p.context, start=len(p.history))
    return rows


def reason_key(message: str) -> str:
    """A refusal message's kind for counting: its text before the first colon, at most 60 characters."""
    return message.split(":")[0][:60]


def persona_rows(runner: Any, director: Any, prefixes: Sequence[Prefix], tries: int, seed: int,
                 batch: int = 16) -> tuple[list[dict], dict]:
    """SFT rows of a persona-balanced warm start: for each prefix and each persona its next decision may pick
    (:func:`mascot.director.decide.choosable_personas` under the runner's serving rules), one directive sampled by
    ``director`` under serving's grammar with ``Agent`` fixed to that persona
    (:func:`mascot.director.decide.decision_regex` over that persona alone) and passing serving's checks as a first
    attempt (:func:`mascot.director.decide.check_decision` against every choosable persona); a refused draw is drawn
    again, up to ``tries`` draws. A persona with no valid draw gets no row.

    Args:
        runner: A :class:`~mascot_training.collaborative.simulate.RolloutRunner` whose settings carry
            ``director_rules`` (``director.sampling: serving``).
        director: A :class:`~mascot_training.collaborative.simulate.PolicyDirector` (the base model).
        prefixes: Training prefixes.
        tries: Draws per (prefix, persona), at least 1.
        seed: Seed of the draws (draw ``k`` of batch ``j`` is seeded from it, ``k`` and ``j``).
        batch: Sequences sampled together.

    Returns:
        ``(rows, figures)``: rows ``{"prompt": director chat, "completion": [assistant directive], "persona_id"}``
        in prefix order, then roster order; figures ``{"decisions", "rows", "draws", "refused", "per_persona"}``
        (``per_persona``: rows per persona id; ``refused``: draws refused, by reason prefix).

    Raises:
        ValueError: the runner has no serving rules, or ``tries`` < 1.
    """
    import collections

    from mascot.director.decide import choosable_personas
    from mascot.director.prompts import build_messages
    from mascot_training.collaborative.simulate import Rollout, rollout_seed

    rules = runner.s.director_rules
    if rules is None or not rules.constrained:
        raise ValueError("director.warm_start_source: personas samples under serving's grammar: set "
                         "director.sampling: serving")
    if tries < 1:
        raise ValueError(f"director.warm_start_tries must be at least 1, got {tries}")
    jobs = []  # (rollout, persona card)
    for p in prefixes:
        r = Rollout(p, 0, 0)
        runner.start(r)
        _, choosable = choosable_personas(runner.roster, r.history, rules)
        jobs += [(r, c) for c in choosable]
    found: dict[int, str] = {}
    refused: collections.Counter = collections.Counter()
    draws = 0
    for k in range(tries):
        pending = [i for i in range(len(jobs)) if i not in found]
        for j in range(0, len(pending), batch):
            part = pending[j:j + batch]
            draws += len(part)
            outs = runner.policy_decisions(director, [jobs[i][0] for i in part],
                                           rollout_seed(seed, "persona-rows", k, j), [jobs[i][1] for i in part])
            for i, o in zip(part, outs):
                if o.directive is None:  # draw again
                    refused[reason_key(o.error or "unparsable directive")] += 1
                else:
                    found[i] = o.text  # as generated: what the director's chat shows later
    rows = []
    for i, (r, card) in enumerate(jobs):
        if i in found:
            rows.append({"prompt": build_messages(runner.roster, r.history, r.prefix.context,
                                                  runner.s.max_consecutive_turns),
                         "completion": [{"role": "assistant", "content": found[i]}], "persona_id": card.id})
    per = collections.Counter(row["persona_id"] for row in rows)
    return rows, {"decisions": len(jobs), "rows": len(rows), "draws": draws, "refused": dict(refused),
                  "per_persona": {c.id: per[c.id] for c in runner.roster}}


def grouped_order(rows: Sequence[dict], total: int, seed: int) -> list[dict]:
    """``total`` rows in an order that keeps each prompt's rows together: the groups (rows of one prompt, in their
    order) are shuffled with ``seed`` each pass over the rows, and passes follow until ``total`` rows are taken.

    Read in that order, every optimiser step of the persona-balanced warm start sees each of its decisions with all
    the personas that decision may pick, so no step pushes one persona's name up alone (drawn at random, a step's 8
    rows are 8 separate decisions, and the prior left by a short run followed whichever personas the last steps
    happened to hold).

    Raises:
        ValueError: no rows, or ``total`` < 1.
    """
    import json
    import random

    if not rows or total < 1:
        raise ValueError(f"grouped_order needs rows and a positive total, got {len(rows)} rows and {total}")
    groups: dict[str, list[dict]] = {}
    for r in rows:
        groups.setdefault(json.dumps(r["prompt"], sort_keys=True), []).append(r)
    keys, rng, out = list(groups), random.Random(seed), []
    while len(out) < total:
        rng.shuffle(keys)
        for k in keys:
            out.extend(groups[k])
    return out[:total]


def warm_start(base_model: str, rows: list[dict], cfg: CollaborativeConfig, out_dir: Path,
               grouped: bool = False) -> dict:
    """Fine-tune a fresh director LoRA (TRL ``SFTTrainer``, ``cfg.lora``) on conversational prompt-completion rows
    (:func:`warm_start_rows` or :func:`persona_rows`, the loss on the completion) and save it to ``out_dir``.
    Returns ``{"rows", "steps", "train_loss", "loss_first", "loss_last"}`` (the first and last logged step losses).

    Each step updates on up to 8 rows, passed :data:`WARM_START_MICRO_BATCH` at a time (gradient accumulation): the
    director's chats run to ``max_model_len`` tokens, and 8 of them at 1536 tokens in one pass needed more than 20 GB
    on a CPU.

    With ``grouped`` the rows are read in :func:`grouped_order` (the persona-balanced rows: one prompt's rows side
    by side in one step), else at random.

    Raises:
        ValueError: no rows (no serving decision was recorded).
    """
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, PrinterCallback
    from trl import SFTConfig, SFTTrainer

    from mascot_training.common.lora import peft_lora

    if not rows:
        raise ValueError("director.warm_start_steps is set but the rollouts stage recorded no serving decision")
    d = cfg.director
    work = out_dir.parent / ".warm-start-trainer"
    batch = min(8, len(rows))
    micro = math.gcd(batch, WARM_START_MICRO_BATCH)
    n_rows = len(rows)
    if grouped:
        rows = grouped_order(rows, batch * d.warm_start_steps, cfg.director_grpo.seed)
    args = SFTConfig(output_dir=str(work), max_steps=d.warm_start_steps, learning_rate=d.warm_start_lr,
                     per_device_train_batch_size=micro, gradient_accumulation_steps=batch // micro,
                     max_length=cfg.max_model_len, logging_steps=1,
                     save_strategy="no", report_to=[], bf16=False, gradient_checkpointing=False,
                     use_cpu=not torch.cuda.is_available(), seed=cfg.director_grpo.seed, dataloader_num_workers=0,
                     disable_tqdm=True, train_sampling_strategy="sequential" if grouped else "random")
    trainer = SFTTrainer(model=AutoModelForCausalLM.from_pretrained(base_model, dtype=torch.float32), args=args,
                         train_dataset=Dataset.from_list(rows),
                         processing_class=AutoTokenizer.from_pretrained(base_model), peft_config=peft_lora(cfg.lora),
                         callbacks=[trainer_progress("director warm start")])
    trainer.remove_callback(PrinterCallback)  # the progress lines carry the loss
    result = trainer.train()
    trainer.model.save_pretrained(str(out_dir))
    shutil.rmtree(work, ignore_errors=True)
    losses = [e["loss"] for e in trainer.state.log_history if isinstance(e.get("loss"), (int, float))]
    return {"rows": n_rows, "steps": trainer.state.global_step, "train_loss": float(result.training_loss),
            "loss_first": losses[0] if losses else None, "loss_last": losses[-1] if losses else None}
