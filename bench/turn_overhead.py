"""Per-turn wall time through the gRPC services vs the same engine calls made in-process.

Same tiny model, same inputs, the same per-turn sampling seeds so both paths generate the same tokens, measured side
by side
in one run (interleaved round by round, the order alternating), each path on its own engine instance so neither finds
its prompts in the other's prefix cache. Prints the ratio; goal <= 1.05.

    python bench/turn_overhead.py [--rounds N] [--model DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "services"))

MESSAGES = ["I failed my driving test again and I feel stupid.", "My best friend is moving to another country.",
            "I finally finished my thesis!", "I can't stop worrying about my mother's health.",
            "Someone stole my bike this morning.", "I got promoted but I'm scared I'm not ready."]


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=12, help="user messages (3 agent turns each) per path")
    ap.add_argument("--model", default="", help="model dir (default: build the tiny Qwen3)")
    args = ap.parse_args()

    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    from mascot.api.conversation.v1 import conversation_pb2 as cpb
    from mascot.api.conversation.v1 import conversation_pb2_grpc as cpb_grpc
    from mascot.core.config import MascotConfig
    from mascot.core.dialogue import HistoryTurn, directive_message
    from mascot.core.engine.tiny import build_tiny_qwen3
    from mascot.core.engine.transformers import TransformersEngine
    from mascot.core.personas import PersonaCatalog
    from mascot.core.server import channel
    from mascot.director.decide import decide
    from mascot.speaker.reply import ReplyOutcome, RetryPolicy, persona_reply
    from mascot.gateway.store import text_digest
    from mascot.app.stack import start_stack

    tmp = Path(tempfile.mkdtemp(prefix="mascot-bench-"))
    model = args.model or str(build_tiny_qwen3(tmp / "tiny"))
    # One engine per path: both paths send the same prompts, so with one shared prefix cache the path that runs second
    # in a round would find its whole prompt cached by the first (a gain that grows with the history, not a gRPC
    # cost). Each path keeps its own cache, as one serving process does across turns.
    engine = TransformersEngine(model, max_model_len=4096, batch_wait_ms=0)
    inproc_engine = TransformersEngine(model, max_model_len=4096, batch_wait_ms=0)
    await engine.start()
    await inproc_engine.start()
    # a speed bench on the tiny random model: the reply checks and the director's content rules are off (its text
    # fails them all; with them on the ratio would count regenerations, not the gRPC overhead)
    # the safety gate's trained detector is off too: its per-message cost (bench/crisis_gate.py) is not transport
    cfg = MascotConfig(server={"gateway_port": 0}, store={"url": f"sqlite:///{tmp}/bench.db"},
                       speaker={"temperature": 0.7, "max_tokens": 48}, guard={"enabled": False},
                       director={"check_content": False, "rest_turns": 0}, safety={"classifier": "none"})
    print("guard: off (reply checks and director content rules; speed only), regenerations: 0 by construction")
    stack = await start_stack(cfg, engine=engine)
    catalog = PersonaCatalog.load()
    roster = catalog.in_set("support")
    ch = channel(stack.target("gateway"))
    stub = cpb_grpc.ConversationServiceStub(ch)

    async def grpc_round(conv_id: str, text: str, key: str) -> tuple[float, int, list[str]]:
        t0 = time.perf_counter()
        texts = []
        request = cpb.SendMessageRequest(conversation_id=conv_id, text=text, idempotency_key=key)
        async for r in stub.SendMessage(request):
            if r.event.HasField("turn_completed"):
                texts.append(r.event.turn_completed.turn.text)
        return time.perf_counter() - t0, len(texts), texts

    async def inproc_round(history: list, text: str, round_seed: int) -> tuple[float, int, list[str]]:
        t0 = time.perf_counter()
        history.append(HistoryTurn("user", text))
        texts = []
        for _ in range(cfg.dialogue.agent_turns_per_round):
            d = await decide(inproc_engine, roster, history, [], cfg.director)
            card = catalog.get(d.directive.persona_id)
            out = None
            async for item in persona_reply(inproc_engine, card, roster, history, [], d.directive.action,
                                            d.directive.tone,
                                            guard=cfg.guard.settings(), policy=RetryPolicy(max_attempts=1),
                                            repetition_penalty=cfg.speaker.repetition_penalty,
                                            frequency_penalty=cfg.speaker.frequency_penalty,
                                            max_tokens=cfg.speaker.max_tokens, temperature=cfg.speaker.temperature,
                                            top_p=cfg.speaker.top_p, seed=round_seed * 7919 + len(history) * 13,
                                            adapter=None):
                if isinstance(item, ReplyOutcome):
                    out = item
            dt = d.directive
            history.append(HistoryTurn("agent", out.text, card.id,
                                       directive_message(card.name, dt.action, dt.tone, d.source, d.raw)))
            texts.append(out.text)
        return time.perf_counter() - t0, len(texts), texts

    conv = (await stub.StartConversation(cpb.StartConversationRequest(mode=cpb.MODE_SUPPORT))).conversation
    await grpc_round(conv.id, "warm up", "warm")  # first-call costs (grammar compile, channel) out of the figures
    await inproc_round([], "warm up", 0)  # and the same for the in-process engine
    conv = (await stub.StartConversation(cpb.StartConversationRequest(mode=cpb.MODE_SUPPORT))).conversation
    history: list = []
    g_times, i_times, same = [], [], 0
    for k in range(args.rounds):
        msg = MESSAGES[k % len(MESSAGES)]
        seed = int(text_digest(conv.id + f"k{k}")[:8], 16)
        if k % 2 == 0:  # the order alternates, so neither path always runs on a machine the other just warmed
            gt, gn, gtexts = await grpc_round(conv.id, msg, f"k{k}")
            it, inn, itexts = await inproc_round(history, msg, seed)
        else:
            it, inn, itexts = await inproc_round(history, msg, seed)
            gt, gn, gtexts = await grpc_round(conv.id, msg, f"k{k}")
        g_times.append(gt / max(gn, 1))
        i_times.append(it / max(inn, 1))
        same += gtexts == itexts
        if k == 0 and gtexts != itexts:
            print("first differing round:", [len(x) for x in gtexts], [len(x) for x in itexts], file=sys.stderr)
    await ch.close()
    await stack.stop(0)
    await engine.close()
    await inproc_engine.close()
    g, i = statistics.median(g_times), statistics.median(i_times)
    paired = statistics.median(a / b for a, b in zip(g_times, i_times))
    print(f"turns per path: {3 * args.rounds}; identical outputs in {same}/{args.rounds} rounds")
    print(f"per-turn wall time: gRPC services {g * 1000:.1f} ms, in-process {i * 1000:.1f} ms (medians)")
    print(f"paired per-round ratio: median {paired:.3f}, range {min(a / b for a, b in zip(g_times, i_times)):.3f}"
          f"-{max(a / b for a, b in zip(g_times, i_times)):.3f}")
    print(f"ratio gRPC / in-process = {sum(g_times) / sum(i_times):.3f} (goal <= 1.05; total per-turn time over the "
          "rounds)")


if __name__ == "__main__":
    asyncio.run(main())
