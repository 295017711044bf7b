"""Fixtures of the Helm chart tests: the chart rendered offline (tests/helpers/chart.py) once per session for every
``helm/mascot/ci/*.yaml``, and the CRD validators of the custom resources it renders."""

from __future__ import annotations

import pytest
import yaml

from tests.helpers.chart import CI_FILES, Rendered, load_crd_validators, render
from tests.helpers.paths import SHARED, need


@pytest.fixture(scope="session")
def rendered() -> dict[str, Rendered]:
    """ci file name -> its rendering."""
    return {p.name: render(yaml.safe_load(p.read_text()) or {}) for p in CI_FILES}


@pytest.fixture(scope="session")
def crd_validators() -> dict:
    """kind -> a strict Draft7Validator of its CRD (read from the shared CRD directory once per session, never
    copied)."""
    crds = SHARED / "crds"
    need(crds.is_dir(), f"{crds} not found: the shared CRD schemas must sit beside the checkout")
    return load_crd_validators(crds)
