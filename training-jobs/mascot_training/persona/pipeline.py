"""Run phase 1 locally or in a Kubernetes Job: the whole chain or one stage (``mascot train``).

Chain: [sft] → sample → judge → pairs → persona_rm → persona_grpo → publish (:data:`STAGE_MODULES` names the
module of each). Each stage skips itself when its manifest matches (resume); the same image and command run as a
Job.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, Callable

from mascot.core.files import read_jsonl
from mascot_training.common.config import active_personas
from mascot_training.common.manifest import read_manifest
from mascot_training.common.memory import after_stage
from mascot_training.common.progress import reporting, stage_finished, stage_started
from mascot_training.persona.config import STAGES, PersonaAlignmentConfig

#: The module under ``mascot_training`` that runs each stage (its ``run``), in chain order.
STAGE_MODULES = {
    "sft": "persona.sft",
    "sample": "persona.sample_candidates",
    "judge": "persona.score_candidates",
    "pairs": "persona.pairs",
    "persona_rm": "persona.persona_rm",
    "persona_grpo": "persona.persona_grpo",
    "publish": "persona.publish_personas",
}


def base_model_of(cfg: PersonaAlignmentConfig) -> str:
    """The speaker base model directory: ``cfg.model`` resolved (empty = the default real model, ``tiny`` = the tiny
    random Qwen3 built on first use)."""
    from mascot.core.engine import resolve_model

    return resolve_model(cfg.model, cfg.tiny_dir)


async def _engine(cfg: PersonaAlignmentConfig, base: str, sft_dir: Path | None) -> Any:
    from mascot.core.engine.transformers import TransformersEngine

    eng = TransformersEngine(base, max_model_len=cfg.max_model_len, batch_wait_ms=2)
    await eng.start()
    if sft_dir is not None:
        await eng.load_adapter("sft", str(sft_dir))
    return eng


def grpo_prompts(cfg: PersonaAlignmentConfig, out: Path, engine: Any) -> dict[str, list[dict]]:
    """GRPO prompt rows per persona from the sampled groups (same serving prompt as the candidates)."""
    from mascot.core.dialogue import history_from_dicts
    from mascot.core.personas import PersonaCatalog
    from mascot_training.persona.sample_candidates import group_prompt

    catalog = PersonaCatalog.load()
    roster = [catalog.get(p) for p in active_personas(cfg)]
    rows: dict[str, list[dict]] = {p: [] for p in active_personas(cfg)}
    for g in read_jsonl(out / "sample" / "candidates.jsonl"):
        history = history_from_dicts(g["history"])
        msgs = group_prompt(engine, catalog.get(g["persona_id"]), roster, history, [tuple(c) for c in g["context"]],
                            cfg.persona_grpo.max_completion_length)
        rows[g["persona_id"]].append({"prompt": msgs, "persona_id": g["persona_id"], "group_id": g["group_id"],
                                      "history": [{"role": h["role"], "text": h["text"],
                                                   "persona_id": h["persona_id"] or ""} for h in g["history"]],
                                      "context": g["context"]})
    return rows


def run(cfg: PersonaAlignmentConfig, out: str | Path, stages: tuple[str, ...] = STAGES,
        log: Callable[[str], None] = print) -> dict[str, dict | None]:
    """Run ``stages`` in chain order; returns each stage's manifest (None for a disabled sft).

    Raises:
        ValueError: a stage cannot run (missing inputs, no qualifying pairs, ...); earlier stages' artefacts stay.
    """
    import importlib

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    base = base_model_of(cfg)
    results: dict[str, dict | None] = {}
    engine = None

    async def get_engine() -> Any:
        nonlocal engine
        if engine is None:
            sft_m = read_manifest(out / "sft")
            engine = await _engine(cfg, base, out / "sft" / "adapter" if sft_m else None)
        return engine

    async def main() -> None:
        try:
            for stage in STAGES:
                if stage not in stages:
                    continue
                before = (read_manifest(out / stage) or {}).get("timings")
                log(stage_started(stage))
                mod = importlib.import_module(f"mascot_training.{STAGE_MODULES[stage]}")
                if stage == "sft":
                    results[stage] = await asyncio.to_thread(mod.run, cfg, out, base_model=base)
                elif stage == "sample":
                    eng = await get_engine()
                    sft_on = read_manifest(out / "sft") is not None and cfg.sft.enabled
                    results[stage] = await mod.run(cfg, out, engine=eng, sft_adapter="sft" if sft_on else None)
                elif stage == "judge":  # a remote JudgeService (judge.target) needs no local model
                    results[stage] = await mod.run(cfg, out, engine=None if cfg.judge.target else await get_engine())
                elif stage == "pairs":
                    results[stage] = mod.run(cfg, out)
                elif stage == "persona_rm":
                    results[stage] = await asyncio.to_thread(mod.run, cfg, out, base_model=base)
                elif stage == "persona_grpo":
                    prompts = grpo_prompts(cfg, out, await get_engine())
                    results[stage] = await asyncio.to_thread(
                        mod.run, cfg, out, base_model=base, rm_dir=str(out / "persona_rm" / "model"),
                        personas=active_personas(cfg), prompts=prompts,
                        init_adapter=str(out / "sft" / "adapter") if cfg.sft.enabled and read_manifest(out / "sft")
                        else None)
                elif stage == "publish":
                    adapters = {p: out / "persona_grpo" / p for p in active_personas(cfg)}
                    ids = sorted(set().union(*[set((read_manifest(out / s) or {}).get("data_ids", []))
                                               for s in ("sample", "pairs")]))
                    results[stage] = await asyncio.to_thread(mod.run, cfg, out, base_model=base,
                                                             adapters=adapters, data_ids=ids)
                log(stage_finished(stage, before, results.get(stage)))
                log(after_stage(stage))  # otherwise glibc's arenas keep what a trainer freed
        finally:
            if engine is not None:
                await engine.close()

    with reporting(log):
        asyncio.run(main())
    return results
