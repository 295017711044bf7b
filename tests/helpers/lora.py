"""Random PEFT LoRA adapters on a local base model."""

from __future__ import annotations

from pathlib import Path


def make_lora(base: Path, out: Path, r: int = 4, seed: int = 0, scale: float = 1.0, **kw) -> Path:
    """A random (non-zero) LoRA of rank ``r`` on q_proj/v_proj of ``base``, saved to ``out`` (returned); ``scale``
    shrinks its B matrices (a small change of the base's output instead of the degenerate repetition a full-size
    random LoRA causes); ``kw`` goes to ``peft.LoraConfig``."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(base),
                           LoraConfig(r=r, lora_alpha=2 * r, target_modules=["q_proj", "v_proj"],
                                      init_lora_weights=False, **kw))
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.mul_(scale)
    model.save_pretrained(out)
    return out
