"""Small shared statistics for evaluation reports.

Every ``{"mean", "std"}`` pair in ``report.json`` is computed here: the arithmetic mean and the population
standard deviation (numpy's default, ddof = 0) over dialogues (the docs: "± is the standard
deviation over dialogues"). An empty sample gives ``{"mean": None, "std": None}`` so a report never invents a
number.
"""

from __future__ import annotations

import math
from typing import Iterable

#: Decimal places kept in report values.
ROUND = 6


def mean_std(xs: Iterable[float]) -> dict[str, float | None]:
    """``{"mean": m, "std": s}`` of ``xs`` (population std, ddof = 0), rounded to 6 decimals.

    Args:
        xs: Finite numbers; NaN values are rejected.

    Raises:
        ValueError: a NaN or infinite value.
    """
    vals = [float(x) for x in xs]
    if any(not math.isfinite(v) for v in vals):
        raise ValueError("mean_std got a NaN or infinite value")
    if not vals:
        return {"mean": None, "std": None}
    m = sum(vals) / len(vals)
    var = sum((v - m) ** 2 for v in vals) / len(vals)
    return {"mean": round(m, ROUND), "std": round(math.sqrt(var), ROUND)}


def to_percent(score: float) -> float:
    """Map a 1-5 rubric score to 0-100: (s - 1) / 4 * 100.

    Raises:
        ValueError: ``score`` outside [1, 5].
    """
    if not 1.0 <= score <= 5.0:
        raise ValueError(f"rubric score must be in [1, 5], got {score}")
    return (score - 1.0) / 4.0 * 100.0
