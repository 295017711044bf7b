"""The training-overlap guard: evaluation refuses situations a training run used.

Situations themselves are read by :mod:`mascot.core.situations`.
"""

from __future__ import annotations

import json
from pathlib import Path

from mascot.core.situations import Situation


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
    """Refuse to evaluate on ids a training run used (docs/data.md, "Splits": splits must be disjoint).

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
