"""One shared engine for director and speaker against one engine each: memory and throughput, side by side in one run.

The same workload runs against two deployments of the model services, each started as real `mascot serve-model`
processes on loopback:

- shared: ONE process serving director and speaker on one engine (`mascot serve-model director,speaker`), the chart's
  default generation service;
- separate: two processes, `mascot serve-model director` and `mascot serve-model speaker`, one engine each (the
  one-service-per-role form).

Workload: the gateway's per-turn traffic, sent by this script: `--turns` agent turns, `--concurrency` at a time,
each a NextDirective call and then a GenerateReply stream for the persona it picked (greedy, so both deployments
generate the same tokens). Memory: the resident set of the serving processes and their children (vLLM's engine core)
after the workload (VmRSS, summed; VmHWM, each process's peak, summed, alongside). Throughput: agent turns per
second. The CPU threads are split fairly: the shared process gets `--threads`, each separate process half of them.
Prints

    memory separate / shared = X (goal > 1)
    throughput shared / separate = Y (indicative on CPU; the GPU figure belongs to bench/gpu_check.py)

    python bench/shared_engine.py [--size small|full] [--model DIR|tiny] [--turns N] [--concurrency C]
                                  [--engine transformers|vllm] [--memory-share F]

With ``--engine vllm`` each serving process runs a vLLM engine; ``--memory-share`` is the shared process's
``engine.gpu_memory_utilization`` (the fraction of GPU memory, or on CPU of NUMA node 0 memory, for weights and KV
cache) and each separate process gets half of it, so both deployments hold the same KV-cache budget in all.
``bench/gpu_check.py`` runs it this way on a GPU machine, where the throughput ratio is the real one.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "services"))

MESSAGES = ["I failed my driving test again and I feel stupid.", "My best friend is moving to another country.",
            "I finally finished my thesis!", "I can't stop worrying about my mother's health.",
            "Someone stole my bike this morning.", "I got promoted but I'm scared I'm not ready."]
SIZES = {"small": {"turns": 8, "concurrency": 4}, "full": {"turns": 48, "concurrency": 8}}


def process_tree(pid: int) -> list[int]:
    """``pid`` and every descendant (vLLM runs its engine core in a child process), from ``/proc`` (Linux)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        for task in Path(f"/proc/{p}/task").glob("*"):
            try:
                todo += [int(c) for c in (task / "children").read_text().split()]
            except OSError:
                pass
    return out


def proc_memory(pid: int) -> tuple[int, int]:
    """``(VmRSS, VmHWM)`` in bytes of a process and its descendants, summed, from ``/proc/<pid>/status`` (Linux)."""
    rss = hwm = 0
    for p in process_tree(pid):
        try:
            lines = Path(f"/proc/{p}/status").read_text().splitlines()
        except OSError:  # ended meanwhile
            continue
        for line in lines:
            key, _, value = line.partition(":")
            if key == "VmRSS":
                rss += int(value.split()[0]) * 1024
            elif key == "VmHWM":
                hwm += int(value.split()[0]) * 1024
    return rss, hwm


class ModelProcess:
    """A `mascot serve-model` subprocess on free loopback ports; :meth:`start` returns once it reports SERVING."""

    def __init__(self, components: str, config: Path) -> None:
        self.components, self.config = components, config
        self.proc: asyncio.subprocess.Process | None = None
        self.grpc_port = 0
        self._drain: asyncio.Task | None = None

    async def start(self, timeout: float = 300.0) -> None:
        """Start the process, read its bound ports, and wait until its gRPC health is SERVING.

        Raises:
            RuntimeError: it exited before printing its ports.
            asyncio.TimeoutError: not SERVING within ``timeout`` seconds.
        """
        from grpc_health.v1 import health_pb2, health_pb2_grpc

        from mascot.core.server import channel

        env = {**os.environ, "PYTHONPATH": str(ROOT / "services"), "TOKENIZERS_PARALLELISM": "false"}
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "mascot.cli", "serve-model", self.components, "--port", "0", "--rest-port", "0",
            "--config", str(self.config), env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL)
        async def announced() -> dict:  # vLLM may log on stdout before the JSON line
            while line := await self.proc.stdout.readline():
                if line.startswith(b'{"component"'):
                    return json.loads(line)
            raise RuntimeError(f"serve-model {self.components} exited before binding (code {await self.proc.wait()})")

        self.grpc_port = (await asyncio.wait_for(announced(), timeout))["grpc_port"]
        # keep reading what it prints (logs): a full pipe would block the server
        self._drain = asyncio.create_task(self.proc.stdout.read())
        async with channel(self.target) as ch:
            async def serving() -> None:
                async for r in health_pb2_grpc.HealthStub(ch).Watch(health_pb2.HealthCheckRequest(service=""),
                                                                     wait_for_ready=True):
                    if r.status == health_pb2.HealthCheckResponse.SERVING:
                        return
            await asyncio.wait_for(serving(), timeout)

    @property
    def target(self) -> str:
        """``host:port`` of its gRPC port."""
        return f"127.0.0.1:{self.grpc_port}"

    async def stop(self) -> None:
        """SIGTERM, then wait up to 60 s (killed after that)."""
        if self.proc is not None and self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(self.proc.wait(), 60)
            except asyncio.TimeoutError:
                self.proc.kill()
                await self.proc.wait()
        if self._drain is not None:
            await self._drain


async def workload(director_target: str, speaker_target: str, turns: int, concurrency: int
                   ) -> tuple[float, list[str]]:
    """Run ``turns`` agent turns (NextDirective, then GenerateReply for the chosen persona), ``concurrency`` at a
    time; returns (wall seconds, reply texts in turn order)."""
    from mascot.api.dialogue.v1 import dialogue_pb2 as dpb
    from mascot.api.director.v1 import director_pb2 as dirpb
    from mascot.api.director.v1 import director_pb2_grpc
    from mascot.api.speaker.v1 import speaker_pb2 as spb
    from mascot.api.speaker.v1 import speaker_pb2_grpc
    from mascot.core.server import channel

    roster = ["empathetic_listener", "anchor", "catalyst", "action_guide", "beacon"]
    texts: list[str] = [""] * turns
    queue: asyncio.Queue = asyncio.Queue()
    for i in range(turns):
        queue.put_nowait(i)
    async with channel(director_target) as dch, channel(speaker_target) as sch:
        director, speaker = director_pb2_grpc.DirectorServiceStub(dch), speaker_pb2_grpc.SpeakerServiceStub(sch)

        async def worker() -> None:
            while not queue.empty():
                i = queue.get_nowait()
                history = [dpb.Turn(role=dpb.ROLE_USER, text=MESSAGES[i % len(MESSAGES)])]
                d = await director.NextDirective(dirpb.NextDirectiveRequest(persona_ids=roster, history=history),
                                                 timeout=600)
                req = spb.GenerateReplyRequest(persona_id=d.directive.persona_id, directive=d.directive,
                                               history=history, roster_persona_ids=roster)
                async for m in speaker.GenerateReply(req, timeout=600):
                    if m.HasField("final"):
                        texts[i] = m.final.text

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return time.perf_counter() - t0, texts


async def run_deployment(name: str, groups: list[str], configs: list[Path], args: argparse.Namespace) -> dict:
    """Start one deployment (a process per entry of ``groups``, each a comma-separated component list, with its
    config), warm it up, run the workload, read its memory, stop it, print and return the figures."""
    procs = [ModelProcess(g, c) for g, c in zip(groups, configs)]
    try:
        for p in procs:  # one at a time: two engines loading at once on 2 cores only slows both
            await p.start()
        target = {c: p.target for p in procs for c in p.components.split(",")}
        await workload(target["director"], target["speaker"], min(2, args.turns), 1)  # warm-up (first-call costs)
        wall, texts = await workload(target["director"], target["speaker"], args.turns, args.concurrency)
        mem = [proc_memory(p.proc.pid) for p in procs]
    finally:
        for p in procs:
            await p.stop()
    rss, hwm = sum(m[0] for m in mem), sum(m[1] for m in mem)
    print(f"{name}: {len(procs)} process(es) [{' | '.join(groups)}]: RSS {rss / 2**20:.0f} MiB (peak {hwm / 2**20:.0f} "
          f"MiB), {args.turns} turns in {wall:.1f} s = {args.turns / wall:.3f} turns/s", flush=True)
    return {"rss": rss, "hwm": hwm, "wall": wall, "texts": texts}


def write_config(path: Path, model: str, threads: int, tiny: bool, kind: str = "transformers",
                 memory_share: float | None = None) -> Path:
    """Write a serving process's MascotConfig (greedy speaker; the reply checks off for the tiny random model)."""
    engine: dict = {"model": model, "threads": threads, "kind": kind}
    if kind == "vllm" and memory_share:
        engine["gpu_memory_utilization"] = memory_share
    path.write_text(json.dumps({
        "engine": engine,
        "speaker": {"temperature": 0.0, "max_tokens": 48},
        # the tiny random model's text fails every reply check: with them on, the figures would count regenerations
        **({"guard": {"enabled": False}, "director": {"check_content": False, "constrained": False}}
           if tiny else {})}))
    return path


async def main() -> None:
    """Parse the options, run both deployments one after the other and print the ratios."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", choices=sorted(SIZES), default="full")
    ap.add_argument("--model", default="", help="model dir, 'tiny', or empty for the default real model")
    ap.add_argument("--turns", type=int, default=0, help="agent turns per deployment (default: the size's)")
    ap.add_argument("--concurrency", type=int, default=0, help="turns in flight (default: the size's)")
    ap.add_argument("--threads", type=int, default=2, help="torch threads of the shared process (each separate "
                    "process gets half, at least 1)")
    ap.add_argument("--engine", choices=("transformers", "vllm"), default="transformers")
    ap.add_argument("--memory-share", type=float, default=0.0, help="vllm: the shared process's "
                    "gpu_memory_utilization (each separate process gets half); 0 = the engine's default")
    args = ap.parse_args()
    args.turns = args.turns or SIZES[args.size]["turns"]
    args.concurrency = args.concurrency or SIZES[args.size]["concurrency"]
    if args.model == "tiny":
        from mascot.core.engine.tiny import build_tiny_qwen3

        args.model = str(build_tiny_qwen3(ROOT / ".cache" / "tiny-qwen3"))
        tiny = True
    else:
        tiny = False
    tmp = Path(tempfile.mkdtemp(prefix="mascot-shared-engine-"))
    half = max(1, args.threads // 2)
    print(f"model: {args.model or 'default (SmolLM2-135M-Instruct)'}; engine: {args.engine}; turns {args.turns}, "
          f"concurrency {args.concurrency}; threads: shared {args.threads}, separate {half} per process", flush=True)
    if tiny:
        print("tiny random model: reply checks and director content rules off (speed and memory only)")
    share = args.memory_share or None
    shared_cfg = write_config(tmp / "shared.yaml", args.model, args.threads, tiny, args.engine, share)
    sep_cfg = write_config(tmp / "separate.yaml", args.model, half, tiny, args.engine, share / 2 if share else None)
    separate = await run_deployment("separate", ["director", "speaker"], [sep_cfg, sep_cfg], args)
    shared = await run_deployment("shared", ["director,speaker"], [shared_cfg], args)
    same = sum(a == b for a, b in zip(shared["texts"], separate["texts"]))
    print(f"identical replies: {same}/{args.turns} (greedy; batching may differ in the last digits of a logit)")
    mem_ratio = separate["rss"] / shared["rss"]
    print(f"memory separate / shared = {mem_ratio:.2f} (goal > 1): {separate['rss'] / 2**20:.0f} MiB vs "
          f"{shared['rss'] / 2**20:.0f} MiB; peak {separate['hwm'] / 2**20:.0f} vs {shared['hwm'] / 2**20:.0f} MiB")
    print(f"throughput shared / separate = {separate['wall'] / shared['wall']:.2f} (indicative on CPU; the GPU figure "
          "belongs to bench/gpu_check.py)")
    print("result:", "PASS" if mem_ratio > 1 else "FAIL")


if __name__ == "__main__":
    asyncio.run(main())
