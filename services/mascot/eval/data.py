"""Evaluation situations, valence/domain splits and the training-overlap guard.

Support mode reads EmpatheticDialogues situation records (``id``, ``emotion``, ``situation``,
``first_utterance``) and splits them by the ED emotion → valence table of the docs Meeting mode
reads QMSum excerpt records (``id``, ``domain``, ``turns``, ``query``) and splits them by domain.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from mascot.core.files import iter_jsonl_records

#: ED emotion label → valence bucket (the docs; MIME grouping as coded in Sahandfer/CEM, with a
#: neutral bucket carved out).
VALENCE: dict[str, str] = {
    **{e: "positive" for e in ("confident", "joyful", "grateful", "impressed", "proud", "excited", "trusting",
                               "hopeful", "faithful", "content", "caring")},
    **{e: "neutral" for e in ("surprised", "anticipating", "prepared", "nostalgic", "sentimental")},
    **{e: "negative" for e in ("afraid", "angry", "annoyed", "anxious", "apprehensive", "ashamed", "devastated",
                               "disappointed", "disgusted", "embarrassed", "furious", "guilty", "jealous", "lonely",
                               "sad", "terrified")},
}
SUPPORT_SPLITS = ("positive", "neutral", "negative")
MEETING_SPLITS = ("academic", "committee", "product")


@dataclass(frozen=True)
class Situation:
    """One evaluation item.

    Attributes:
        id: The record id (stable across runs; used for overlap checks).
        split: Valence bucket (support) or lower-case domain (meeting).
        opening: The user's first message (ED first utterance, or the QMSum query).
        situation: What the simulated user is told about themselves.
        emotion: ED emotion label ('' in meeting mode).
        context: Seed context ``(speaker, content)`` (the meeting excerpt; empty in support mode).
    """

    id: str
    split: str
    opening: str
    situation: str
    emotion: str = ""
    context: tuple[tuple[str, str], ...] = field(default_factory=tuple)


def load_situations(path: str | Path, mode: str, limit: int | None = None) -> list[Situation]:
    """Read up to ``limit`` records of ``path`` (JSONL) as :class:`Situation` items, in file order.

    Raises:
        FileNotFoundError: no such file.
        ValueError: a line is not JSON, lacks a field, has an emotion outside the 32 ED labels or a domain outside
            Academic/Committee/Product, or repeats an id (messages name the file and line).
    """
    if mode not in ("support", "meeting"):
        raise ValueError(f"mode must be support or meeting, got {mode!r}")
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"situations file {p} does not exist")
    need = ("id", "emotion", "situation", "first_utterance") if mode == "support" else ("id", "domain", "turns", "query")
    out: list[Situation] = []
    seen: set[str] = set()
    for n, rec in iter_jsonl_records(p, need, f"--mode {mode}"):
        sid = str(rec["id"])
        if sid in seen:
            raise ValueError(f"{p}:{n}: duplicate id {sid!r}")
        seen.add(sid)
        if mode == "support":
            emotion = str(rec["emotion"]).strip().lower()
            if emotion not in VALENCE:
                raise ValueError(f"{p}:{n}: emotion {rec['emotion']!r} is not one of the 32 EmpatheticDialogues "
                                 "labels")
            out.append(Situation(sid, VALENCE[emotion], str(rec["first_utterance"]).strip(),
                                 str(rec["situation"]).strip(), emotion))
        else:
            domain = str(rec["domain"]).strip().lower()
            if domain not in MEETING_SPLITS:
                raise ValueError(f"{p}:{n}: domain {rec['domain']!r} is not Academic, Committee or Product")
            ctx = tuple((str(t.get("speaker", "Speaker")), str(t.get("content", ""))) for t in rec["turns"])
            query = str(rec["query"]).strip()
            out.append(Situation(sid, domain, query, f"You attended this meeting and want to know: {query}",
                                 "", ctx))
        if limit is not None and len(out) >= limit:
            break
    if not out:
        raise ValueError(f"{p}: no records")
    return out


def manifest_ids(path: str | Path) -> set[str]:
    """Situation/data ids a training run used, from its manifest JSON (``data_ids`` or ``situation_ids`` lists).

    Raises:
        FileNotFoundError: no such file.
        ValueError: not JSON, or no id list in it.
    """
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"training manifest {p} does not exist")
    try:
        d = json.loads(p.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ValueError(f"{p}: not valid JSON ({e.msg})") from None
    ids = d.get("data_ids", d.get("situation_ids")) if isinstance(d, dict) else None
    if not isinstance(ids, list):
        raise ValueError(f"{p}: a training manifest lists the ids it trained on under 'data_ids'")
    return {str(i) for i in ids}


def check_no_overlap(situations: list[Situation], manifests: list[str | Path]) -> None:
    """Refuse to evaluate on ids a training run used (data README: splits must be disjoint).

    Raises:
        ValueError: an id appears in a manifest; the message names the manifest and up to 5 ids.
    """
    ids = {s.id for s in situations}
    for m in manifests:
        overlap = sorted(ids & manifest_ids(m))
        if overlap:
            shown = ", ".join(overlap[:5]) + (" ..." if len(overlap) > 5 else "")
            raise ValueError(f"{len(overlap)} evaluation situation(s) were used for training by {m}: {shown}. "
                             "Evaluate on a disjoint subset (drop these ids or choose other records).")
