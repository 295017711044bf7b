"""Assemble ``report.json`` from dialogues, judgements and automatic metrics, and write every output.

Report schema: the requirements (``seed``, ``mode``, ``situations``, ``judges``, ``models``, ``systems`` → split →
criteria/overall/collective/collective_overall/automatic/safety_turns/unparseable/personas, and ``by_judge``
when several judges ran). Splits: positive/neutral/negative/all (support), academic/committee/product/all
(meeting).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

from mascot.core.files import atomic_write_text
from mascot.eval.aggregate import aggregate_split, combine_judges
from mascot.eval.data import MEETING_SPLITS, SUPPORT_SPLITS


def _nli_scorer(model: str) -> Any:
    from mascot.eval.automatic import NLIScorer, build_tiny_nli_model

    if not model:
        tiny = Path(".cache/tiny-nli")
        if not tiny.is_dir():
            build_tiny_nli_model(tiny)
        model = str(tiny)
    return NLIScorer(model)


def reply_check_counts(dialogues: list[dict]) -> dict:
    """What the reply checks did in a system's dialogues: ``{"rejections": {reason: n}, "cut": n,
    "agent_turns": n}`` (refused attempts and turns, and replies cut back to a sentence end)."""
    from collections import Counter

    turns = [t for d in dialogues for t in d["turns"]]
    rejections = Counter(r.get("reason", "") for t in turns for r in t.get("rejections", []))
    return {"rejections": dict(sorted(rejections.items())), "cut": sum(1 for t in turns if t.get("cut_reason")),
            "agent_turns": sum(1 for t in turns if t["role"] == "agent")}


def build_report(opts: Any, cfg: Any, situations: list, dialogues: list[dict], judged: dict, embedder: Any,
                 progress: Callable[[str, int, int], None]) -> dict:
    """The report dict (blocking: runs the NLI and embedding models)."""
    from mascot.eval.automatic import aggregate as aggregate_automatic
    from mascot.eval.automatic import dialogue_metrics

    meeting = opts.mode == "meeting"
    splits = (*(MEETING_SPLITS if meeting else SUPPORT_SPLITS), "all")
    nli = _nli_scorer(opts.nli_model)
    auto: dict = {}
    for i, d in enumerate(dialogues):
        texts = [t["text"] for t in d["turns"] if t["role"] == "agent" and t["text"].strip()]
        auto[(d["system"], d["situation_id"])] = dialogue_metrics(texts, nli, embedder)
        progress("metrics", i + 1, len(dialogues))
    judges = [j["name"] for j in opts.judges]

    def systems_block(judge_names: list[str]) -> dict:
        res: dict = {}
        for system in opts.systems:
            res[system] = {}
            mine = [d for d in dialogues if d["system"] == system]
            for split in splits:
                items = []
                for d in mine:
                    if split != "all" and d["split"] != split:
                        continue
                    key = (system, d["situation_id"])
                    per = [judged[key][n] for n in judge_names]
                    n_agent = len(per[0]["agent"])
                    items.append({
                        "agent": [combine_judges([p["agent"][k] for p in per]) for k in range(n_agent)],
                        "agent_personas": [t["persona_id"] for t in d["turns"] if t["role"] == "agent"],
                        "collective": combine_judges([p["collective"] for p in per]),
                        "unparseable": sum(p["unparseable"] for p in per),
                        "safety_turns": sum(1 for t in d["turns"] if t.get("safety")),
                    })
                block = aggregate_split(items, meeting)
                block["reply_checks"] = reply_check_counts([d for d in mine if split == "all" or d["split"] == split])
                block["automatic"] = aggregate_automatic(
                    [auto[(system, d["situation_id"])] for d in mine if split == "all" or d["split"] == split],
                    nli.model_name, nli.trained)
                res[system][split] = block
        return res

    from mascot.core.engine.tiny import is_tiny

    from mascot.core.engine import resolve_model
    from mascot.core.engine.default_model import model_identity

    backbone = resolve_model(cfg.engine.model, cfg.engine.tiny_dir, cfg.engine.cache_dir)
    identity = model_identity(backbone)
    model_name = identity["name"]
    trained = not is_tiny(backbone)
    report = {
        "seed": opts.seed, "mode": opts.mode, "situations": [s.id for s in situations], "judges": judges,
        "models": {"backbone": model_name, "backbone_digest": identity["digest"], "trained": trained, "nli": nli.model_name,
                   "nli_trained": nli.trained, "embedding": embedder.model_name,
                   "sft_adapter": str(opts.sft_adapter) if opts.sft_adapter else None},
        "agent_turns": opts.agent_turns or cfg.selfplay.agent_turns,
        "systems": systems_block(judges),
    }
    if len(judges) > 1:
        report["by_judge"] = {n: systems_block([n]) for n in judges}
    return report


def write_outputs(out: Path, report: dict, dialogues: list[dict]) -> None:
    """``transcripts.jsonl`` (ordered by system then situation), ``report.json``, ``report.md`` and the plots."""
    from mascot.eval.report import write_report

    atomic_write_text(out / "transcripts.jsonl", "".join(json.dumps(d, ensure_ascii=False) + "\n" for d in dialogues))
    write_report(report, out)
