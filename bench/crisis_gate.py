"""Per-message latency of the safety gate's check, the trained detector against the rules alone, side by side.

Each message is checked on its own (one ``SafetyGate.detect`` call, as the gateway does for every user message),
torch on ``--threads`` threads (2: the project's CPU budget), the two gates interleaved message by message after a
warm-up. Messages: the labelled training set's texts in a fixed shuffled order (lengths from 2 words to 3
sentences), and every ``--long-every``-th message replaced by a long one: six training texts joined (about 80-150
words, 6-15 sentences), which the detector also reads sentence by sentence (up to 12 windows beside the whole
message: its costliest path), then the held-out sets' messages as their writers wrote them
(``tests/reliability/crisis_holdout*.yaml``). Prints p50, p95 and max in milliseconds for both gates over all
messages and over the long ones alone, and the goal (trained p95 < 50 ms on 2 cores) three times: on the labelled
messages (the lengths people write in chat), on the held-out messages and on the mix with one message in K long.

    python bench/crisis_gate.py [--messages N] [--threads T] [--long-every K]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "services"))

GOAL_P95_MS = 50.0


def pct(xs: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``xs``, nearest rank."""
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(q * len(s) + 0.5) - 1))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--messages", type=int, default=300, help="messages checked by each gate")
    ap.add_argument("--threads", type=int, default=2, help="torch threads")
    ap.add_argument("--long-every", type=int, default=5, help="every K-th message is a long one (0: none)")
    args = ap.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    from mascot.core.config import SafetyConfig
    from mascot.core.personas import PersonaCatalog
    from mascot.gateway.crisis_model import load_examples
    from mascot.gateway.safety import SafetyGate

    catalog = PersonaCatalog.load()
    gates = {"trained": SafetyGate(SafetyConfig(), catalog),
             "rules": SafetyGate(SafetyConfig(classifier="none"), catalog)}
    texts = [e.text for e in load_examples()]
    random.Random(0).shuffle(texts)
    texts = (texts * (args.messages // len(texts) + 1))[:args.messages]
    long_idx = set(range(args.long_every - 1, len(texts), args.long_every)) if args.long_every > 0 else set()
    for i in sorted(long_idx):
        texts[i] = " ".join(texts[(i + j * 37) % len(texts)].rstrip(".!? ") + "." for j in range(6))
    import yaml

    held_out = [d["text"] for f in sorted((ROOT / "tests" / "reliability").glob("crisis_holdout*.yaml"))
                for d in yaml.safe_load(f.read_text(encoding="utf-8"))["items"]]
    for g in gates.values():  # warm-up
        for t in texts[:10]:
            g.detect(t)
    times: dict[str, list[float]] = {k: [] for k in gates}
    for t in texts:
        for name, g in gates.items():
            t0 = time.perf_counter()
            g.detect(t)
            times[name].append((time.perf_counter() - t0) * 1000)
    held_times: list[float] = []
    for t in held_out:
        t0 = time.perf_counter()
        gates["trained"].detect(t)
        held_times.append((time.perf_counter() - t0) * 1000)
    for name, xs in times.items():
        print(f"{name}: {len(xs)} messages, p50 {statistics.median(xs):.1f} ms, p95 {pct(xs, 0.95):.1f} ms, "
              f"max {max(xs):.1f} ms")
    short = [x for i, x in enumerate(times["trained"]) if i not in long_idx]
    if long_idx:
        for name, xs in times.items():
            ys = [x for i, x in enumerate(xs) if i in long_idx]
            words = statistics.median(len(texts[i].split()) for i in long_idx)
            print(f"{name} long: {len(ys)} messages (median {words:.0f} words), p50 {statistics.median(ys):.1f} ms, "
                  f"p95 {pct(ys, 0.95):.1f} ms, max {max(ys):.1f} ms")
        print(f"trained labelled: {len(short)} messages, p50 {statistics.median(short):.1f} ms, "
              f"p95 {pct(short, 0.95):.1f} ms")
    p95 = pct(short, 0.95)
    print(f"trained p95 = {p95:.1f} ms on the labelled messages (goal < {GOAL_P95_MS:.0f} ms on {args.threads} "
          f"threads): {'PASS' if p95 < GOAL_P95_MS else 'MISSED'}")
    if held_times:
        p95_held = pct(held_times, 0.95)
        print(f"trained p95 = {p95_held:.1f} ms on the {len(held_times)} held-out messages as written (p50 "
              f"{statistics.median(held_times):.1f} ms; goal < {GOAL_P95_MS:.0f} ms): "
              f"{'PASS' if p95_held < GOAL_P95_MS else 'MISSED'}")
    if long_idx:
        p95_all = pct(times["trained"], 0.95)
        print(f"trained p95 = {p95_all:.1f} ms with one message in {args.long_every} long (goal < {GOAL_P95_MS:.0f} "
              f"ms): {'PASS' if p95_all < GOAL_P95_MS else 'MISSED'}")

if __name__ == "__main__":
    main()
