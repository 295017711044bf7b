"""Reward functions of phase 1 and phase 2 (section 6) as pure functions.

- :func:`format_reward`: R_format = −1 unless the output starts with exactly one non-empty ``<think>…</think>``
  block followed by a non-empty answer; otherwise max(−1, 1 − λ·max(0, w − L_max)/L_max), w = answer words.
- :func:`move_reward`: R_move = +1 for a required move of the card, −1 for a forbidden one (weights in config);
- :func:`composite_reward`: r = w_rm·ẑ + w_fmt·R_format; a missing or non-finite part makes the whole reward None
  (the sample is masked and counted, never a NaN advantage).
- :func:`i_div`, :func:`rollout_reward`: R = R_group + η·I_div (+ β·B, :func:`usage_balance`) of a director rollout,
  −2 when it ended at an invalid directive, None when the episode was dropped; :func:`judge_group_reward`:
  (s − 1)/4; :func:`team_terms`, :func:`team_reward`: R_group of ``phase2.group_reward.source: team``, the
  collective criteria read from card moves and MiniLM cosines.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

if TYPE_CHECKING:  # pragma: no cover - imports for annotations only
    import numpy as np

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


#: ``phase2.diversity``: how I_div reads a rollout (see :func:`i_div`).
DIVERSITY_MODES = ("new_persona", "distinct")


def i_div(personas: Sequence[str], min_distinct: int = 2, *, mode: str = "new_persona",
          heard: Sequence[str] = ()) -> int:
    """The diversity indicator I_div ∈ {−1, +1} of a suffix (``phase2.diversity``).

    Modes:
        ``new_persona`` (the default; our deviation, docs/method.md "Deviation: the diversity indicator"): +1 when
        the suffix gives a turn to at least one persona not heard in the dialogue so far (not in ``heard``), else −1
        (a suffix without agent turns included). Under serving's rest rule (no persona of the last
        ``rest_turns`` = 2 agent turns) the suffix's first speaker is always new after a prefix of at most 2 agent
        turns, so the indicator varies only after prefixes of 3 or more agent turns (``phase2.prefix_agent_turns``).
        ``distinct`` (the paper's): +1 when at least ``min_distinct`` distinct personas spoke in the suffix, else
        −1; under the rest rule always +1 for a valid suffix of 3 agent turns or fewer.

    Args:
        personas: Persona ids of the suffix's agent turns, in order.
        min_distinct: Distinct personas needed (``phase2.min_distinct``; ``distinct`` only).
        mode: One of :data:`DIVERSITY_MODES`.
        heard: Persona ids of the agent turns before the suffix (the prefix's; ``new_persona`` only).

    Raises:
        ValueError: unknown ``mode``.
    """
    if mode == "new_persona":
        return 1 if set(personas) - set(heard) else -1
    if mode == "distinct":
        return 1 if len(set(personas)) >= min_distinct else -1
    raise ValueError(f"unknown diversity mode {mode!r}; use one of {', '.join(DIVERSITY_MODES)}")


def usage_balance(personas: Sequence[str], counts: Mapping[str, int], roster: Sequence[str]) -> float:
    """The usage-balance term B ∈ [−1, 1] of a suffix: the mean over its agent turns of 1 − K·s_p, clipped to
    [−1, 1], where s_p is persona p's share of the agent turns counted so far (``counts``) and K the roster's size.
    B is 0 when every persona has its 1/K share, +1 for a persona not yet counted, −1 for one at twice its share or
    more; 0 when nothing is counted yet or the suffix has no agent turn.

    A reward-side form of the load-balancing terms of mixture-of-experts routing (Shazeer et al., 2017; Fedus et al.,
    2021, "Switch Transformers"), our addition (docs/method.md, "Deviation: usage balance"): within a GRPO group,
    the rollout that gives the turn to a persona the policy under-uses is ranked above one that picks the favourite.

    Raises:
        ValueError: an empty ``roster``.
    """
    if not roster:
        raise ValueError("usage_balance needs the roster's persona ids")
    total = sum(counts.get(p, 0) for p in roster)
    if not personas or total == 0:
        return 0.0
    k = len(roster)
    terms = [min(1.0, max(-1.0, 1.0 - k * counts.get(p, 0) / total)) for p in personas]
    return sum(terms) / len(terms)


def rollout_reward(*, invalid: bool, dropped: bool, r_group: float | None, personas: Sequence[str], eta: float,
                   min_distinct: int, invalid_reward: float, diversity: str = "new_persona",
                   heard: Sequence[str] = (), beta: float = 0.0, balance: float = 0.0) -> float | None:
    """R = R_group + η·I_div (+ β·B, the usage-balance term of :func:`usage_balance`, when ``beta`` > 0).

    Args:
        invalid: The rollout ended at an invalid directive.
        dropped: The episode was dropped (the simulated user flipped role).
        r_group: The group reward of the suffix block; None when it could not be computed.
        personas: Persona ids of the suffix's agent turns.
        eta: η (``phase2.eta``).
        min_distinct: For :func:`i_div` (``distinct`` mode).
        invalid_reward: R of an invalid rollout (``phase2.invalid_reward``, -2).
        diversity: :func:`i_div`'s mode (``phase2.diversity``).
        heard: Persona ids of the prefix's agent turns (:func:`i_div`, ``new_persona`` mode).
        beta: β (``phase2.balance``); 0 leaves the paper's reward.
        balance: B of the suffix (:func:`usage_balance`).

    Returns:
        ``invalid_reward`` for an invalid rollout; None for a dropped one or a missing/non-finite ``r_group`` (the
        rollout is masked: TRL gives it advantage 0); else R_group + η·I_div + β·B.

    Raises:
        ValueError: unknown ``diversity``.
    """
    if dropped:
        return None
    if invalid:
        return float(invalid_reward)
    if r_group is None or r_group != r_group or r_group in (float("inf"), float("-inf")):
        return None
    return float(r_group) + eta * i_div(personas, min_distinct, mode=diversity, heard=heard) + beta * balance


def judge_group_reward(mean_score: float) -> float:
    """R_group from the judge's mean collective score s ∈ [1, 5]: (s − 1)/4 ∈ [0, 1].

    Raises:
        ValueError: ``mean_score`` outside [1, 5].
    """
    if not 1.0 <= mean_score <= 5.0:
        raise ValueError(f"collective mean score must be in [1, 5], got {mean_score}")
    return (mean_score - 1.0) / 4.0


# ----------------------------------------------------------------------------- phase 2: the team reward


@dataclass(frozen=True)
class TeamTerms:
    """The measured terms of the team reward of one block (:func:`team_terms`); None where a term has no value.

    Attributes:
        agent_turns: Agent turns of the block.
        complementarity: Share of the block's agent turns that show a card move no earlier turn of the block showed,
            in [0, 1] (None when no roster card has moves).
        relevance: Mean over the block's agent turns of max(0, cos(turn, latest user message before it)), in [0, 1];
            an empty turn and an echo of the user's message (the metrics judge's rule) count 0 (None when no agent
            turn has a user message before it).
        redundancy: Mean pairwise cosine between the block's non-empty agent turns, clipped to [0, 1] (None for fewer
            than two).
    """

    agent_turns: int
    complementarity: float | None
    relevance: float | None
    redundancy: float | None


def _answered(history: Sequence[Any], block: Sequence[Any]) -> list[tuple[str, str]]:
    """``(text, latest user message before it)`` per agent turn of ``block`` ("" when no user message)."""
    user, out = "", []
    for t in history:
        if t.role != "agent" and t.text.strip():
            user = t.text
    for t in block:
        if t.role == "agent":
            out.append((t.text, user))
        elif t.text.strip():
            user = t.text
    return out


def team_texts(history: Sequence[Any], block: Sequence[Any]) -> list[str]:
    """The texts :func:`team_terms` embeds for one block (its agent turns with a word and the user messages they
    answer), for callers that embed many blocks in one batch."""
    from mascot.core.guard import words

    return list(dict.fromkeys(x for text, u in _answered(history, block) if words(text) for x in (text, u) if x))


def team_terms(history: Sequence[Any], block: Sequence[Any], moves: Any,
               embed: Callable[[Sequence[str]], "np.ndarray"]) -> TeamTerms:
    """The terms of the team reward (:func:`team_reward`) of a block of turns after ``history``.

    Reads the same signals as the team measures of ``mascot eval`` and the metrics judge: card moves
    (:func:`mascot.core.moves.assess` with :func:`mascot.core.moves.round_moves` of the roster, as
    ``moves_per_round``), the pairwise MiniLM cosine of the turns (:func:`mascot.core.embedding.mean_pairwise_cosine`,
    as ``round_redundancy``) and the cosine of each turn to the latest user message (as ``relevance_user``, with the
    metrics judge's echo rule: :data:`mascot.judge.metrics.ECHO_COSINE`, :data:`~mascot.judge.metrics.ECHO_WORDS`).

    Args:
        history: The turns before the block (``role``, ``text``), oldest first.
        block: The block's turns (agent and user), oldest first.
        moves: :func:`mascot.core.moves.round_moves` of the roster (None: no card has moves).
        embed: ``embed(texts) -> [len(texts), d]`` L2-normalised embeddings (e.g.
            :meth:`mascot.core.embedding.SentenceEncoder.embed`); called once, with :func:`team_texts`.

    Returns:
        The :class:`TeamTerms` (every term None for a block without agent turns).
    """
    import numpy as np

    from mascot.core.embedding import mean_pairwise_cosine
    from mascot.core.guard import shares_ngram, words
    from mascot.core.moves import assess
    from mascot.judge.metrics import ECHO_COSINE, ECHO_WORDS

    agents = _answered(history, block)
    if not agents:
        return TeamTerms(0, None, None, None)
    texts = team_texts(history, block)
    vec = dict(zip(texts, np.asarray(embed(texts), dtype=np.float64))) if texts else {}
    complementarity = None
    if moves is not None:
        shown: set[str] = set()
        adding = 0
        for text, u in agents:
            fired = set(assess(moves, text, u).required) if words(text) else set()
            adding += bool(fired - shown)
            shown |= fired
        complementarity = adding / len(agents)
    rel = []
    for text, u in agents:
        if not u:
            continue
        cos = float(vec[text] @ vec[u]) if words(text) else 0.0
        echo = cos >= ECHO_COSINE or shares_ngram(text, [u], ECHO_WORDS)
        rel.append(0.0 if echo else min(1.0, max(0.0, cos)))
    said = [vec[text] for text, _ in agents if words(text)]
    red = mean_pairwise_cosine(np.stack(said)) if len(said) >= 2 else None
    return TeamTerms(len(agents), complementarity, sum(rel) / len(rel) if rel else None,
                     None if red is None else min(1.0, max(0.0, red)))


#: The cosine between two turns up to which the team reward counts no redundancy: turns answering one user message
#: share its topic (different moves on one topic measured about 0.3 with MiniLM, near-identical validations above 0.9),
#: and the metrics judge gives its best overlap score up to the same cosine
#: (:data:`mascot.judge.metrics.OVERLAP_STEPS`).
REDUNDANCY_FLOOR = 0.5


def team_reward(terms: TeamTerms, w_moves: float = 1.0, w_relevance: float = 0.5, w_redundancy: float = 0.5,
                redundancy_floor: float = REDUNDANCY_FLOOR) -> float | None:
    """R_group of ``phase2.group_reward.source: team``: the weighted mean of the paper's collective criteria as
    measured (our formula; docs/method.md, "Deviation: the group reward"):

        R_team = (w_m·C + w_u·U + w_r·(1 − D')) / (w_m + w_u + w_r)  ∈ [0, 1],
        D' = clip((D − d₀) / (1 − d₀), 0, 1)

    with C the complementarity (complementary contributions), U the relevance to the user, D the redundancy between
    the turns (:class:`TeamTerms`) and d₀ = ``redundancy_floor`` (shared topic is not redundancy); a term without a
    value is left out with its weight.

    Args:
        terms: :func:`team_terms` of the block.
        w_moves, w_relevance, w_redundancy: The weights w_m, w_u, w_r (``phase2.group_reward.team``), each in [0, 1].
        redundancy_floor: d₀ in [0, 1).

    Returns:
        R_team in [0, 1]; None when no weighted term has a value (the rollout is masked and counted).

    Raises:
        ValueError: a weight outside [0, 1], or ``redundancy_floor`` outside [0, 1).
    """
    weights = (w_moves, w_relevance, w_redundancy)
    if any(not 0.0 <= w <= 1.0 for w in weights):
        raise ValueError(f"team reward weights must be in [0, 1], got {weights}")
    if not 0.0 <= redundancy_floor < 1.0:
        raise ValueError(f"redundancy_floor must be in [0, 1), got {redundancy_floor}")
    excess = None if terms.redundancy is None else \
        min(1.0, max(0.0, (terms.redundancy - redundancy_floor) / (1.0 - redundancy_floor)))
    values = (terms.complementarity, terms.relevance, None if excess is None else 1.0 - excess)
    pairs = [(w, v) for w, v in zip(weights, values) if v is not None and w > 0]
    total = sum(w for w, _ in pairs)
    return sum(w * v for w, v in pairs) / total if total else None
