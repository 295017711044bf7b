"""``judge`` stage: the agent-specific rubric on every candidate (REFERENCE.md sections 4.1, 4.3, 5).

Judging runs in-process on the local engine (or any configured OpenAI-compatible judge) with the same rubric
prompts, retry/drop rule and content-hash cache as JudgeService; with ``judge.target`` set it calls a running
JudgeService over gRPC instead. An empty answer is not sent to the judge: it scores 1 on every criterion (a
degenerate output earns the lowest score, so it becomes a rejected example). The cache lives in the partial
directory, so a killed stage resumes without repeating a judge call.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from mascot.core.dialogue import history_from_dicts
from mascot.core.personas import PersonaCatalog
from mascot.judge import rubric as rb
from mascot.judge.judging import fit_prompt
from mascot.core.files import read_jsonl
from mascot_training.manifest import digest_path, digest_obj, is_done, read_manifest, stage_dir

EMPTY_SCORES = {k: 1 for k in rb.AGENT_CRITERIA}


def _judges(cfg, engine: Any, cache_url: str) -> list:  # noqa: ANN001
    from mascot.core.config import JudgeConfig
    from mascot.judge.backends import LocalJudgeBackend, OpenAIJudgeBackend, read_api_key
    from mascot.judge.cache import JudgeCache
    from mascot.judge.judging import Judge

    jc = JudgeConfig(judges=cfg.judge.judges, max_retries=cfg.judge.max_retries, cache_url=cache_url)
    cache = JudgeCache(cache_url)
    out = []
    for spec in jc.judges:
        if spec.kind == "local":
            backend = LocalJudgeBackend(engine, Path(str(cfg.model or cfg.tiny_dir)).name, spec.adapter or None,
                                        spec.max_tokens)
        else:
            backend = OpenAIJudgeBackend(spec.model, spec.endpoint, read_api_key(spec.api_key_env, spec.api_key_file),
                                         spec.response_format, spec.max_tokens, spec.timeout_s, spec.max_concurrency)
        out.append(Judge(spec.name, backend, jc.max_retries, cache))
    return out


async def run(cfg, out: Path, *, engine: Any) -> dict:  # noqa: ANN001
    """Judge ``OUT/sample/candidates.jsonl``; returns the stage manifest.

    Raises:
        ValueError: the sample stage has not run.
    """
    src = out / "sample" / "candidates.jsonl"
    if not src.is_file():
        raise ValueError(f"{src} is missing: run the sample stage first")
    conf = {"judge": cfg.judge.model_dump(mode="json")}
    inputs = {"candidates": digest_path(src)}
    if is_done(out, "judge", conf, inputs):
        return read_manifest(out / "judge")
    catalog = PersonaCatalog.load()
    names = {pid: c.name for pid, c in catalog.cards.items()}
    groups = read_jsonl(src)
    with stage_dir(out, "judge", conf, inputs) as (part, manifest):
        judges = _judges(cfg, engine, f"sqlite:///{(part / 'judge-cache.db').resolve()}")
        lines, unparseable, calls = [], 0, 0
        for g in groups:
            card = catalog.get(g["persona_id"])
            history = history_from_dicts(g["history"])
            context = [tuple(c) for c in g["context"]]
            per_cand: list[list[dict | None]] = [[] for _ in g["candidates"]]
            for j in judges:
                idx = [i for i, c in enumerate(g["candidates"]) if c.strip()]
                items = [fit_prompt(j.backend, (lambda h, cx, t=g["candidates"][i]: rb.agent_messages(
                    card, h, t, cx, names)), history, context) for i in idx]
                verdicts = await j.judge_many(rb.AGENT, items)
                for i, v in zip(idx, verdicts):
                    calls += v.attempts
                    per_cand[i].append(v.scores if v.status == "ok" else None)
                    unparseable += v.status != "ok"
            scores, means = [], []
            for i, c in enumerate(g["candidates"]):
                if not c.strip():
                    s = dict(EMPTY_SCORES)
                else:
                    ok = [x for x in per_cand[i] if x]
                    s = {k: sum(x[k] for x in ok) / len(ok) for k in rb.AGENT_CRITERIA} if ok else None
                scores.append(s)
                means.append(sum(s.values()) / len(s) if s else None)
            lines.append({"group_id": g["group_id"], "persona_id": g["persona_id"], "scores": scores, "means": means})
        (part / "judgements.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines), encoding="utf-8")
        manifest["data_ids"] = sorted({g["situation_id"] for g in groups})
        manifest["metrics"] = {"groups": len(lines), "unparseable": unparseable, "judge_calls": calls,
                               "judges": [j.name for j in judges], "rubric_version": rb.rubric_version(),
                               "judgements_digest": digest_obj(lines)}
        await close_judges(judges)
    return read_manifest(out / "judge")


async def close_judges(judges: list) -> None:
    """Close every judge backend (HTTP clients) and their shared cache."""
    for j in judges:
        close = getattr(j.backend, "close", None)
        if close:
            await close()
    if judges and judges[0].cache is not None:
        judges[0].cache.close()
