"""The MASCOT paper's published numbers, transcribed once, and the mapping from our system ids to its names.

Source: Wang, Jin, Cabral, Hester, *MASCOT: Towards Multi-Agent Socio-Collaborative Companion Systems*,
arXiv 2601.14230, as transcribed from the paper:

- section 8.1: ED agent-specific scores per valence (Positive, Negative, Neutral) -> :data:`AGENT_SPECIFIC`;
- section 8.2: ED collective scores (Positive and Negative only) -> :data:`COLLECTIVE`;
- section 8.3: QMSum collective scores per domain, MASCOT and MultiAgentESC only, read off a dot plot
  (about +/-1) -> :data:`QMSUM_COLLECTIVE`;
- section 8.4: ablation (MASCOT-C: random speaking order, our ``no-director``; MASCOT-P: no persona prompts,
  our ``no-persona``), read off a figure (about +/-1) -> :data:`ABLATION`, :data:`ABLATION_CRITERIA`;
- section 8.7: automatic metrics, mean +/- std of per-dialogue rates in [0, 1] -> :data:`AUTOMATIC`.

All judge scores are on 0-100 (the docs maps 1-5 to (s - 1) / 4 * 100); NLI rates and
Self-BLEU are in [0, 1]. The paper reports no std for sections 8.1-8.4 and no split for 8.4 and 8.7.

Derived identity: a table's Overall equals the unweighted mean of its criterion
columns up to rounding. Every row of sections 8.1 and 8.2 satisfies it within 0.1 (the largest gap is 0.06,
Negative Self-Consistency agent-specific). The figure-read section 8.3 rows satisfy it within 0.1 except
MultiAgentESC Academic: mean of the four columns 62.175 against Overall ~63.4 (gap 1.225), which is inside the
combined reading error of the dot plot (each value about +/-1) and is listed in
:data:`QMSUM_IDENTITY_EXCEPTIONS`.

Names: section 8.7 calls the prompting baseline "Few-Shot CoT"; we read it as the "Few-Shot + CoT" row of
sections 8.1-8.2 (our ``few-shot-cot``). Section 8.4's "Coherence" is read as the collective Relevance &
Coherence criterion (``relevance_coherence``).
"""

from __future__ import annotations

from typing import Mapping

#: Agent-specific criterion keys, in the paper's column order.
AGENT_KEYS: tuple[str, ...] = (
    "emotional_expressiveness",
    "empathetic_support_quality",
    "persona_consistency",
    "response_relevance",
    "social_contribution",
)
#: Paper column title of each agent-specific criterion key.
AGENT_COLUMNS: dict[str, str] = {
    "emotional_expressiveness": "Emotion",
    "empathetic_support_quality": "Empathy",
    "persona_consistency": "Consistency",
    "response_relevance": "Relevance",
    "social_contribution": "Contribution",
}
#: Collective criterion keys, in the paper's column order.
COLLECTIVE_KEYS: tuple[str, ...] = (
    "fidelity",
    "originality_specificity",
    "relevance_coherence",
    "engagement_contribution",
)
#: Paper column title of each collective criterion key.
COLLECTIVE_COLUMNS: dict[str, str] = {
    "fidelity": "Fidelity",
    "originality_specificity": "Originality",
    "relevance_coherence": "Relevance",
    "engagement_contribution": "Engagement",
}

#: Our system id -> the paper's name, in the paper's row order (baselines, MASCOT), then the ablations.
SYSTEM_NAMES: dict[str, str] = {
    "zero-shot": "Zero-Shot",
    "zero-shot-cot": "Zero-Shot CoT",
    "few-shot": "Few-Shot",
    "few-shot-cot": "Few-Shot + CoT",
    "sft": "SFT",
    "self-consistency": "Self-Consistency",
    "multiagentesc": "MultiAgentESC",
    "mascot": "MASCOT",
    "no-director": "MASCOT-C",
    "no-persona": "MASCOT-P",
    "mascot-trained": "MASCOT (trained)",
}
#: Systems of the main tables (sections 8.1-8.2), in the paper's row order.
PAPER_SYSTEMS: tuple[str, ...] = (
    "zero-shot", "zero-shot-cot", "few-shot", "few-shot-cot", "sft", "self-consistency", "multiagentesc", "mascot",
)
#: Ablation variants (section 8.4): ``no-director`` = MASCOT-C, ``no-persona`` = MASCOT-P.
ABLATION_SYSTEMS: tuple[str, ...] = ("no-director", "no-persona")
#: Ours, not the paper's: MASCOT served with a store's trained adapter versions (``mascot eval --adapters``).
TRAINED_SYSTEMS: tuple[str, ...] = ("mascot-trained",)
#: ED valence splits in the paper's table order (section 8.1).
SUPPORT_SPLITS: tuple[str, ...] = ("positive", "negative", "neutral")
#: QMSum domains (section 8.3).
MEETING_SPLITS: tuple[str, ...] = ("academic", "committee", "product")

# Section 8.1, one tuple per row: (Emotion, Empathy, Consistency, Relevance, Contribution, Overall).
_AGENT_ROWS: dict[str, dict[str, tuple[float, ...]]] = {
    "positive": {
        "zero-shot": (59.5, 58.1, 61.5, 58.6, 56.5, 58.8),
        "zero-shot-cot": (63.4, 60.5, 65.2, 60.4, 59.4, 61.8),
        "few-shot": (61.4, 59.9, 63.5, 59.8, 58.6, 60.6),
        "few-shot-cot": (63.8, 61.2, 65.4, 61.2, 60.2, 62.4),
        "sft": (46.3, 46.0, 47.5, 52.1, 43.5, 47.1),
        "self-consistency": (66.3, 66.9, 65.1, 69.1, 66.3, 66.7),
        "multiagentesc": (66.9, 67.9, 65.9, 70.4, 67.0, 67.6),
        "mascot": (75.3, 76.2, 80.0, 78.1, 74.9, 76.9),
    },
    "negative": {
        "zero-shot": (54.6, 54.6, 56.9, 56.0, 53.2, 55.1),
        "zero-shot-cot": (59.9, 59.4, 61.8, 60.3, 58.0, 59.9),
        "few-shot": (57.6, 57.6, 59.4, 58.4, 55.9, 57.8),
        "few-shot-cot": (60.7, 60.5, 62.1, 61.2, 58.9, 60.7),
        "sft": (43.2, 43.2, 44.1, 49.8, 40.3, 44.1),
        "self-consistency": (61.4, 61.1, 59.9, 61.0, 59.3, 60.6),
        "multiagentesc": (63.8, 62.4, 61.6, 67.0, 60.4, 63.0),
        "mascot": (68.2, 69.3, 73.4, 74.0, 67.8, 70.5),
    },
    "neutral": {
        "zero-shot": (58.8, 57.9, 60.5, 58.4, 56.2, 58.4),
        "zero-shot-cot": (63.2, 60.8, 65.1, 60.9, 59.4, 61.9),
        "few-shot": (61.6, 60.5, 63.4, 60.7, 59.0, 61.0),
        "few-shot-cot": (63.7, 61.8, 65.3, 61.7, 60.3, 62.6),
        "sft": (45.9, 45.7, 47.0, 51.8, 43.0, 46.7),
        "self-consistency": (60.3, 64.6, 70.9, 66.1, 65.7, 65.5),
        "multiagentesc": (67.4, 65.5, 72.4, 68.3, 68.7, 68.5),
        "mascot": (75.1, 75.6, 79.0, 78.1, 74.1, 76.4),
    },
}

# Section 8.2, one tuple per row: (Fidelity, Originality, Relevance, Engagement, Overall).
_COLLECTIVE_ROWS: dict[str, dict[str, tuple[float, ...]]] = {
    "positive": {
        "zero-shot": (42.4, 33.0, 52.2, 59.7, 46.8),
        "zero-shot-cot": (48.7, 36.8, 49.7, 58.1, 48.3),
        "few-shot": (43.9, 35.5, 54.5, 59.9, 48.4),
        "few-shot-cot": (48.7, 39.8, 58.9, 60.0, 51.8),
        "sft": (40.6, 37.2, 47.3, 58.9, 46.0),
        "self-consistency": (48.7, 40.2, 59.8, 60.9, 52.4),
        "multiagentesc": (49.2, 39.2, 47.3, 64.5, 50.1),
        "mascot": (54.9, 45.5, 61.6, 69.8, 57.9),
    },
    "negative": {
        "zero-shot": (41.8, 33.0, 52.8, 59.3, 46.7),
        "zero-shot-cot": (49.0, 36.1, 49.9, 58.0, 48.3),
        "few-shot": (43.6, 35.7, 55.2, 59.5, 48.5),
        "few-shot-cot": (48.0, 39.4, 59.0, 59.9, 51.6),
        "sft": (40.3, 36.9, 46.4, 57.9, 45.4),
        "self-consistency": (45.0, 38.0, 49.3, 49.8, 45.5),
        "multiagentesc": (45.7, 38.6, 47.1, 61.0, 48.1),
        "mascot": (53.0, 44.3, 60.9, 65.4, 55.9),
    },
}

# Section 8.3 (all ~), in the source's column order: (Overall, Engagement, Relevance, Originality, Fidelity).
_QMSUM_ROWS: dict[str, dict[str, tuple[float, ...]]] = {
    "academic": {"mascot": (69.5, 76.7, 74.5, 63.4, 63.6), "multiagentesc": (63.4, 66.4, 64.4, 58.4, 59.5)},
    "committee": {"mascot": (77.2, 78.5, 80.4, 81.3, 68.7), "multiagentesc": (66.0, 74.1, 66.1, 62.0, 62.0)},
    "product": {"mascot": (72.3, 83.1, 78.0, 65.6, 62.5), "multiagentesc": (62.5, 69.8, 62.6, 58.3, 59.4)},
}
_QMSUM_ORDER = ("overall", "engagement_contribution", "relevance_coherence", "originality_specificity", "fidelity")


def _rows_to_dicts(rows: Mapping[str, Mapping[str, tuple[float, ...]]],
                   keys: tuple[str, ...]) -> dict[str, dict[str, dict[str, float]]]:
    """``{split: {system: row tuple}}`` -> ``{split: {system: {key: value}}}``.

    Raises:
        ValueError: a row whose length differs from ``keys`` (a transcription slip).
    """
    out: dict[str, dict[str, dict[str, float]]] = {}
    for split, systems in rows.items():
        out[split] = {}
        for system, values in systems.items():
            if len(values) != len(keys):
                raise ValueError(f"paper row {split}/{system} has {len(values)} values, expected {len(keys)}")
            out[split][system] = dict(zip(keys, values))
    return out


#: Section 8.1: ``{split: {system_id: {criterion key or "overall": score 0-100}}}``; splits positive, negative,
#: neutral; the eight systems of :data:`PAPER_SYSTEMS`.
AGENT_SPECIFIC: dict[str, dict[str, dict[str, float]]] = _rows_to_dicts(_AGENT_ROWS, AGENT_KEYS + ("overall",))
#: Section 8.2: ``{split: {system_id: {collective key or "overall": score 0-100}}}``; splits positive and negative.
COLLECTIVE: dict[str, dict[str, dict[str, float]]] = _rows_to_dicts(_COLLECTIVE_ROWS, COLLECTIVE_KEYS + ("overall",))
#: Section 8.3 (figure-read, ~ +/-1): ``{domain: {"mascot"|"multiagentesc": {collective key or "overall": 0-100}}}``.
QMSUM_COLLECTIVE: dict[str, dict[str, dict[str, float]]] = _rows_to_dicts(_QMSUM_ROWS, _QMSUM_ORDER)
#: Section 8.3 rows whose Overall is not the mean of the four columns within 0.1 (figure-reading error, see the
#: module docstring): ``{(domain, system_id)}``.
QMSUM_IDENTITY_EXCEPTIONS: frozenset[tuple[str, str]] = frozenset({("academic", "multiagentesc")})

#: Section 8.4 (figure-read, ~ +/-1; split not stated): ``{system_id: {"agent_overall", "collective_overall",
#: "coherence"}}`` on 0-100. ``coherence`` is the collective Relevance & Coherence criterion.
ABLATION: dict[str, dict[str, float]] = {
    "mascot": {"agent_overall": 73.7, "collective_overall": 56.8, "coherence": 61.0},
    "no-director": {"agent_overall": 72.8, "collective_overall": 48.5, "coherence": 48.0},
    "no-persona": {"agent_overall": 69.6, "collective_overall": 53.9, "coherence": 59.0},
}
#: Section 8.4 text: the agent-specific criteria quoted for MASCOT-P against MASCOT (Empathy 72.8 -> 65.1,
#: Consistency 76.6 -> 72.3): ``{system_id: {agent criterion key: score 0-100}}``.
ABLATION_CRITERIA: dict[str, dict[str, float]] = {
    "mascot": {"empathetic_support_quality": 72.8, "persona_consistency": 76.6},
    "no-persona": {"empathetic_support_quality": 65.1, "persona_consistency": 72.3},
}

#: Section 8.7: ``{system_id: {metric: (mean, std)}}``, metrics ``entailment``, ``neutral``, ``contradiction``
#: (NLI label rates between consecutive agent turns) and ``self_bleu`` (0-1, lower = more diverse). SFT has only
#: a contradiction rate in the paper. Split not stated (all ED).
AUTOMATIC: dict[str, dict[str, tuple[float, float]]] = {
    "mascot": {
        "entailment": (0.098, 0.097),
        "neutral": (0.769, 0.177),
        "contradiction": (0.133, 0.148),
        "self_bleu": (0.316, 0.151),
    },
    "few-shot-cot": {
        "entailment": (0.564, 0.104),
        "neutral": (0.429, 0.104),
        "contradiction": (0.008, 0.016),
        "self_bleu": (0.551, 0.058),
    },
    "sft": {"contradiction": (0.195, 0.179)},
}


def system_label(system_id: str) -> str:
    """The paper's name of one of our system ids (``"few-shot-cot"`` -> ``"Few-Shot + CoT"``).

    Args:
        system_id: Our id, e.g. ``"mascot"``; an id the paper does not know is returned unchanged.
    """
    return SYSTEM_NAMES.get(system_id, system_id)
