"""The main job: one self-play conversation per situation record, over the gateway's gRPC API.

Writes ``DIR/transcripts.jsonl`` (one line per conversation) and ``DIR/summary.json`` (schema in docs/commands.md).
A conversation that fails is listed in the summary and the others are kept; the same command run again resumes.
Situations (:mod:`mascot.core.situations`, read with ``require_labels=False, verbatim=True``) are EmpatheticDialogues
situations for ``support`` and QMSum excerpts for ``meeting`` (the excerpt seeds the conversation and the query opens
the user's turn). Conversations run ``concurrency`` at a time so that the engine decodes their turns in one batch.
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
from mascot.core.dialogue import directive_source_name
from mascot.core.enums import enum_name, enum_value
from mascot.core.files import append_jsonl, atomic_write_text, jsonl_text, read_jsonl, write_jsonl
from mascot.core.situations import Situation


def start_request(sit: Situation, mode: str) -> cpb.StartConversationRequest:
    """StartConversation for ``sit`` in ``mode`` (``support`` | ``meeting``): its context seeds the conversation and
    its id (first 256 characters) is the ``source_id``."""
    ctx = [dpb.ContextUtterance(speaker=s, content=c) for s, c in sit.context]
    return cpb.StartConversationRequest(mode=enum_value(cpb.Mode, mode), context=ctx, source_id=sit.id[:256])


def selfplay_request(conv_id: str, sit: Situation, agent_turns: int, seed: int) -> cpb.RunSelfPlayRequest:
    """RunSelfPlay of conversation ``conv_id``: ``sit``'s opening, and its situation and emotion for the simulated
    user."""
    return cpb.RunSelfPlayRequest(conversation_id=conv_id, opening_text=sit.opening,
                                  user=dpb.UserSimulation(situation=sit.situation, emotion=sit.emotion),
                                  agent_turns=agent_turns, seed=seed)


def _end_reason(reason: int) -> str:
    """``transcripts.jsonl``'s ``end_reason`` of a RoundEndReason: its name, "" when unspecified or unknown."""
    return "" if reason == cpb.ROUND_END_REASON_UNSPECIFIED else enum_name(cpb.RoundEndReason, reason, default="")


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


async def started(stub: Any, request: cpb.StartConversationRequest, max_wait_s: float = ADMISSION_WAIT_S,
                  sleep: Callable[[float], Any] = asyncio.sleep) -> cpb.Conversation:
    """StartConversation, made again after the wait the gateway asks for (``retry-after``) while it refuses the
    caller's new conversations as over its limit (RESOURCE_EXHAUSTED: ``security.conversations_per_minute``).

    Raises:
        grpc.aio.AioRpcError: any other status, or a refusal past ``max_wait_s`` seconds of waiting.
    """
    import grpc

    from mascot.core.retry import overload_wait_s

    waited = 0.0
    while True:
        try:
            return (await stub.StartConversation(request)).conversation
        except grpc.aio.AioRpcError as e:
            wait = overload_wait_s(e)
            if wait is None or waited + wait > max_wait_s:
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
    """One ``transcripts.jsonl`` object from a stored conversation (fields in docs/commands.md), naming ``model``."""
    c = resp.conversation
    turns = []
    for t in c.turns:
        agent = t.role == dpb.ROLE_AGENT
        turns.append({
            "index": t.index, "role": "agent" if agent else "user", "persona_id": t.persona_id or None,
            "directive": {"persona_id": t.directive.persona_id, "action": t.directive.action, "tone": t.directive.tone,
                          "source": directive_source_name(t.directive.source), "raw": t.directive.raw}
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
    """``summary.json``: counts, persona counts, agent turns per adapter version (``anchor--v2``, ``base``), director
    fallback rate, turn latency p50/p95 (agent turns)."""
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
        "adapter_versions": dict(sorted(Counter(t["adapter_version"] or "base" for t in agent).items())),
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


#: What a failed conversation's entry in ``summary.json``'s ``failed`` holds, and the fix the message names.
RETRY_HINT = ("lower --concurrency (fewer conversations decoded at once) or raise server.call_timeout_s, then run the "
              "same command again: it keeps the finished conversations and runs only the failed ones")


class RunIncomplete(Exception):
    """Some conversations of a run failed; the others were written (``summary`` holds ``failed``).

    Attributes:
        summary: The summary written to ``summary.json``.
    """

    def __init__(self, summary: dict) -> None:
        failed = summary["failed"]
        names = ", ".join(f"#{f['index']} {f['source_id'] or '?'} ({f['code']})" for f in failed[:5])
        more = f" and {len(failed) - 5} more" if len(failed) > 5 else ""
        super().__init__(f"{len(failed)} of {summary['conversations'] + len(failed)} conversations failed: "
                         f"{names}{more}; {RETRY_HINT}")
        self.summary = summary


#: Journal of a run in progress in its output folder: one finished conversation's transcript line per line, appended
#: and flushed as each finishes, removed once ``transcripts.jsonl`` and ``summary.json`` are written. A run killed
#: before that (Ctrl-C, SIGKILL, a lost node) leaves it, and the same command resumes from it.
JOURNAL = ".transcripts.partial.jsonl"


def previous_lines(out: Path, situations: list[Situation], mode: str) -> dict[int, dict]:
    """The transcript lines of an earlier run in ``out`` to keep: those of an incomplete run (its ``summary.json``
    lists failed conversations) and those of an interrupted run (its journal, :data:`JOURNAL`, is still there), each
    line matched to the situation at the same position with the same ``source_id`` and ``mode``. A complete or
    unreadable earlier run keeps nothing (the run starts over).

    Returns:
        Situation index -> transcript line.
    """
    lines: list[dict] = []
    try:
        summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
        if isinstance(summary, dict) and summary.get("failed"):
            lines = read_jsonl(out / "transcripts.jsonl")
    except (OSError, ValueError):
        pass
    try:
        lines += read_jsonl(out / JOURNAL)  # a line torn by a kill is cut off
    except (OSError, ValueError):
        pass
    kept: dict[int, dict] = {}
    for ln in lines:
        i = ln.get("situation_index")
        if (isinstance(i, int) and 0 <= i < len(situations) and ln.get("mode") == mode
                and ln.get("source_id") == situations[i].id[:256]):
            kept[i] = ln
    return kept


async def run_job(target: str, situations: list[Situation], mode: str, out_dir: str | Path, *, agent_turns: int = 0,
                  seed: int = 0, progress: Callable[[], None] | None = None, max_message_bytes: int = 16 << 20,
                  concurrency: int = 1, model: dict | None = None, resume: bool = True) -> dict:
    """Run one self-play conversation per situation against the gateway at ``target``; write the outputs.

    A conversation whose call fails (a deadline passed under load, the gateway unavailable, ...) is recorded with its
    status and the others go on; every finished conversation is written. Run again with the same arguments and
    ``out_dir``, a run whose ``summary.json`` lists failures resumes: its finished conversations are kept (same
    situation position, id and mode) and only the others run (with the seeds they had). Each finished conversation is
    also appended to a journal (:data:`JOURNAL`) as it finishes, so a run killed outright (Ctrl-C, SIGKILL) resumes
    the same way.

    Args:
        concurrency: Conversations in flight at once (>= 1); outputs keep the situations' order either way.
        model: ``{"name", "digest", ...}`` of the model serving the gateway, written into every transcript line and
            the summary (:func:`mascot.core.engine.default_model.model_identity`); None leaves it out.
        resume: Keep the finished conversations of an incomplete earlier run in ``out_dir`` (False starts over).

    Files are written to temporary names and renamed, so a crashed run leaves no half-written artefact.

    Returns:
        The summary dict (also written to ``summary.json``): ``failed`` is empty.

    Raises:
        RunIncomplete: some conversations failed; the others and the summary (with ``failed``: index, source id,
            conversation id, status code and message of each) were written.
        ValueError: ``concurrency`` below 1.
    """
    import grpc

    from mascot.core.server import channel

    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    kept = previous_lines(out, situations, mode) if resume else {}
    lines: list[dict | None] = [kept.get(i) for i in range(len(situations))]
    journal = out / JOURNAL
    write_jsonl(journal, [kept[i] for i in sorted(kept)])  # rewritten with what is kept
    failed: list[dict] = []
    gate = asyncio.Semaphore(concurrency)
    async with channel(target, max_message_bytes) as ch:
        stub = cpb_grpc.ConversationServiceStub(ch)

        async def one(i: int, sit: Situation) -> None:
            async with gate:
                conv_id = ""
                try:
                    conv = await started(stub, start_request(sit, mode))
                    conv_id = conv.id
                    reason = ""
                    events = admitted(lambda: stub.RunSelfPlay(selfplay_request(conv.id, sit, agent_turns, seed + i)))
                    async for ev in events:
                        if ev.event.WhichOneof("event") == "round_completed":
                            reason = _end_reason(ev.event.round_completed.reason)
                    resp = await read_conversation(stub, conv.id, include_think=True)
                except grpc.aio.AioRpcError as e:
                    failed.append({"index": i, "source_id": sit.id[:256], "conversation_id": conv_id,
                                   "code": e.code().name, "message": (e.details() or "")[:500]})
                    return
                line = transcript_line(resp, mode, model, reason)
                line["situation_index"] = i
                lines[i] = line
                append_jsonl(journal, line)
                if progress:
                    progress()

        if progress:
            for _ in kept:
                progress()
        tasks = [asyncio.create_task(one(i, sit)) for i, sit in enumerate(situations) if i not in kept]
        try:
            await asyncio.gather(*tasks)
        except BaseException:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise
    done = [ln for ln in lines if ln is not None]
    summary = summarize(done)
    summary["resumed"] = len(kept)
    summary["failed"] = sorted(failed, key=lambda f: f["index"])
    _atomic_write(out / "transcripts.jsonl", jsonl_text(done))
    _atomic_write(out / "summary.json", json.dumps(summary, indent=2) + "\n")
    journal.unlink(missing_ok=True)
    if failed:
        raise RunIncomplete(summary)
    return summary
