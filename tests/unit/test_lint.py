"""ruff (rules of ruff.toml: pycodestyle, pyflakes, blind excepts, stale noqa comments) is clean on the tree, and the
configuration is the one in force: a planted unused import and an unexplained blind ``except`` are reported."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.helpers.paths import ROOT

RUFF = Path(sys.executable).with_name("ruff")


def ruff(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([str(RUFF), "check", "--no-cache", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=300)


def test_the_tree_is_clean() -> None:
    out = ruff(".")
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-1000:]


def test_the_configuration_reports_planted_faults(tmp_path: Path) -> None:
    (tmp_path / "ruff.toml").write_text((ROOT / "ruff.toml").read_text())
    (tmp_path / "planted.py").write_text(
        "import os\n\n\ndef f() -> int:\n    try:\n        return 1\n    except Exception:\n        return 2\n")
    out = ruff("--output-format", "concise", ".", cwd=tmp_path)
    assert out.returncode == 1
    assert "F401" in out.stdout and "BLE001" in out.stdout, out.stdout
