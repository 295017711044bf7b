"""``mascot eval`` commands: the evaluation run, and the human-preference export/import."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Optional

import typer

from mascot.cli.common import MODE, ModeName, console

eval_app = typer.Typer(help="Evaluate MASCOT against baselines (LLM judge, automatic metrics, human preference).",
                       invoke_without_command=True, add_completion=False)


def _fail(msg: str, code: int = 2) -> None:
    """Print ``msg`` on one line (no wrapping, no markup in it) and exit with ``code``."""
    from rich.markup import escape

    console.print(f"[red]{escape(msg)}[/red]", soft_wrap=True)
    raise typer.Exit(code)


def _judge_names(judges: str) -> list[dict]:
    """``--judges`` with ``--judge-target``: judge names configured on that service.

    Raises:
        ValueError: an item is not a judge name (``openai:...`` specs belong to the service's config).
    """
    import re

    out = []
    for item in (s.strip() for s in judges.split(",")):
        if not item:
            continue
        if not re.fullmatch(r"[A-Za-z0-9_.-]{1,64}", item):
            raise ValueError(f"with --judge-target, --judges lists names of judges configured on that JudgeService "
                             f"(e.g. local,gpt4o), not specs: {item!r}")
        out.append({"name": item, "kind": "local"})
    return out


@eval_app.callback()
def evaluate(
    ctx: typer.Context,
    situations: Optional[Path] = typer.Option(None, "--situations",
        help="Situations: .jsonl records (../shared/data/...), an EmpatheticDialogues .csv, or QMSum meetings "
             "(a .json file or a folder of them)."),
    limit: Optional[int] = typer.Option(None, "--limit", min=1, help="Use the first N records."),
    systems: str = typer.Option("mascot,zero-shot,zero-shot-cot,few-shot,few-shot-cot,self-consistency,no-director,"
                                "no-persona,multiagentesc", "--systems", help="Comma-separated system ids."),
    out: Optional[Path] = typer.Option(None, "--out", help="Output directory (a rerun resumes it)."),
    judges: str = typer.Option("local", "--judges", help="Comma-separated judge specs: local, metrics (the MiniLM "
                               "metrics judge, a CPU stand-in), openai:MODEL@URL, or NAME=SPEC for any of them (key "
                               "from OPENAI_API_KEY or --judge-key-file); none: no judge, judge-free measures only."),
    judge_key_file: Optional[Path] = typer.Option(None, "--judge-key-file", help="File holding the judges' API key."),
    judge_target: str = typer.Option("", "--judge-target", help="HOST:PORT of a running JudgeService to judge with "
                                     "(--judges then names its judges); default: an in-process one."),
    judge_call_timeout: float = typer.Option(120.0, "--judge-call-timeout", help="Deadline of each judge call, "
                                             "seconds."),
    judge_retry_budget: float = typer.Option(300.0, "--judge-retry-budget", help="Seconds a judge call is retried "
                                             "(UNAVAILABLE, DEADLINE_EXCEEDED) before the run stops; a rerun resumes."),
    mode: ModeName = MODE,
    seed: int = typer.Option(0, "--seed", help="Base seed (same seed, same report)."),
    agent_turns: Optional[int] = typer.Option(None, "--agent-turns", min=1, max=64, help="Agent turns per dialogue."),
    concurrency: int = typer.Option(8, "--concurrency", min=1, max=256, help="Dialogues / judge calls in flight."),
    sft_adapter: Optional[Path] = typer.Option(None, "--sft-adapter", help="PEFT adapter for the sft system."),
    adapters: str = typer.Option("", "--adapters", help="Adapter store of the mascot-trained system (a folder, or a "
                                 "file://, pvc:// or s3:// URI): MASCOT with each stable version in it (promote the "
                                 "trained versions first); the situations their training used are refused."),
    training_manifest: list[Path] = typer.Option([], "--training-manifest", help="A training run's manifest.json: "
                                                 "its ids are refused (repeatable)."),
    nli_model: str = typer.Option("", "--nli-model", help="NLI cross-encoder directory (default: tiny random)."),
    model: Optional[str] = typer.Option(None, "--model", help="Backbone model directory or hub id, or 'tiny' for "
                                        "the tiny random-init Qwen3 (default: SmolLM2-135M-Instruct, prepared by "
                                        "make setup)."),
    config: Optional[Path] = typer.Option(None, "--config", help="YAML config file."),
) -> None:
    """Run the evaluation: dialogues for every system, judge scores, automatic metrics, report.json/md/png."""
    if ctx.invoked_subcommand is not None:
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from pydantic import ValidationError

    from mascot.cli.common import load_config_or_exit, quiet
    from mascot.eval.runner import EvalOptions, run_eval
    from mascot.judge.servicer import parse_judge_spec

    if situations is None or out is None:
        _fail("mascot eval needs --situations FILE and --out DIR (or a subcommand: export-pairs, import-pairs)")
    judge_target = judge_target.strip()
    try:
        if judges.strip().lower() == "none":
            specs = []
        elif judge_target:
            specs = _judge_names(judges)
        else:
            specs = [parse_judge_spec(s.strip()) for s in judges.split(",") if s.strip()]
    except ValueError as e:
        _fail(str(e))
    if judge_key_file is not None and judge_target:
        _fail("--judge-key-file is for in-process openai judges; a --judge-target service reads its own key")
    if judge_key_file is not None:
        if not judge_key_file.is_file():
            _fail(f"--judge-key-file {judge_key_file} does not exist")
        specs = [{**s, "api_key_file": str(judge_key_file)} if s["kind"] == "openai" else s for s in specs]
    opts = EvalOptions(situations=situations, out_dir=out, mode=mode, limit=limit,
                       systems=[s.strip() for s in systems.split(",") if s.strip()], judges=specs, seed=seed,
                       agent_turns=agent_turns or 0, concurrency=concurrency, sft_adapter=sft_adapter,
                       adapters=adapters.strip(),
                       manifests=list(training_manifest), nli_model=nli_model, judge_target=judge_target,
                       judge_call_timeout_s=judge_call_timeout, judge_retry_budget_s=judge_retry_budget)
    cfg = load_config_or_exit(config, **{"engine.model": model})
    try:
        from mascot.core.config import JudgeConfig
        from mascot.eval.runner import validate

        validate(opts)
        if specs:
            JudgeConfig(judges=specs)
    except ValidationError as e:
        err = e.errors()[0]
        _fail(f"bad judge spec ({'.'.join(str(x) for x in err['loc'])}): {err['msg']}")
    except ValueError as e:
        _fail(str(e))
    quiet()
    import grpc

    from mascot.core.retry import RETRYABLE, RetryBudgetExhausted, one_line
    from mascot.eval.judging import JudgeRefused
    from mascot.eval.runner import DIALOGUE_ATTEMPTS

    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console) as bar:
        tasks: dict[str, int] = {}
        last: dict[str, int] = {}

        def progress(phase: str, done: int, total: int) -> None:
            if phase not in tasks:
                tasks[phase] = bar.add_task(phase, total=total)
            bar.update(tasks[phase], completed=done, total=total)
            step = max(1, total // 20)
            if not console.is_terminal and (done == total or done - last.get(phase, -step) >= step):
                last[phase] = done
                console.print(f"{phase} {done}/{total}")

        try:
            report = asyncio.run(run_eval(opts, cfg, progress))
        except (ValueError, FileNotFoundError) as e:
            _fail(str(e))
        except RetryBudgetExhausted as e:
            where = f"judge service at {e.target}" if judge_target else "in-process judge service"
            _fail(f"judging stopped: the {where} did not answer within the retry budget of {e.budget_s:g} s "
                  f"({e.attempts} attempts, last {e.code.name}); answered items are kept in "
                  f"{out / 'judge-results.jsonl'}, so rerunning the same command resumes", 1)
        except JudgeRefused as e:
            _fail(str(e) if judge_target else f"the in-process judge refused a request: {e.code.name}: "
                  f"{one_line(e.details)}", 1)
        except grpc.aio.AioRpcError as e:
            hint = ""
            if e.code() in RETRYABLE:
                hint = (f" (the same dialogue failed {DIALOGUE_ATTEMPTS} times: the engine is overloaded; lower "
                        "--concurrency or raise server.call_timeout_s; rerunning the same command resumes)")
            _fail(f"a service refused: {e.code().name}: {one_line(e.details())}{hint}", 1)
    summary: dict = {}
    if specs:
        summary["overall"] = {s: v["all"]["overall"]["mean"] if mode == "support"
                              else v["all"]["collective_overall"]["mean"] for s, v in report["systems"].items()}
        summary["uninformative_judges"] = [n for n, j in report.get("judge_info", {}).items() if not j["informative"]]
    measures = report.get("measures") or {}
    msys = measures.get("systems") or {}
    summary["move_compliance"] = {s: v["values"]["move_compliance"]["mean"] for s, v in msys.items()}
    summary["distinguishability"] = {s: (v.get("distinguishability") or {}).get("accuracy") for s, v in msys.items()}
    summary["identifiability"] = {s: v["values"]["identifiability"]["mean"] for s, v in msys.items()}
    summary["wall_seconds"] = report.get("timings", {})
    print(json.dumps(summary, indent=2), flush=True)  # the result on stdout (`| jq`); progress stays on stderr
    console.print(f"report: {out / 'report.md'} (and report.json, *.png, transcripts.jsonl, measures.jsonl)")


@eval_app.command("export-pairs")
def export_pairs_cmd(
    eval_dir: Path = typer.Option(..., "--eval-dir", help="A finished `mascot eval` output directory."),
    out: Path = typer.Option(..., "--out", help="Where the rater sheets go."),
    target: str = typer.Option("mascot", "--target", help="The system compared against the others."),
    against: str = typer.Option("", "--against", help="Comma-separated systems (default: all others)."),
    threeway: str = typer.Option("", "--threeway", help="Three comma-separated systems for three-way items."),
    raters: int = typer.Option(3, "--raters", min=1, max=100, help="Raters per item."),
    limit: Optional[int] = typer.Option(None, "--limit", min=1, help="Situations to sample."),
    seed: int = typer.Option(0, "--seed", help="Seed of the blinding order."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace an earlier study in --out."),
) -> None:
    """Write blinded pairwise (and three-way) rater sheets: pairs.csv, ratings_template.csv, form.html, key.json."""
    from mascot.core.personas import PersonaCatalog
    from mascot.eval.human import export_pairs

    tw = [s.strip() for s in threeway.split(",") if s.strip()] or None
    try:
        res = export_pairs(eval_dir, out, target=target, against=[s.strip() for s in against.split(",") if s.strip()]
                           or None, seed=seed, raters=raters, threeway=tw, limit=limit, overwrite=overwrite,
                           names={c.id: c.name for c in PersonaCatalog.load().cards.values()})
    except FileExistsError as e:
        _fail(str(e).replace("overwrite=True", "--overwrite"))
    except (ValueError, FileNotFoundError) as e:
        _fail(str(e))
    console.print_json(json.dumps({k: v for k, v in res.items() if k != "files"}, default=str))


@eval_app.command("import-pairs")
def import_pairs_cmd(
    study: Path = typer.Option(..., "--study", help="The directory export-pairs wrote (holds key.json)."),
    ratings: list[Path] = typer.Option(..., "--ratings", help="Filled ratings CSV (repeatable)."),
) -> None:
    """Unblind filled ratings: win rates, ties, binomial p-values, Krippendorff's alpha -> preference.json."""
    from mascot.eval.human import import_pairs

    try:
        res = import_pairs(study, ratings)
    except (ValueError, FileNotFoundError) as e:
        _fail(str(e))
    for w in res.get("warnings", []):
        console.print(f"[yellow]warning:[/yellow] {w}")
    if not res.get("judgements"):
        console.print("[yellow]warning: no filled ratings were found; fill the choice column first[/yellow]")
    console.print_json(json.dumps(res.get("pairs", res), default=str))
    console.print(f"written: {study / 'preference.json'}")


@eval_app.command("probe")
def probe_cmd(
    situations: Path = typer.Option(..., "--situations", help="Situations (.jsonl, an EmpatheticDialogues .csv, or "
                                    "QMSum meetings)."),
    out: Path = typer.Option(..., "--out", help="Output directory (a rerun resumes it)."),
    limit: Optional[int] = typer.Option(None, "--limit", min=1, help="Use the first N records."),
    conditions: str = typer.Option("fallback,director", "--conditions", help="fallback (the first reply under the "
                                   "fallback directive) and/or director (under a directive the director writes for "
                                   "that persona)."),
    adapters: str = typer.Option("", "--adapters", help="Adapter store (a folder, or a file://, pvc:// or s3:// URI): "
                                 "its stable persona versions answer as system 'adapters', beside the base model; "
                                 "the situations their training used are refused."),
    training_manifest: list[Path] = typer.Option([], "--training-manifest", help="A training run's manifest.json: "
                                                 "its ids are refused (repeatable)."),
    mode: ModeName = MODE,
    seed: int = typer.Option(0, "--seed", help="Base seed (same seed, same directives and reply seeds)."),
    concurrency: int = typer.Option(16, "--concurrency", min=1, max=256, help="Requests in flight (the engine "
                                    "batches up to engine.max_batch_size, 16 by default)."),
    model: Optional[str] = typer.Option(None, "--model", help="Backbone model directory, or 'tiny' (default: "
                                        "SmolLM2-135M-Instruct, prepared by make setup)."),
    config: Optional[Path] = typer.Option(None, "--config", help="YAML config file."),
) -> None:
    """The speaker probe: every persona answers every situation directly (no director choosing who speaks), base
    model and adapters side by side; writes probe-report.json/md with card-move compliance and distinguishability."""
    from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn,
                               TimeRemainingColumn)

    from mascot.cli.common import load_config_or_exit, quiet
    from mascot.eval.probe import ProbeOptions, run_probe, validate

    opts = ProbeOptions(situations=situations, out_dir=out, mode=mode, limit=limit,
                        conditions=[c.strip() for c in conditions.split(",") if c.strip()], adapters=adapters.strip(),
                        manifests=list(training_manifest), seed=seed, concurrency=concurrency)
    try:
        validate(opts)
    except ValueError as e:
        _fail(str(e))
    cfg = load_config_or_exit(config, **{"engine.model": model})
    quiet()
    import grpc

    from mascot.core.retry import one_line

    started: dict[str, float] = {}
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  TextColumn("eta"), TimeRemainingColumn(), console=console) as bar:
        tasks: dict[str, int] = {}
        last: dict[str, int] = {}

        def progress(phase: str, done: int, total: int) -> None:
            import time

            if phase not in tasks:
                tasks[phase] = bar.add_task(phase, total=total)
                started[phase] = time.monotonic()
                last[phase] = done
                started[phase + ":first"] = done
            bar.update(tasks[phase], completed=done, total=total)
            step = max(1, total // 20)
            if not console.is_terminal and (done == total or done - last.get(phase, -step) >= step):
                last[phase] = done
                made = done - started[phase + ":first"]
                eta = ""
                if 0 < made and done < total:
                    rate = (time.monotonic() - started[phase]) / made
                    eta = f", eta {rate * (total - done) / 60:.1f} min"
                console.print(f"{phase} {done}/{total}{eta}")

        try:
            report = asyncio.run(run_probe(opts, cfg, progress))
        except (ValueError, FileNotFoundError) as e:
            _fail(str(e))
        except grpc.aio.AioRpcError as e:
            _fail(f"a service refused: {e.code().name}: {one_line(e.details())} (rerunning the same command resumes)",
                  1)
    summary = {s: {c: {"compliance": v["macro"]["compliance"]["mean"], "forbidden": v["macro"]["forbidden"]["mean"],
                       "distinguishability": v["distinguishability"]["accuracy"]}
                   for c, v in conds.items()} for s, conds in report["results"].items()}
    print(json.dumps({"macro": summary, "wall_seconds": report["timings"]}, indent=2), flush=True)
    console.print(f"report: {out / 'probe-report.md'} (and probe-report.json, replies.jsonl, directives.jsonl)")
