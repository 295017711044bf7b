"""The import contracts of ``.importlinter`` (layers cli -> eval -> app -> components -> core -> api, components
independent, training never importing servicers, the composition root, eval or the cli) hold on the tree, and
``lint-imports`` fails when one is broken: a copy of the packages with one planted import must be refused."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.paths import ROOT

LINT = Path(sys.executable).with_name("lint-imports")


def lint(src_root: Path) -> subprocess.CompletedProcess:
    """``lint-imports`` over the packages under ``src_root`` (``services/`` and ``training-jobs/`` layout)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(src_root / "services"), str(src_root / "training-jobs")])}
    return subprocess.run([str(LINT), "--no-cache", str(ROOT / ".importlinter")], capture_output=True, text=True,
                          env=env, cwd=src_root, timeout=300)


@pytest.fixture(scope="module")
def tree_copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    dst = tmp_path_factory.mktemp("tree")
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(ROOT / "services" / "mascot", dst / "services" / "mascot", ignore=ignore)
    shutil.copytree(ROOT / "training-jobs" / "mascot_training", dst / "training-jobs" / "mascot_training",
                    ignore=ignore)
    return dst


def test_the_tree_keeps_every_contract() -> None:
    out = lint(ROOT)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    assert "0 broken" in out.stdout and "4 kept" in out.stdout, out.stdout[-2000:]


@pytest.mark.parametrize(("module", "planted", "message"), [
    # core reaching up to the composition root
    ("core/files.py", "import mascot.app.stack", "mascot.core is not allowed to import mascot.app"),
    # one component importing another
    ("director/directive.py", "import mascot.speaker.prompts",
     "mascot.director is not allowed to import mascot.speaker"),
    # the generated API importing core
    ("api/__init__.py", "import mascot.core.config", "mascot.api is not allowed to import mascot.core"),
    # serving code importing the training jobs
    ("core/files.py", "import mascot_training", "mascot.core is not allowed to import mascot_training"),
])
def test_a_planted_violation_is_refused(tree_copy: Path, module: str, planted: str, message: str) -> None:
    path = tree_copy / "services" / "mascot" / module
    before = path.read_text()
    path.write_text(before + f"\n\ndef _planted() -> None:\n    {planted}  # a planted violation\n")
    try:
        out = lint(tree_copy)
    finally:
        path.write_text(before)
    assert out.returncode != 0, out.stdout[-2000:]
    broken = out.stdout.split("Broken contracts", 1)[-1]
    assert message in broken, broken[-3000:]


def test_training_importing_a_servicer_is_refused(tree_copy: Path) -> None:
    path = tree_copy / "training-jobs" / "mascot_training" / "__init__.py"
    before = path.read_text()
    path.write_text(before + "\nimport mascot.speaker.servicer  # a planted violation\n")
    try:
        out = lint(tree_copy)
    finally:
        path.write_text(before)
    assert out.returncode != 0
    assert "mascot_training is not allowed to import mascot.speaker.servicer" in out.stdout, out.stdout[-3000:]
