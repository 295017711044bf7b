"""Training situations: a deterministic hash split keeps training and evaluation ids disjoint.

docs/data.md asks that anything trained on the shared evaluation texts use a subset disjoint from anything
evaluated: ids go to training when SHA-256(salt + id) falls below ``train_fraction``; the manifest records the ids
used, and ``mascot eval --training-manifest`` refuses them.
"""

from __future__ import annotations

import hashlib

from mascot.core.situations import Situation, load_situations


def in_train_split(item_id: str, train_fraction: float, salt: str) -> bool:
    """True when ``item_id`` belongs to the training split (uniform in [0, 1) from the first 8 hash bytes)."""
    h = hashlib.sha256((salt + item_id).encode("utf-8")).digest()
    return int.from_bytes(h[:8], "big") / 2**64 < train_fraction


def heldout_unit(item_id: str) -> str:
    """The situation id of a phase 1 group id (``situation|persona``) or a phase 2 prefix id (``situation#j``); any
    other id is its own unit."""
    return item_id.split("|", 1)[0].split("#", 1)[0]


def in_heldout_split(item_id: str, fraction: float) -> bool:
    """True when a group (phase 1: context x persona) or a prefix (phase 2) is held out: its reward model pairs only
    measure the reward model, and GRPO (``heldout_eval``) measures the policy on it without training on it. Whole
    situations are held out (:func:`heldout_unit`: every persona's group and every prefix of one situation go the same
    way), so a held-out figure is on user messages training never saw. A fixed hash of the situation id, so every
    stage and every resumed run holds out the same ones; about ``fraction`` (0-1) of the situations."""
    return not in_train_split(heldout_unit(item_id), 1 - fraction, "heldout")


def training_situations(cfg, limit: int | None = None) -> list[Situation]:
    """The first ``limit`` (default ``data.limit``) records of the training split (file order).

    Raises:
        ValueError: no record falls in the training split.
    """
    d = cfg.data
    every = load_situations(d.situations, cfg.mode, None)
    train = [s for s in every if in_train_split(s.id, d.train_fraction, d.salt)]
    n = limit if limit is not None else d.limit
    if n is not None:
        train = train[:n]
    if not train:
        raise ValueError(f"no record of {d.situations} falls in the training split (train_fraction "
                         f"{d.train_fraction}); raise it or add records")
    return train
