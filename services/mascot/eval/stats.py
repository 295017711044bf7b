"""Small shared statistics for evaluation reports.

Every ``{"mean", "std"}`` pair in ``report.json`` is computed here: the arithmetic mean and the population
standard deviation (numpy's default, ddof = 0) over dialogues (the docs: "± is the standard
deviation over dialogues"). An empty sample gives ``{"mean": None, "std": None}`` so a report never invents a
number.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Iterable, Sequence

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


#: Bootstrap resamples of :func:`bootstrap_mean` and :func:`paired_difference`.
N_RESAMPLES = 2000
#: Confidence level of every interval.
LEVEL = 0.95


def _finite(xs: Iterable[float], what: str) -> list[float]:
    vals = [float(x) for x in xs]
    if any(not math.isfinite(v) for v in vals):
        raise ValueError(f"{what} got a NaN or infinite value")
    return vals


def _bootstrap_mean_ci(vals: list[float], seed: int) -> tuple[float | None, float | None]:
    """Percentile bootstrap interval of the mean (``scipy.stats.bootstrap``, ``method="percentile"``); ``(None,
    None)`` for fewer than two values. The percentile method, not BCa: BCa is undefined on a constant sample (every
    resample has the same mean), which planted and degenerate data produce."""
    if len(vals) < 2:
        return None, None
    if max(vals) == min(vals):
        return vals[0], vals[0]
    import numpy as np
    from scipy.stats import bootstrap

    res = bootstrap((np.asarray(vals),), np.mean, n_resamples=N_RESAMPLES, confidence_level=LEVEL,
                    method="percentile", vectorized=True, rng=np.random.default_rng(seed))
    return float(res.confidence_interval.low), float(res.confidence_interval.high)


def bootstrap_mean(xs: Iterable[float], seed: int = 0) -> dict[str, float | int | None]:
    """Mean of ``xs`` with a 95% percentile-bootstrap interval (2000 resamples, seeded: same input, same interval).

    Returns:
        ``{"n", "mean", "lo", "hi"}`` rounded to 6 decimals; ``mean`` is None for an empty sample, ``lo``/``hi`` for
        fewer than two values (an interval needs a spread to resample).

    Raises:
        ValueError: a NaN or infinite value.
    """
    vals = _finite(xs, "bootstrap_mean")
    if not vals:
        return {"n": 0, "mean": None, "lo": None, "hi": None}
    lo, hi = _bootstrap_mean_ci(vals, seed)
    r = _rounded
    return {"n": len(vals), "mean": r(sum(vals) / len(vals)), "lo": r(lo), "hi": r(hi)}


def _rounded(v: float | None) -> float | None:
    return None if v is None else round(v, ROUND)


def paired_difference(a: Iterable[float], b: Iterable[float], seed: int = 0) -> dict[str, float | int | None]:
    """Paired comparison of two systems measured on the same items: ``a[i]`` and ``b[i]`` are one situation and seed.

    The difference is ``a - b`` per pair; its mean gets a 95% percentile-bootstrap interval over pairs (resampling
    pairs, so the pairing is kept), and ``p`` is the two-sided Wilcoxon signed-rank p-value
    (``scipy.stats.wilcoxon``, zero differences dropped, its default ``zero_method="wilcox"``). When every
    difference is zero there is no evidence of a difference: ``p`` = 1.

    Returns:
        ``{"n", "mean_diff", "lo", "hi", "p"}`` (rounded to 6 decimals, ``p`` to 4 significant digits; None where
        undefined: no pairs, or fewer than two for the interval).

    Raises:
        ValueError: ``a`` and ``b`` differ in length, or a NaN or infinite value.
    """
    av, bv = _finite(a, "paired_difference"), _finite(b, "paired_difference")
    if len(av) != len(bv):
        raise ValueError(f"paired_difference needs pairs: {len(av)} values against {len(bv)}")
    d = [x - y for x, y in zip(av, bv)]
    if not d:
        return {"n": 0, "mean_diff": None, "lo": None, "hi": None, "p": None}
    lo, hi = _bootstrap_mean_ci(d, seed)
    if all(x == 0 for x in d):
        p: float | None = 1.0
    else:
        import warnings

        from scipy.stats import wilcoxon

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # scipy warns that the normal approximation is used for small n / ties
            p = float(wilcoxon(d).pvalue)
        if not math.isfinite(p):
            p = None
    r = _rounded
    return {"n": len(d), "mean_diff": r(sum(d) / len(d)), "lo": r(lo), "hi": r(hi),
            "p": None if p is None else float(f"{p:.4g}")}


def bootstrap_pooled(counts: Sequence[Sequence[float]], statistic: Callable[[Any], Any],
                     seed: int = 0) -> tuple[float | None, float | None]:
    """95% percentile-bootstrap interval of a statistic of pooled counts (2000 resamples, seeded): the rows (one per
    dialogue) are resampled with replacement and summed, and ``statistic`` maps the sums to the figure, as
    :func:`bootstrap_mean` does for a mean of per-dialogue values (``scipy.stats.bootstrap``, percentile method).

    Args:
        counts: ``[D, K]`` non-negative counts, one row per dialogue (e.g. agent turns per persona).
        statistic: Vectorised: maps sums of shape ``[..., K]`` to figures of shape ``[...]`` (e.g. the entropy of the
            shares).

    Returns:
        ``(lo, hi)`` rounded to 6 decimals; ``(None, None)`` for fewer than two rows with a count (rows of zeros add
        nothing to the pool and are left out).

    Raises:
        ValueError: a NaN or infinite count, or rows of different lengths.
    """
    import numpy as np

    rows = np.asarray(counts, dtype=np.float64)
    if rows.size and not np.isfinite(rows).all():
        raise ValueError("bootstrap_pooled got a NaN or infinite count")
    if rows.ndim == 2:
        rows = rows[rows.sum(axis=1) > 0]  # they add nothing to the pool, and would leave some resamples empty
    if rows.ndim != 2 or len(rows) < 2:
        return None, None
    from scipy.stats import bootstrap

    res = bootstrap((np.arange(len(rows)),), lambda idx, axis=-1: statistic(rows[idx].sum(axis=-2)),
                    n_resamples=N_RESAMPLES, confidence_level=LEVEL, method="percentile", vectorized=True,
                    rng=np.random.default_rng(seed))
    return _rounded(float(res.confidence_interval.low)), _rounded(float(res.confidence_interval.high))
