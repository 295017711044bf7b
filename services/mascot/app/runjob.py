"""The main job: one self-play conversation per situation record, over the gateway's gRPC API.

Writes ``DIR/transcripts.jsonl`` (one line per conversation) and ``DIR/summary.json`` (schema in the README).
Records are EmpatheticDialogues situations for ``support`` and QMSum excerpts for ``meeting`` (the excerpt seeds the
conversation and the query opens the user's turn). Conversations run ``concurrency`` at a time so that the engine
decodes their turns in one batch.
"""

from __future__ import annotations

import asyncio
import json
import statistics
from collections import Counter
from pathlib import Path
from typing import Any, AsyncIterator, Callable, Iterable

from mascot.api.conversation.v1 import conversation_pb2 as cpb
from mascot.api.conversation.v1 import conversation_pb2_grpc as cpb_grpc
from mascot.api.dialogue.v1 import dialogue_pb2 as dpb
from mascot.core.files import atomic_write_text, iter_jsonl_records

SOURCE_NAMES = {dpb.DIRECTIVE_SOURCE_MODEL: "model", dpb.DIRECTIVE_SOURCE_RETRY: "retry",
                dpb.DIRECTIVE_SOURCE_FALLBACK: "fallback", dpb.DIRECTIVE_SOURCE_SAFETY: "safety", dpb.DIRECTIVE_SOURCE_RANDOM: "random"}
MODES = {"support": cpb.MODE_SUPPORT, "meeting": cpb.MODE_MEETING}


def read_records(path: str | Path, mode: str, limit: int | None) -> list[dict]:
    """Read up to ``limit`` JSONL records and check the fields the mode needs.

    Raises:
        FileNotFoundError: no such file.
        ValueError: a line is not JSON or lacks a required field (the message names the line).
    """
    need = ("id", "situation", "first_utterance") if mode == "support" else ("id", "turns", "query")
    out = []
    for _, rec in iter_jsonl_records(path, need, f"--mode {mode}"):
        out.append(rec)
        if limit is not None and len(out) >= limit:
            break
    return out


def _start_request(rec: dict, mode: str) -> cpb.StartConversationRequest:
    ctx = []
    if mode == "meeting":
        ctx = [dpb.ContextUtterance(speaker=t.get("speaker", "Speaker"), content=t.get("content", ""))
               for t in rec["turns"]]
    return cpb.StartConversationRequest(mode=MODES[mode], context=ctx, source_id=str(rec["id"])[:256])


def _selfplay_request(conv_id: str, rec: dict, mode: str, agent_turns: int, seed: int) -> cpb.RunSelfPlayRequest:
    if mode == "support":
        user = dpb.UserSimulation(situation=rec["situation"], emotion=rec.get("emotion", ""))
        opening = rec["first_utterance"]
    else:
        user = dpb.UserSimulation(situation=f"You attended this meeting and want to know: {rec['query']}")
        opening = rec["query"]
    return cpb.RunSelfPlayRequest(conversation_id=conv_id, opening_text=opening, user=user, agent_turns=agent_turns,
                                  seed=seed)


END_REASONS = {cpb.ROUND_END_REASON_COMPLETED: "completed", cpb.ROUND_END_REASON_EMPTY_REPLIES: "empty_replies",
               cpb.ROUND_END_REASON_SAFETY: "safety", cpb.ROUND_END_REASON_INTERRUPTED: "interrupted"}


#: Longest a client waits, over all retries, for the gateway to admit one round it refused as overloaded.
ADMISSION_WAIT_S = 900.0


async def admitted(start: Callable[[], Any], max_wait_s: float = ADMISSION_WAIT_S,
                   sleep: Callable[[float], Any] = asyncio.sleep) -> AsyncIterator[Any]:
    """The responses of a round stream (``start()`` makes the call: SendMessage or RunSelfPlay), started again after
    the wait the gateway asks for (``retry-after``) while it refuses the round as overloaded before anything was
    stored (RESOURCE_EXHAUSTED: ``limits.max_active_rounds`` or ``limits.max_rounds_per_caller``).

    Raises:
        grpc.aio.AioRpcError: any other status, an overload refusal after the first response, or one past
            ``max_wait_s`` seconds of waiting.
    """
    import grpc

    from mascot.core.retry import overload_wait_s

    waited = 0.0
    while True:
        got_any = False
        try:
            async for item in start():
                got_any = True
                yield item
            return
        except grpc.aio.AioRpcError as e:
            wait = overload_wait_s(e)
            if got_any or wait is None or waited + wait > max_wait_s:
                raise
            waited += wait
            await sleep(wait)


async def read_conversation(stub: Any, conv_id: str, include_think: bool = False) -> cpb.GetConversationResponse:
    """GetConversation over every page (``next_page_token``): one response holding all the turns.

    Raises:
        grpc.aio.AioRpcError: the gateway's status (NOT_FOUND, UNAVAILABLE, ...).
    """
    resp = await stub.GetConversation(cpb.GetConversationRequest(conversation_id=conv_id,
                                                                 include_think=include_think))
    token = resp.next_page_token
    while token:
        page = await stub.GetConversation(cpb.GetConversationRequest(conversation_id=conv_id,
                                                                     include_think=include_think, page_token=token))
        resp.conversation.turns.extend(page.conversation.turns)
        token = page.next_page_token
    resp.next_page_token = ""
    return resp


def transcript_line(resp: cpb.GetConversationResponse, mode: str, model: dict | None = None,
                    end_reason: str = "") -> dict:
    """One ``transcripts.jsonl`` object from a stored conversation (fields in the README), naming ``model``."""
    c = resp.conversation
    turns = []
    for t in c.turns:
        agent = t.role == dpb.ROLE_AGENT
        turns.append({
            "index": t.index, "role": "agent" if agent else "user", "persona_id": t.persona_id or None,
            "directive": {"persona_id": t.directive.persona_id, "action": t.directive.action, "tone": t.directive.tone,
                          "source": SOURCE_NAMES.get(t.directive.source, "model"), "raw": t.directive.raw}
            if agent else None,
            "adapter_version": t.adapter_version, "text": t.text, "think": t.think, "safety": t.safety,
            "latency_seconds": round(t.timings.latency.ToTimedelta().total_seconds(), 6),
            "first_delta_seconds": round(t.timings.first_token.ToTimedelta().total_seconds(), 6),
            "director_seconds": round(t.timings.director.ToTimedelta().total_seconds(), 6),
            "rejections": [{"persona_id": r.persona_id, "attempt": r.attempt, "reason": r.reason, "text": r.text}
                           for r in t.rejections],
            "cut_reason": t.cut_reason,
        })
    line = {"conversation_id": c.id, "mode": mode, "source_id": c.source_id, "personas": list(c.persona_ids),
            "turns": turns, "director_retries": resp.director_retries, "director_fallbacks": resp.director_fallbacks,
            "end_reason": end_reason}
    if model is not None:
        line["model"] = model
    return line


def percentile(xs: list[float], q: float) -> float:
    """The ``q``-th percentile (1-99) of sorted ``xs`` (inclusive method); 0 for none, the value for one."""
    if not xs:
        return 0.0
    if len(xs) == 1:
        return xs[0]
    return statistics.quantiles(xs, n=100, method="inclusive")[int(q) - 1]


def summarize(lines: Iterable[dict]) -> dict:
    """``summary.json``: counts, persona counts, director fallback rate, turn latency p50/p95 (agent turns)."""
    lines = list(lines)
    agent = [t for ln in lines for t in ln["turns"] if t["role"] == "agent"]
    user = [t for ln in lines for t in ln["turns"] if t["role"] == "user"]
    lat = sorted(t["latency_seconds"] for t in agent)
    fallbacks = sum(1 for t in agent if t["directive"]["source"] == "fallback")
    turns = [t for ln in lines for t in ln["turns"]]
    rejections = Counter(r["reason"] for t in turns for r in t.get("rejections", []))
    out = {
        "conversations": len(lines), "agent_turns": len(agent), "user_turns": len(user),
        "persona_counts": dict(sorted(Counter(t["persona_id"] for t in agent).items())),
        "director_fallback_rate": round(fallbacks / len(agent), 6) if agent else 0.0,
        "turn_latency_seconds": {"p50": round(percentile(lat, 50), 6), "p95": round(percentile(lat, 95), 6)},
        "rejections": dict(sorted(rejections.items())),
        "cut_replies": sum(1 for t in turns if t.get("cut_reason")),
        "early_round_ends": sum(1 for ln in lines if ln.get("end_reason") == "empty_replies"),
    }
    models = [ln["model"] for ln in lines if ln.get("model")]
    if models:
        out["model"] = models[0]
    return out


def _atomic_write(path: Path, text: str) -> None:
    atomic_write_text(path, text)


async def run_job(target: str, records: list[dict], mode: str, out_dir: str | Path, *, agent_turns: int = 0,
                  seed: int = 0, progress: Callable[[], None] | None = None, max_message_bytes: int = 16 << 20,
                  concurrency: int = 1, model: dict | None = None) -> dict:
    """Run one self-play conversation per record against the gateway at ``target``; write the outputs.

    Args:
        concurrency: Conversations in flight at once (>= 1); outputs keep the records' order either way.
        model: ``{"name", "digest", ...}`` of the model serving the gateway, written into every transcript line and
            the summary (:func:`mascot.core.engine.default_model.model_identity`); None leaves it out.

    Files are written to temporary names and renamed, so a crashed run leaves no half-written artefact.

    Returns:
        The summary dict (also written to ``summary.json``).

    Raises:
        grpc.aio.AioRpcError: the gateway refused a request (its status says why).
        ValueError: ``concurrency`` below 1.
    """
    from mascot.core.server import channel

    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    lines: list[dict | None] = [None] * len(records)
    gate = asyncio.Semaphore(concurrency)
    async with channel(target, max_message_bytes) as ch:
        stub = cpb_grpc.ConversationServiceStub(ch)

        async def one(i: int, rec: dict) -> None:
            async with gate:
                conv = (await stub.StartConversation(_start_request(rec, mode))).conversation
                reason = ""
                events = admitted(lambda: stub.RunSelfPlay(_selfplay_request(conv.id, rec, mode, agent_turns,
                                                                             seed + i)))
                async for ev in events:
                    if ev.event.WhichOneof("event") == "round_completed":
                        reason = END_REASONS.get(ev.event.round_completed.reason, "")
                resp = await read_conversation(stub, conv.id, include_think=True)
                lines[i] = transcript_line(resp, mode, model, reason)
                if progress:
                    progress()

        tasks = [asyncio.create_task(one(i, rec)) for i, rec in enumerate(records)]
        try:
            await asyncio.gather(*tasks)
        except BaseException:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise
    done = [ln for ln in lines if ln is not None]
    summary = summarize(done)
    _atomic_write(out / "transcripts.jsonl", "".join(json.dumps(ln, ensure_ascii=False) + "\n" for ln in done))
    _atomic_write(out / "summary.json", json.dumps(summary, indent=2) + "\n")
    return summary
