"""LoRA helpers both phases use: the PEFT config of ``cfg.lora``, saving a trained adapter, and the tiny SFT set
built from persona cards.

Phase 1's ``sft`` and ``persona_grpo`` stages and phase 2's quick speaker adapters, director warm start and
``director_grpo`` all train LoRAs of this one shape (PEFT ``task_type="CAUSAL_LM"``, no full-weight modules), so
every adapter passes the store's serving checks (:func:`mascot.core.adapters.store.check_adapter`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

#: User messages of the smoke set.
STOCK_MESSAGES = (
    "I feel so anxious about my exam tomorrow.",
    "My dog died last week and I miss him so much.",
    "I finally finished the project I was stuck on for months.",
    "Nobody at work listens to my ideas.",
)
SMOKE_ROWS_PER_PERSONA = 3


def peft_lora(lora: Any) -> Any:
    """The PEFT ``LoraConfig`` of a :class:`~mascot_training.common.config.LoraConfig` (``cfg.lora``): task
    CAUSAL_LM, bias none, no full-weight modules (``modules_to_save`` None)."""
    from peft import LoraConfig as PeftLoraConfig

    return PeftLoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout, task_type="CAUSAL_LM",
                          target_modules=list(lora.target_modules), bias="none", modules_to_save=None)


def save_adapter(trainer: Any, out_dir: Path) -> None:
    """Save the trained LoRA of a TRL trainer (adapter only) to ``out_dir``.

    Raises:
        RuntimeError: the adapter would carry full-weight modules or non-LoRA tensors.
    """
    from safetensors import safe_open

    model = trainer.model
    for name, pc in model.peft_config.items():
        if pc.modules_to_save:
            raise RuntimeError(f"adapter {name} has modules_to_save={pc.modules_to_save}: full weights would ship")
    model.save_pretrained(out_dir)
    with safe_open(str(out_dir / "adapter_model.safetensors"), "pt") as f:
        bad = [k for k in f.keys() if "lora_" not in k]
    if bad:
        raise RuntimeError(f"non-LoRA tensors in the saved adapter: {bad[:3]}")


def smoke_rows(persona_ids: list[str], per_persona: int = SMOKE_ROWS_PER_PERSONA) -> list[dict]:
    """A tiny SFT set from the persona cards: system = speaker prompt, a stock user message, a short think + reply.

    Rows are ``{"persona_id", "line", "messages": [system, user, assistant]}`` (the SFT data format of
    :mod:`mascot_training.persona.sft`), ``per_persona`` per persona.
    """
    from mascot.core.personas import PersonaCatalog
    from mascot.speaker.prompts import persona_system_prompt

    catalog = PersonaCatalog.load()
    rows = []
    for pid in persona_ids:
        card = catalog.get(pid)
        system = persona_system_prompt(card)
        for i in range(per_persona):
            user = STOCK_MESSAGES[i % len(STOCK_MESSAGES)]
            reply = (f"<think>{card.name} listens first and answers briefly.</think> "
                     f"I hear you. Tell me a little more about it.")
            rows.append({"persona_id": pid, "line": i + 1,
                         "messages": [{"role": "system", "content": system}, {"role": "user", "content": user},
                                      {"role": "assistant", "content": reply}]})
    return rows
