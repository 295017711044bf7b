"""Stage ``judge`` of phase 1: the agent-specific rubric on every sampled candidate (``OUT/judge/judgements.jsonl``).

Judging runs in-process on the local engine (or any configured OpenAI-compatible judge) with the same rubric
prompts, retry/drop rule and content-hash cache as JudgeService (:mod:`mascot_training.common.judges`); with
``judge.target`` set it calls a running JudgeService over gRPC instead (one RUBRIC_AGENT JudgeCandidates call per
group and judge, the judge picked by the spec's ``name``; a deadline of ``judge.call_timeout_s`` per call;
UNAVAILABLE / DEADLINE_EXCEEDED retried with backoff for ``judge.retry_budget_s`` seconds, :mod:`mascot.core.retry`).
An empty answer is not sent to the judge: it scores 1 on every criterion (a degenerate output earns the lowest score,
so it becomes a rejected example). A candidate the reply checks refused on every attempt (``refused`` in the sample
row) is neither judged nor scored: serving never shows it, so it is no example of anything the reward model scores.

Resumption without counting twice: each judged group (scores, unparseable count, judge-model calls) is appended
and fsynced to ``progress.jsonl`` in the partial directory (which survives a crash and a rerun) as soon as it is
judged; a rerun skips the groups recorded there, so none is judged or counted again, and the manifest's
``unparseable`` and ``judge_calls`` are sums over the recorded groups. The file stays in the stage directory as
the per-group record behind those sums. In-process judging also keeps its cache in the partial directory.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Awaitable, Callable

from mascot.core.dialogue import history_from_dicts
from mascot.core.files import append_jsonl, atomic_write_text, read_jsonl, write_jsonl
from mascot.core.personas import PersonaCatalog
from mascot.judge import rubric as rb
from mascot.judge.judging import agent_item
from mascot_training.common.judges import build_stage_judges, close_judges, judging_versions
from mascot_training.common.manifest import digest_path, digest_obj, is_done, read_manifest, stage_dir
from mascot_training.common.progress import StepProgress

EMPTY_SCORES = {k: 1 for k in rb.AGENT_CRITERIA}
PROGRESS = "progress.jsonl"
#: Settings that change how the stage reaches the judge, not what it answers (kept out of the config digest, so
#: raising the retry budget for a rerun resumes instead of starting over).
_OPERATIONAL = {"call_timeout_s", "retry_budget_s"}

#: ``judge_group(group) -> (per candidate: [scores | None per judge], unparseable, judge-model calls)``
GroupJudge = Callable[[dict], Awaitable[tuple[list[list[dict | None]], int, int]]]


class Progress:
    """Append-only, fsynced record of judged groups in ``path``, valid for one (config, inputs) key.

    The first line is ``{"progress_of": key}``; a file written for another key (the config or the candidates
    changed) is started over. A torn last line (a kill mid-write) is dropped.

    Args:
        path: The progress file.
        key: Digest of the stage's config and input digests.
    """

    def __init__(self, path: Path, key: str) -> None:
        self.path = path
        rows = read_jsonl(path)
        if not rows or rows[0].get("progress_of") != key:
            atomic_write_text(path, json.dumps({"progress_of": key}) + "\n")
            rows = []
        self.done: dict[str, dict] = {r["group_id"]: r for r in rows[1:]}

    def add(self, row: dict) -> None:
        """Record one judged group durably (on disk when this returns)."""
        append_jsonl(self.path, row)
        self.done[row["group_id"]] = row


def _local_judge(judges: list, catalog: PersonaCatalog, names: dict[str, str]) -> GroupJudge:
    async def judge_group(g: dict) -> tuple[list[list[dict | None]], int, int]:
        card = catalog.get(g["persona_id"])
        history = history_from_dicts(g["history"])
        context = [tuple(c) for c in g["context"]]
        per_cand: list[list[dict | None]] = [[] for _ in g["candidates"]]
        unparseable = calls = 0
        for j in judges:
            idx = [i for i, c in enumerate(g["candidates"]) if c.strip()]
            roster = catalog.in_set(card.persona_set)
            items = [agent_item(j.backend, card, roster, history, g["candidates"][i], context, names) for i in idx]
            verdicts = await j.judge_many(rb.AGENT, items)
            for i, v in zip(idx, verdicts):
                calls += v.attempts
                per_cand[i].append(v.scores if v.status == "ok" else None)
                unparseable += v.status != "ok"
        return per_cand, unparseable, calls

    return judge_group


def _remote_judge(cfg, channel: Any) -> GroupJudge:
    """Judge groups through JudgeService at ``cfg.judge.target`` on ``channel``.

    The returned function raises :class:`~mascot.core.retry.RetryBudgetExhausted` (no answer within the budget)
    or ``grpc.aio.AioRpcError`` (any other status, at once).
    """
    from mascot.api.judge.v1 import judge_pb2 as jpb
    from mascot.api.judge.v1 import judge_pb2_grpc as jpb_grpc
    from mascot.core.config import JudgeConfig
    from mascot.core.retry import RetryPolicy, call_with_retry
    from mascot.judge.requests import agent_request

    jc = cfg.judge
    names = [spec.name for spec in JudgeConfig(judges=jc.judges).judges]
    policy = RetryPolicy(call_timeout_s=jc.call_timeout_s, budget_s=jc.retry_budget_s)
    stub = jpb_grpc.JudgeServiceStub(channel)

    async def judge_group(g: dict) -> tuple[list[list[dict | None]], int, int]:
        per_cand: list[list[dict | None]] = [[] for _ in g["candidates"]]
        unparseable = calls = 0
        idx = [i for i, c in enumerate(g["candidates"]) if c.strip()]
        if not idx:
            return per_cand, 0, 0
        for name in names:
            req = agent_request(name, g["history"], g["context"],
                                [(str(i), g["persona_id"], g["candidates"][i]) for i in idx])
            resp = await call_with_retry(lambda t, req=req: stub.JudgeCandidates(req, timeout=t), jc.target, policy)
            for i, j in zip(idx, resp.judgements):
                ok = j.status == jpb.JUDGEMENT_STATUS_OK
                calls += j.attempts
                per_cand[i].append({k: int(s) for k, s in j.scores.items()} if ok else None)
                unparseable += not ok
        return per_cand, unparseable, calls

    return judge_group


def _row(g: dict, per_cand: list[list[dict | None]], unparseable: int, calls: int) -> dict:
    scores, means = [], []
    refused = g.get("refused") or [""] * len(g["candidates"])
    for i, c in enumerate(g["candidates"]):
        if refused[i]:
            s = None  # serving would never show it: no score, no pair
        elif not c.strip():
            s = dict(EMPTY_SCORES)
        else:
            ok = [x for x in per_cand[i] if x]
            s = {k: sum(x[k] for x in ok) / len(ok) for k in rb.AGENT_CRITERIA} if ok else None
        scores.append(s)
        means.append(sum(s.values()) / len(s) if s else None)
    return {"group_id": g["group_id"], "persona_id": g["persona_id"], "scores": scores, "means": means,
            "unparseable": unparseable, "judge_calls": calls}


async def run(cfg, out: Path, *, engine: Any) -> dict:
    """Judge ``OUT/sample/candidates.jsonl``; returns the stage manifest.

    Metrics: ``groups``, ``unparseable`` (dropped judgements) and ``judge_calls`` (judge-model calls reported for
    the recorded groups; 0 for answers from a cache), ``judges``, ``rubric_version``, ``judgements_digest``.

    Raises:
        ValueError: the sample stage has not run; with ``judge.target``: the JudgeService did not answer within
            ``judge.retry_budget_s`` (the groups judged so far are kept; rerunning resumes) or refused a request.
    """
    src = out / "sample" / "candidates.jsonl"
    if not src.is_file():
        raise ValueError(f"{src} is missing: run the sample stage first")
    conf = {"judge": cfg.judge.model_dump(mode="json", exclude=_OPERATIONAL),
            "versions": judging_versions(cfg.judge.judges)}
    inputs = {"candidates": digest_path(src)}
    if is_done(out, "judge", conf, inputs):
        return read_manifest(out / "judge")
    catalog = PersonaCatalog.load()
    names = {pid: c.name for pid, c in catalog.cards.items()}
    groups = read_jsonl(src)
    with stage_dir(out, "judge", conf, inputs) as (part, manifest):
        progress = Progress(part / PROGRESS, digest_obj({"config": conf, "inputs": inputs}))
        todo = [g for g in groups if g["group_id"] not in progress.done]
        if cfg.judge.target:
            judge_names = await _judge_remote(cfg, todo, progress, len(groups))
        else:
            judges = build_stage_judges(cfg, engine, f"sqlite:///{(part / 'judge-cache.db').resolve()}")
            try:
                judge_group = _local_judge(judges, catalog, names)
                bar = StepProgress("judge", len(todo), unit="group")
                for g in todo:
                    progress.add(_row(g, *await judge_group(g)))
                    bar.step(persona=g["persona_id"])
                bar.close()
            finally:
                await close_judges(judges)
            judge_names = [j.name for j in judges]
        rows = [progress.done[g["group_id"]] for g in groups]
        lines = [{k: r[k] for k in ("group_id", "persona_id", "scores", "means")} for r in rows]
        write_jsonl(part / "judgements.jsonl", lines)
        manifest["data_ids"] = sorted({g["situation_id"] for g in groups})
        manifest["metrics"] = {"groups": len(lines), "unparseable": sum(r["unparseable"] for r in rows),
                               "judge_calls": sum(r["judge_calls"] for r in rows),
                               "judges": judge_names, "rubric_version": rb.rubric_version(),
                               "judgements_digest": digest_obj(lines)}
        if cfg.judge.target:
            manifest["metrics"]["target"] = cfg.judge.target
    return read_manifest(out / "judge")


async def _judge_remote(cfg, todo: list[dict], progress: Progress, total: int) -> list[str]:
    """Judge ``todo`` through the JudgeService at ``cfg.judge.target``, recording each group; returns judge names.

    Raises:
        ValueError: no answer within the retry budget, or a refused request (one line naming the target).
    """
    import grpc

    from mascot.core.config import JudgeConfig
    from mascot.core.retry import RetryBudgetExhausted, one_line
    from mascot.core.server import channel

    target = cfg.judge.target
    async with channel(target) as ch:
        judge_group = _remote_judge(cfg, ch)
        bar = StepProgress(f"judge ({target})", len(todo), unit="group")
        try:
            for g in todo:
                progress.add(_row(g, *await judge_group(g)))
                bar.step(persona=g["persona_id"])
        except RetryBudgetExhausted as e:
            raise ValueError(
                f"the JudgeService at {target} did not answer within judge.retry_budget_s = "
                f"{e.budget_s:g} s ({e.attempts} attempts, last {e.code.name}); {len(progress.done)} of {total} "
                f"groups are recorded, so rerunning the command resumes without judging them again") from None
        except grpc.aio.AioRpcError as e:
            raise ValueError(f"the JudgeService at {target} refused a request: {e.code().name}: "
                             f"{one_line(e.details())}") from None
    return [spec.name for spec in JudgeConfig(judges=cfg.judge.judges).judges]


