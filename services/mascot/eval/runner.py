"""``mascot eval``: generate dialogues for every system, judge them, add automatic metrics, write the report.

Phases (each resumable after SIGKILL):

1. Dialogues: MASCOT and its ablations run self-play through the gateway's gRPC API (``RunSelfPlay``) on an
   embedded stack per variant; baselines run on the same engine and simulated user. Every finished dialogue is
   appended to ``DIR/dialogues.jsonl`` and fsynced; a rerun skips what is there. A dialogue whose call missed its
   deadline or found a service unavailable (an overloaded engine) is started again from its first turn, with the
   same seed, up to :data:`DIALOGUE_ATTEMPTS` times; the retries are counted in ``timings.json``.
2. Judging: every agent turn on the agent-specific rubric (support mode) and every dialogue's block after the
   opening message on the collective rubric, through JudgeService over gRPC, for every judge: an in-process
   JudgeService on the shared engine (judgements cached by content hash in ``DIR/judge-cache.db``), or a running
   one at ``judge_target``. Every answered request is appended and fsynced to ``DIR/judge-results.jsonl``, so a
   rerun after the eval or the judge service died asks no answered item again and counts none twice; each call
   has a deadline and UNAVAILABLE / DEADLINE_EXCEEDED are retried within ``judge_retry_budget_s``.
3. Automatic metrics (Self-BLEU, distinct-n, NLI, embedding redundancy), the judge-free measures with bootstrap
   intervals and paired tests (:mod:`mascot.eval.measures`), and the report (``report.json``, ``report.md``,
   ``*.png``) plus ``transcripts.jsonl``, ``measures.jsonl`` and ``timings.json``, each written atomically.

With no judges (``--judges none``) phase 2 is skipped: the report holds the judge-free measures only.

Every system sees the same situations with the same per-situation seeds, so comparisons are paired. The
report holds no timestamps: the same seed and inputs give the same ``report.json``.
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from mascot.core.config import MascotConfig, deep_merge
from mascot.core.files import append_jsonl, atomic_write_text, read_jsonl
from mascot.core.situations import Situation, load_situations
from mascot.eval.baselines import BaselineContext, ReplySampling, run_baseline
from mascot.eval.data import check_no_overlap

logger = logging.getLogger(__name__)

SYSTEMS = ("mascot", "zero-shot", "zero-shot-cot", "few-shot", "few-shot-cot", "self-consistency", "no-director",
           "no-persona", "multiagentesc", "sft", "mascot-trained")
#: MASCOT variants: config overrides of the embedded stack (``mascot-trained`` also gets ``adapters.store``).
VARIANTS: dict[str, dict] = {"mascot": {}, "no-director": {"director": {"policy": "random"}},
                             "no-persona": {"speaker": {"persona_prompts": False}}, "mascot-trained": {}}
#: Systems that run only with an option: the option's flag.
NEEDS = {"sft": "--sft-adapter DIR (a PEFT LoRA adapter)",
         "mascot-trained": "--adapters STORE (an adapter store whose trained versions are promoted to stable)"}
SFT_ADAPTER_NAME = "sft"
#: Tries of one dialogue whose calls miss their deadline or find a service unavailable before the run stops.
DIALOGUE_ATTEMPTS = 3


@dataclass
class EvalOptions:
    """Options of one evaluation run (``mascot eval`` flags).

    Attributes:
        situations: Situation file or QMSum folder (:func:`mascot.core.situations.load_situations`).
        out_dir: Output directory (resumable).
        mode: ``support`` or ``meeting``.
        limit: First N records; None for all.
        systems: System ids from :data:`SYSTEMS`.
        judges: Judge spec dicts (:class:`~mascot.core.config.JudgeSpec` fields); empty: no LLM judge runs (the
            report then has the judge-free measures only).
        seed: Base seed.
        agent_turns: Agent turns per dialogue (0: ``selfplay.agent_turns``).
        concurrency: Dialogues and judge calls in flight.
        sft_adapter: PEFT adapter directory for the ``sft`` system.
        adapters: Adapter store (a local path or a store URI: ``file://``, ``pvc://``, ``s3://``) for the
            ``mascot-trained`` system: MASCOT with each persona's and the director's stable version from it.
        manifests: Training-run manifests whose ids must not be evaluated.
        nli_model: NLI cross-encoder directory; empty builds the tiny random one.
        judge_target: ``HOST:PORT`` of a running JudgeService to judge with (its judges are picked by the names
            in ``judges``); empty starts an in-process one on the shared engine.
        judge_call_timeout_s: Deadline of each judge call, in seconds.
        judge_retry_budget_s: Seconds a judge call is retried (UNAVAILABLE, DEADLINE_EXCEEDED) before the run
            stops with :class:`~mascot.core.retry.RetryBudgetExhausted` (a rerun resumes).
    """

    situations: Path
    out_dir: Path
    mode: str = "support"
    limit: int | None = None
    systems: list[str] = field(default_factory=lambda: [s for s in SYSTEMS if s not in NEEDS])
    judges: list[dict] = field(default_factory=lambda: [{"name": "local", "kind": "local"}])
    seed: int = 0
    agent_turns: int = 0
    concurrency: int = 8
    sft_adapter: Path | None = None
    adapters: str = ""
    manifests: list[Path] = field(default_factory=list)
    nli_model: str = ""
    judge_target: str = ""
    judge_call_timeout_s: float = 120.0
    judge_retry_budget_s: float = 300.0


def validate(opts: EvalOptions) -> None:
    """Check options before any work.

    Raises:
        ValueError: unknown or repeated system, ``sft`` without an adapter (or an adapter without ``sft``), bad
            mode, concurrency < 1, no judges, a judge target that is not HOST:PORT or with an ``openai`` judge spec,
            a judge call timeout <= 0 or a negative retry budget.
    """
    from mascot.core.retry import target_problem

    bad = [s for s in opts.systems if s not in SYSTEMS]
    if bad:
        raise ValueError(f"unknown system {bad[0]!r}; choose from {', '.join(SYSTEMS)}")
    if not opts.systems or len(set(opts.systems)) != len(opts.systems):
        raise ValueError("--systems must list each system once")
    for system, given in (("sft", opts.sft_adapter), ("mascot-trained", opts.adapters)):
        if system in opts.systems and not given:
            raise ValueError(f"the {system} system runs only with {NEEDS[system]}")
    if opts.adapters and "mascot-trained" not in opts.systems:
        raise ValueError("--adapters is the store of the mascot-trained system: add mascot-trained to --systems")
    if opts.sft_adapter and not (Path(opts.sft_adapter) / "adapter_config.json").is_file():
        raise ValueError(f"--sft-adapter {opts.sft_adapter} is not a PEFT adapter directory (no adapter_config.json)")
    if opts.mode not in ("support", "meeting"):
        raise ValueError("--mode must be support or meeting")
    if opts.concurrency < 1:
        raise ValueError("--concurrency must be >= 1")
    names = [j.get("name", "local") for j in opts.judges]
    if len(set(names)) != len(names):
        raise ValueError(f"judge names must be unique, got {', '.join(names)}; name them NAME=SPEC")
    if opts.judge_target:
        problem = target_problem(opts.judge_target)
        if problem:
            raise ValueError(f"--judge-target {problem}")
        remote = [j.get("name", "") for j in opts.judges if j.get("kind", "local") != "local"]
        if remote:
            raise ValueError(f"--judge-target: judge(s) {', '.join(remote)} are openai specs; with a judge target, "
                             "--judges names judges configured on that JudgeService (judge.judges of its config)")
    if not opts.judge_call_timeout_s > 0:
        raise ValueError("--judge-call-timeout must be > 0 seconds")
    if not opts.judge_retry_budget_s >= 0:
        raise ValueError("--judge-retry-budget must be >= 0 seconds")
    if Path(opts.out_dir).exists() and not Path(opts.out_dir).is_dir():
        raise ValueError(f"--out {opts.out_dir} exists and is not a directory")


def trained_versions(store_uri: str, cache_dir: Path, config: Any = None) -> dict[str, dict]:
    """What the ``mascot-trained`` system serves: every adapter of the store with a stable version (personas and the
    director), ``{adapter id: {"name": "<id>--v<N>", "digest", "dir": local folder of the version}}``. ``config``:
    the :class:`~mascot.core.config.AdaptersConfig` whose ``pvc_root`` and ``s3_endpoint_url`` the stack uses too.

    Raises:
        ValueError: the store cannot be read or holds no adapter, has no stable version (the system would be the
            base model: promote the trained versions first), has a canary open (dialogues would mix two versions
            of one persona), or a version cannot be fetched or fails its digest check.
    """
    from mascot.core.adapters.registry import version_name
    from mascot.core.adapters.store import backend_errors, open_store

    try:
        store = open_store(store_uri, config=config)
        reg = store.read_registry().get("adapters", {})
    except (RuntimeError, OSError, ValueError, *backend_errors()) as e:
        raise ValueError(f"--adapters {store_uri}: cannot read the adapter store ({e})") from None
    if not any(e.get("versions") for e in reg.values()):
        raise ValueError(f"--adapters {store_uri} holds no adapter (no registry.json listing versions there): give "
                         "the store a training run published to, e.g. runs/p1/adapters")
    canary = sorted(pid for pid, e in reg.items() if e.get("canary"))
    if canary:
        raise ValueError(f"--adapters {store_uri}: {', '.join(canary)} has a canary version open; promote it to "
                         "stable or retire it first, so that every dialogue of mascot-trained uses the same versions")
    out = {}
    for pid, e in sorted(reg.items()):
        n = e.get("stable")
        v = (e.get("versions") or {}).get(str(n)) if n else None
        if v:
            try:
                local = store.local_version(pid, n, v["digest"], cache_dir)
            except (RuntimeError, OSError, *backend_errors()) as e:
                raise ValueError(f"--adapters {store_uri}: cannot use {version_name(pid, n)} ({e})") from None
            out[pid] = {"name": version_name(pid, n), "digest": v["digest"], "dir": str(local)}
    if not out:
        staged = sorted(pid for pid, e in reg.items() if e.get("versions"))
        raise ValueError(f"--adapters {store_uri} serves no stable version ({len(staged)} adapter(s) with only "
                         "staged or retired versions): promote the trained versions first (mascot adapters promote "
                         "PERSONA N), or mascot-trained would be the untrained base model")
    return out


def _seed(base: int, index: int) -> int:
    return base * 100_003 + index


class DialogueLog:
    """Append-only, fsynced JSONL of finished dialogues; a torn last line (a kill mid-write) is ignored."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.done: dict[tuple[str, str], dict] = {(d["system"], d["situation_id"]): d for d in read_jsonl(path)}
        self._lock = asyncio.Lock()

    async def add(self, d: dict) -> None:
        async with self._lock:
            append_jsonl(self.path, d)
            self.done[(d["system"], d["situation_id"])] = d


def _check_run_file(out: Path, opts: EvalOptions, cfg: MascotConfig, trained: dict[str, dict] | None = None) -> None:
    """Record the run's settings in ``run.json``; a resumed run must match them (its dialogues are reused). The
    versions of ``mascot-trained`` (``trained``) may be added to a run that had none, as only that system's dialogues
    depend on them; once recorded they must match too."""
    def path_or_id(x: Any) -> str:
        return str(Path(x).resolve()) if x and Path(x).exists() else str(x or "")

    settings = {"mode": opts.mode, "seed": opts.seed, "agent_turns": opts.agent_turns,
                "situations_file": path_or_id(opts.situations), "model": path_or_id(cfg.engine.model),
                "nli_model": path_or_id(opts.nli_model), "sft_adapter": path_or_id(opts.sft_adapter),
                "selfplay": cfg.selfplay.model_dump(), "speaker": cfg.speaker.model_dump(),
                "director": cfg.director.model_dump()}
    if trained:
        settings["trained_adapters"] = {pid: f"{v['name']}@{v['digest']}" for pid, v in trained.items()}
    p = out / "run.json"
    if p.is_file():
        old = json.loads(p.read_text(encoding="utf-8"))
        diff = [k for k in settings if old.get(k) != settings[k] and not (k == "trained_adapters" and k not in old)]
        if diff:
            raise ValueError(f"{out} holds a run with different {', '.join(diff)}; resume with the same settings or "
                             "choose another --out")
        if settings.get("trained_adapters") and "trained_adapters" not in old:
            atomic_write_text(p, json.dumps({**old, "trained_adapters": settings["trained_adapters"]}, indent=2))
    else:
        atomic_write_text(p, json.dumps(settings, indent=2))


def _judge_identities(cfg: MascotConfig) -> dict[str, str]:
    """Per in-process judge, what its answers depend on (spec without secrets or limits, rubric version, model):
    a recorded answer is reused only while these stay the same."""
    from mascot.judge.rubric import rubric_version

    out = {}
    for spec in cfg.judge.judges:
        ident = spec.model_dump(mode="json", exclude={"api_key_env", "api_key_file", "timeout_s", "max_concurrency"})
        out[spec.name] = json.dumps({"spec": ident, "rubric": rubric_version(), "max_retries": cfg.judge.max_retries,
                                     "engine": str(cfg.engine.model)}, sort_keys=True)
    return out


async def _mascot_dialogue(stub: Any, sit: Situation, mode: str, agent_turns: int, seed: int) -> dict:
    from mascot.app.runjob import admitted, read_conversation, selfplay_request, start_request, started, transcript_line

    conv = await started(stub, start_request(sit, mode))
    async for _ in admitted(lambda: stub.RunSelfPlay(selfplay_request(conv.id, sit, agent_turns, seed))):
        pass
    resp = await read_conversation(stub, conv.id, include_think=True)
    line = transcript_line(resp, mode)
    return {"personas": line["personas"], "turns": line["turns"]}


async def run_eval(opts: EvalOptions, cfg: MascotConfig, progress: Callable[[str, int, int], None] | None = None,
                   engine: Any = None) -> dict:
    """Run an evaluation and write its outputs to ``opts.out_dir``.

    Args:
        opts: What to evaluate.
        cfg: Base configuration (engine, personas, self-play, director, speaker); ports are forced to 0.
        progress: ``progress(phase, done, total)`` callback.
        engine: An already started engine to use (tests); else one is built from ``cfg.engine``.

    Returns:
        The report dict (also in ``report.json``), plus ``timings``: wall seconds of this invocation's phases
        (``dialogues_s``, ``judging_s``, ``metrics_and_report_s``, ``total_s``; also in ``timings.json``, kept out of
        ``report.json`` so the same inputs give the same report), and ``per_system``: for each system whose dialogues
        this invocation generated, their count, ``dialogue_s`` (the sum of their wall seconds from taking a
        concurrency slot to being stored; dialogues overlap, so this exceeds the span) and the span
        (``first_start_s``, ``last_end_s``, seconds after the dialogue phase began).

    Raises:
        ValueError: bad options, overlap with a training manifest, or a resumed directory with other settings.
        FileNotFoundError: missing situations file or manifest.
        mascot.core.retry.RetryBudgetExhausted: the judge did not answer within ``opts.judge_retry_budget_s``;
            no report is written and a rerun resumes.
        mascot.eval.judging.JudgeRefused: the judge service refused a request with a status that is not retried.
        grpc.aio.AioRpcError: a dialogue service refused a request (DEADLINE_EXCEEDED or UNAVAILABLE only after
            :data:`DIALOGUE_ATTEMPTS` tries of the same dialogue).
    """
    from mascot.api.conversation.v1 import conversation_pb2_grpc as cpb_grpc
    from mascot.api.speaker.v1 import speaker_pb2_grpc as spb_grpc
    from mascot.core.metrics import Metrics
    from mascot.core.personas import PersonaCatalog
    from mascot.core.server import channel
    from mascot.eval.automatic import EmbeddingRedundancy
    from mascot.app.stack import start_stack

    import time

    validate(opts)
    t_start = time.perf_counter()
    timings: dict[str, Any] = {}
    situations = load_situations(opts.situations, opts.mode, opts.limit)
    manifests = list(opts.manifests)
    if opts.sft_adapter and (Path(opts.sft_adapter) / "manifest.json").is_file():
        manifests.append(Path(opts.sft_adapter) / "manifest.json")
    out = Path(opts.out_dir)
    trained = trained_versions(opts.adapters, out / ".adapter-cache", cfg.adapters) if opts.adapters else {}
    # every served version's own manifest lists the situations its training run used
    manifests += [Path(v["dir"]) / "manifest.json" for v in trained.values()]
    check_no_overlap(situations, manifests)
    out.mkdir(parents=True, exist_ok=True)
    _check_run_file(out, opts, cfg, trained)
    agent_turns = opts.agent_turns or cfg.selfplay.agent_turns
    report_progress = progress or (lambda *_: None)

    base = deep_merge(cfg.model_dump(mode="python"), {"server": {"gateway_port": 0, "director_port": 0,
                                                                 "speaker_port": 0, "judge_port": 0,
                                                                 "reward_port": 0}})
    # the run's own embedded gateways admit every dialogue it runs at once (all come from one local caller)
    lim = base["limits"]
    lim["max_active_rounds"] = max(lim["max_active_rounds"], opts.concurrency)
    lim["max_rounds_per_caller"] = max(lim["max_rounds_per_caller"], opts.concurrency)
    base["security"]["conversations_per_minute"] = 0  # the evaluation is the only caller of its own gateways
    metrics = Metrics()
    own_engine = engine is None
    if own_engine:
        from mascot.core.engine import build_engine

        engine = build_engine(cfg.engine, metrics, component="eval")
        await engine.start()
    if opts.sft_adapter and SFT_ADAPTER_NAME not in engine.adapters():
        await engine.load_adapter(SFT_ADAPTER_NAME, str(opts.sft_adapter))
    stacks: dict[str, Any] = {}
    log = DialogueLog(out / "dialogues.jsonl")
    catalog = PersonaCatalog.load(cfg.personas.extra_files)
    active = list(cfg.personas.active_support if opts.mode == "support" else cfg.personas.active_meeting)
    roster = [catalog.get(i) for i in active] or catalog.in_set(opts.mode)
    embedder = EmbeddingRedundancy()
    try:
        # One stack per MASCOT variant; baselines alone still need one for the simulated user (its speaker).
        for name in [s for s in opts.systems if s in VARIANTS] or ["mascot"]:
            over = {**VARIANTS[name], "store": {"url": f"sqlite:///{(out / f'conversations-{name}.db').resolve()}"}}
            if name == "mascot-trained":
                over["adapters"] = {"store": opts.adapters, "cache_dir": str((out / ".adapter-cache").resolve())}
            elif opts.adapters:  # one shared engine: the other variants must not pick up the trained versions
                over["adapters"] = {"store": ""}
                over["speaker"] = {**over.get("speaker", {}), "adapter_mode": "none"}
            vcfg = MascotConfig(**deep_merge(base, over))
            stacks[name] = await start_stack(vcfg, ("gateway", "director", "speaker"), engine=engine, metrics=metrics,
                                             admin=False)
        first = next(iter(stacks.values()))
        sem = asyncio.Semaphore(opts.concurrency)
        todo = [(s, i, sit) for s in opts.systems for i, sit in enumerate(situations) if (s, sit.id) not in log.done]
        total = len(opts.systems) * len(situations)
        count = [total - len(todo)]
        report_progress("dialogues", count[0], total)
        chans = {n: channel(st.target("gateway"), cfg.server.max_message_bytes) for n, st in stacks.items()}
        sch = channel(first.target("speaker"), cfg.server.max_message_bytes)
        bctx = BaselineContext(engine=engine, speaker=spb_grpc.SpeakerServiceStub(sch), roster=roster,
                               supporter=catalog.get("supporter"), agent_turns=agent_turns,
                               user_speak_prob=cfg.selfplay.user_speak_prob, max_tokens=cfg.speaker.max_tokens,
                               temperature=cfg.speaker.temperature,
                               sft_adapter=SFT_ADAPTER_NAME if opts.sft_adapter else None, embedder=embedder,
                               mode=opts.mode, timeout_s=cfg.server.call_timeout_s, guard=cfg.guard.settings(),
                               max_in_flight=opts.concurrency, step_attempts=cfg.guard.max_attempts,
                               sampling=ReplySampling(top_p=cfg.speaker.top_p,
                                                      frequency_penalty=cfg.speaker.frequency_penalty,
                                                      repetition_penalty=cfg.speaker.repetition_penalty,
                                                      penalty_step=cfg.guard.retry_penalty_step,
                                                      retry_temperature=cfg.guard.retry_temperature))

        import grpc

        from mascot.core.retry import RETRYABLE

        retried = [0]
        per_system: dict[str, dict[str, float]] = {}

        async def one(system: str, i: int, sit: Situation) -> None:
            async with sem:
                seed = _seed(opts.seed, i)
                started = time.perf_counter() - t0
                for attempt in range(1, DIALOGUE_ATTEMPTS + 1):
                    try:
                        if system in VARIANTS:
                            d = await _mascot_dialogue(cpb_grpc.ConversationServiceStub(chans[system]), sit,
                                                       opts.mode, agent_turns, seed)
                        else:
                            d = await run_baseline(system, bctx, sit, seed)
                        break
                    except grpc.aio.AioRpcError as e:
                        if e.code() not in RETRYABLE or attempt == DIALOGUE_ATTEMPTS:
                            raise
                        retried[0] += 1
                        logger.warning("%s on situation %s: %s (%s); starting the dialogue again (try %d of %d)",
                                     system, sit.id, e.code().name, e.details(), attempt + 1, DIALOGUE_ATTEMPTS)
                await log.add({"system": system, "situation_id": sit.id, "split": sit.split, "mode": opts.mode,
                               "situation": sit.situation, "emotion": sit.emotion, **d})
                ended = time.perf_counter() - t0
                row = per_system.setdefault(system, {"dialogues": 0, "dialogue_s": 0.0, "first_start_s": started,
                                                     "last_end_s": ended})
                row["dialogues"] += 1
                row["dialogue_s"] += ended - started
                row["first_start_s"] = min(row["first_start_s"], started)
                row["last_end_s"] = max(row["last_end_s"], ended)
                count[0] += 1
                report_progress("dialogues", count[0], total)

        t0 = time.perf_counter()
        try:
            await asyncio.gather(*(one(*t) for t in todo))
        finally:
            for ch in [*chans.values(), sch]:
                await ch.close()
        timings["dialogues_s"] = time.perf_counter() - t0
        timings["dialogues_generated"] = len(todo)
        timings["dialogues_retried"] = retried[0]
        timings["per_system"] = {name: {k: round(v, 1) if isinstance(v, float) else v for k, v in row.items()}
                                 for name, row in per_system.items()}
        for st in stacks.values():
            await st.stop(0)
        stacks.clear()
        from mascot.core.retry import RetryPolicy
        from mascot.eval.judging import RESULTS_FILE, JudgeResults, judge_dialogues

        dialogues = [log.done[(s, sit.id)] for s in opts.systems for sit in situations]
        t0 = time.perf_counter()
        if not opts.judges:
            judged: dict = {}
        elif opts.judge_target:
            target, identities = opts.judge_target, None  # answers are reused for the same target and request
        else:
            judge_cfg = MascotConfig(**deep_merge(base, {"judge": {"judges": opts.judges, "cache_url":
                                                                   f"sqlite:///{(out / 'judge-cache.db').resolve()}"}}))
            judge_stack = await start_stack(judge_cfg, ("judge",), engine=engine, metrics=metrics)
            stacks["judge"] = judge_stack
            target, identities = judge_stack.target("judge"), _judge_identities(judge_cfg)
        if opts.judges:
            judged = await judge_dialogues(target, dialogues, situations, opts, catalog,
                                           cfg.server.max_message_bytes, report_progress,
                                           results=JudgeResults(out / RESULTS_FILE), identities=identities,
                                           policy=RetryPolicy(call_timeout_s=opts.judge_call_timeout_s,
                                                              budget_s=opts.judge_retry_budget_s))
        timings["judging_s"] = time.perf_counter() - t0
        from mascot.eval.assemble import build_report, write_outputs

        t0 = time.perf_counter()
        supporter = catalog.cards.get("supporter")
        report = await asyncio.to_thread(build_report, opts, cfg, situations, dialogues, judged, embedder,
                                         report_progress, roster, [supporter] if supporter is not None else [],
                                         trained)
        await asyncio.to_thread(write_outputs, out, report, dialogues)
        timings["metrics_and_report_s"] = time.perf_counter() - t0
        timings["total_s"] = time.perf_counter() - t_start
        timings = {k: round(v, 1) if isinstance(v, float) else v for k, v in timings.items()}
        atomic_write_text(out / "timings.json", json.dumps({"engine": cfg.engine.kind,
                                                            "concurrency": opts.concurrency, **timings}, indent=2))
        return {**report, "timings": timings}
    finally:
        for st in stacks.values():
            await st.stop(0)
        if own_engine:
            await engine.close()
