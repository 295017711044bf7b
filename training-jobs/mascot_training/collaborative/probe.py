"""The director's first decisions on held-out situations, as served (``mascot train director-probe``).

For each situation the prefix is the user's opening alone; the director (the base model, or the base with a director
LoRA) decides the first agent turn under serving's grammar and checks, at the run config's ``director.decoding``
(serving's setting: sampled at temperature 0.7, nucleus 0.9 by default, seeded per decision), ``samples`` times.
The report gives each persona's share of the decisions with its 95% Wilson interval (scipy), the share of refused
decisions (a directive serving would retry), and the Tones: how many distinct ones and the most common one's share.
Phase 2's own measure (``persona_distribution_before`` / ``_after`` in the stage manifest) reads the training and
held-out prefixes of the run; this one reads situations the run never saw (the evaluation split), so a trained and
an untrained director can be compared on the same prefixes and seeds.
"""

from __future__ import annotations

import collections
from pathlib import Path
from typing import Any, Sequence

from mascot_training.collaborative.config import CollaborativeConfig
from mascot_training.collaborative.simulate import Prefix, Rollout, RolloutRunner, rollout_seed


def opening_prefixes(cfg: CollaborativeConfig, situations: Path, limit: int) -> list[Prefix]:
    """One prefix per situation of ``situations`` (the first ``limit``, file order): the user's opening alone.

    Raises:
        ValueError: the file has no situation of the config's mode.
    """
    from mascot.core.dialogue import HistoryTurn
    from mascot.core.situations import load_situations

    sits = load_situations(situations, cfg.mode, limit)
    if not sits:
        raise ValueError(f"{situations}: no {cfg.mode} situation")
    return [Prefix(f"{s.id}#probe", s.id, s.situation, s.emotion, 0, [HistoryTurn("user", s.opening)],
                   [tuple(c) for c in s.context]) for s in sits]


def first_decisions(runner: RolloutRunner, director: Any, prefixes: Sequence[Prefix], samples: int,
                    seed: int) -> list[dict]:
    """``samples`` first decisions per prefix, as :meth:`RolloutRunner.policy_decisions` samples them (serving's
    grammar and checks when the runner carries the serving director's rules): one dict per decision with
    ``prefix_id``, ``sample``, ``persona`` and ``tone`` ("" when refused) and ``error``."""
    rows = []
    todo = []
    for p in prefixes:
        for k in range(samples):
            r = Rollout(p, k, 0)
            runner.start(r)
            todo.append(r)
    for a in range(0, len(todo), 16):
        batch = todo[a:a + 16]
        for r, o in zip(batch, runner.policy_decisions(director, batch, rollout_seed(seed, "probe", a))):
            d = o.directive
            rows.append({"prefix_id": r.prefix.prefix_id, "sample": r.index, "persona": d.persona_id if d else "",
                         "tone": d.tone if d else "", "error": "" if d else (o.error or "invalid")})
    return rows


def decision_table(rows: Sequence[dict], roster: Sequence[str]) -> dict:
    """Shares of ``rows`` (:func:`first_decisions`): ``{"n", "personas": {id: {"count", "share", "ci95"}},
    "refused": {...}, "tones": {"distinct", "top", "top_share"}}``. Shares are over all decisions, refused ones
    included; ``ci95`` is the Wilson score interval (scipy.stats.binomtest); the Tone shares are over the valid
    decisions."""
    from scipy.stats import binomtest

    n = len(rows)

    def entry(count: int) -> dict:
        ci = binomtest(count, n).proportion_ci(method="wilson") if n else None
        return {"count": count, "share": round(count / n, 4) if n else 0.0,
                "ci95": [round(ci.low, 4), round(ci.high, 4)] if ci else [0.0, 0.0]}

    counts = collections.Counter(r["persona"] for r in rows)
    tones = collections.Counter(r["tone"] for r in rows if r["persona"])
    valid = sum(tones.values())
    top, top_n = tones.most_common(1)[0] if tones else ("", 0)
    return {"n": n, "personas": {p: entry(counts[p]) for p in roster}, "refused": entry(counts[""]),
            "tones": {"distinct": len(tones), "top": top, "top_share": round(top_n / valid, 4) if valid else 0.0}}


def run_probe(cfg: CollaborativeConfig, situations: Path, *, limit: int = 100, adapter: str | None = None,
              samples: int = 1, seed: int = 0) -> dict:
    """Load the config's base model (with the director LoRA ``adapter`` when given), decide the first turn of the
    first ``limit`` situations of ``situations`` ``samples`` times each, and return :func:`decision_table` with
    ``adapter``, ``situations``, ``samples``, ``seed``, the decoding and every decision (``rows``).

    Raises:
        ValueError: no situation of the config's mode, or ``adapter`` is not a LoRA adapter directory.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from mascot.core.engine import resolve_model
    from mascot.core.personas import PersonaCatalog
    from mascot_training.collaborative import rollouts
    from mascot_training.collaborative.simulate import PolicyDirector
    from mascot_training.common.config import active_personas

    prefixes = opening_prefixes(cfg, situations, limit)
    base = resolve_model(cfg.model, cfg.tiny_dir)
    tokenizer = AutoTokenizer.from_pretrained(base)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(base, torch_dtype=torch.float32)
    if adapter:
        if not (Path(adapter) / "adapter_config.json").is_file():
            raise ValueError(f"{adapter} is not a LoRA adapter directory (no adapter_config.json)")
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, adapter)
    model.eval()
    roster = [PersonaCatalog.load().get(p) for p in active_personas(cfg)]
    runner = RolloutRunner(None, tokenizer, roster, rollouts.settings(cfg), {})
    dec = cfg.director.decoding
    director = PolicyDirector(model, tokenizer, max_tokens=cfg.director.max_tokens, temperature=dec.temperature,
                              top_p=dec.top_p)
    with torch.inference_mode():
        rows = first_decisions(runner, director, prefixes, samples, seed)
    return {"adapter": adapter or "", "situations": str(situations), "samples": samples, "seed": seed,
            "decoding": {"temperature": dec.temperature, "top_p": dec.top_p},
            **decision_table(rows, [c.id for c in roster]), "rows": rows}
