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


def resolve_model(model: str, tiny_dir: str | Path) -> str:
    """Return what to load: ``model`` if given, else the tiny random Qwen3 at ``tiny_dir`` (built on first use)."""
    if model:
        return model
    tiny = Path(tiny_dir)
    if not (tiny / "config.json").is_file() or not (tiny / "tokenizer.json").is_file():
        from mascot.core.engine.tiny import build_tiny_qwen3

        tmp = tiny.with_name(tiny.name + ".tmp")
        build_tiny_qwen3(tmp)
        tmp.replace(tiny) if not tiny.exists() else None
    return str(tiny)


def build_engine(cfg: Any, metrics: Any = None, component: str = "engine") -> Engine:
    """Build the engine named by ``cfg.kind`` from an :class:`~mascot.core.config.EngineConfig`.

    Raises:
        ValueError: an unknown engine kind.
    """
    if cfg.kind == "transformers":
        from mascot.core.engine.transformers import TransformersEngine

        return TransformersEngine(resolve_model(cfg.model, cfg.tiny_dir), dtype=cfg.dtype,
                                  max_model_len=cfg.max_model_len, max_batch_size=cfg.max_batch_size,
                                  batch_wait_ms=cfg.batch_wait_ms, adapters=cfg.adapters, metrics=metrics,
                                  component=component, threads=cfg.threads)
    if cfg.kind == "vllm":
        from mascot.core.engine.vllm import VllmEngine

        return VllmEngine(resolve_model(cfg.model, cfg.tiny_dir), dtype=cfg.dtype, max_model_len=cfg.max_model_len,
                          max_batch_size=cfg.max_batch_size, adapters=cfg.adapters, max_loras=cfg.max_loras,
                          max_lora_rank=cfg.max_lora_rank, gpu_memory_utilization=cfg.gpu_memory_utilization,
                          enforce_eager=cfg.enforce_eager, prefix_caching=cfg.prefix_caching,
                          block_size=cfg.block_size, metrics=metrics,
                          component=component)
    raise ValueError(f"unknown engine kind {cfg.kind!r}; known: transformers, vllm")
