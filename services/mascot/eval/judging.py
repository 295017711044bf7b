"""Judge evaluation dialogues through JudgeService over gRPC (REFERENCE.md sections 4.1-4.3, 7).

Support mode: every non-empty agent turn on the agent-specific rubric (context = the turns before it) and the
dialogue's block after the opening message on the collective rubric. Meeting mode: the collective rubric only
(REFERENCE.md section 7). One request per item; the service's cache makes a rerun call no model.
"""

from __future__ import annotations

import asyncio
from typing import Any, Callable, Sequence

from mascot.api.dialogue.v1 import dialogue_pb2 as dpb
from mascot.api.judge.v1 import judge_pb2 as jpb
from mascot.api.judge.v1 import judge_pb2_grpc as jpb_grpc
from mascot.core.dialogue import history_from_dicts, history_to_proto


def _proto_turns(turns: Sequence[dict]) -> list[dpb.Turn]:
    return history_to_proto(history_from_dicts(turns))


async def judge_dialogues(target: str, dialogues: list[dict], situations: list, opts: Any, catalog: Any,
                          max_message_bytes: int, progress: Callable[[str, int, int], None]) -> dict:
    """Judge every dialogue with every judge.

    Returns:
        ``{(system, situation_id): {judge_name: {"agent": [scores | None per agent turn], "collective": scores |
        None, "unparseable": int}}}`` where scores are ``{criterion: int 1..5}``; None marks a dropped
        (unparseable) item or an empty turn (not judged).

    Raises:
        grpc.aio.AioRpcError: the judge service refused a request (e.g. an endpoint down after retries).
    """
    from mascot.core.server import channel

    ctx_of = {s.id: [dpb.ContextUtterance(speaker=a, content=b) for a, b in s.context] for s in situations}
    names = [j["name"] for j in opts.judges]
    meeting = opts.mode == "meeting"
    jobs: list[tuple[tuple[str, str], str, str, int, jpb.JudgeCandidatesRequest]] = []
    for d in dialogues:
        key = (d["system"], d["situation_id"])
        turns = d["turns"]
        for name in names:
            if not meeting:
                k = 0
                for i, t in enumerate(turns):
                    if t["role"] != "agent":
                        continue
                    if t["text"].strip():
                        jobs.append((key, name, "agent", k, jpb.JudgeCandidatesRequest(
                            rubric=jpb.RUBRIC_AGENT, judge=name, history=_proto_turns(turns[:i]),
                            context=ctx_of[d["situation_id"]],
                            candidates=[jpb.Candidate(candidate_id=str(i), persona_id=t["persona_id"],
                                                      text=t["text"])])))
                    k += 1
            block = [t for t in turns[1:] if t["role"] == "user" or t["text"].strip()]
            if any(t["role"] == "agent" for t in block):
                jobs.append((key, name, "collective", 0, jpb.JudgeCandidatesRequest(
                    rubric=jpb.RUBRIC_COLLECTIVE, judge=name, history=_proto_turns(turns[:1]),
                    context=ctx_of[d["situation_id"]], roster_persona_ids=d["personas"],
                    candidates=[jpb.Candidate(candidate_id="block", block=_proto_turns(block))])))
    out: dict = {}
    for d in dialogues:
        n_agent = sum(1 for t in d["turns"] if t["role"] == "agent")
        out[(d["system"], d["situation_id"])] = {n: {"agent": [None] * n_agent, "collective": None, "unparseable": 0}
                                                 for n in names}
    sem = asyncio.Semaphore(max(1, opts.concurrency))
    done = [0]
    progress("judging", 0, len(jobs))
    async with channel(target, max_message_bytes) as ch:
        stub = jpb_grpc.JudgeServiceStub(ch)

        async def one(key, name, kind, k, req) -> None:  # noqa: ANN001
            async with sem:
                resp = await stub.JudgeCandidates(req)
            j = resp.judgements[0]
            slot = out[key][name]
            ok = j.status == jpb.JUDGEMENT_STATUS_OK
            if not ok:
                slot["unparseable"] += 1
            scores = dict(j.scores) if ok else None
            if kind == "agent":
                slot["agent"][k] = scores
            else:
                slot["collective"] = scores
            done[0] += 1
            progress("judging", done[0], len(jobs))

        await asyncio.gather(*(one(*job) for job in jobs))
    return out
