"""Optional warm start of the director LoRA before GRPO (``director.warm_start_steps``; our addition).

Behaviour cloning of the serving director: every decision the rollouts stage recorded (prefix turns and the group
RM's blocks; the constrained serving director, with retries and fallback) becomes an SFT row whose prompt is the
serving director chat before that turn and whose completion is the directive as the director's chat shows it. A
small director that rarely writes a valid directive unconstrained then gives GRPO rollouts to compare.
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


def warm_start(base_model: str, rows: list[dict], cfg: CollaborativeConfig, out_dir: Path) -> dict:
    """Behaviour-clone the serving director into a fresh director LoRA (TRL ``SFTTrainer``, ``cfg.lora``) and save it
    to ``out_dir``. Returns ``{"rows", "steps", "train_loss", "loss_first", "loss_last"}`` (the first and last logged
    step losses).

    Each step updates on up to 8 rows, passed :data:`WARM_START_MICRO_BATCH` at a time (gradient accumulation): the
    director's chats run to ``max_model_len`` tokens, and 8 of them at 1536 tokens in one pass needed more than 20 GB
    on a CPU.

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
    args = SFTConfig(output_dir=str(work), max_steps=d.warm_start_steps, learning_rate=d.warm_start_lr,
                     per_device_train_batch_size=micro, gradient_accumulation_steps=batch // micro,
                     max_length=cfg.max_model_len, logging_steps=1,
                     save_strategy="no", report_to=[], bf16=False, gradient_checkpointing=False,
                     use_cpu=not torch.cuda.is_available(), seed=cfg.director_grpo.seed, dataloader_num_workers=0,
                     disable_tqdm=True)
    trainer = SFTTrainer(model=AutoModelForCausalLM.from_pretrained(base_model, dtype=torch.float32), args=args,
                         train_dataset=Dataset.from_list(rows),
                         processing_class=AutoTokenizer.from_pretrained(base_model), peft_config=peft_lora(cfg.lora),
                         callbacks=[trainer_progress("director warm start")])
    trainer.remove_callback(PrinterCallback)  # the progress lines carry the loss
    result = trainer.train()
    trainer.model.save_pretrained(str(out_dir))
    shutil.rmtree(work, ignore_errors=True)
    losses = [e["loss"] for e in trainer.state.log_history if isinstance(e.get("loss"), (int, float))]
    return {"rows": len(rows), "steps": trainer.state.global_step, "train_loss": float(result.training_loss),
            "loss_first": losses[0] if losses else None, "loss_last": losses[-1] if losses else None}
