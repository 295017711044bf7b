"""``mascot data``: prepare situation files (docs/data.md, "Splits").

``mascot data split FILE --out DIR --eval N --gate M`` writes ``eval.jsonl`` (the first N records), ``gate.jsonl``
(the next M) and ``train.jsonl`` (the rest) from any situations file the readers accept, so training, the
PromoteAdapter gate and the evaluation never see the same situation.
"""

from __future__ import annotations

import json
from pathlib import Path

import typer

from mascot.cli.common import MODE, ModeName, console

data_app = typer.Typer(help="Prepare situation files: disjoint evaluation, gate and training parts.",
                       no_args_is_help=True)


@data_app.command("split")
def split(
    situations: Path = typer.Argument(..., help="Situations file: our JSONL, an EmpatheticDialogues CSV, or QMSum "
                                                "JSON (a file or a folder of meetings)."),
    out: Path = typer.Option(..., "--out", help="Folder for eval.jsonl, gate.jsonl and train.jsonl."),
    eval_n: int = typer.Option(100, "--eval", min=1, help="Records for evaluation: the first N of the file."),
    gate_n: int = typer.Option(40, "--gate", min=0, help="Records for the PromoteAdapter gate: the next M."),
    mode: ModeName = MODE,
) -> None:
    """Split a situations file by position into evaluation, gate and training parts (disjoint)."""
    from mascot.core.situations import split_situations

    if not str(out).strip() or str(out) == ".":
        console.print("[red]--out must name a folder for the split files (e.g. runs/splits)[/red]")
        raise typer.Exit(2)
    try:
        counts = split_situations(situations, mode, out, eval_n=eval_n, gate_n=gate_n)
    except (FileNotFoundError, ValueError) as e:
        console.print(f"[red]cannot split:[/red] {e}", soft_wrap=True, highlight=False)
        raise typer.Exit(1) from None
    except OSError as e:
        console.print(f"[red]cannot split:[/red] {e}", soft_wrap=True, highlight=False)
        raise typer.Exit(1) from None
    print(json.dumps({name: {"records": n, "file": str(out / f"{name}.jsonl")} for name, n in counts.items()}),
          flush=True)
