"""Engines behind one interface (:class:`~mascot.core.engine.base.Engine`); :func:`build_engine` picks one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mascot.core.engine.base import (  # noqa: F401  (re-exported)
    BASE_ADAPTER,
    Engine,
    GenerationRequest,
    GenerationResult,
    PromptTooLong,
    SamplingParams,
    StreamDelta,
    StructuredOutput,
    UnknownAdapter,
    regex_escape,
)


def resolve_model(model: str, tiny_dir: str | Path, cache_dir: str | Path = ".cache/models") -> str:
    """Return what to load for a model setting: empty = the default real model (SmolLM2-135M-Instruct, converted on
    first use, :mod:`mascot.core.engine.default_model`), ``tiny`` = the tiny random Qwen3 at ``tiny_dir`` (built on
    first use), anything else as given (a model directory or a Hugging Face id).

    Raises:
        DefaultModelError: the default model is needed and cannot be prepared (the message says what to run).
    """
    from mascot.core.engine.default_model import resolve_model_name

    return resolve_model_name(model, tiny_dir, cache_dir)


def native_bfloat16() -> bool:
    """Whether this machine computes bfloat16 natively: a CUDA device, or a CPU with AVX512-BF16 or AMX tiles
    (``torch.cpu._is_avx512_bf16_supported`` / ``_is_amx_tile_supported``). Without them torch converts bfloat16 on
    every matrix product, and on an AVX2-only CPU a 460-token prefill of the default model takes about 5x longer in
    bfloat16 than in float32 (measured: 10.7 s against 2.2 s on two cores)."""
    import torch

    if torch.cuda.is_available():
        return True
    try:
        return bool(torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())
    except AttributeError:  # an older torch without the probes: assume the slow path
        return False


def auto_dtype(model: str) -> str:
    """The weights dtype ``engine.dtype: auto`` means: bfloat16 for the default model (``model`` empty) where the
    machine computes it natively (:func:`native_bfloat16`; there the default model decodes about 30% and prefills
    about 2x faster than in float32), float32 otherwise and for every other model (a model directory or storage
    URI sets its own dtype explicitly)."""
    return "bfloat16" if not model and native_bfloat16() else "float32"


def build_engine(cfg: Any, metrics: Any = None, component: str = "engine") -> Engine:
    """Build the engine named by ``cfg.kind`` from an :class:`~mascot.core.config.EngineConfig`.

    Raises:
        ValueError: an unknown engine kind, or ``tensor_parallel_size`` > 1 for the transformers engine (it runs on
            one device).
    """
    dtype = cfg.dtype if cfg.dtype != "auto" else auto_dtype(cfg.model)
    if cfg.kind == "transformers":
        if cfg.tensor_parallel_size > 1:
            raise ValueError(f"engine.tensor_parallel_size {cfg.tensor_parallel_size} needs engine.kind vllm: the "
                             "transformers engine runs on one device")
        from mascot.core.engine.transformers import TransformersEngine

        return TransformersEngine(resolve_model(cfg.model, cfg.tiny_dir, cfg.cache_dir), dtype=dtype,
                                  max_model_len=cfg.max_model_len, max_batch_size=cfg.max_batch_size,
                                  batch_wait_ms=cfg.batch_wait_ms, adapters=cfg.adapters, metrics=metrics,
                                  component=component, threads=cfg.threads,
                                  prefix_cache_tokens=cfg.prefix_cache_tokens, jump_forward=cfg.jump_forward,
                                  device=cfg.device)
    if cfg.kind == "vllm":
        from mascot.core.engine.vllm import VllmEngine

        return VllmEngine(resolve_model(cfg.model, cfg.tiny_dir, cfg.cache_dir), dtype=dtype,
                          max_model_len=cfg.max_model_len, max_batch_size=cfg.max_batch_size, adapters=cfg.adapters,
                          max_loras=cfg.max_loras,
                          max_lora_rank=cfg.max_lora_rank, gpu_memory_utilization=cfg.gpu_memory_utilization,
                          enforce_eager=cfg.enforce_eager, prefix_caching=cfg.prefix_caching,
                          block_size=cfg.block_size, tensor_parallel_size=cfg.tensor_parallel_size,
                          log_stats=cfg.log_stats, metrics=metrics, component=component)
    raise ValueError(f"unknown engine kind {cfg.kind!r}; known: transformers, vllm")
