"""The speaker probe (``mascot eval probe``): every persona answers every situation directly, no director choosing.

Who speaks is fixed by construction, so the probe measures the speakers alone: each persona of the roster answers the
user's opening message of each situation

* ``fallback``: as the first reply, under the fallback directive (the standard Action and the card's default Tone);
* ``director``: under a directive the serving director writes *for that persona* (its grammar restricted to that
  persona with the other personas excluded, at its configured decoding, base director), the same directive for
  every system,

at serving decoding (the speaker settings and reply checks of the configuration), with the base model (system
``base``) and, with ``--adapters STORE``, with each persona's stable adapter of that store (system ``adapters``;
a persona without one answers with the base model, and the report says so). Replies are paired by (situation,
persona, condition): the same seed for every system.

Phases, each resumable after a kill (a rerun of the same command continues): directives
(``directives.jsonl``), replies (``replies.jsonl``), then the report (``probe-report.json``, ``probe-report.md``),
written atomically. The training ids of any served adapter (its ``manifest.json``) and of ``--training-manifest``
files are refused, as in ``mascot eval``.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from mascot.core.config import MascotConfig, deep_merge
from mascot.core.files import append_jsonl, atomic_write_text, read_jsonl
from mascot.core.situations import Situation, load_situations
from mascot.eval.data import check_no_overlap

#: Probe conditions, in report order.
CONDITIONS = ("fallback", "director")
#: Systems: the base model, and the adapter store's stable versions.
SYSTEMS = ("base", "adapters")


@dataclass
class ProbeOptions:
    """Options of one probe run (``mascot eval probe`` flags).

    Attributes:
        situations: Situation file (:func:`mascot.core.situations.load_situations`).
        out_dir: Output directory (resumable).
        mode: ``support`` or ``meeting``.
        limit: First N records; None for all.
        conditions: Subset of :data:`CONDITIONS`.
        adapters: Adapter store (path or URI) whose stable persona versions answer as system ``adapters``; "" for
            the base model only.
        manifests: Training manifests whose ids must not be probed.
        seed: Base seed.
        concurrency: Requests in flight.
    """

    situations: Path
    out_dir: Path
    mode: str = "support"
    limit: int | None = None
    conditions: list[str] = field(default_factory=lambda: list(CONDITIONS))
    adapters: str = ""
    manifests: list[Path] = field(default_factory=list)
    seed: int = 0
    concurrency: int = 16


def validate(opts: ProbeOptions) -> None:
    """Check options before any work.

    Raises:
        ValueError: unknown or repeated condition, bad mode, concurrency < 1, ``--out`` not a directory.
    """
    bad = [c for c in opts.conditions if c not in CONDITIONS]
    if bad or not opts.conditions or len(set(opts.conditions)) != len(opts.conditions):
        raise ValueError(f"--conditions lists each of {', '.join(CONDITIONS)} at most once; got "
                         f"{','.join(opts.conditions) or '(none)'}")
    if opts.mode not in ("support", "meeting"):
        raise ValueError("--mode must be support or meeting")
    if opts.concurrency < 1:
        raise ValueError("--concurrency must be >= 1")
    if Path(opts.out_dir).exists() and not Path(opts.out_dir).is_dir():
        raise ValueError(f"--out {opts.out_dir} exists and is not a directory")


def _seed(base: int, index: int, persona: int, condition: str) -> int:
    return (base * 100_003 + index) * 64 + persona * 2 + CONDITIONS.index(condition)


#: Tries of one call that misses its deadline or finds a service unavailable (an overloaded engine).
ATTEMPTS = 3


async def _retried(call: Callable[[], Any], counter: list[int]) -> Any:
    """``await call()``, tried again (same request, same seed) on DEADLINE_EXCEEDED or UNAVAILABLE up to
    :data:`ATTEMPTS` times; ``counter[0]`` counts the retries.

    Raises:
        grpc.aio.AioRpcError: another status, or the last try's.
    """
    import grpc

    from mascot.core.retry import RETRYABLE

    for attempt in range(1, ATTEMPTS + 1):
        try:
            return await call()
        except grpc.aio.AioRpcError as e:
            if e.code() not in RETRYABLE or attempt == ATTEMPTS:
                raise
            counter[0] += 1
    raise AssertionError("unreachable")  # pragma: no cover


def _check_run_file(out: Path, opts: ProbeOptions, cfg: MascotConfig, trained: dict[str, dict],
                    roster: list[Any]) -> None:
    """Record the run's settings in ``run.json``; a resumed run must match them (its replies are reused). The roster's
    cards count as settings (an edited card would make the stored replies another card's); ``--limit`` does not (a
    rerun with a larger limit extends the run)."""
    def path_or_id(x: Any) -> str:
        return str(Path(x).resolve()) if x and Path(x).exists() else str(x or "")

    settings = {"probe": "speakers", "mode": opts.mode, "seed": opts.seed,
                "situations_file": path_or_id(opts.situations), "model": path_or_id(cfg.engine.model),
                "speaker": cfg.speaker.model_dump(), "director": cfg.director.model_dump(),
                "guard": cfg.guard.model_dump(),
                "roster": {c.id: hashlib.sha256(c.model_dump_json().encode()).hexdigest()[:16] for c in roster},
                "trained_adapters": {pid: f"{v['name']}@{v['digest']}" for pid, v in trained.items()}}
    p = out / "run.json"
    if p.is_file():
        old = json.loads(p.read_text(encoding="utf-8"))
        diff = [k for k in settings if old.get(k) != settings[k]]
        if diff:
            raise ValueError(f"{out} holds a probe with different {', '.join(diff)}; resume with the same settings or "
                             "choose another --out")
    else:
        atomic_write_text(p, json.dumps(settings, indent=2))


async def run_probe(opts: ProbeOptions, cfg: MascotConfig,
                    progress: Callable[[str, int, int], None] | None = None, engine: Any = None) -> dict:
    """Run the speaker probe and write its outputs to ``opts.out_dir``.

    Args:
        opts: What to probe.
        cfg: Base configuration (engine, personas, speaker, director, guard); ports are forced to 0.
        progress: ``progress(phase, done, total)`` callback (phases ``directives``, ``replies``).
        engine: An already started engine to use (tests); else one is built from ``cfg.engine``.

    Returns:
        The report dict (also in ``probe-report.json``) plus ``timings`` (wall seconds of this invocation).

    Raises:
        ValueError: bad options, overlap with a training manifest or a served adapter's training ids, a store
            without a stable version, or a resumed directory with other settings.
        FileNotFoundError: missing situations file or manifest.
        grpc.aio.AioRpcError: a service refused a request.
    """
    from mascot.api.dialogue.v1 import dialogue_pb2 as dpb
    from mascot.api.director.v1 import director_pb2 as dirpb
    from mascot.api.director.v1 import director_pb2_grpc as dir_grpc
    from mascot.api.speaker.v1 import speaker_pb2 as spb
    from mascot.api.speaker.v1 import speaker_pb2_grpc as spb_grpc
    from mascot.app.stack import start_stack
    from mascot.core.dialogue import FALLBACK_ACTION, directive_source_name, directive_source_value
    from mascot.core.metrics import Metrics
    from mascot.core.personas import PersonaCatalog
    from mascot.core.server import channel
    from mascot.eval.runner import trained_versions

    validate(opts)
    t_start = time.perf_counter()
    situations = load_situations(opts.situations, opts.mode, opts.limit)
    out = Path(opts.out_dir)
    trained = trained_versions(opts.adapters, out / ".adapter-cache", cfg.adapters) if opts.adapters else {}
    check_no_overlap(situations, [*opts.manifests, *(Path(v["dir"]) / "manifest.json" for v in trained.values())])
    catalog = PersonaCatalog.load(cfg.personas.extra_files)
    active = list(cfg.personas.active_support if opts.mode == "support" else cfg.personas.active_meeting)
    roster = [catalog.get(i) for i in active] or catalog.in_set(opts.mode)
    out.mkdir(parents=True, exist_ok=True)
    _check_run_file(out, opts, cfg, trained, roster)
    ids = [c.id for c in roster]
    systems = ["base", *(["adapters"] if trained else [])]
    report_progress = progress or (lambda *_: None)

    over: dict[str, Any] = {"server": {"gateway_port": 0, "director_port": 0, "speaker_port": 0, "judge_port": 0,
                                       "reward_port": 0}}
    if trained:
        over["adapters"] = {"store": opts.adapters, "cache_dir": str((out / ".adapter-cache").resolve())}
    vcfg = MascotConfig(**deep_merge(cfg.model_dump(mode="python"), over))
    own_engine = engine is None
    if own_engine:
        from mascot.core.engine import build_engine

        engine = build_engine(cfg.engine, Metrics(), component="probe")
        await engine.start()
    stack = None
    timings: dict[str, Any] = {}
    try:
        stack = await start_stack(vcfg, ("director", "speaker"), engine=engine, admin=False)
        dch = channel(stack.target("director"), cfg.server.max_message_bytes)
        sch = channel(stack.target("speaker"), cfg.server.max_message_bytes)
        director = dir_grpc.DirectorServiceStub(dch)
        speaker = spb_grpc.SpeakerServiceStub(sch)
        sem = asyncio.Semaphore(opts.concurrency)
        timeout = cfg.server.call_timeout_s
        retried = [0]

        def history(sit: Situation) -> list:
            return [dpb.Turn(role=dpb.ROLE_USER, text=sit.opening)]

        def context(sit: Situation) -> list:
            return [dpb.ContextUtterance(speaker=s, content=c) for s, c in sit.context]

        # One chain per (situation, persona): its directive (written by the base director for that persona), then its
        # replies; the chains run together, so directives and replies share the engine's batches.
        dpath, rpath = out / "directives.jsonl", out / "replies.jsonl"
        directives = {(d["situation_id"], d["persona_id"]): d for d in read_jsonl(dpath)}
        replies = {(r["system"], r["condition"], r["situation_id"], r["persona_id"]): r for r in read_jsonl(rpath)}
        n_dir = len(situations) * len(ids) if "director" in opts.conditions else 0
        total = len(systems) * len(opts.conditions) * len(situations) * len(ids)
        here = {sit.id for sit in situations}
        count = {"directives": sum(1 for k in directives if k[0] in here and k[1] in ids) if n_dir else 0,
                 "replies": sum(1 for k in replies if k[0] in systems and k[1] in opts.conditions and k[2] in here
                                and k[3] in ids)}
        if n_dir:
            report_progress("directives", count["directives"], n_dir)
        report_progress("replies", count["replies"], total)
        lock = asyncio.Lock()
        made = {"directives": 0, "replies": 0}

        async def store(phase: str, path: Path, row: dict) -> None:
            async with lock:
                append_jsonl(path, row)
                count[phase] += 1
                made[phase] += 1
                report_progress(phase, count[phase], n_dir if phase == "directives" else total)

        async def direct(i: int, sit: Situation, k: int) -> None:
            async with sem:
                resp = await _retried(lambda: director.NextDirective(dirpb.NextDirectiveRequest(
                    persona_ids=ids, history=history(sit), context=context(sit),
                    seed=_seed(opts.seed, i, k, "director"), adapter_version="base",
                    exclude_persona_ids=[p for p in ids if p != ids[k]]), timeout=timeout), retried)
            d = resp.directive
            row = {"situation_id": sit.id, "persona_id": ids[k], "action": d.action, "tone": d.tone,
                   "source": directive_source_name(d.source), "raw": d.raw, "retries": resp.retries}
            directives[(sit.id, ids[k])] = row
            await store("directives", dpath, row)

        async def reply(system: str, cond: str, i: int, sit: Situation, k: int) -> None:
            card = roster[k]
            if cond == "fallback":
                directive = dpb.Directive(persona_id=card.id, action=FALLBACK_ACTION, tone=card.default_tone,
                                          source=dpb.DIRECTIVE_SOURCE_FALLBACK)
            else:
                d = directives[(sit.id, card.id)]
                directive = dpb.Directive(persona_id=card.id, action=d["action"], tone=d["tone"], raw=d["raw"],
                                          source=directive_source_value(d["source"]))
            version = trained[card.id]["name"] if system == "adapters" and card.id in trained else "base"
            request = spb.GenerateReplyRequest(
                persona_id=card.id, directive=directive, history=history(sit), context=context(sit),
                roster_persona_ids=ids, seed=_seed(opts.seed, i, k, cond), adapter_version=version)

            async def call() -> Any:
                last = None
                async for msg in speaker.GenerateReply(request, timeout=timeout):
                    if msg.WhichOneof("event") == "final":
                        last = msg.final
                return last

            async with sem:
                final = await _retried(call, retried)
            row = {"system": system, "condition": cond, "situation_id": sit.id, "split": sit.split,
                   "persona_id": card.id, "user": sit.opening, "situation": sit.situation,
                   "directive": {"action": directive.action, "tone": directive.tone},
                   "text": "" if final is None or final.rejected else final.text,
                   "rejected": bool(final is None or final.rejected),
                   "attempts_refused": 0 if final is None else len(final.rejections),
                   "adapter_version": "" if final is None else final.adapter_version}
            replies[(system, cond, sit.id, card.id)] = row
            await store("replies", rpath, row)

        async def chain(i: int, sit: Situation, k: int) -> None:
            todo = [(s, c) for c in opts.conditions for s in systems if (s, c, sit.id, ids[k]) not in replies]
            # fallback replies need no directive: they go first, so the engine has work while directives decode
            for s, c in [x for x in todo if x[1] == "fallback"]:
                await reply(s, c, i, sit, k)
            if "director" in opts.conditions and (sit.id, ids[k]) not in directives:
                await direct(i, sit, k)
            for s, c in [x for x in todo if x[1] == "director"]:
                await reply(s, c, i, sit, k)

        t0 = time.perf_counter()
        try:
            await asyncio.gather(*(chain(i, sit, k) for i, sit in enumerate(situations) for k in range(len(ids))))
        finally:
            await dch.close()
            await sch.close()
        timings["probe_s"] = time.perf_counter() - t0
        timings["directives_generated"] = made["directives"]
        timings["replies_generated"] = made["replies"]
        timings["calls_retried"] = retried[0]
    finally:
        if stack is not None:
            await stack.stop(0)
        if own_engine:
            await engine.close()

    from mascot.eval.probe_report import build_probe_report, render_probe_markdown

    t0 = time.perf_counter()
    rows = [replies[(s, c, sit.id, p)] for s in systems for c in opts.conditions for sit in situations for p in ids]
    report = await asyncio.to_thread(build_probe_report, rows, roster, systems, list(opts.conditions), opts.seed,
                                     trained)
    atomic_write_text(out / "probe-report.json", json.dumps(report, indent=2))
    atomic_write_text(out / "probe-report.md", render_probe_markdown(report))
    from mascot.eval.probe_report import write_probe_plots

    await asyncio.to_thread(write_probe_plots, report, out)
    timings["report_s"] = time.perf_counter() - t0
    timings["total_s"] = time.perf_counter() - t_start
    timings = {k: round(v, 1) if isinstance(v, float) else v for k, v in timings.items()}
    atomic_write_text(out / "timings.json", json.dumps({"concurrency": opts.concurrency, **timings}, indent=2))
    return {**report, "timings": timings}
