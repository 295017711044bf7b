"""Run phase 1 locally or in a Kubernetes Job: the whole chain or one stage (``mascot train``).

Chain: [sft_data → sft] → sample → judge → pairs → persona_rm → persona_grpo → publish (:data:`STAGE_MODULES` names the
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
from mascot_training.persona.sft import adapter_dirs

#: The module under ``mascot_training`` that runs each stage (its ``run``), in chain order.
STAGE_MODULES = {
    "sft_data": "persona.sft_data",
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


def sft_adapter_names(dirs: dict[str, Path] | None) -> dict[str, str] | None:
    """The engine's adapter name of each persona's SFT adapter (``dirs`` from
    :func:`mascot_training.persona.sft.adapter_dirs`): ``sft`` when one adapter is shared, ``sft-<persona>`` when each
    persona has its own; None without SFT."""
    if dirs is None:
        return None
    shared = len(set(dirs.values())) == 1
    return {p: "sft" if shared else f"sft-{p}" for p in dirs}


async def _engine(cfg: PersonaAlignmentConfig, base: str, sft_dirs: dict[str, Path] | None) -> Any:
    from mascot.core.engine.transformers import TransformersEngine

    eng = TransformersEngine(base, max_model_len=cfg.max_model_len, batch_wait_ms=2)
    await eng.start()
    names = sft_adapter_names(sft_dirs) or {}
    for pid, name in names.items():
        if name not in eng.adapters():
            await eng.load_adapter(name, str(sft_dirs[pid]))
    return eng


def grpo_prompts(cfg: PersonaAlignmentConfig, out: Path, engine: Any) -> dict[str, list[dict]]:
    """GRPO prompt rows per persona from the sampled groups, in serving's prompt mix (``persona_grpo``'s
    ``fallback_share`` and ``mid_dialogue_share``): each group's directive is the fallback one or an Action and Tone
    of the director's vocabulary (:func:`mascot_training.persona.sft_data.choose_directive`), and in a share of the
    situations the persona answers after another persona's sampled candidate, as the second agent. A row keeps its
    group's id, so the held-out split is unchanged."""
    from mascot.core.dialogue import history_from_dicts
    from mascot.core.personas import PersonaCatalog
    from mascot_training.persona.sample_candidates import group_prompt
    from mascot_training.persona.sft_data import _unit, choose_directive

    g_cfg = cfg.persona_grpo
    catalog = PersonaCatalog.load()
    roster = [catalog.get(p) for p in active_personas(cfg)]
    rows: dict[str, list[dict]] = {p: [] for p in active_personas(cfg)}
    groups = read_jsonl(out / "sample" / "candidates.jsonl")
    by_sit: dict[str, list[dict]] = {}
    for g in groups:
        by_sit.setdefault(g["situation_id"], []).append(g)
    for g in groups:
        card = catalog.get(g["persona_id"])
        action, tone = choose_directive(card, g["group_id"], g_cfg.fallback_share)
        hist = list(g["history"])
        if _unit(g["situation_id"], "grpo-mid") < g_cfg.mid_dialogue_share:
            others = [(o["persona_id"], c) for o in by_sit[g["situation_id"]] if o["persona_id"] != g["persona_id"]
                      for c in o["candidates"][:1] if c]
            if others:
                pid, text = others[int(_unit(g["group_id"], "grpo-prev") * len(others))]
                hist.append({"role": "agent", "text": text, "persona_id": pid})
        history = history_from_dicts(hist)
        msgs = group_prompt(engine, card, roster, history, [tuple(c) for c in g["context"]],
                            g_cfg.max_completion_length, action, tone)
        rows[g["persona_id"]].append({"prompt": msgs, "persona_id": g["persona_id"], "group_id": g["group_id"],
                                      "history": [{"role": h["role"], "text": h["text"],
                                                   "persona_id": h.get("persona_id") or ""} for h in hist],
                                      "context": g["context"], "action": action, "tone": tone})
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
            engine = await _engine(cfg, base, adapter_dirs(out, active_personas(cfg)))
        return engine

    def nonlocal_reset() -> None:
        """After SFT the engine must be rebuilt with the new adapter (the next get_engine loads it)."""
        nonlocal engine
        if engine is not None:
            pending.append(engine)
            engine = None

    pending: list[Any] = []

    async def main() -> None:
        try:
            for stage in STAGES:
                if stage not in stages:
                    continue
                before = (read_manifest(out / stage) or {}).get("timings")
                log(stage_started(stage))
                mod = importlib.import_module(f"mascot_training.{STAGE_MODULES[stage]}")
                if stage == "sft_data":  # sampled from the base model, before any adapter exists
                    results[stage] = await mod.run(cfg, out, engine=await get_engine()) if cfg.sft_data.enabled \
                        else None
                elif stage == "sft":
                    results[stage] = await asyncio.to_thread(mod.run, cfg, out, base_model=base)
                    nonlocal_reset()
                elif stage == "sample":
                    eng = await get_engine()
                    names = sft_adapter_names(adapter_dirs(out, active_personas(cfg))) if cfg.sft.enabled else None
                    results[stage] = await mod.run(cfg, out, engine=eng, sft_adapter=names)
                elif stage == "judge":  # a remote JudgeService (judge.target) needs no local model
                    results[stage] = await mod.run(cfg, out, engine=None if cfg.judge.target else await get_engine())
                elif stage == "pairs":
                    results[stage] = mod.run(cfg, out)
                elif stage == "persona_rm":
                    results[stage] = await asyncio.to_thread(mod.run, cfg, out, base_model=base)
                elif stage == "persona_grpo" and not cfg.persona_grpo.enabled:
                    results[stage] = None
                elif stage == "persona_grpo":
                    prompts = grpo_prompts(cfg, out, await get_engine())
                    rm_m = read_manifest(out / "persona_rm") or {}
                    rm_dir = str(out / "persona_rm" / "model") if rm_m.get("rm_used_by_grpo", True) else None
                    sft_dirs = adapter_dirs(out, active_personas(cfg)) if cfg.sft.enabled else None
                    results[stage] = await asyncio.to_thread(
                        mod.run, cfg, out, base_model=base, rm_dir=rm_dir,
                        personas=active_personas(cfg), prompts=prompts,
                        init_adapter={p: str(d) for p, d in sft_dirs.items()} if sft_dirs else None)
                elif stage == "publish":
                    if cfg.persona_grpo.enabled:
                        adapters = {p: out / "persona_grpo" / p for p in active_personas(cfg)}
                        sources = ("sft_data", "sft", "sample", "pairs")
                    else:  # the SFT policy is every persona's adapter
                        adapters = adapter_dirs(out, active_personas(cfg))
                        if adapters is None:
                            raise ValueError("persona_grpo is off and the sft stage has not run: nothing to publish; "
                                             "enable sft (the SFT policy is then every persona's adapter)")
                        sources = ("sft_data", "sft")
                    ids = sorted(set().union(*[set((read_manifest(out / s) or {}).get("data_ids", []))
                                               for s in sources]))
                    results[stage] = await asyncio.to_thread(mod.run, cfg, out, base_model=base,
                                                             adapters=adapters, data_ids=ids)
                while pending:
                    await pending.pop().close()
                log(stage_finished(stage, before, results.get(stage)))
                log(after_stage(stage))  # otherwise glibc's arenas keep what a trainer freed
        finally:
            if engine is not None:
                await engine.close()

    with reporting(log):
        asyncio.run(main())
    return results
