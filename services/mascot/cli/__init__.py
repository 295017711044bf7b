"""The ``mascot`` command line (typer): ``mascot = mascot.cli:app``; ``python -m mascot.cli`` runs the same."""

from mascot.cli.main import app

__all__ = ["app"]
