"""Turn judgements and metrics into ``report.json`` numbers.

Per dialogue: each criterion's score is the mean over the dialogue's judged agent turns of (s − 1)/4 × 100;
the dialogue's Overall is the mean of its criteria. Per system × split: mean and population std over dialogues
(:func:`mascot.eval.stats.mean_std`). Collective criteria are judged once per dialogue (the block of turns after
the opening message). With several judges, a turn's score per criterion is first averaged over the judges that
produced a valid judgement ("each judge on its own, plus their mean").
"""

from __future__ import annotations

from collections import defaultdict
from typing import Iterable, Sequence

from mascot.eval.stats import mean_std, to_percent
from mascot.judge.rubric import AGENT_CRITERIA, COLLECTIVE_CRITERIA

AGENT_KEYS = tuple(AGENT_CRITERIA)
COLLECTIVE_KEYS = tuple(COLLECTIVE_CRITERIA)


def _avg(xs: Sequence[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def combine_judges(per_judge: Sequence[dict[str, int] | None]) -> dict[str, float] | None:
    """Mean 0-100 score per criterion over the judges with a valid verdict (None entries are dropped items).

    Returns:
        ``{criterion: 0..100}``, or None when no judge produced a valid verdict.
    """
    ok = [s for s in per_judge if s]
    if not ok:
        return None
    return {k: sum(to_percent(s[k]) for s in ok) / len(ok) for k in ok[0]}


def dialogue_scores(agent: Sequence[dict[str, float] | None], keys: Sequence[str]) -> dict[str, float] | None:
    """Per-criterion means over a dialogue's valid turn scores plus ``"overall"``; None when no turn is valid."""
    ok = [a for a in agent if a]
    if not ok:
        return None
    out = {k: sum(a[k] for a in ok) / len(ok) for k in keys}
    out["overall"] = sum(out[k] for k in keys) / len(keys)
    return out


def aggregate_split(items: Iterable[dict], meeting: bool) -> dict:
    """One system × split block of ``report.json``.

    Args:
        items: Per-dialogue dicts with ``agent`` (list of per-turn ``{criterion: 0..100}`` or None, aligned with
            ``agent_personas``), ``agent_personas``, ``collective`` (``{criterion: 0..100}`` or None),
            ``unparseable`` (int), ``safety_turns`` (int) and ``automatic`` (from
            :func:`mascot.eval.automatic.dialogue_metrics`).
        meeting: Meeting mode reports collective criteria only.

    Returns:
        ``{"n", "criteria", "overall", "collective", "collective_overall", "automatic", "safety_turns",
        "unparseable", "personas"}`` (the automatic block is filled by the caller).
    """
    items = list(items)
    per_dialogue = [] if meeting else [d for d in (dialogue_scores(it["agent"], AGENT_KEYS) for it in items) if d]
    coll = [dialogue_scores([it["collective"]], COLLECTIVE_KEYS) for it in items]
    coll = [c for c in coll if c]
    personas: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    if not meeting:
        for it in items:
            for pid, s in zip(it["agent_personas"], it["agent"]):
                if s:
                    for k in AGENT_KEYS:
                        personas[pid][k].append(s[k])
    return {
        "n": len(items),
        "criteria": {} if meeting else {k: mean_std(d[k] for d in per_dialogue) for k in AGENT_KEYS},
        "overall": mean_std(d["overall"] for d in per_dialogue),
        "collective": {k: mean_std(c[k] for c in coll) for k in COLLECTIVE_KEYS},
        "collective_overall": mean_std(c["overall"] for c in coll),
        "safety_turns": sum(it["safety_turns"] for it in items),
        "unparseable": sum(it["unparseable"] for it in items),
        "personas": {pid: {k: round(_avg(v) or 0.0, 6) for k, v in sorted(ks.items())}
                     for pid, ks in sorted(personas.items())},
    }
