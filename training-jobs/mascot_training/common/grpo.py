"""TRL GRPO plumbing both phases use: the generation-backend fields of ``GRPOConfig``, the vLLM-needs-CUDA check,
the finite-loss guard and a reward call with a deadline.

Phase 1 (:mod:`mascot_training.persona.persona_grpo`) and phase 2 (:mod:`mascot_training.collaborative.director_grpo`)
build their own ``GRPOConfig`` and reward functions from these.
"""

from __future__ import annotations

import math
import threading
from typing import Any, Callable, Sequence

from mascot_training.common.config import ConfigError, GenerationConfig, generation_problems


def call_with_timeout(fn: Callable[[Sequence[Any]], Sequence[Any]], arg: Sequence[Any],
                      timeout_s: float) -> list | None:
    """``list(fn(arg))`` in a daemon thread (a hung reward model never blocks exit); None after ``timeout_s`` seconds.

    Raises:
        Whatever ``fn`` raised, re-raised in the caller's thread.
    """
    box: dict = {}

    def target() -> None:
        try:
            box["v"] = list(fn(arg))
        except BaseException as e:  # noqa: BLE001 - re-raised in the caller's thread
            box["e"] = e

    t = threading.Thread(target=target, daemon=True, name="reward-model")
    t.start()
    t.join(timeout_s)
    if t.is_alive():
        return None
    if "e" in box:
        raise box["e"]
    return box["v"]


def trl_generation_args(gen: GenerationConfig, max_model_len: int | None = None,
                        importance_sampling: bool = True) -> dict:
    """The TRL 1.16 ``GRPOConfig`` fields of ``gen``: ``{"use_vllm": False}`` for ``transformers``; for ``vllm``
    ``use_vllm``, ``vllm_mode`` and that mode's fields (colocate: ``vllm_gpu_memory_utilization``,
    ``vllm_tensor_parallel_size``, ``vllm_max_model_length`` = ``max_model_len`` when given; server:
    ``vllm_server_base_url`` or ``vllm_server_host`` + ``vllm_server_port``, ``vllm_server_timeout``), and
    ``vllm_importance_sampling_correction: False`` when ``importance_sampling`` is off (rollouts that return no
    sampling log-probabilities)."""
    if gen.backend != "vllm":
        return {"use_vllm": False}
    out: dict = {"use_vllm": True, "vllm_mode": gen.vllm_mode}
    if gen.vllm_mode == "colocate":
        out |= {"vllm_gpu_memory_utilization": gen.vllm_gpu_memory_utilization,
                "vllm_tensor_parallel_size": gen.vllm_tensor_parallel_size}
        if max_model_len:
            out["vllm_max_model_length"] = max_model_len
    else:
        out |= ({"vllm_server_base_url": gen.vllm_server_base_url} if gen.vllm_server_base_url else
                {"vllm_server_host": gen.vllm_server_host, "vllm_server_port": gen.vllm_server_port})
        out["vllm_server_timeout"] = gen.vllm_server_timeout_s
    if not importance_sampling:
        out["vllm_importance_sampling_correction"] = False
    return out


def check_generation(section: str, gen: GenerationConfig) -> None:
    """Refuse a generation backend this machine cannot run, before any model is loaded.

    Raises:
        ConfigError: ``backend: vllm`` without a CUDA GPU (:func:`mascot_training.common.config.generation_problems`).
    """
    problems = generation_problems(section, gen)
    if problems:
        raise ConfigError("; ".join(problems))


def finite_guard() -> Any:
    """A ``transformers.TrainerCallback`` that fails the run loudly on a non-finite loss, or non-finite trainable
    weights at the end of training (RuntimeError)."""
    from transformers import TrainerCallback

    class _FiniteGuard(TrainerCallback):
        """Fail loudly on a non-finite loss, or non-finite trainable weights at the end of training."""

        def on_log(self, args, state, control, logs=None, **kw):
            loss = (logs or {}).get("loss")
            if loss is not None and not math.isfinite(loss):
                raise RuntimeError(f"GRPO loss is {loss} at step {state.global_step}: a NaN advantage or reward "
                                   "reached the update")

        def on_train_end(self, args, state, control, model=None, **kw):
            bad = [n for n, p in model.named_parameters() if p.requires_grad and not p.isfinite().all()]
            if bad:
                raise RuntimeError(f"non-finite LoRA weights after GRPO: {bad[:3]}")

    return _FiniteGuard()
