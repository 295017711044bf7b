"""The adapter store on S3: moto's S3 server on 127.0.0.1 (a free port, no network) behind the
gateway's AdapterService and a model service's AdapterResolver with the tiny transformers engine.

Publish / list / promote / rollback / retire over gRPC, a writer race and a writer outside the lock (the same gRPC
statuses as the local store), an atomic publish (a corrupt upload, a failed move and a killed publisher leave no
version), digest checks when serving, and a version downloaded from S3, generated with, unloaded and loaded again.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import logging
import os
import shutil
import uuid
from pathlib import Path

import grpc
import pytest

from mascot.api.adapter.v1 import adapter_pb2 as pb
from mascot.api.adapter.v1 import adapter_pb2_grpc
from mascot.core.adapters import registry as rg
from mascot.core.adapters import store as st
from mascot.core.server import channel
from mascot.app.stack import start_stack
from tests.helpers.config import make_config
from tests.helpers.engine import ScriptedEngine
from tests.helpers.lora import make_lora
from tests.helpers.paths import need
from tests.helpers.rpc import code_of

pytestmark = pytest.mark.integration
TOKEN = "s3-admin-token"
AUTH = (("authorization", f"Bearer {TOKEN}"),)
STABLE, CANARY, STAGED, RETIRED = (pb.ADAPTER_STATE_STABLE, pb.ADAPTER_STATE_CANARY, pb.ADAPTER_STATE_STAGED,
                                   pb.ADAPTER_STATE_RETIRED)


@pytest.fixture(scope="module")
def s3_endpoint():
    """moto's S3 server in a thread on 127.0.0.1, port chosen by the OS."""
    for mod in ("moto", "flask", "s3fs", "boto3"):
        need(importlib.util.find_spec(mod) is not None,
             f"{mod} is not installed: pip install -c constraints.txt -e '.[dev]' (moto[server], s3fs)")
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one INFO line per request otherwise
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def s3(s3_endpoint, monkeypatch, tmp_path):
    """A fresh bucket; AWS variables point every client (s3fs, boto3) at moto. Yields ``(store uri, boto3 client)``."""
    import boto3

    for k, v in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
                 "AWS_ENDPOINT_URL_S3": s3_endpoint, "AWS_EC2_METADATA_DISABLED": "true",
                 "XDG_CACHE_HOME": str(tmp_path / "xdg-cache")}.items():
        monkeypatch.setenv(k, v)
    for k in ("AWS_PROFILE", "AWS_ENDPOINT_URL", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(k, raising=False)
    client = boto3.client("s3", endpoint_url=s3_endpoint)
    bucket = f"mascot-{uuid.uuid4().hex[:12]}"
    client.create_bucket(Bucket=bucket)
    yield f"s3://{bucket}/adapters", client


def keys(client, uri: str) -> list[str]:
    """Object keys under the store (relative to it)."""
    bucket, prefix = uri[5:].split("/", 1)
    out = client.list_objects_v2(Bucket=bucket, Prefix=prefix + "/").get("Contents", [])
    return sorted(o["Key"][len(prefix) + 1:] for o in out)


def get(client, uri: str, rel: str) -> bytes:
    bucket, prefix = uri[5:].split("/", 1)
    return client.get_object(Bucket=bucket, Key=f"{prefix}/{rel}")["Body"].read()


def put(client, uri: str, rel: str, data: bytes) -> None:
    bucket, prefix = uri[5:].split("/", 1)
    client.put_object(Bucket=bucket, Key=f"{prefix}/{rel}", Body=data)


@pytest.fixture(scope="module")
def loras(tiny_model_dir, tmp_path_factory):
    d = tmp_path_factory.mktemp("s3-loras")
    return {i: make_lora(tiny_model_dir, d / f"v{i}", seed=s) for i, s in ((1, 11), (2, 13), (3, 21))}


def publish(store, pid, lora, base, **kw):
    return store.publish(pid, lora, base_model=str(base), run_id="r1", data_ids=["a"], eval_metrics={}, **kw)


@pytest.fixture
async def gateway(s3, tiny_model_dir, monkeypatch, tmp_path):
    """A stack whose gateway hosts AdapterService on the S3 store (endpoint from AWS_ENDPOINT_URL_S3)."""
    uri, client = s3
    monkeypatch.setenv("MASCOT_TEST_ADMIN", TOKEN)
    cfg = make_config(tmp_path, adapters={"store": uri, "base_model": str(tiny_model_dir), "max_rank": 4,
                                     "admin_token_env": "MASCOT_TEST_ADMIN"})
    stack = await start_stack(cfg, engine=ScriptedEngine(lambda p: "", lambda p: ""))
    ch = channel(stack.target("control"))
    yield adapter_pb2_grpc.AdapterServiceStub(ch), uri, client
    await ch.close()
    await stack.stop(0)


# ------------------------------------------------------------------------------------ AdapterService on S3


async def test_lifecycle_on_s3_through_the_gateway(gateway, loras):
    stub, uri, client = gateway

    async def pub(i):
        return await stub.PublishAdapter(pb.PublishAdapterRequest(persona_id="anchor", source_path=str(loras[i]),
                                                                  run_id="r1", data_ids=["a", "b"]), metadata=AUTH)

    r1 = await pub(1)
    assert (r1.version.name, r1.version.state, r1.revision) == ("anchor--v1", STAGED, 1)
    man = json.loads(get(client, uri, "anchor/v1/manifest.json"))
    assert man["digest"] == r1.version.digest == st.file_digest(loras[1] / "adapter_model.safetensors")
    assert man["data_ids"] == ["a", "b"]
    assert (await pub(1)).already_published
    await stub.PromoteAdapter(pb.PromoteAdapterRequest(persona_id="anchor", version=1), metadata=AUTH)
    await pub(2)
    p = (await stub.PromoteAdapter(pb.PromoteAdapterRequest(persona_id="anchor", version=2, canary_weight=0.25),
                                   metadata=AUTH)).persona
    assert (p.stable, p.canary, p.versions[1].state) == (1, 2, CANARY)
    p = (await stub.PromoteAdapter(pb.PromoteAdapterRequest(persona_id="anchor", version=2), metadata=AUTH)).persona
    assert [v.state for v in p.versions] == [RETIRED, STABLE]
    r = await stub.RollbackAdapter(pb.RollbackAdapterRequest(persona_id="anchor"), metadata=AUTH)
    assert r.persona.stable == 1 and [v.state for v in r.persona.versions] == [STABLE, RETIRED]
    await pub(3)
    code, msg = await code_of(stub.RetireAdapter(pb.RetireAdapterRequest(persona_id="anchor", version=1),
                                                 metadata=AUTH))
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "stable version" in msg
    r = await stub.RetireAdapter(pb.RetireAdapterRequest(persona_id="anchor", version=3), metadata=AUTH)
    listed = await stub.ListAdapters(pb.ListAdaptersRequest(), metadata=AUTH)
    assert listed.revision == r.revision == json.loads(get(client, uri, "registry.json"))["revision"] == 8
    assert [v.state for v in listed.personas[0].versions] == [STABLE, RETIRED, RETIRED]
    assert keys(client, uri) == sorted(["registry.json"] + [f"anchor/v{i}/{f}" for i in (1, 2, 3) for f in (
        "README.md", "adapter_config.json", "adapter_model.safetensors", "manifest.json")])  # no tmp, no lock


async def test_two_writers_racing_on_s3_one_fails_like_on_a_local_store(gateway, loras):
    stub, uri, client = gateway
    await stub.PublishAdapter(pb.PublishAdapterRequest(persona_id="beacon", source_path=str(loras[3])), metadata=AUTH)
    rev = json.loads(get(client, uri, "registry.json"))["revision"]
    results = await asyncio.gather(*[stub.RetireAdapter(pb.RetireAdapterRequest(persona_id="beacon", version=1),
                                                        metadata=AUTH) for _ in range(2)], return_exceptions=True)
    bad = [r for r in results if isinstance(r, grpc.aio.AioRpcError)]
    assert len(bad) == 1 and bad[0].code() == grpc.StatusCode.FAILED_PRECONDITION, results
    assert "already retired" in bad[0].details()
    assert json.loads(get(client, uri, "registry.json"))["revision"] == rev + 1


@pytest.mark.parametrize("backend", ["local", "s3"])
async def test_a_writer_outside_the_lock_never_loses_an_update(backend, s3, tiny_model_dir, loras, tmp_path,
                                                               monkeypatch):
    """Every attempt of a RetireAdapter races a registry write that ignores the lock: the compare-and-swap refuses
    ours each time (UNAVAILABLE, retryable), on the local store and on S3 alike, and the other write stays."""
    uri, client = s3
    if backend == "local":
        uri = str(tmp_path / "store")
    store = st.open_store(uri)
    publish(store, "anchor", loras[1], tiny_model_dir)
    real, writes = rg.retire, []

    def foreign_write():
        reg = store.read_registry()
        reg["revision"] += 1
        data = json.dumps(reg).encode()
        if backend == "local":
            (Path(uri) / "registry.json").write_bytes(data)
        else:
            put(client, uri, "registry.json", data)
        writes.append(reg["revision"])

    def racing_retire(reg, pid, version):
        foreign_write()
        return real(reg, pid, version)

    monkeypatch.setattr(rg, "retire", racing_retire)
    monkeypatch.setenv("MASCOT_TEST_ADMIN", TOKEN)
    cfg = make_config(tmp_path, adapters={"store": uri, "base_model": str(tiny_model_dir), "max_rank": 4,
                                          "admin_token_env": "MASCOT_TEST_ADMIN"})
    stack = await start_stack(cfg, engine=ScriptedEngine(lambda p: "", lambda p: ""))
    ch = channel(stack.target("control"))
    try:
        code, msg = await code_of(adapter_pb2_grpc.AdapterServiceStub(ch).RetireAdapter(
            pb.RetireAdapterRequest(persona_id="anchor", version=1), metadata=AUTH))
        assert code == grpc.StatusCode.UNAVAILABLE and "changed during each of 3 attempts" in msg, msg
    finally:
        await ch.close()
        await stack.stop(0)
    reg = store.read_registry()  # the client retried UNAVAILABLE: 3 attempts per call, each refused
    assert len(writes) % 3 == 0 and reg["revision"] == 1 + len(writes) == writes[-1]
    assert reg["adapters"]["anchor"]["versions"]["1"]["state"] == "staged"


@pytest.mark.parametrize("backend", ["local", "pvc", "s3"])
def test_compare_and_swap_refuses_a_write_over_a_changed_registry(backend, s3, tmp_path):
    """Two writers that read the same registry: the second write is refused (If-Match on S3)."""
    uri = {"s3": s3[0], "local": str(tmp_path / "store"), "pvc": "pvc://adapters-claim/store"}[backend]
    (tmp_path / "mnt").mkdir()  # the claim's mount
    store = st.open_store(uri, pvc_root=str(tmp_path / "mnt"))
    store.update(lambda r: r.setdefault("adapters", {}))  # revision 1
    reg, token = store._read_registry()
    store._write_registry({**reg, "revision": 2}, token)
    with pytest.raises(st.RegistryConflict, match="changed since it was read"):
        store._write_registry({**reg, "revision": 2, "adapters": {"x": {"versions": {}}}}, token)
    assert store.read_registry() == {**reg, "revision": 2}
    with pytest.raises(st.RegistryConflict):  # creating a registry that exists is refused too
        store._write_registry({"revision": 1, "adapters": {}}, None)
    if backend == "pvc":  # KServe's mapping: pvc://<claim>/<path> is <pvc_root>/<path>
        assert json.loads((tmp_path / "mnt" / "store" / "registry.json").read_text())["revision"] == 2


def test_lock_object_on_s3(s3):
    uri, client = s3
    store = st.open_store(uri)
    with store.lock():
        assert "registry.lock" in keys(client, uri)
        with pytest.raises(st.RegistryConflict, match="stayed locked"):
            with store.lock(timeout_s=0.2):
                pass
        assert "registry.lock" in keys(client, uri)  # someone else's lock is not removed
    assert "registry.lock" not in keys(client, uri)
    put(client, uri, "registry.lock", b"{}")  # a killed writer's lock
    with store.lock(stale_s=0.0):  # taken as stale and broken
        pass
    assert keys(client, uri) == []


# ------------------------------------------------------------------------------------------ atomic publish


def test_a_corrupt_upload_is_refused_and_leaves_nothing(s3, tiny_model_dir, loras, monkeypatch):
    uri, client = s3
    store = st.open_store(uri)
    publish(store, "anchor", loras[1], tiny_model_dir)
    before, reg = keys(client, uri), get(client, uri, "registry.json")
    real = st.AdapterStore._upload_dir

    def corrupting(self, src, dest):
        real(self, src, dest)
        data = bytearray(self.fs.cat_file(f"{dest}/adapter_model.safetensors"))
        data[-1] ^= 0xFF
        self.fs.pipe_file(f"{dest}/adapter_model.safetensors", bytes(data))

    monkeypatch.setattr(st.AdapterStore, "_upload_dir", corrupting)
    with pytest.raises(st.PublishError, match="copy is corrupt"):
        publish(store, "anchor", loras[2], tiny_model_dir)
    assert keys(client, uri) == before and get(client, uri, "registry.json") == reg


def test_a_failed_move_on_s3_leaves_no_version(s3, tiny_model_dir, loras, monkeypatch):
    uri, client = s3
    store = st.open_store(uri)
    publish(store, "anchor", loras[1], tiny_model_dir)
    before, reg = keys(client, uri), get(client, uri, "registry.json")
    real_copy = store.fs.cp_file

    def failing_copy(src, dst, **kw):
        if dst.endswith("/manifest.json"):  # the weights and config are already in v2/
            raise OSError("connection reset")
        return real_copy(src, dst, **kw)

    monkeypatch.setattr(store.fs, "cp_file", failing_copy)
    with pytest.raises(OSError, match="connection reset"):
        publish(store, "anchor", loras[2], tiny_model_dir)
    assert keys(client, uri) == before and get(client, uri, "registry.json") == reg


def test_a_killed_publisher_leaves_nothing_the_next_publish_keeps(s3, tiny_model_dir, loras):
    uri, client = s3
    store = st.open_store(uri)
    publish(store, "anchor", loras[1], tiny_model_dir)
    weights = (loras[2] / "adapter_model.safetensors").read_bytes()
    put(client, uri, "anchor/v2.tmp-0badc0de/adapter_model.safetensors", weights)  # killed while uploading
    put(client, uri, "anchor/v2/adapter_model.safetensors", weights)  # killed while moving (no manifest.json yet)
    assert store.read_registry()["adapters"]["anchor"]["versions"].keys() == {"1"}  # nothing of it is registered
    res = publish(store, "anchor", loras[2], tiny_model_dir)
    assert (res["version"], res["path"]) == (2, uri + "/anchor/v2")
    assert not [k for k in keys(client, uri) if ".tmp-" in k]
    assert json.loads(get(client, uri, "anchor/v2/manifest.json"))["digest"] == res["digest"]
    assert get(client, uri, "anchor/v2/adapter_model.safetensors") == weights


# ------------------------------------------------------------------------------------------------- serving


async def test_serving_downloads_a_version_from_s3_checks_it_and_generates(engine, s3, tiny_model_dir, loras,
                                                                           tmp_path, monkeypatch):
    from mascot.core.adapters.reconcile import AdapterResolver
    from mascot.core.config import AdaptersConfig
    from mascot.core.engine import GenerationRequest, SamplingParams
    from mascot.core.errors import Unavailable
    from mascot.core.metrics import Metrics

    uri, client = s3
    pid = "s3_served"  # a persona id no other test loads into the session engine
    store = st.open_store(uri)
    for i in (1, 2):
        publish(store, pid, loras[i], tiny_model_dir)
    store.update(lambda r: rg.promote(r, pid, 1))
    cache, now, metrics = tmp_path / "cache", [0.0], Metrics()
    endpoint = os.environ["AWS_ENDPOINT_URL_S3"]
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3")  # the endpoint comes from the setting alone
    cfg = AdaptersConfig(store=uri, s3_endpoint_url=endpoint, cache_dir=str(cache), retired_unload_s=5)
    res = AdapterResolver(engine, uri, metrics, config=cfg, clock=lambda: now[0])
    name = f"{pid}--v1"
    prompt = engine.render_chat([{"role": "user", "content": "hello there"}])

    async def run(adapter):
        return (await engine.generate(GenerationRequest(prompt, SamplingParams(max_tokens=8),
                                                        adapter=adapter))).token_ids

    try:
        assert await res.reconcile_once() == {}
        local = res._paths[name]
        assert cache in local.parents and st.file_digest(local / "adapter_model.safetensors") == \
            store.read_registry()["adapters"][pid]["versions"]["1"]["digest"]
        assert not [p for p in local.parent.iterdir() if p.name.startswith(".tmp-")]
        await engine.load_adapter(f"{pid}-reference", str(loras[1]))
        assert await run(name) == await run(f"{pid}-reference")  # the S3 copy is the adapter that was published
        assert await run(name) != await run(None)
        assert metrics.registry.get_sample_value("mascot_adapter_load_seconds_count", {"persona": pid}) == 1

        # retire v1: unloaded when unused, its downloaded copy removed; a pinned conversation loads it again
        store.update(lambda r: rg.promote(r, pid, 2))
        await res.reconcile_once(now=10.0)
        assert name not in engine.adapters() and not local.exists()
        assert await res.ensure(name, pid) == name and local.is_dir()

        # digest checks: a tampered object in S3 is refused, for a new load and for the cache
        await engine.unload_adapter(name)
        for p in (local, *local.parent.iterdir()):
            if p.is_dir():
                shutil.rmtree(p)
        good = get(client, uri, f"{pid}/v1/adapter_model.safetensors")
        put(client, uri, f"{pid}/v1/adapter_model.safetensors", good[:-1] + bytes([good[-1] ^ 0xFF]))
        with pytest.raises(Unavailable, match="DigestMismatch"):
            await res.ensure(name, pid)
        assert name not in engine.adapters() and not any(local.parent.iterdir())  # nothing half-downloaded kept
        assert metrics.registry.get_sample_value("mascot_adapter_load_failures_total",
                                                 {"reason": "digest"}) == 1
        put(client, uri, f"{pid}/v1/adapter_model.safetensors", good)
        man = json.loads(get(client, uri, f"{pid}/v1/manifest.json"))
        put(client, uri, f"{pid}/v1/manifest.json", json.dumps({**man, "digest": "0" * 64}).encode())
        with pytest.raises(Unavailable, match="names digest"):
            await res.ensure(name, pid)
    finally:
        for n in (name, f"{pid}--v2", f"{pid}-reference"):
            if n in engine.adapters():
                await engine.unload_adapter(n)
