"""Preference pairs within one group of scored candidates, the rule both phases use.

Phase 1's ``pairs`` stage (:mod:`mascot_training.persona.pairs`) applies it to the K candidate replies of a
(context, persona) group, phase 2's ``group_rm`` stage (:mod:`mascot_training.collaborative.group_rm`) to the K
block continuations of a prefix: every ordered pair whose judge means differ by at least δ, largest margin first, at
most ``max_per_group``; unjudged candidates and identical texts are skipped and counted.
"""

from __future__ import annotations


def build_pairs(candidates: list[str], means: list[float | None], delta: float, max_per_group: int
                ) -> tuple[list[tuple[int, int, float]], dict[str, int]]:
    """Pairs ``(winner index, loser index, margin)`` of one group, largest margin first, then index order.

    Returns:
        ``(pairs, dropped)`` with ``dropped`` counts: ``unjudged`` candidates, ``identical`` text pairs that met δ,
        ``over_cap`` qualifying pairs beyond ``max_per_group``.
    """
    dropped = {"unjudged": sum(1 for m in means if m is None), "identical": 0, "over_cap": 0}
    qual = []
    for i, mi in enumerate(means):
        for j, mj in enumerate(means):
            if i == j or mi is None or mj is None or mi - mj < delta - 1e-9:
                continue
            if abs(mi - mj) < 1e-9 and j < i:  # delta 0: a tie is kept once, in index order
                continue
            if candidates[i].strip() == candidates[j].strip():
                dropped["identical"] += 1
                continue
            qual.append((i, j, round(mi - mj, 6)))
    qual.sort(key=lambda p: (-p[2], p[0], p[1]))
    dropped["over_cap"] = max(0, len(qual) - max_per_group)
    return qual[:max_per_group], dropped
