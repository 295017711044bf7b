"""The metric catalog as Prometheus stores it, the metric names a PromQL expression reads, and promtool."""

from __future__ import annotations

import re
import shutil

from tests.helpers.paths import need

#: PromQL words that look like metric names: keywords, grouping modifiers, and the special float values.
KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless", "bool", "offset",
            "Inf", "NaN", "inf", "nan"}


def catalog_series() -> dict[str, str]:
    """Series name -> family of every metric of :class:`mascot.core.metrics.Metrics`, as Prometheus stores them."""
    from mascot.core.metrics import Metrics

    out = {}
    for fam in Metrics().registry.collect():
        suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_sum", "_count"], "gauge": [""]}[fam.type]
        out.update({fam.name + s: fam.name for s in suffixes})
    return out


def metric_names(expr: str) -> list[str]:
    """The metric names a PromQL expression selects: identifiers that are not functions, keywords, label names
    (in matchers or grouping clauses), strings or durations."""
    e = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    e = re.sub(r"\{[^}]*\}", "", e)
    e = re.sub(r"\[[^\]]*\]", "", e)
    e = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", e)
    names = []
    for m in re.finditer(r"(?<![\w.])[A-Za-z_:][A-Za-z0-9_:]*", e):
        if e[m.end():].lstrip().startswith("(") or m.group(0) in KEYWORDS:
            continue
        names.append(m.group(0))
    return names


def promtool_path() -> str:
    """The promtool binary (Debian's ``prometheus`` package); skips, or fails under CI, when it is missing."""
    path = shutil.which("promtool")
    need(path is not None, "promtool not found: apt-get install prometheus (.ci/run installs it)")
    return path
