"""``mascot train``: phase 1 (persona alignment) and phase 2 (collaborative dialogue optimisation) as chains or
single stages; the same commands run in a Job."""

from __future__ import annotations

import contextlib
import json
import sys
import warnings
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

console = Console(stderr=True)
train_app = typer.Typer(help="Training phases (run locally or as Kubernetes Jobs).", no_args_is_help=True,
                        add_completion=False)
STAGE_NAMES = ("sft-data", "sft", "sample", "judge", "pairs", "persona-rm", "persona-grpo", "publish")


def _load(config: Path, phase: int = 1):
    from mascot_training.common.config import ConfigError

    if phase == 2:
        from mascot_training.collaborative.config import load
    else:
        from mascot_training.persona.config import load
    try:
        return load(config)
    except ConfigError as e:
        console.print(f"[red]configuration error:[/red] {e}", soft_wrap=True)
        raise typer.Exit(2) from None


def _line(message: str) -> None:
    """One progress or stage line on stderr, never wrapped (a Job's log keeps one line per step)."""
    console.print(message, soft_wrap=True, markup=False, highlight=False)


def _run(config: Path, out: Path, stages: tuple[str, ...], phase: int = 1) -> None:
    from mascot.cli.common import quiet

    cfg = _load(config, phase)
    blocked = next((p for p in [out, *out.parents] if p.exists() and not p.is_dir()), None)
    if blocked is not None:
        console.print(f"[red]--out {out}: {blocked} exists and is not a directory[/red]")
        raise typer.Exit(2)
    quiet()
    import datasets

    datasets.disable_progress_bars()  # the stages report their own progress, one line per step in a Job log
    # TRL warns at import that it was tested with older vLLM releases; generation on vLLM needs a GPU and is checked
    # when the config loads, so on every run the warning is noise.
    warnings.filterwarnings("ignore", message="TRL currently supports vLLM versions")
    try:
        # The trainers print their step logs on stdout; they go to stderr with the rest of the progress, so that
        # stdout holds the JSON summary alone.
        with contextlib.redirect_stdout(sys.stderr):
            if phase == 2:
                from mascot_training.collaborative.pipeline import run as run2

                results = run2(cfg, out, stages, log_fn=_line)
            else:
                from mascot_training.persona.pipeline import run

                results = run(cfg, out, stages, log=_line)
    except (ValueError, FileNotFoundError, NotImplementedError) as e:
        console.print(f"[red]stage failed:[/red] {e}", soft_wrap=True)  # one line in Job logs
        raise typer.Exit(1) from None
    except OSError as e:  # e.g. a hub id that is not in the local cache, an unwritable --out
        console.print(f"[red]stage failed:[/red] {type(e).__name__}: {str(e).splitlines()[0] if str(e) else e}",
                      soft_wrap=True)
        raise typer.Exit(1) from None
    summary = {s: (m or {}).get("metrics") for s, m in results.items()}
    print(json.dumps(summary, indent=2, default=str), flush=True)  # the result on stdout; logs stay on stderr
    console.print(f"manifests under {out}/<stage>/manifest.json")
    pub = (results.get("publish") or {}).get("metrics") or {}
    if phase == 2 and pub.get("refused"):
        console.print(f"[red]publish refused the director adapter: {pub['refused']}[/red]")
        raise typer.Exit(1)
    if pub and not pub.get("published") and pub.get("refused"):
        console.print(f"[red]publish refused every adapter ({pub['refused']}); see {out}/publish/manifest.json for "
                      "the reasons[/red]")
        raise typer.Exit(1)


@train_app.command("persona-alignment")
def persona_alignment(
    config: Path = typer.Option(..., "--config", help="Phase 1 YAML (training-jobs/configs/*.yaml)."),
    out: Path = typer.Option(..., "--out", help="Run directory (resumable; DIR/adapters is the store)."),
) -> None:
    """Run phase 1 end to end: \\[sft-data → sft] → sample → judge → pairs → persona_rm → persona_grpo → publish."""
    from mascot_training.persona.config import STAGES

    _run(config, out, STAGES)


@train_app.command("collaborative")
def collaborative(
    config: Path = typer.Option(..., "--config", help="Phase 2 YAML (training-jobs/configs/collaborative*.yaml)."),
    out: Path = typer.Option(..., "--out", help="Run directory (resumable; DIR/adapters is the store)."),
    stage: list[str] = typer.Option([], "--stage", help="Run only these stages (repeatable): speakers, rollouts, "
                                    "group-rm, director-grpo, publish. Default: all, in order."),
) -> None:
    """Run phase 2 end to end: speakers → rollouts → group_rm → director_grpo → publish."""
    from mascot_training.collaborative.config import STAGES

    chosen = tuple(s.replace("-", "_") for s in stage) or STAGES
    unknown = [s for s in chosen if s not in STAGES]
    if unknown:
        console.print(f"[red]unknown stage(s) {unknown}; known: {', '.join(s.replace('_', '-') for s in STAGES)}"
                      "[/red]")
        raise typer.Exit(2)
    _run(config, out, chosen, phase=2)


@train_app.command("director-probe")
def director_probe(
    config: Path = typer.Option(..., "--config", help="Phase 2 YAML: its model, personas and director decoding."),
    situations: Path = typer.Option(..., "--situations", help="Held-out situations (e.g. runs/splits/eval.jsonl)."),
    limit: int = typer.Option(100, "--limit", min=1, help="First N situations, one prefix (the opening) each."),
    adapter: Optional[Path] = typer.Option(None, "--adapter", help="Director LoRA (e.g. RUN/director_grpo/adapter); "
                                                                   "default: the base model."),
    samples: int = typer.Option(1, "--samples", min=1, max=64, help="Decisions per prefix."),
    seed: int = typer.Option(0, "--seed"),
    out: Optional[Path] = typer.Option(None, "--out", help="Write the report and every decision as JSON here."),
) -> None:
    """The director's first decisions on held-out situations, as served: each persona's share with its 95% interval,
    refused decisions, and the Tones (docs/training.md, "Measuring the director")."""
    from mascot.cli.common import quiet
    from mascot.core.files import atomic_write_text
    from mascot_training.collaborative.probe import run_probe

    cfg = _load(config, phase=2)
    quiet()
    try:
        rep = run_probe(cfg, situations, limit=limit, adapter=str(adapter) if adapter else None, samples=samples,
                        seed=seed)
    except (ValueError, FileNotFoundError) as e:
        console.print(f"[red]cannot probe:[/red] {e}", soft_wrap=True)
        raise typer.Exit(1) from None
    if out is not None:
        atomic_write_text(out, json.dumps(rep, indent=1) + "\n")
    console.print(f"{rep['n']} first decisions ({limit} situations x {samples}), director "
                  f"{rep['adapter'] or 'base model'}, decoding {rep['decoding']}", highlight=False, soft_wrap=True)
    for pid, e in [*rep["personas"].items(), ("refused", rep["refused"])]:
        console.print(f"  {pid:20s} {e['count']:4d}  {e['share']:.3f}  [{e['ci95'][0]:.3f}, {e['ci95'][1]:.3f}]",
                      highlight=False)
    t = rep["tones"]
    console.print(f"  Tones: {t['distinct']} distinct; most common {t['top']!r} in {t['top_share']:.3f} of valid "
                  "directives", highlight=False, soft_wrap=True)


def _stage_command(name: str) -> None:
    def cmd(config: Path = typer.Option(..., "--config", help="Phase 1 YAML."),
            out: Path = typer.Option(..., "--out", help="Run directory.")) -> None:
        _run(config, out, (name.replace("-", "_"),))

    cmd.__doc__ = f"Run the {name} stage of phase 1 only (inputs from earlier stages in --out)."
    train_app.command(name)(cmd)


for _name in STAGE_NAMES:
    _stage_command(_name)
