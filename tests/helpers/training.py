"""Training job configurations for tests, written from the shipped smoke configs."""

from __future__ import annotations

from pathlib import Path

import yaml

from tests.helpers.paths import ROOT, SHARED


def phase2_config(tmp_path: Path, **over) -> Path:
    """training-jobs/configs/collaborative_smoke.yaml with ``over`` set (dotted keys, e.g. ``phase2.num_generations``;
    missing sections are made) and the shared EmpatheticDialogues test situations as data, written to
    ``tmp_path``/c.yaml (returned)."""
    cfg = yaml.safe_load((ROOT / "training-jobs" / "configs" / "collaborative_smoke.yaml").read_text())
    for k, v in over.items():
        node = cfg
        *path, last = k.split(".")
        for p in path:
            node = node.setdefault(p, {})
        node[last] = v
    cfg["data"]["situations"] = str(SHARED / "data" / "empathetic_dialogues" / "test_situations.jsonl")
    f = tmp_path / "c.yaml"
    f.write_text(yaml.safe_dump(cfg))
    return f
