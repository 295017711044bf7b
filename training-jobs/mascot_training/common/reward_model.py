"""The Bradley–Terry reward-model recipe both phases train with: tokenizer set-up and TRL ``RewardTrainer``.

Phase 1's ``persona_rm`` stage (:mod:`mascot_training.persona.persona_rm`) trains it on persona replies, phase 2's
``group_rm`` stage (:mod:`mascot_training.collaborative.group_rm`) on judged blocks of turns; both then measure μ, σ
of held-out scores for ẑ = (r − μ)/σ, replacing a degenerate σ (at or below :data:`SIGMA_FLOOR`) by 1.0.
"""

from __future__ import annotations

import logging
import math
import shutil
from pathlib import Path
from typing import Any

from mascot_training.common.progress import trainer_progress, write_curves

log = logging.getLogger(__name__)

#: σ at or below this is treated as degenerate and replaced by 1.0 (scores are then only centred).
SIGMA_FLOOR = 1e-6


def load_rm_tokenizer(base: str) -> Any:
    """The reward model's tokenizer (pad token = EOS when it has none).

    Raises:
        ValueError: no pad and no EOS token, or no EOS token (TRL appends it to every plain-text sample).
    """
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(base)
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise ValueError(f"tokenizer of {base} has neither a pad nor an eos token; set pad_token")
        tokenizer.pad_token = tokenizer.eos_token
    if tokenizer.eos_token is None:
        raise ValueError(f"tokenizer of {base} has no eos token; TRL appends it to every plain-text sample")
    return tokenizer


def fit_reward_model(base: str, tokenizer: Any, dataset: Any, rm_cfg: Any, seed: int, model_dir: Path,
                     trainer_dir: Path, label: str = "reward model",
                     curves: Path | None = None) -> tuple[int, float | None]:
    """Bradley–Terry training with TRL ``RewardTrainer`` and save to ``model_dir``.

    Args:
        base: Base of the reward model (a causal-LM or classifier directory / hub id); a 1-label head is added.
        tokenizer: From :func:`load_rm_tokenizer`.
        dataset: ``datasets.Dataset`` with plain-text ``chosen`` / ``rejected`` columns (EOS included).
        rm_cfg: ``epochs``, ``lr``, ``batch_size`` (pairs per update), ``micro_batch_size`` (pairs per pass; 0 =
            ``batch_size``; the rest by gradient accumulation), ``max_length``.
        seed: Seed of the head init and the data order.
        model_dir: Where the model and tokenizer are saved.
        trainer_dir: Scratch directory of the trainer (removed afterwards).
        label: Name on the progress lines (:mod:`mascot_training.common.progress`).
        curves: PNG path for the loss and accuracy curves per step (None: no plot).

    Returns:
        ``(pairs trained on, final training loss or None when not finite)``.
    """
    import torch
    from transformers import AutoModelForSequenceClassification, PrinterCallback, set_seed
    from trl import RewardConfig, RewardTrainer

    for d in (model_dir, trainer_dir):
        shutil.rmtree(d, ignore_errors=True)
    set_seed(seed)  # the classification head is random-initialised at load time
    model = AutoModelForSequenceClassification.from_pretrained(base, num_labels=1, dtype=torch.float32)
    model.config.pad_token_id = tokenizer.pad_token_id
    micro = rm_cfg.micro_batch_size or rm_cfg.batch_size
    args = RewardConfig(output_dir=str(trainer_dir), bf16=False, fp16=False,
                        gradient_checkpointing=rm_cfg.gradient_checkpointing,
                        use_cpu=not torch.cuda.is_available(), num_train_epochs=rm_cfg.epochs,
                        learning_rate=rm_cfg.lr, per_device_train_batch_size=micro,
                        gradient_accumulation_steps=rm_cfg.batch_size // micro,
                        max_length=rm_cfg.max_length, report_to=[], save_strategy="no", logging_steps=1,
                        disable_tqdm=True, seed=seed, data_seed=seed)
    trainer = RewardTrainer(model=model, args=args, train_dataset=dataset, processing_class=tokenizer,
                            callbacks=[trainer_progress(label)])
    trainer.remove_callback(PrinterCallback)  # it print()s the final metrics; they go to the log
    result = trainer.train()
    if curves is not None:
        write_curves(trainer.state.log_history, curves, label)
    log.info("reward model: trained on %d pairs: %s", len(trainer.train_dataset),
             {k: v for k, v in result.metrics.items() if isinstance(v, (int, float))})
    trainer.model.save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    shutil.rmtree(trainer_dir, ignore_errors=True)
    loss = float(result.training_loss)
    return len(trainer.train_dataset), (loss if math.isfinite(loss) else None)
