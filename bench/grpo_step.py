"""Per-step time of our ``persona_grpo`` stage vs a bare TRL ``GRPOTrainer``.

Same tiny policy, same tiny reward model, same prompt rows (real persona prompts) and the same GRPO config, measured
side by side in one run: the repetitions alternate (ours, bare, bare, ours, ...). "Ours" is
:func:`mascot_training.persona.persona_grpo.train_persona` with :func:`make_reward_func` (RM input built by
``formatting.reward_text``, EOS, timeout thread, failure metric, finite guard). "Bare" is ``GRPOTrainer`` given the RM
directory as a reward model plus the plain format reward (``reward_weights`` = [w_rm, w_fmt]). Each step is timed
from ``on_step_begin`` to ``on_step_end``; the first step of every run is a warm-up and is left out.

    python bench/grpo_step.py [--size small|full] [--steps N] [--reps N] [--model DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "services"), str(ROOT / "training-jobs")]

SIZES = {  # num_generations, batch (completions per step), completion tokens, steps, repetitions per path
    "small": dict(num_generations=4, batch_size=8, max_completion_length=16, steps=6, reps=3),
    "full": dict(num_generations=8, batch_size=16, max_completion_length=64, steps=10, reps=3),
}
MESSAGES = ["I failed my driving test again and I feel stupid.", "My best friend is moving to another country.",
            "I finally finished my thesis!", "I can't stop worrying about my mother's health."]


@contextlib.contextmanager
def quiet_stdout():
    """Silence file descriptor 1 (the BPE trainer's progress lines, the trainers' per-step log dicts)."""
    sys.stdout.flush()
    saved, null = os.dup(1), os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)
    try:
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)
        os.close(null)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", choices=sorted(SIZES), default="small")
    ap.add_argument("--steps", type=int, default=0, help="optimiser steps per run (default: by size)")
    ap.add_argument("--reps", type=int, default=0, help="runs per path (default: by size)")
    ap.add_argument("--model", default="", help="policy model dir (default: build the tiny Qwen3)")
    args = ap.parse_args()
    size = SIZES[args.size]
    steps, reps = args.steps or size["steps"], args.reps or size["reps"]

    import warnings

    warnings.filterwarnings("ignore")
    from transformers import AutoModelForCausalLM, TrainerCallback
    from transformers.utils import logging as hf_logging
    from trl import GRPOTrainer

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    from datasets import Dataset

    from mascot.core.dialogue import HistoryTurn
    from mascot.core.engine.tiny import build_tiny_qwen3
    from mascot.core.metrics import Metrics
    from mascot.core.personas import PersonaCatalog
    from mascot.reward.scorer import RewardScorer, build_tiny_reward_model
    from mascot_training.common.config import LoraConfig
    from mascot_training.common.lora import peft_lora
    from mascot_training.common.rewards import format_reward
    from mascot_training.persona.config import GrpoConfig
    from mascot_training.persona.persona_grpo import (completion_text, grpo_args, make_reward_func, prompt_row,
                                                      train_persona)

    tmp = Path(tempfile.mkdtemp(prefix="mascot-grpo-bench-"))
    with quiet_stdout():
        model = args.model or str(build_tiny_qwen3(tmp / "policy"))
        rm_dir = build_tiny_reward_model(tmp / "rm")
    catalog = PersonaCatalog.load()
    card = catalog.get("anchor")
    names = {c.id: c.name for c in catalog.in_set("support")}
    rows = [prompt_row(card, [HistoryTurn("user", m)], [], names) for m in MESSAGES] * 64
    g = GrpoConfig(num_generations=size["num_generations"], batch_size=size["batch_size"],
                   max_completion_length=size["max_completion_length"], max_steps=steps)
    lora = LoraConfig()
    scorer = RewardScorer(rm_dir)

    class StepTimer(TrainerCallback):
        def __init__(self) -> None:
            self.times: list[float] = []

        def on_step_begin(self, args, state, control, **kw):
            self.t0 = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            self.times.append(time.perf_counter() - self.t0)

    def fmt(prompts, completions, **_):
        return [format_reward(completion_text(c), l_max=g.format.l_max, lam=g.format.lam) for c in completions]

    def ours() -> list[float]:
        timer = StepTimer()
        reward = make_reward_func(scorer, catalog, g, Metrics())
        train_persona(model, rows, reward, g, lora, tmp / "ours", callbacks=[timer])
        return timer.times[1:]

    def bare() -> list[float]:
        timer = StepTimer()
        a = grpo_args(g, tmp / "bare")
        a.reward_weights = [g.w_rm, g.w_format]
        trainer = GRPOTrainer(model=AutoModelForCausalLM.from_pretrained(model), reward_funcs=[str(rm_dir), fmt],
                              args=a, train_dataset=Dataset.from_list(rows), peft_config=peft_lora(lora),
                              callbacks=[timer])
        trainer.train()
        return timer.times[1:]

    o_times, b_times = [], []
    for k in range(reps):
        for name in (("ours", "bare") if k % 2 == 0 else ("bare", "ours")):
            with quiet_stdout():
                (o_times if name == "ours" else b_times).extend(ours() if name == "ours" else bare())
    shutil.rmtree(tmp, ignore_errors=True)
    o, b = statistics.median(o_times), statistics.median(b_times)
    ratio = o / b
    print(f"size {args.size}: {steps} steps x {reps} runs per path, {g.batch_size} completions x "
          f"{g.max_completion_length} tokens per step, G = {g.num_generations}")
    print(f"seconds per step (median): ours {o:.3f}, bare TRL {b:.3f}")
    print(f"ratio ours / bare TRL = {ratio:.3f} (goal <= 1.10): {'goal met' if ratio <= 1.10 else 'goal missed'}")


if __name__ == "__main__":
    main()
