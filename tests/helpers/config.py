"""The MascotConfig tests start stacks with."""

from __future__ import annotations

from pathlib import Path


def make_config(tmp_path: Path, **sections):
    """A MascotConfig for tests: ports 0, a SQLite file in ``tmp_path``, section overrides merged in."""
    from mascot.core.config import MascotConfig

    base = {"server": {"gateway_port": 0, "metrics_port": 0}, "store": {"url": f"sqlite:///{tmp_path}/store.db"}}
    for k, v in sections.items():
        base[k] = {**base.get(k, {}), **v}
    return MascotConfig(**base)
