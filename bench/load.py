"""Load on the gateway: N concurrent conversations x R rounds on loopback with the tiny model.

The embedded stack (gateway, director, speaker sharing one engine built from the default config) runs in this
process on 127.0.0.1; every conversation sends its R messages one after another, all conversations at once, within
the configured capacity (``limits.max_active_rounds``). Afterwards every acknowledged turn (the RoundStarted user
turn and every TurnCompleted) is looked up in GetConversation: lost turns and errors must both be 0. Then the
overload phase offers ``--overload`` x capacity rounds at once on new conversations: the excess must be refused with
RESOURCE_EXHAUSTED (retry-after) and every conversation must hold whole rounds or nothing.

    python bench/load.py                     # full size: 64 conversations x 10 rounds, capacity 64
    python bench/load.py --size small        # CI: 4 x 2, capacity 4, 1 agent turn per round, short replies
    python bench/load.py --conversations 16 --rounds 3 --capacity 16 --model DIR

Prints ``rounds:``, ``round latency:``, ``throughput:``, ``overload:`` and ``result: PASS|FAIL`` lines; exits 1 on
FAIL (an error, a lost or half-stored turn, no refusal under overload), 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "services"))

#: Presets. ``full`` is the issue's size with the default config but a capacity that admits all 64 conversations
#: (``limits.max_active_rounds`` defaults to 16, one batch of the CPU engine) and an engine batch of the same size, so
#: every admitted round's model call decodes in the running batch instead of queueing behind it (a capacity above
#: the engine's batch is not a capacity the deployment has; see docs/operations.md, "Limits"). ``small`` keeps
#: CI under a minute on 2 cores: fewer conversations, one agent turn per round, short replies and directives (the
#: tiny model's constrained directives otherwise run to max_action_chars); every check is the same.
SIZES = {
    "full": dict(conversations=64, rounds=10, capacity=64, overrides={"engine": {"max_batch_size": 64}}),
    "small": dict(conversations=4, rounds=2, capacity=4, overrides={
        "dialogue": {"agent_turns_per_round": 1}, "speaker": {"max_tokens": 16},
        "director": {"max_action_chars": 24, "max_tone_chars": 12}}),
}
MESSAGES = ["I failed my driving test again and I feel stupid.", "My best friend is moving to another country.",
            "I finally finished my thesis!", "I can't stop worrying about my mother's health.",
            "Someone stole my bike this morning.", "I got promoted but I'm scared I'm not ready.",
            "My sister and I had a big argument.", "I have a job interview tomorrow."]


@dataclass
class Tally:
    """What the clients saw: acknowledged turns per conversation, round latencies, errors by status."""

    acked: dict[str, dict[int, tuple[int, str, str]]] = field(default_factory=dict)  # conv -> idx -> ...
    latencies: list[float] = field(default_factory=list)
    errors: Counter = field(default_factory=Counter)
    delta_mismatches: int = 0
    rounds_ok: int = 0
    agent_turns: int = 0
    director_retries: int = 0
    director_fallbacks: int = 0
    turn_s: list[float] = field(default_factory=list)  # stored agent-turn latencies (director + speaker)
    director_s: list[float] = field(default_factory=list)  # of which the director's decision


async def one_round(stub, cpb, conv_id: str, text: str, key: str, tally: Tally, timeout: float) -> list | None:
    """Send one message; record its acknowledged turns. Returns the events, or None after an RPC error."""
    import grpc

    t0 = time.perf_counter()
    events = []
    try:
        async for r in stub.SendMessage(cpb.SendMessageRequest(conversation_id=conv_id, text=text,
                                                               idempotency_key=key), timeout=timeout):
            events.append(r.event)
            acked = tally.acked.setdefault(conv_id, {})
            if r.event.HasField("round_started"):
                t = r.event.round_started.user_turn
                acked[t.index] = (t.role, t.persona_id, t.text)
            elif r.event.HasField("turn_completed"):
                t = r.event.turn_completed.turn
                acked[t.index] = (t.role, t.persona_id, t.text)
                joined = "".join(e.turn_delta.text for e in events
                                 if e.HasField("turn_delta") and e.turn_delta.index == t.index)
                tally.delta_mismatches += joined != t.text  # the streamed deltas join to the stored text
    except grpc.aio.AioRpcError as e:
        tally.errors[e.code().name] += 1
        return None
    if not events or not events[-1].HasField("round_completed"):
        tally.errors["NO_ROUND_COMPLETED"] += 1
        return None
    tally.latencies.append(time.perf_counter() - t0)
    tally.rounds_ok += 1
    tally.agent_turns += events[-1].round_completed.agent_turns
    return events


async def check_stored(stub, cpb, tally: Tally) -> tuple[int, int]:
    """``(lost, unacknowledged)``: acknowledged turns missing or different in GetConversation, and stored turns no
    client saw acknowledged."""
    lost = extra = 0
    for conv_id, acked in tally.acked.items():
        got = await stub.GetConversation(cpb.GetConversationRequest(conversation_id=conv_id))
        tally.director_retries += got.director_retries
        tally.director_fallbacks += got.director_fallbacks
        for t in got.conversation.turns:
            if t.role == 2:  # agent turns (ROLE_AGENT): where a turn's time goes
                tally.turn_s.append(t.timings.latency.ToTimedelta().total_seconds())
                tally.director_s.append(t.timings.director.ToTimedelta().total_seconds())
        stored = {t.index: (t.role, t.persona_id, t.text) for t in got.conversation.turns}
        lost += sum(1 for i, v in acked.items() if stored.get(i) != v)
        extra += sum(1 for i in stored if i not in acked)
    return lost, extra


def pct(values: list[float], p: int) -> float:
    """The ``p``-th percentile (inclusive method; the only value for one sample)."""
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[p - 1]


async def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", choices=sorted(SIZES), default="full", help="preset: full 64x10, small 4x2")
    ap.add_argument("--conversations", type=int, default=0, help="concurrent conversations (default: the preset)")
    ap.add_argument("--rounds", type=int, default=0, help="messages per conversation (default: the preset)")
    ap.add_argument("--capacity", type=int, default=0,
                    help="limits.max_active_rounds (default: the preset's, else the config default)")
    ap.add_argument("--overload", type=float, default=4.0, help="offered rounds in the overload phase, as a multiple "
                    "of capacity (0 skips the phase)")
    ap.add_argument("--max-tokens", type=int, default=0, help="speaker.max_tokens (default: the preset's, else the "
                    "config default)")
    ap.add_argument("--batch", type=int, default=0, help="engine.max_batch_size (default: the preset's, else the "
                    "config default)")
    ap.add_argument("--model", default="", help="model dir (default: build the tiny Qwen3)")
    ap.add_argument("--timeout", type=float, default=900.0, help="deadline of each SendMessage, in seconds")
    args = ap.parse_args()

    from mascot.core.config import LimitsConfig, MascotConfig

    preset = SIZES[args.size]
    n = args.conversations or preset["conversations"]
    rounds = args.rounds or preset["rounds"]
    capacity = args.capacity or preset.get("capacity") or LimitsConfig().max_active_rounds
    overrides = {k: dict(v) for k, v in preset.get("overrides", {}).items()}
    if args.max_tokens:
        overrides.setdefault("speaker", {})["max_tokens"] = args.max_tokens
    if args.batch:
        overrides.setdefault("engine", {})["max_batch_size"] = args.batch
    if n < 1 or rounds < 1 or capacity < 1:
        print("--conversations, --rounds and --capacity must be at least 1", file=sys.stderr)
        return 2
    if n > capacity:
        print(f"--conversations {n} exceeds the capacity {capacity}: the load phase runs within capacity; raise "
              "--capacity", file=sys.stderr)
        return 2

    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    from mascot.api.conversation.v1 import conversation_pb2 as cpb
    from mascot.api.conversation.v1 import conversation_pb2_grpc as cpb_grpc
    from mascot.api.dialogue.v1 import dialogue_pb2 as dpb
    from mascot.core.engine.tiny import build_tiny_qwen3
    from mascot.core.server import channel
    from mascot.app.stack import start_stack

    tmp = Path(tempfile.mkdtemp(prefix="mascot-load-"))
    model = args.model or str(build_tiny_qwen3(tmp / "tiny"))
    cfg = MascotConfig(server={"gateway_port": 0, "metrics_port": 0}, store={"url": f"sqlite:///{tmp}/load.db"},
                       engine={"model": model, **overrides.pop("engine", {})},
                       limits={"max_active_rounds": capacity, "max_rounds_per_caller": capacity},
                       # one local client stands for every user: no per-caller limit of new conversations
                       security={"conversations_per_minute": 0},
                       guard={"enabled": False},
                       director={"check_content": False, "rest_turns": 0, **overrides.pop("director", {})},
                       **overrides)
    stack = await start_stack(cfg)
    ch = channel(stack.target("gateway"), cfg.server.max_message_bytes)
    stub = cpb_grpc.ConversationServiceStub(ch)
    ok = True
    try:
        print(f"load: {n} conversations x {rounds} rounds, capacity {capacity} (limits.max_active_rounds), "
              f"agent_turns_per_round {cfg.dialogue.agent_turns_per_round}, engine {cfg.engine.kind} "
              f"batch {cfg.engine.max_batch_size}, speaker max_tokens {cfg.speaker.max_tokens}; guard off (reply "
              "checks and director content rules: speed only on the tiny random model; 0 regenerations)", flush=True)
        warm = (await stub.StartConversation(cpb.StartConversationRequest(mode=cpb.MODE_SUPPORT))).conversation
        await one_round(stub, cpb, warm.id, "warm up", "warm", Tally(), args.timeout)  # first-call costs out

        convs = [(await stub.StartConversation(cpb.StartConversationRequest(mode=cpb.MODE_SUPPORT))).conversation.id
                 for _ in range(n)]
        tally = Tally()

        async def converse(i: int, conv_id: str) -> None:
            for k in range(rounds):
                await one_round(stub, cpb, conv_id, MESSAGES[(i + k) % len(MESSAGES)], f"r{k}", tally, args.timeout)

        t0 = time.perf_counter()
        await asyncio.gather(*(converse(i, c) for i, c in enumerate(convs)))
        wall = time.perf_counter() - t0
        lost, extra = await check_stored(stub, cpb, tally)
        errors = sum(tally.errors.values())
        acked = sum(len(v) for v in tally.acked.values())
        print(f"rounds: {tally.rounds_ok} ok of {n * rounds}, errors {errors} {dict(tally.errors) or ''}; "
              f"acknowledged turns {acked}, lost turns {lost}, unacknowledged stored turns {extra}, "
              f"delta mismatches {tally.delta_mismatches}".rstrip())
        lat = sorted(tally.latencies)
        if lat:
            print(f"round latency: p50 {pct(lat, 50):.2f} s, p95 {pct(lat, 95):.2f} s, p99 {pct(lat, 99):.2f} s, "
                  f"max {lat[-1]:.2f} s")
        print(f"throughput: {tally.rounds_ok} rounds in {wall:.1f} s = {tally.rounds_ok / wall:.2f} rounds/s, "
              f"{tally.agent_turns / wall:.2f} agent turns/s")
        if tally.turn_s:
            print(f"agent turn: median {statistics.median(tally.turn_s):.2f} s, of which director "
                  f"{statistics.median(tally.director_s):.2f} s; director retries {tally.director_retries}, "
                  f"fallbacks {tally.director_fallbacks}")
        ok = errors == 0 and lost == 0 and extra == 0 and tally.delta_mismatches == 0 and tally.rounds_ok == n * rounds

        if args.overload > 0:
            offered = int(round(args.overload * capacity))
            over = [(await stub.StartConversation(cpb.StartConversationRequest(mode=cpb.MODE_SUPPORT))).conversation.id
                    for _ in range(offered)]
            otally = Tally()
            before = stack.metrics.registry.get_sample_value("mascot_rpc_requests_total", {
                "component": "gateway", "rpc": "SendMessage", "code": "RESOURCE_EXHAUSTED"}) or 0.0
            results = await asyncio.gather(*(one_round(stub, cpb, c, MESSAGES[i % len(MESSAGES)], "o1", otally,
                                                       args.timeout) for i, c in enumerate(over)))
            refused = otally.errors.pop("RESOURCE_EXHAUSTED", 0)
            other = sum(otally.errors.values())
            half = 0
            for conv_id, events in zip(over, results):
                turns = (await stub.GetConversation(cpb.GetConversationRequest(
                    conversation_id=conv_id))).conversation.turns
                if events is None:  # refused: nothing stored
                    half += len(turns) != 0
                else:  # admitted: the user turn and exactly the acknowledged agent turns
                    done = events[-1].round_completed.agent_turns
                    acked = otally.acked.get(conv_id, {})
                    half += not (len(turns) == 1 + done and turns[0].role == dpb.ROLE_USER
                                 and all(acked.get(t.index) == (t.role, t.persona_id, t.text) for t in turns))
            counted = (stack.metrics.registry.get_sample_value("mascot_rpc_requests_total", {
                "component": "gateway", "rpc": "SendMessage", "code": "RESOURCE_EXHAUSTED"}) or 0.0) - before
            print(f"overload: {offered} offered at {args.overload:g}x capacity: {otally.rounds_ok} admitted, "
                  f"{refused} RESOURCE_EXHAUSTED (metric {counted:.0f}), {other} other errors "
                  f"{dict(otally.errors) or ''}; half-stored conversations {half}".rstrip())
            ok = ok and refused > 0 and other == 0 and half == 0 and refused == counted \
                and otally.rounds_ok + refused == offered
    finally:
        await ch.close()
        await stack.stop(0)
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"result: {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
