"""Judge evaluation dialogues through JudgeService over gRPC.

Support mode: every non-empty agent turn on the agent-specific rubric (context = the turns before it) and the
dialogue's block after the opening message on the collective rubric. Meeting mode: the collective rubric only. One
request per item.

Resumption without counting twice: every answered request is appended (and fsynced) to a
:class:`JudgeResults` file keyed by the SHA-256 of the judge's identity and the serialized request; a rerun reads
it and sends only the requests not answered yet, so an item is never asked again and its scores and unparseable
count enter the report exactly once. Each call has a deadline, and UNAVAILABLE / DEADLINE_EXCEEDED are retried
with backoff within a budget (:mod:`mascot.core.retry`), so a judge service that restarts is ridden out.

The request builders (:func:`mascot.judge.requests.agent_request`, :func:`mascot.judge.requests.collective_request`)
are shared with the training ``judge`` stage, so both send JudgeService the same shape.
"""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path
from typing import Any, Callable

from mascot.api.judge.v1 import judge_pb2 as jpb
from mascot.api.judge.v1 import judge_pb2_grpc as jpb_grpc
from mascot.core.files import append_jsonl, read_jsonl
from mascot.core.retry import RetryPolicy, call_with_retry
from mascot.judge.requests import agent_request, collective_request

RESULTS_FILE = "judge-results.jsonl"


def request_key(identity: str, request: jpb.JudgeCandidatesRequest) -> str:
    """Hex SHA-256 of the judge's ``identity`` and the deterministic serialization of ``request``."""
    h = hashlib.sha256(identity.encode("utf-8"))
    h.update(b"\0")
    h.update(request.SerializeToString(deterministic=True))
    return h.hexdigest()


def judgement_record(resp: jpb.JudgeCandidatesResponse) -> dict:
    """The JSON-ready part of a response a resumed run needs: per judgement status, scores, attempts."""
    return {"model": resp.model, "rubric_version": resp.rubric_version,
            "judgements": [{"candidate_id": j.candidate_id,
                            "status": "ok" if j.status == jpb.JUDGEMENT_STATUS_OK else "unparseable",
                            "scores": dict(j.scores), "attempts": j.attempts} for j in resp.judgements]}


class JudgeRefused(Exception):
    """The judge service answered a request with a status that is not retried (e.g. INVALID_ARGUMENT for an
    unknown judge name).

    Attributes:
        target: ``host:port`` of the service.
        code: The gRPC status code.
        details: The status message.
    """

    def __init__(self, target: str, code: Any, details: str) -> None:
        from mascot.core.retry import one_line

        self.target, self.code, self.details = target, code, details
        super().__init__(f"the judge service at {target} refused a request: {code.name}: {one_line(details)}")


class JudgeResults:
    """Append-only, fsynced JSONL of answered judge requests, by :func:`request_key` (a torn last line is dropped).

    Args:
        path: The file (created on the first answer).
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.done: dict[str, dict] = {r["key"]: r for r in read_jsonl(self.path) if "key" in r}

    def add(self, key: str, record: dict) -> None:
        """Record one answered request durably (returns once it is on disk)."""
        rec = {"key": key, **record}
        append_jsonl(self.path, rec)
        self.done[key] = rec


async def judge_dialogues(target: str, dialogues: list[dict], situations: list, opts: Any, catalog: Any,
                          max_message_bytes: int, progress: Callable[[str, int, int], None], *,
                          results: JudgeResults | None = None, identities: dict[str, str] | None = None,
                          policy: RetryPolicy | None = None) -> dict:
    """Judge every dialogue with every judge, asking only what ``results`` does not hold yet.

    Args:
        target: ``host:port`` of the JudgeService.
        dialogues: Finished dialogues (``system``, ``situation_id``, ``turns``, ``personas``).
        situations: The situations (their seed context goes into each request).
        opts: :class:`~mascot.eval.runner.EvalOptions` (judges, mode, concurrency).
        catalog: Persona catalog (unused; kept for callers).
        max_message_bytes: gRPC size limit of the channel.
        progress: ``progress("judging", done, total)``.
        results: Durable record of answered requests (None: nothing kept, everything asked).
        identities: Judge name to identity string (what makes its answers reusable: the judge spec, or the
            target); a missing name uses ``target``.
        policy: Per-call deadline and retry budget (default :class:`RetryPolicy`).

    Returns:
        ``{(system, situation_id): {judge_name: {"agent": [scores | None per agent turn], "collective": scores |
        None, "unparseable": int}}}`` where scores are ``{criterion: int 1..5}``; None marks a dropped
        (unparseable) item or an empty turn (not judged).

    Raises:
        mascot.core.retry.RetryBudgetExhausted: the judge did not answer within the budget (answers so far are in
            ``results``; a rerun resumes).
        JudgeRefused: the judge service refused a request (any status but the retried ones).
    """
    import grpc

    from mascot.core.server import channel

    ctx_of = {s.id: [list(c) for c in s.context] for s in situations}
    names = [j["name"] for j in opts.judges]
    meeting = opts.mode == "meeting"
    policy = policy or RetryPolicy()
    identities = identities or {}
    jobs: list[tuple[tuple[str, str], str, str, int, jpb.JudgeCandidatesRequest]] = []
    for d in dialogues:
        key = (d["system"], d["situation_id"])
        turns = d["turns"]
        ctx = ctx_of[d["situation_id"]]
        for name in names:
            if not meeting:
                k = 0
                for i, t in enumerate(turns):
                    if t["role"] != "agent":
                        continue
                    if t["text"].strip():
                        jobs.append((key, name, "agent", k,
                                     agent_request(name, turns[:i], ctx, [(str(i), t["persona_id"], t["text"])])))
                    k += 1
            block = [t for t in turns[1:] if t["role"] == "user" or t["text"].strip()]
            if any(t["role"] == "agent" for t in block):
                jobs.append((key, name, "collective", 0,
                             collective_request(name, turns[:1], ctx, block, d["personas"])))
    out: dict = {}
    for d in dialogues:
        n_agent = sum(1 for t in d["turns"] if t["role"] == "agent")
        out[(d["system"], d["situation_id"])] = {n: {"agent": [None] * n_agent, "collective": None, "unparseable": 0}
                                                 for n in names}

    def apply(key: tuple[str, str], name: str, kind: str, k: int, rec: dict) -> None:
        j = rec["judgements"][0]
        slot = out[key][name]
        ok = j["status"] == "ok"
        slot["unparseable"] += not ok
        scores = {c: int(s) for c, s in j["scores"].items()} if ok else None
        if kind == "agent":
            slot["agent"][k] = scores
        else:
            slot["collective"] = scores

    todo = []
    for key, name, kind, k, req in jobs:
        rkey = request_key(identities.get(name, f"target={target}"), req)
        if results is not None and rkey in results.done:
            apply(key, name, kind, k, results.done[rkey])  # answered before a kill: never asked or counted again
        else:
            todo.append((key, name, kind, k, req, rkey))
    done = [len(jobs) - len(todo)]
    progress("judging", done[0], len(jobs))
    sem = asyncio.Semaphore(max(1, opts.concurrency))
    stopped = asyncio.Event()  # set by the first failure: no queued request is sent after it
    async with channel(target, max_message_bytes) as ch:
        stub = jpb_grpc.JudgeServiceStub(ch)

        async def one(key, name, kind, k, req, rkey) -> None:
            async with sem:
                if stopped.is_set():
                    return
                try:
                    resp = await call_with_retry(lambda t: stub.JudgeCandidates(req, timeout=t), target, policy)
                except grpc.aio.AioRpcError as e:
                    stopped.set()
                    raise JudgeRefused(target, e.code(), e.details() or "") from None
                except BaseException:
                    stopped.set()
                    raise
            rec = judgement_record(resp)
            if results is not None:
                results.add(rkey, rec)
            apply(key, name, kind, k, rec)
            done[0] += 1
            progress("judging", done[0], len(jobs))

        await gather_or_cancel([one(*job) for job in todo])
    return out


async def gather_or_cancel(coros: list) -> list:
    """Run ``coros`` concurrently; on the first failure cancel the rest (waiting for them) and raise it."""
    tasks = [asyncio.ensure_future(c) for c in coros]
    try:
        return await asyncio.gather(*tasks)
    except BaseException:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
