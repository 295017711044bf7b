"""The MascotConfig tests start stacks with."""

from __future__ import annotations

from pathlib import Path


def make_config(tmp_path: Path, **sections):
    """A MascotConfig for tests: ports 0 (the control plane's too), a SQLite file in ``tmp_path``, section overrides
    merged in.

    The safety gate runs its rules only (``safety.classifier: none``): these stacks serve scripted engines and the
    tiny random model, whose text is noise to the trained crisis detector, and what they test is not the detector.
    The detector through real servers is tested where it is the subject (``safety={"classifier": "minilm"}``:
    tests/reliability/test_safety_dialogue.py; its figures: test_crisis_detector.py)."""
    from mascot.core.config import MascotConfig

    base = {"server": {"gateway_port": 0, "metrics_port": 0}, "store": {"url": f"sqlite:///{tmp_path}/store.db"},
            "safety": {"classifier": "none"}, "control": {"port": 0}}
    for k, v in sections.items():
        base[k] = {**base.get(k, {}), **v}
    return MascotConfig(**base)
