"""Adapter registry state transitions and the canary draw, on plain registry dicts."""

from __future__ import annotations

import pytest
from scipy.stats import binom

from mascot.core.adapters import registry as rg
from mascot.core.errors import FailedPrecondition, InvalidArgument, NotFound


def reg_with(*states):
    return {"revision": 3, "adapters": {"anchor": {"versions": {
        str(i + 1): {"state": s, "name": f"anchor--v{i + 1}"} for i, s in enumerate(states)},
        "stable": None, "canary": None, "canary_weight": 0, "previous_stable": []}}}


def test_promote_to_stable_retires_the_old_one_and_remembers_it():
    reg = reg_with("staged", "staged")
    rg.promote(reg, "anchor", 1)
    rg.promote(reg, "anchor", 2)
    e = reg["adapters"]["anchor"]
    assert (e["stable"], e["previous_stable"]) == (2, [1])
    assert [v["state"] for v in e["versions"].values()] == ["retired", "stable"]


def test_a_new_canary_replaces_the_old_one_and_promoting_it_clears_the_alias():
    reg = reg_with("staged", "staged", "staged")
    rg.promote(reg, "anchor", 1)
    rg.promote(reg, "anchor", 2, 0.3)
    rg.promote(reg, "anchor", 3, 0.5)
    e = reg["adapters"]["anchor"]
    assert (e["canary"], e["canary_weight"]) == (3, 0.5) and e["versions"]["2"]["state"] == "staged"
    rg.promote(reg, "anchor", 3)
    assert (e["stable"], e["canary"], e["canary_weight"]) == (3, None, 0)


def test_rollback_restores_and_retires_current_and_canary():
    reg = reg_with("staged", "staged", "staged")
    rg.promote(reg, "anchor", 1)
    rg.promote(reg, "anchor", 2)
    rg.promote(reg, "anchor", 3, 0.2)
    rg.rollback(reg, "anchor")
    e = reg["adapters"]["anchor"]
    assert (e["stable"], e["canary"], e["previous_stable"]) == (1, None, [])
    assert [v["state"] for v in e["versions"].values()] == ["stable", "retired", "retired"]
    with pytest.raises(FailedPrecondition, match="no previous stable"):
        rg.rollback(reg, "anchor")


@pytest.mark.parametrize("op,err,msg", [
    (lambda r: rg.promote(r, "anchor", 9), NotFound, "no version 9"),
    (lambda r: rg.promote(r, "beacon", 1), NotFound, "no adapter is published"),
    (lambda r: rg.promote(r, "anchor", 1, 1.0), InvalidArgument, "canary_weight"),
    (lambda r: rg.promote(r, "anchor", 2), FailedPrecondition, "already stable"),
    (lambda r: rg.retire(r, "anchor", 2), FailedPrecondition, "stable version"),
    (lambda r: rg.retire(r, "anchor", 3), FailedPrecondition, "already retired"),
])
def test_forbidden_transitions_raise_and_change_nothing(op, err, msg):
    reg = reg_with("staged", "stable", "retired")
    reg["adapters"]["anchor"]["stable"] = 2
    before = repr(reg)
    with pytest.raises(err, match=msg):
        op(reg)
    assert repr(reg) == before


def test_canary_split_lands_in_a_binomial_99_percent_interval():
    entry = {"stable": 1, "canary": 2, "canary_weight": 0.3}
    picks = [rg.choose_version(entry, f"conversation-{i}") for i in range(400)]
    lo, hi = binom.interval(0.99, 400, 0.3)
    assert lo <= picks.count(2) <= hi and set(picks) == {1, 2}
    assert all(rg.choose_version(entry, f"conversation-{i}") == picks[i] for i in range(50))  # sticky per key
    assert rg.choose_version({"stable": 4, "canary": None, "canary_weight": 0}, "x") == 4
    assert rg.choose_version({"stable": None, "canary": None}, "x") is None


def test_a_retired_version_can_be_promoted_again():
    reg = reg_with("staged", "staged")
    rg.promote(reg, "anchor", 1)
    rg.promote(reg, "anchor", 2)  # v1 retired, remembered
    rg.promote(reg, "anchor", 1)  # back to v1 without a rollback
    e = reg["adapters"]["anchor"]
    assert (e["stable"], e["previous_stable"]) == (1, [2])
    assert [v["state"] for v in e["versions"].values()] == ["stable", "retired"]


def test_store_uris_resolve_to_one_filesystem_and_root(tmp_path):
    """the docs: a local directory, file://, pvc:// (KServe: the claim is mounted at the PVC root and the
    URI's path is below it) and s3:// (no request is made to open it)."""
    from mascot.core.adapters import store as st

    assert st.open_store(tmp_path / "a").root == str(tmp_path / "a")
    assert st.open_store(f"file://{tmp_path}/b").root == str(tmp_path / "b")
    (tmp_path / "mnt").mkdir()
    pvc = st.open_store("pvc://adapter-claim/runs/store", pvc_root=str(tmp_path / "mnt"))
    assert (pvc.root, pvc.local) == (str(tmp_path / "mnt" / "runs" / "store"), True)
    with pytest.raises(ValueError, match="not mounted at .*/nothing-here"):  # never the pod's own disk
        st.open_store("pvc://c/x", pvc_root=str(tmp_path / "nothing-here"))
    s = st.open_store("s3://my-bucket/a//b/", s3_endpoint_url="http://127.0.0.1:9")
    assert (s.local, s.root) == (False, "my-bucket/a/b")
    assert s.display("registry.json") == "s3://my-bucket/a/b/registry.json"
    for bad, msg in [("gs://b/x", "unsupported scheme"), ("pvc://Bad_Claim/x", "not a PersistentVolumeClaim"),
                     ("pvc://c/../../etc", "leaves the claim's mount"), ("s3:///x", "not an S3 bucket"),
                     ("s3://bucket/../x", "not allowed"), ("file://relative/x", "absolute path"),
                     ("", "no adapter store")]:
        with pytest.raises(ValueError, match=msg):
            st.open_store(bad)


def test_adapters_config_store_uri_and_unload_delay():
    from pydantic import ValidationError

    from mascot.core.config import AdaptersConfig

    for ok in ("", "/data/adapters", "rel/dir", "file:///data", "pvc://claim/x", "s3://bucket/p"):
        assert AdaptersConfig(store=ok).store == ok
    for bad, msg in [("gs://b/x", "unsupported scheme"), ("s3://", "names no bucket"), ("pvc:///x", "names no claim")]:
        with pytest.raises(ValidationError, match=msg):
            AdaptersConfig(store=bad)
    cfg = AdaptersConfig()
    assert (cfg.retired_unload_s, cfg.pvc_root, cfg.s3_endpoint_url, cfg.cache_dir) == (600, "/mnt/pvc", "", "")
    with pytest.raises(ValidationError):
        AdaptersConfig(retired_unload_s=-1)
