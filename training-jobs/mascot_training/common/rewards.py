"""Reward functions of phase 1 and phase 2 (section 6) as pure functions.

- :func:`format_reward`: R_format = −1 unless the output starts with exactly one non-empty ``<think>…</think>``
  block followed by a non-empty answer; otherwise max(−1, 1 − λ·max(0, w − L_max)/L_max), w = answer words.
- :func:`move_reward`: R_move = +1 for a required move of the card, −1 for a forbidden one (weights in config);
- :func:`composite_reward`: r = w_rm·ẑ + w_fmt·R_format; a missing or non-finite part makes the whole reward None
  (the sample is masked and counted, never a NaN advantage).
- :func:`i_div`, :func:`rollout_reward`: R = R_group + η·I_div of a director rollout, −2 when it ended at an invalid
  directive, None when the episode was dropped; :func:`judge_group_reward`: (s − 1)/4.
"""

from __future__ import annotations

import math
import re
from typing import Sequence

_THINK = re.compile(r"^\s*<think>(.*?)</think>(.*)$", re.DOTALL)


def split_think(text: str) -> tuple[str | None, str]:
    """``(think, answer)`` when ``text`` opens with a ``<think>…</think>`` block, else ``(None, text)``."""
    m = _THINK.match(text)
    if not m:
        return None, text
    return m.group(1), m.group(2)


def format_reward(text: str, l_max: int = 80, lam: float = 0.5, think: bool = True) -> float:
    """R_format in [−1, 1] (the paper's format reward, docs/method.md; ``think=False`` is our variant for models
    without a thinking mode).

    Args:
        text: The completion.
        l_max: Word budget of the answer (80 ED, 120 QMSum).
        lam: Verbosity penalty slope λ.
        think: The model has a thinking mode (Qwen3): a non-empty ``<think>`` block must open the completion.
            False (SmolLM2 and other models without one): the whole completion is the answer, and a think tag
            anywhere in it is a format error; only the empty answer and the verbosity ramp remain.

    Returns:
        −1 for a missing/empty/duplicated think block (``think``), a stray think tag (not ``think``) or an empty
        answer; else the verbosity ramp ``max(−1, 1 − λ·max(0, words − l_max)/l_max)``.
    """
    if not think:
        if "<think>" in text or "</think>" in text:
            return -1.0
        think_text, answer = "-", text
    else:
        think_text, answer = split_think(text)
    if think_text is None or not think_text.strip() or "<think>" in answer or "</think>" in answer \
            or "<think>" in think_text:
        return -1.0
    words = len(answer.split())
    if words == 0:
        return -1.0
    return max(-1.0, 1.0 - lam * max(0, words - l_max) / l_max)


def move_reward(moves, reply: str, user: str, required: float = 1.0, forbidden: float = 1.0) -> float:
    """R_move of a persona reply (our addition to the paper's rule-based reward, docs/method.md): ``+required`` when
    it shows one of its card's required moves, ``-forbidden`` when it shows a forbidden one (both can apply), 0 for a
    card without moves. Range [-forbidden, +required].

    Args:
        moves: The speaking card's :class:`mascot.core.moves.CardMoves`, or None.
        reply: The delivered reply text.
        user: The user's latest message (what detectors compare the reply with).
    """
    if moves is None or not reply.strip():
        return 0.0
    from mascot.core.moves import assess

    v = assess(moves, reply, user)
    return (required if v.required else 0.0) - (forbidden if v.forbidden else 0.0)


def composite_reward(z_rm: float | None, r_format: float | None, w_rm: float = 1.0, w_fmt: float = 1.0) -> float | None:
    """r = w_rm·ẑ + w_fmt·R_format; None when either part is None, NaN or infinite."""
    parts = (z_rm, r_format)
    if any(p is None or not math.isfinite(p) for p in parts):
        return None
    return w_rm * z_rm + w_fmt * r_format


# ----------------------------------------------------------------------------- phase 2


def i_div(personas: Sequence[str], min_distinct: int = 2) -> int:
    """The diversity indicator of the docs.

    Args:
        personas: Persona ids of the suffix's agent turns, in order.
        min_distinct: Distinct personas needed (``phase2.min_distinct``).

    Returns:
        +1 when at least ``min_distinct`` distinct personas spoke, else -1.
    """
    return 1 if len(set(personas)) >= min_distinct else -1


def rollout_reward(*, invalid: bool, dropped: bool, r_group: float | None, personas: Sequence[str], eta: float,
                   min_distinct: int, invalid_reward: float) -> float | None:
    """R = R_group + η·I_div.

    Args:
        invalid: The rollout ended at an invalid directive.
        dropped: The episode was dropped (the simulated user flipped role).
        r_group: The group reward of the suffix block; None when it could not be computed.
        personas: Persona ids of the suffix's agent turns.
        eta: η (``phase2.eta``).
        min_distinct: For :func:`i_div`.
        invalid_reward: R of an invalid rollout (``phase2.invalid_reward``, -2).

    Returns:
        ``invalid_reward`` for an invalid rollout; None for a dropped one or a missing/non-finite ``r_group`` (the
        rollout is masked: TRL gives it advantage 0); else R_group + η·I_div.
    """
    if dropped:
        return None
    if invalid:
        return float(invalid_reward)
    if r_group is None or r_group != r_group or r_group in (float("inf"), float("-inf")):
        return None
    return float(r_group) + eta * i_div(personas, min_distinct)


def judge_group_reward(mean_score: float) -> float:
    """R_group from the judge's mean collective score s ∈ [1, 5]: (s − 1)/4 ∈ [0, 1].

    Raises:
        ValueError: ``mean_score`` outside [1, 5].
    """
    if not 1.0 <= mean_score <= 5.0:
        raise ValueError(f"collective mean score must be in [1, 5], got {mean_score}")
    return (mean_score - 1.0) / 4.0
