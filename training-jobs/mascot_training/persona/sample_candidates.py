"""``sample`` stage: K candidates per (context x, persona ρ) from the candidate policy.

The context of a group is a training situation's opening user message (its seed context in meeting mode); the
prompt is exactly the speaker prompt serving uses (persona card, tagged history, a directive with the fallback
action and the persona's default tone). Candidates are sampled at T 1.0, top-p 0.95 with per-candidate seeds and
serving's speaker penalties, all K of a group submitted together so the engine batches them.

With the run's ``guard`` section on (the default) each candidate is what serving would deliver
(:func:`mascot.speaker.reply.persona_reply`): a first sentence the reply checks refuse is generated again, a later
one cuts the reply there, an unfinished tail after the token budget is dropped. A candidate refused on every attempt
is kept as ``""`` with its reason in ``refused`` (the judge skips it: serving never shows it). Each row records
``refused``, ``cut`` (why an accepted reply was cut back), ``attempts`` and the refused attempts' texts
(``rejections``). Groups are appended to the partial directory as they finish, so a killed stage resumes where it
stopped.
"""

from __future__ import annotations

import asyncio
import collections
from pathlib import Path
from typing import Any

from mascot.core.dialogue import FALLBACK_ACTION, HistoryTurn, history_from_dicts
from mascot.core.personas import PersonaCatalog
from mascot.core.context import fit_history
from mascot.speaker.prompts import build_persona_messages
from mascot.speaker.reply import ReplyOutcome, RetryPolicy, persona_reply
from mascot_training.common.config import active_personas
from mascot_training.common.data import training_situations
from mascot.core.files import append_jsonl, read_jsonl, write_jsonl
from mascot_training.common.manifest import digest_path, is_done, read_manifest, stage_dir
from mascot_training.common.progress import StepProgress


def group_prompt(engine: Any, card, roster, history: list[HistoryTurn], context,
                 max_tokens: int, action: str = "", tone: str = "") -> list[dict]:
    """The serving speaker prompt for ``card`` (chat messages) under the directive ``action`` / ``tone`` (empty:
    the fallback directive and the card's default tone), fitted to the engine's window."""
    names = {c.id: c.name for c in roster}

    def build(h: list, c: list) -> list[dict]:
        return build_persona_messages(card, h, c, action or FALLBACK_ACTION, tone or card.default_tone, names)

    return fit_history(build, history, context, engine.render_chat, engine.count_tokens,
                       engine.max_context_tokens - max_tokens)


def groups(cfg) -> list[dict]:
    """Every (situation, persona) group of the run: ids, history and context (no candidates yet)."""
    catalog = PersonaCatalog.load()
    out = []
    for sit in training_situations(cfg):
        for pid in active_personas(cfg):
            out.append({"group_id": f"{sit.id}|{pid}", "situation_id": sit.id, "persona_id": pid,
                        "history": [{"role": "user", "persona_id": None, "text": sit.opening}],
                        "context": [list(c) for c in sit.context]})
    assert all(g["persona_id"] in catalog.cards for g in out)
    return out


async def _sample_group(engine: Any, g: dict, cfg, adapter: str | None, seed: int) -> dict:
    catalog = PersonaCatalog.load()
    roster = [catalog.get(p) for p in active_personas(cfg)]
    card = catalog.get(g["persona_id"])
    history = history_from_dicts(g["history"])
    context = [tuple(c) for c in g["context"]]
    s = cfg.sample
    guard = cfg.guard.settings()

    async def one(k: int) -> ReplyOutcome:
        out = None
        async for item in persona_reply(engine, card, roster, history, context, FALLBACK_ACTION, card.default_tone,
                                        max_tokens=s.max_tokens, temperature=s.temperature, top_p=s.top_p,
                                        seed=seed + k, adapter=adapter, repetition_penalty=s.repetition_penalty,
                                        frequency_penalty=s.frequency_penalty, guard=guard,
                                        policy=RetryPolicy.from_guard(cfg.guard)):
            if isinstance(item, ReplyOutcome):
                out = item
        assert out is not None
        return out

    results = await asyncio.gather(*(one(k) for k in range(s.k)))
    refused = [(r.rejections[-1]["reason"] if r.rejections else "empty") if r.rejected else "" for r in results]
    return {**g, "candidates": [r.text.strip() for r in results], "thinks": [r.think.strip() for r in results],
            "refused": refused, "cut": [r.cut_reason for r in results], "attempts": [r.attempts for r in results],
            "rejections": [r.rejections for r in results]}


async def run(cfg, out: Path, *, engine: Any, sft_adapter: str | dict[str, str] | None = None) -> dict:
    """Sample every group; returns the stage manifest (``data_ids`` = situation ids used).

    ``sft_adapter`` is the engine's adapter name of the SFT policy: one name for every persona, or ``{persona:
    name}`` when each persona has its own; None samples the base model."""
    inputs = {"situations": digest_path(cfg.data.situations), "sft": digest_path(out / "sft") if sft_adapter else "",
              "base_model": str(cfg.model or "default")}
    conf = {"sample": cfg.sample.model_dump(mode="json"), "data": cfg.data.model_dump(mode="json"),
            "personas": active_personas(cfg), "mode": cfg.mode, "guard": cfg.guard.model_dump(mode="json")}
    if is_done(out, "sample", conf, inputs):
        return read_manifest(out / "sample")
    todo = groups(cfg)
    with stage_dir(out, "sample", conf, inputs) as (part, manifest):
        path = part / "candidates.jsonl"
        done = {d["group_id"] for d in read_jsonl(path)}
        bar = StepProgress("sample", sum(g["group_id"] not in done for g in todo), unit="group")
        slots = asyncio.Semaphore(cfg.sample.concurrency)

        async def one(i: int, g: dict) -> None:
            async with slots:
                adapter = sft_adapter.get(g["persona_id"]) if isinstance(sft_adapter, dict) else sft_adapter
                row = await _sample_group(engine, g, cfg, adapter, cfg.sample.seed * 1_000_003 + i * 97)
            append_jsonl(path, row)  # as each group finishes: a rerun resumes after the last one written
            bar.step(persona=g["persona_id"])

        await asyncio.gather(*(one(i, g) for i, g in enumerate(todo) if g["group_id"] not in done))
        bar.close()
        order = {g["group_id"]: i for i, g in enumerate(todo)}
        rows = sorted(read_jsonl(path), key=lambda r: order.get(r["group_id"], len(order)))
        write_jsonl(path, rows)  # file order = group order
        empty = sum(1 for r in rows for c, why in zip(r["candidates"], r["refused"]) if not c and not why)
        refused = collections.Counter(why for r in rows for why in r["refused"] if why)
        attempts = [a for r in rows for a, why in zip(r["attempts"], r["refused"]) if not why]
        manifest["data_ids"] = sorted({g["situation_id"] for g in todo})
        manifest["metrics"] = {"groups": len(rows), "candidates": sum(len(r["candidates"]) for r in rows),
                               "empty_answers": empty, "refused": sum(refused.values()),
                               "refused_by_reason": dict(sorted(refused.items())),
                               "cut": sum(1 for r in rows for c in r["cut"] if c),
                               "attempts_per_candidate": round(sum(attempts) / len(attempts), 3) if attempts else None,
                               "policy": "sft" if sft_adapter else "base"}
    return read_manifest(out / "sample")
