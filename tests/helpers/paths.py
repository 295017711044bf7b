"""Where the tests find things: the checkout, the shared data beside it, and whether they run under CI."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

#: The checkout's root (the folder of pyproject.toml).
ROOT = Path(__file__).resolve().parents[2]
#: ``../shared`` beside the checkout (``MASCOT_SHARED_DIR`` overrides it): evaluation data and CRD schemas.
SHARED = Path(os.environ.get("MASCOT_SHARED_DIR", ROOT.parent / "shared"))
#: True under ``CI=true``, where a missing dependency fails a test instead of skipping it.
IN_CI = os.environ.get("CI", "").lower() == "true"


def need(condition: bool, why: str) -> None:
    """Skip (outside CI) or fail (under CI=true) when a dependency is missing."""
    if not condition:
        if IN_CI:
            pytest.fail(f"missing dependency under CI=true: {why}")
        pytest.skip(why)
