"""Dialogue quality on the default real model: what users are shown, measured by fixed detectors.

Runs N self-play conversations over the EmpatheticDialogues test situations at a fixed seed through the embedded
stack (the product's own turn loop, reply checks and director), then measures the delivered transcripts with the
fixed detectors of :mod:`mascot.eval.defects` (independent of the reply-check settings). Prints one line per figure
and a verdict against the targets; ``--json FILE`` writes the figures.

    python bench/dialogue_quality.py --size small|full [--concurrency K] [--json out.json]

Sizes: ``small`` (2 conversations, 4 agent turns, concurrency 2; runs in ``make test``), ``full`` (20 conversations,
6 agent turns, one conversation at a time for the latency-alone figure, then the first 8 again at concurrency 8).
Targets (full size): 0 echoes, 0 loops, 0 near-duplicates delivered; degenerate directives <= 5 % of decisions;
clean endings >= 95 %; early round ends <= 5 %; median reply >= 15 words; no persona above 50 % of turns; agent-turn
latency p50 <= 4 s alone.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mascot.core.situations import Situation

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "services"))
SHARED = Path(os.environ.get("MASCOT_SHARED_DIR", ROOT.parent / "shared"))
SIZES = {"small": {"conversations": 2, "agent_turns": 4, "concurrency": 2, "concurrent_pass": 0},
         "full": {"conversations": 20, "agent_turns": 6, "concurrency": 1, "concurrent_pass": 8}}
TARGETS = {"echoes": ("==", 0), "loops": ("==", 0), "near_duplicates": ("==", 0), "empty": ("==", 0),
           "degenerate_directives": ("<=", 0.05), "clean_endings": (">=", 0.95), "early_round_ends": ("<=", 0.05),
           "median_words": (">=", 15), "max_persona_share": ("<=", 0.5), "turn_latency_p50_alone": ("<=", 4.0)}


async def run_pass(records: list[Situation], agent_turns: int, concurrency: int, model: str, seed: int,
                   guard: bool) -> tuple[list[dict], dict]:
    """One pass through a fresh embedded stack; returns (transcript lines, {wall_s, generated_tokens})."""
    from mascot.core.config import MascotConfig
    from mascot.core.engine import resolve_model
    from mascot.core.engine.default_model import model_identity
    from mascot.app.runjob import run_job
    from mascot.app.stack import start_stack

    tmp = Path(tempfile.mkdtemp(prefix="mascot-quality-"))
    cfg = MascotConfig(engine={"model": model}, server={"gateway_port": 0, "metrics_port": 0},
                       store={"url": f"sqlite:///{tmp}/c.db"}, guard={"enabled": guard},
                       limits={"max_active_rounds": max(16, concurrency),
                               "max_rounds_per_caller": max(16, concurrency)},
                       security={"conversations_per_minute": 0})  # a timed run: never held back
    identity = model_identity(resolve_model(cfg.engine.model, cfg.engine.tiny_dir, cfg.engine.cache_dir))
    stack = await start_stack(cfg)
    try:
        t0 = time.perf_counter()
        await run_job(stack.target("gateway"), records, "support", tmp / "out", agent_turns=agent_turns, seed=seed,
                      concurrency=concurrency, model=identity)
        wall = time.perf_counter() - t0
        tokens = sum(s.value for m in stack.metrics.generated_tokens.collect() for s in m.samples
                     if s.name.endswith("_total"))
    finally:
        await stack.stop(1)
    lines = [json.loads(x) for x in (tmp / "out" / "transcripts.jsonl").read_text().splitlines() if x.strip()]
    return lines, {"wall_s": wall, "generated_tokens": tokens, "model": identity}


def prompts_by_persona() -> tuple[dict, dict]:
    """``({persona_id: [system prompt, card text]}, {persona_id: name})`` of the support set."""
    from mascot.core.personas import PersonaCatalog
    from mascot.eval.defects import echo_sources

    cards = PersonaCatalog.load().in_set("support")
    return echo_sources(cards), {c.id: c.name for c in cards}


def verdict(fig: dict) -> dict:
    """``{name: (value, op, target, ok)}`` for every target."""
    out = {}
    for k, (op, target) in TARGETS.items():
        v = fig[k]
        if v is None:  # not measured at this size
            out[k] = (v, op, target, False)
            continue
        ok = v == target if op == "==" else (v <= target if op == "<=" else v >= target)
        out[k] = (v, op, target, ok)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", choices=sorted(SIZES), default="small")
    ap.add_argument("--model", default="", help="model (default: the default real model; 'tiny' for speed only)")
    ap.add_argument("--concurrency", type=int, default=0, help="override the size's concurrency")
    ap.add_argument("--conversations", type=int, default=0, help="override the size's number of conversations")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-guard", action="store_true", help="switch the reply checks off (guard.enabled false)")
    ap.add_argument("--json", default="", help="write the figures to this file")
    args = ap.parse_args()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    from mascot.eval.defects import analyse
    from mascot.core.situations import load_situations

    size = dict(SIZES[args.size])
    if args.conversations:
        size["conversations"] = args.conversations
    conc = args.concurrency or size["concurrency"]
    path = SHARED / "data" / "empathetic_dialogues" / "test_situations.jsonl"
    records = load_situations(path, "support", size["conversations"], require_labels=False, verbatim=True)
    prompts, names = prompts_by_persona()
    guard = not args.no_guard
    print(f"dialogue_quality: size={args.size} conversations={len(records)} agent_turns={size['agent_turns']} "
          f"concurrency={conc} guard={'on' if guard else 'off'} seed={args.seed}")
    lines, info = asyncio.run(run_pass(records, size["agent_turns"], conc, args.model, args.seed, guard))
    fig = analyse(lines, prompts, names)
    fig["max_persona_share"] = max(fig["persona_shares"].values(), default=0.0)
    fig["turn_latency_p50_alone"] = fig["turn_latency_seconds"]["p50"] if conc == 1 else None
    fig["tokens_per_second"] = round(info["generated_tokens"] / info["wall_s"], 2) if info["wall_s"] else 0.0
    fig["wall_seconds"] = round(info["wall_s"], 1)
    fig["model"] = info["model"]
    fig["concurrency"] = conc
    print(f"model: {info['model']['name']} sha256 {info['model']['digest'][:16]}")
    for k in ("agent_turns", "echoes", "loops", "near_duplicates", "empty", "degenerate_directives", "clean_endings",
              "early_round_ends", "regenerations_per_turn", "median_words", "max_persona_share", "safety_turns",
              "tokens_per_second", "wall_seconds"):
        print(f"  {k}: {fig[k]}")
    print(f"  persona_shares: {json.dumps(fig['persona_shares'])}")
    print(f"  turn_latency_seconds (concurrency {conc}): p50 {fig['turn_latency_seconds']['p50']} "
          f"p95 {fig['turn_latency_seconds']['p95']}")
    print(f"  first_delta_seconds (concurrency {conc}): p50 {fig['first_delta_seconds']['p50']} "
          f"p95 {fig['first_delta_seconds']['p95']}")
    print(f"  user_defects: {json.dumps(fig['user_defects'])}")
    for ex in fig["examples"]:
        print(f"  example {ex['defect']}: {ex['text'][:160]!r}")
    if size["concurrent_pass"] and not args.concurrency:
        k = size["concurrent_pass"]
        lines2, info2 = asyncio.run(run_pass(records[:k], size["agent_turns"], k, args.model, args.seed, guard))
        fig2 = analyse(lines2, prompts, names)
        fig["at_concurrency"] = {"concurrency": k, "turn_latency_seconds": fig2["turn_latency_seconds"],
                                 "first_delta_seconds": fig2["first_delta_seconds"],
                                 "tokens_per_second": round(info2["generated_tokens"] / info2["wall_s"], 2)}
        print(f"  at concurrency {k}: turn latency p50 {fig2['turn_latency_seconds']['p50']} p95 "
              f"{fig2['turn_latency_seconds']['p95']}, first delta p50 {fig2['first_delta_seconds']['p50']}, "
              f"tokens/s {fig['at_concurrency']['tokens_per_second']}")
    v = verdict(fig)
    for k, (val, op, target, ok) in v.items():
        if val is None:
            print(f"  target {k} {op} {target}: not measured at concurrency {conc} (needs --concurrency 1)")
            continue
        print(f"  target {k} {op} {target}: {val} {'PASS' if ok else 'MISS'}")
    if args.json:
        Path(args.json).write_text(json.dumps(fig, indent=2) + "\n")


if __name__ == "__main__":
    main()
