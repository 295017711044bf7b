"""Phase 2 ``speakers`` from a phase 1 adapter store named by URI, through the store's own API: a local path
(absolute and relative), ``file:///`` and ``s3://`` (moto's S3 server on 127.0.0.1). The latest live version of each
persona is used (stable, else the highest version not retired); a remote version is downloaded and checked against
its registered digest; the phase 2 config check reads the same store."""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import shutil
import uuid
from pathlib import Path

import pytest

from mascot.core.adapters import registry as rg
from mascot.core.adapters import store as st
from mascot_training.collaborative import speakers
from mascot_training.collaborative.config import CollaborativeConfig, load
from mascot_training.common import manifest as mf
from mascot_training.common.config import ConfigError
from tests.helpers.lora import make_lora
from tests.helpers.paths import need
from tests.helpers.training import phase2_config

PERSONAS = ["anchor", "catalyst"]


@pytest.fixture(scope="module")
def loras(tiny_model_dir, tmp_path_factory) -> dict[str, Path]:
    """Four distinct LoRAs on the tiny model: two versions each of anchor and catalyst."""
    d = tmp_path_factory.mktemp("speaker-loras")
    return {name: make_lora(tiny_model_dir, d / name, seed=i)
            for i, name in enumerate(("anchor1", "anchor2", "catalyst1", "catalyst2"))}


def _fill(store: str | Path, loras: dict[str, Path], base: Path) -> None:
    """anchor: v1, v2 staged (latest live = v2); catalyst: v1 stable, v2 staged (latest live = the stable v1)."""
    for name in ("anchor1", "anchor2", "catalyst1", "catalyst2"):
        st.publish_adapter(store, name[:-1], loras[name], base_model=str(base), run_id="p1", data_ids=[],
                           eval_metrics={})
    st.update_registry(store, lambda reg: rg.promote(reg, "catalyst", 1))


def _cfg(tiny_model_dir: Path, uri: str) -> CollaborativeConfig:
    return CollaborativeConfig(model=str(tiny_model_dir), personas=PERSONAS, speakers={"store": uri})


def _weights_digest(d: str | Path) -> str:
    return hashlib.sha256((Path(d) / st.WEIGHTS).read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def local_store(loras, tiny_model_dir, tmp_path_factory) -> Path:
    store = tmp_path_factory.mktemp("p1-run") / "adapters"
    _fill(store, loras, tiny_model_dir)
    return store


@pytest.mark.parametrize("form", ["absolute", "relative", "file"])
def test_speakers_come_from_a_local_store_named_by_path_or_file_uri(form, local_store, loras, tiny_model_dir,
                                                                   tmp_path, monkeypatch):
    monkeypatch.chdir(local_store.parent)
    uri = {"absolute": str(local_store), "relative": "adapters", "file": f"file://{local_store}"}[form]
    m = speakers.run(_cfg(tiny_model_dir, uri), tmp_path / "out", base_model=str(tiny_model_dir))
    got = m["adapters"]
    assert {p: a["source"] for p, a in got.items()} == {"anchor": "store:v2", "catalyst": "store:v1"}
    assert got["anchor"]["path"] == str(local_store / "anchor" / "v2")  # read in place
    assert got["catalyst"]["path"] == str(local_store / "catalyst" / "v1")
    assert _weights_digest(got["anchor"]["path"]) == _weights_digest(loras["anchor2"])
    assert _weights_digest(got["catalyst"]["path"]) == _weights_digest(loras["catalyst1"])
    assert got["anchor"]["digest"] == mf.digest_path(local_store / "anchor" / "v2")
    assert m["metrics"] == {"quick": 0, "given": 2, "base": 0}  # no quick stand-in was trained
    assert not (tmp_path / "out" / speakers.CACHE_DIR).exists()


def test_a_retired_version_is_never_a_speaker_and_a_store_without_the_persona_is_refused(
        local_store, tiny_model_dir, tmp_path):
    store = tmp_path / "adapters"
    shutil.copytree(local_store, store)
    st.update_registry(store, lambda reg: rg.retire(reg, "anchor", 2))
    m = speakers.run(_cfg(tiny_model_dir, str(store)), tmp_path / "out", base_model=str(tiny_model_dir))
    assert m["adapters"]["anchor"]["source"] == "store:v1"
    st.update_registry(store, lambda reg: rg.retire(reg, "anchor", 1))
    with pytest.raises(ValueError, match=r"no phase 1 adapter for persona\(s\) \['anchor'\]"):
        speakers.run(_cfg(tiny_model_dir, str(store)), tmp_path / "out2", base_model=str(tiny_model_dir))
    # speakers.missing: base - the persona phase 1 left without a live version speaks with the base model, as in
    # serving; the others keep their adapters
    cfg = CollaborativeConfig(model=str(tiny_model_dir), personas=PERSONAS,
                              speakers={"store": str(store), "missing": "base"})
    m = speakers.run(cfg, tmp_path / "out3", base_model=str(tiny_model_dir))
    assert m["adapters"]["anchor"] == {"path": "", "source": "base", "digest": ""}
    assert m["adapters"]["catalyst"]["source"] == "store:v1" and m["metrics"] == {"quick": 0, "given": 1, "base": 1}


def test_a_store_copy_that_does_not_match_its_digest_is_refused(local_store, tiny_model_dir, tmp_path):
    store = tmp_path / "adapters"
    shutil.copytree(local_store, store)
    weights = store / "anchor" / "v2" / st.WEIGHTS
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF  # one flipped byte
    weights.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=r"cannot read anchor's adapter .*digest"):
        speakers.run(_cfg(tiny_model_dir, f"file://{store}"), tmp_path / "out", base_model=str(tiny_model_dir))


def test_the_phase2_config_check_reads_the_store_by_uri(local_store, tmp_path, shared_data):
    # the smoke config trains anchor, catalyst and beacon; the store holds no beacon
    with pytest.raises(ConfigError, match=r"no phase 1 adapter for persona\(s\) \['beacon'\]"):
        load(phase2_config(tmp_path, **{"speakers.store": f"file://{local_store}"}))
    cfg = load(phase2_config(tmp_path, **{"speakers.store": f"file://{local_store}", "personas": PERSONAS}))
    assert cfg.speakers.store == f"file://{local_store}"
    cfg = load(phase2_config(tmp_path, **{"speakers.store": f"file://{local_store}", "speakers.missing": "base"}))
    assert cfg.speakers.missing == "base"  # beacon will speak with the base model
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="has no registry.json"):
        load(phase2_config(tmp_path, **{"speakers.store": str(tmp_path / "empty"), "personas": PERSONAS}))
    with pytest.raises(ConfigError, match="unsupported scheme 'ftp'"):
        load(phase2_config(tmp_path, **{"speakers.store": "ftp://host/adapters", "personas": PERSONAS}))


# ----------------------------------------------------------------------------------------------------- S3


@pytest.fixture(scope="module")
def s3_endpoint():
    """moto's S3 server in a thread on 127.0.0.1, port chosen by the OS (the pattern of test_adapter_store_s3)."""
    for mod in ("moto", "flask", "s3fs", "boto3"):
        need(importlib.util.find_spec(mod) is not None,
             f"{mod} is not installed: pip install -c constraints.txt -e '.[dev]' (moto[server], s3fs)")
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


def test_speakers_come_from_an_s3_store_downloaded_and_checked(s3_endpoint, loras, tiny_model_dir, tmp_path,
                                                               monkeypatch):
    import boto3

    for k, v in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
                 "AWS_ENDPOINT_URL_S3": s3_endpoint, "AWS_EC2_METADATA_DISABLED": "true"}.items():
        monkeypatch.setenv(k, v)
    for k in ("AWS_PROFILE", "AWS_ENDPOINT_URL", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(k, raising=False)
    bucket = f"mascot-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=s3_endpoint).create_bucket(Bucket=bucket)
    uri = f"s3://{bucket}/adapters"
    _fill(uri, loras, tiny_model_dir)

    out = tmp_path / "out"
    m = speakers.run(_cfg(tiny_model_dir, uri), out, base_model=str(tiny_model_dir))
    got = m["adapters"]
    assert {p: a["source"] for p, a in got.items()} == {"anchor": "store:v2", "catalyst": "store:v1"}
    for pid, lora in (("anchor", "anchor2"), ("catalyst", "catalyst1")):
        path = Path(got[pid]["path"])
        assert out / speakers.CACHE_DIR in path.parents  # downloaded under the run directory
        assert (path / "adapter_config.json").is_file() and _weights_digest(path) == _weights_digest(loras[lora])
    reg = st.read_registry(uri)
    assert _weights_digest(got["anchor"]["path"]) == reg["adapters"]["anchor"]["versions"]["2"]["digest"]
    again = speakers.run(_cfg(tiny_model_dir, uri), out, base_model=str(tiny_model_dir))
    assert again == m  # resumed: the same downloaded copies, the stage not redone
