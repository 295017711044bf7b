"""``AdapterStore.latest_live``: the version training builds on (phase 2's frozen speakers), from the registry of a
local store opened by path or ``file://`` URI: stable, else the highest version that is not retired."""

from __future__ import annotations

import json

import pytest

from mascot.core.adapters import store as st


def _store(tmp_path, versions: dict[int, str], stable: int | None = None, canary: int | None = None, uri=False):
    root = tmp_path / "store"
    root.mkdir(exist_ok=True)
    entry = {"versions": {str(n): {"state": s, "name": f"anchor--v{n}", "digest": f"d{n}"}
                          for n, s in versions.items()},
             "stable": stable, "canary": canary, "canary_weight": 0.25 if canary else 0, "previous_stable": []}
    (root / "registry.json").write_text(json.dumps({"revision": 4, "adapters": {"anchor": entry}}))
    return st.open_store(f"file://{root}" if uri else str(root))


@pytest.mark.parametrize("uri", [False, True])
@pytest.mark.parametrize("versions,stable,canary,expected", [
    ({1: "retired", 2: "stable", 3: "canary", 4: "staged"}, 2, 3, 2),  # stable wins over newer versions
    ({1: "staged", 2: "staged"}, None, None, 2),  # a fresh phase 1 store: the highest staged version
    ({1: "retired", 2: "canary", 3: "retired"}, None, 2, 2),  # no stable: the canary
    ({1: "staged", 2: "retired"}, None, None, 1),  # a retired version is never live
    ({1: "retired", 2: "retired"}, None, None, None),
])
def test_latest_live_is_stable_else_the_highest_version_not_retired(tmp_path, uri, versions, stable, canary,
                                                                     expected):
    got = _store(tmp_path, versions, stable, canary, uri).latest_live("anchor")
    if expected is None:
        assert got is None
    else:
        assert got == {"version": expected, "state": versions[expected], "name": f"anchor--v{expected}",
                       "digest": f"d{expected}"}


def test_latest_live_of_an_unknown_persona_or_an_empty_store_is_none(tmp_path):
    assert _store(tmp_path, {1: "stable"}, 1).latest_live("beacon") is None
    assert st.open_store(str(tmp_path / "nothing-here")).latest_live("anchor") is None


def test_latest_live_refuses_a_malformed_registry(tmp_path):
    (tmp_path / "registry.json").write_text("{not json")
    with pytest.raises(RuntimeError, match="not valid JSON"):
        st.open_store(str(tmp_path)).latest_live("anchor")
