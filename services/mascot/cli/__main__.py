"""``python -m mascot.cli ...`` (the chart's Jobs and probes run it this way)."""

from mascot.cli.main import app

app(prog_name="mascot")
