"""Reward functions of phase 1 (REFERENCE.md section 5) as pure functions.

- :func:`format_reward`: R_format = −1 unless the output starts with exactly one non-empty ``<think>…</think>``
  block followed by a non-empty answer; otherwise max(−1, 1 − λ·max(0, w − L_max)/L_max), w = answer words.
- :func:`composite_reward`: r = w_rm·ẑ + w_fmt·R_format; a missing or non-finite part makes the whole reward None
  (the sample is masked and counted, never a NaN advantage).
"""

from __future__ import annotations

import math
import re

_THINK = re.compile(r"^\s*<think>(.*?)</think>(.*)$", re.DOTALL)


def split_think(text: str) -> tuple[str | None, str]:
    """``(think, answer)`` when ``text`` opens with a ``<think>…</think>`` block, else ``(None, text)``."""
    m = _THINK.match(text)
    if not m:
        return None, text
    return m.group(1), m.group(2)


def format_reward(text: str, l_max: int = 80, lam: float = 0.5) -> float:
    """R_format in [−1, 1] (REFERENCE.md section 5, ``phase1.format.*``).

    Args:
        text: The completion.
        l_max: Word budget of the answer (80 ED, 120 QMSum).
        lam: Verbosity penalty slope λ.

    Returns:
        −1 for a missing/empty/duplicated think block or an empty answer; else the verbosity ramp.
    """
    think, answer = split_think(text)
    if think is None or not think.strip() or "<think>" in answer or "</think>" in answer or "<think>" in think:
        return -1.0
    words = len(answer.split())
    if words == 0:
        return -1.0
    return max(-1.0, 1.0 - lam * max(0, words - l_max) / l_max)


def composite_reward(z_rm: float | None, r_format: float | None, w_rm: float = 1.0, w_fmt: float = 1.0) -> float | None:
    """r = w_rm·ẑ + w_fmt·R_format; None when either part is None, NaN or infinite."""
    parts = (z_rm, r_format)
    if any(p is None or not math.isfinite(p) for p in parts):
        return None
    return w_rm * z_rm + w_fmt * r_format
