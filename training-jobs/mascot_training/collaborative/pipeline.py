"""Run phase 2 locally or in a Kubernetes Job: ``speakers → rollouts → group_rm → director_grpo → publish``
(``mascot train collaborative``; the stages' modules: :mod:`.speakers`, :mod:`.rollouts`, :mod:`.group_rm`,
:mod:`.director_grpo`, :mod:`.publish_director`).

Each stage skips itself when its manifest matches (resume). One engine (base model + the frozen persona adapters,
plus the starting director adapter for the serving director) serves the speakers, the simulated user and the local
judge from a background event loop; the director under training generates from the trainer's own model.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Callable

from mascot_training.collaborative.config import STAGES, CollaborativeConfig
from mascot_training.common import manifest as mf
from mascot_training.common.config import active_personas
from mascot_training.common.memory import after_stage
from mascot_training.common.progress import reporting, stage_finished, stage_started

log = logging.getLogger(__name__)
#: Engine name of the starting director adapter (serving director of prefixes and blocks).
DIRECTOR_INIT = "director-init"


def run(cfg: CollaborativeConfig, out: str | Path, stages: tuple[str, ...] = STAGES,
        log_fn: Callable[[str], None] = print, metrics: Any = None) -> dict[str, dict | None]:
    """Run ``stages`` in chain order; returns each stage's manifest.

    Raises:
        ValueError: a stage cannot run (missing inputs, no qualifying pairs, ...); earlier artefacts stay.
    """
    with reporting(log_fn):
        return _run(cfg, Path(out), stages, log_fn, metrics)


def _run(cfg: CollaborativeConfig, out: Path, stages: tuple[str, ...], log_fn: Callable[[str], None],
         metrics: Any) -> dict[str, dict | None]:
    from transformers import AutoTokenizer

    from mascot.core.engine import resolve_model
    from mascot.core.engine.transformers import TransformersEngine
    from mascot.core.personas import PersonaCatalog
    from mascot_training.collaborative import director_grpo, group_rm, publish_director, rollouts, speakers
    from mascot_training.collaborative.simulate import RolloutRunner

    out.mkdir(parents=True, exist_ok=True)
    base = resolve_model(cfg.model, cfg.tiny_dir)
    results: dict[str, dict | None] = {}

    def report(stage: str, before: Any) -> None:
        log_fn(stage_finished(stage, before, results.get(stage)))
        log_fn(after_stage(stage))  # group_rm trains in the engine loop's thread, GRPO in this one: separate arenas

    def timings(stage: str) -> Any:
        return (mf.read_manifest(out / stage) or {}).get("timings")

    before = timings("speakers")
    log_fn(stage_started("speakers"))
    results["speakers"] = speakers.run(cfg, out, base_model=base)  # every later stage needs the adapters
    report("speakers", before)
    rest = [s for s in STAGES[1:] if s in stages]
    if not rest:
        return results
    loop = director_grpo.LoopThread()
    engine = TransformersEngine(base, max_model_len=cfg.max_model_len, batch_wait_ms=2)
    try:
        loop.call(engine.start())
        adapters = {}
        for pid, a in results["speakers"]["adapters"].items():
            if a["source"] == "base":  # speakers.missing: base - no adapter, the base model speaks
                continue
            loop.call(engine.load_adapter(pid, a["path"]))
            adapters[pid] = pid
        init = cfg.director.init_adapter or None
        if init:
            loop.call(engine.load_adapter(DIRECTOR_INIT, init))
        tokenizer = AutoTokenizer.from_pretrained(base)
        catalog = PersonaCatalog.load()
        roster = [catalog.get(p) for p in active_personas(cfg)]
        runner = RolloutRunner(engine, tokenizer, roster, rollouts.settings(cfg), adapters)
        inputs = {"base_model": mf.digest_path(base) or f"hub:{base}",
                  "speakers": mf.digest_obj({p: a["digest"] for p, a in results["speakers"]["adapters"].items()}),
                  "director_init": mf.digest_path(init) if init else ""}
        for stage in rest:
            before = timings(stage)
            log_fn(stage_started(stage))
            if stage == "rollouts":
                results[stage] = loop.call(rollouts.run(cfg, out, engine=engine, tokenizer=tokenizer,
                                                        adapters=adapters, director_adapter=DIRECTOR_INIT if init
                                                        else None, inputs=inputs))
            elif stage == "group_rm":
                results[stage] = loop.call(group_rm.run(cfg, out, engine=engine, base_model=base))
            elif stage == "director_grpo":
                if not (out / "rollouts" / "prefixes.jsonl").is_file():
                    raise ValueError(f"{out / 'rollouts' / 'prefixes.jsonl'} is missing: run the rollouts stage first")
                fn = _group_reward_fn(cfg, out, engine, roster, loop)
                results[stage] = director_grpo.run(cfg, out, base_model=base, runner=runner, loop=loop,
                                                   group_reward_fn=fn, inputs=inputs | _reward_inputs(cfg, out),
                                                   metrics=metrics)
            elif stage == "publish":
                results[stage] = publish_director.run(cfg, out, base_model=base)
            report(stage, before)
    finally:
        try:
            loop.call(engine.close(), timeout=30)
        finally:
            loop.close()
    return results


def _reward_inputs(cfg: CollaborativeConfig, out: Path) -> dict[str, str]:
    gr = cfg.phase2.group_reward
    if gr.source == "rm":
        return {"group_rm": mf.digest_path(out / "group_rm" / "model")}
    if gr.source == "team":
        from mascot.core.embedding import SentenceEncoder

        return {"group_reward": "team:" + mf.digest_obj({"team": gr.team.model_dump(mode="json"),
                                                         "encoder": SentenceEncoder.model_name})}
    return {"group_reward": "judge:" + mf.digest_obj(gr.judge.model_dump(mode="json"))}


def _group_reward_fn(cfg: CollaborativeConfig, out: Path, engine: Any, roster: list, loop: Any) -> Any:
    from mascot_training.collaborative import director_grpo

    gr = cfg.phase2.group_reward
    if gr.source == "team":  # no model trained: card moves and the bundled MiniLM, on the CPU (a few texts a step)
        from mascot.core.embedding import SentenceEncoder

        t = gr.team
        return director_grpo.team_group_reward(roster, SentenceEncoder(device="cpu").embed, w_moves=t.w_moves,
                                               w_relevance=t.w_relevance, w_redundancy=t.w_redundancy,
                                               redundancy_floor=t.redundancy_floor)
    if gr.source == "rm":
        from mascot.reward.scorer import RewardScorer

        model = out / "group_rm" / "model"
        if not (model / "config.json").is_file():
            raise ValueError(f"{model} is missing: run the group_rm stage first")
        return director_grpo.rm_group_reward(RewardScorer(model, max_length=gr.rm.max_length,
                                                          batch_size=gr.rm.batch_size), roster)
    from mascot_training.collaborative.group_rm import judge_specs
    from mascot_training.common.judges import build_stage_judges

    judges = build_stage_judges(judge_specs(cfg), engine, f"sqlite:///{(out / '.director-judge-cache.db').resolve()}")
    return director_grpo.judge_group_reward_fn(judges, roster, loop, cfg.director_grpo.reward_timeout_s)
