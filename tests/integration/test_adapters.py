"""AdapterService on the gateway over real gRPC: admin token, atomic checked publish,
promote / canary / rollback / retire with compare-and-swap, the `mascot adapters` CLI, and training Jobs
publishing through the gateway."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import grpc
import pytest

from mascot.api.adapter.v1 import adapter_pb2 as pb
from mascot.api.adapter.v1 import adapter_pb2_grpc
from mascot.core.server import channel
from mascot.app.stack import start_stack
from tests.helpers.config import make_config
from tests.helpers.engine import ScriptedEngine
from tests.helpers.lora import make_lora
from tests.helpers.paths import ROOT
from tests.helpers.rpc import code_of

pytestmark = pytest.mark.integration
TOKEN = "s3cret-admin-token"
AUTH = (("authorization", f"Bearer {TOKEN}"),)
STABLE, CANARY, STAGED, RETIRED = (pb.ADAPTER_STATE_STABLE, pb.ADAPTER_STATE_CANARY, pb.ADAPTER_STATE_STAGED,
                                   pb.ADAPTER_STATE_RETIRED)


@pytest.fixture(scope="module")
def loras(tiny_model_dir, tmp_path_factory):
    d = tmp_path_factory.mktemp("loras")
    out = {f"v{i}": make_lora(tiny_model_dir, d / f"v{i}", seed=i) for i in range(1, 4)}
    out["rank8"] = make_lora(tiny_model_dir, d / "rank8", r=8)
    out["empty"] = d / "empty"
    out["empty"].mkdir()
    other = make_lora(tiny_model_dir, d / "other", seed=9)
    conf = json.loads((other / "adapter_config.json").read_text())
    conf["base_model_name_or_path"] = "Qwen/Qwen3-8B"
    (other / "adapter_config.json").write_text(json.dumps(conf))
    out["other"] = other
    full = make_lora(tiny_model_dir, d / "full", seed=7)
    conf = json.loads((full / "adapter_config.json").read_text())
    conf["modules_to_save"] = ["lm_head"]
    (full / "adapter_config.json").write_text(json.dumps(conf))
    out["full"] = full
    return out


@pytest.fixture
async def admin(tmp_path, tiny_model_dir, monkeypatch):
    monkeypatch.setenv("MASCOT_TEST_ADMIN", TOKEN)
    store = tmp_path / "store"
    cfg = make_config(tmp_path, adapters={"store": str(store), "base_model": str(tiny_model_dir), "max_rank": 4,
                                          "admin_token_env": "MASCOT_TEST_ADMIN"})
    stack = await start_stack(cfg, engine=ScriptedEngine(lambda p: "", lambda p: ""))
    ch = channel(stack.target("control"))
    yield adapter_pb2_grpc.AdapterServiceStub(ch), store, stack
    await ch.close()
    await stack.stop(0)


async def test_admin_token_is_required(admin):
    stub, _, _ = admin
    code, msg = await code_of(stub.ListAdapters(pb.ListAdaptersRequest()))
    assert code == grpc.StatusCode.UNAUTHENTICATED and "MASCOT_ADMIN_TOKEN" in msg
    code, msg = await code_of(stub.ListAdapters(pb.ListAdaptersRequest(),
                                                metadata=(("authorization", "Bearer nope"),)))
    assert code == grpc.StatusCode.UNAUTHENTICATED and TOKEN not in msg and "not valid" in msg
    assert (await stub.ListAdapters(pb.ListAdaptersRequest(), metadata=AUTH)).revision == 0


async def test_no_configured_token_refuses_everything(tmp_path, tiny_model_dir, monkeypatch):
    monkeypatch.delenv("MASCOT_ADMIN_TOKEN", raising=False)
    cfg = make_config(tmp_path, adapters={"store": str(tmp_path / "s"), "base_model": str(tiny_model_dir)})
    stack = await start_stack(cfg, engine=ScriptedEngine(lambda p: "", lambda p: ""))
    ch = channel(stack.target("control"))
    try:
        code, msg = await code_of(adapter_pb2_grpc.AdapterServiceStub(ch).ListAdapters(
            pb.ListAdaptersRequest(), metadata=AUTH))
        assert code == grpc.StatusCode.PERMISSION_DENIED and "no admin identity configured" in msg
    finally:
        await ch.close()
        await stack.stop(0)


@pytest.mark.parametrize("case,fragment", [
    ("missing", "not a directory"), ("empty", "has no adapter_config.json"), ("other", "trained on base model"),
    ("rank8", "above the serving limit"), ("full", "full-weight modules")])
async def test_bad_publishes_are_refused_and_write_nothing(admin, loras, case, fragment):
    stub, store, _ = admin
    src = "/nonexistent/adapter" if case == "missing" else str(loras[case])
    code, msg = await code_of(stub.PublishAdapter(pb.PublishAdapterRequest(persona_id="anchor", source_path=src),
                                                  metadata=AUTH))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and fragment in msg
    assert not (store / "registry.json").exists() and not (store / "anchor").exists()


async def test_bad_ids_and_arguments(admin, loras):
    stub, _, _ = admin
    for req, code_want in [
        (stub.PublishAdapter(pb.PublishAdapterRequest(persona_id="Bad Id", source_path=str(loras["v1"])),
                             metadata=AUTH), grpc.StatusCode.INVALID_ARGUMENT),
        (stub.PromoteAdapter(pb.PromoteAdapterRequest(persona_id="anchor", version=1), metadata=AUTH),
         grpc.StatusCode.NOT_FOUND),
        (stub.PromoteAdapter(pb.PromoteAdapterRequest(persona_id="anchor", version=0), metadata=AUTH),
         grpc.StatusCode.INVALID_ARGUMENT),
        (stub.RollbackAdapter(pb.RollbackAdapterRequest(persona_id="anchor"), metadata=AUTH),
         grpc.StatusCode.NOT_FOUND)]:
        assert (await code_of(req))[0] == code_want


async def test_lifecycle_publish_promote_canary_rollback_retire(admin, loras):
    stub, store, _ = admin

    async def publish(key):
        return await stub.PublishAdapter(pb.PublishAdapterRequest(persona_id="anchor", source_path=str(loras[key]),
                                                                  run_id="r1", data_ids=["a", "b"],
                                                                  eval_metrics_json='{"gate": {"passed": true}}'),
                                         metadata=AUTH)

    r1 = await publish("v1")
    assert (r1.version.version, r1.version.name, r1.version.state, r1.revision) == (1, "anchor--v1", STAGED, 1)
    man = json.loads((store / "anchor" / "v1" / "manifest.json").read_text())
    assert man["digest"] == r1.version.digest and man["data_ids"] == ["a", "b"] and man["rank"] == 4
    again = await publish("v1")
    assert again.already_published and again.version.version == 1 and again.revision == 1
    # a canary needs a stable version first
    code, msg = await code_of(stub.PromoteAdapter(pb.PromoteAdapterRequest(persona_id="anchor", version=1,
                                                                           canary_weight=0.3), metadata=AUTH))
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "no stable version" in msg
    p = (await stub.PromoteAdapter(pb.PromoteAdapterRequest(persona_id="anchor", version=1), metadata=AUTH)).persona
    assert p.stable == 1 and p.versions[0].state == STABLE
    await publish("v2")
    p = (await stub.PromoteAdapter(pb.PromoteAdapterRequest(persona_id="anchor", version=2, canary_weight=0.3),
                                   metadata=AUTH)).persona
    assert (p.stable, p.canary, p.canary_weight) == (1, 2, pytest.approx(0.3)) and p.versions[1].state == CANARY
    code, _ = await code_of(stub.PromoteAdapter(pb.PromoteAdapterRequest(persona_id="anchor", version=2,
                                                                         canary_weight=1.5), metadata=AUTH))
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    p = (await stub.PromoteAdapter(pb.PromoteAdapterRequest(persona_id="anchor", version=2), metadata=AUTH)).persona
    assert (p.stable, p.canary, list(p.previous_stable)) == (2, 0, [1])
    assert [v.state for v in p.versions] == [RETIRED, STABLE]
    code, msg = await code_of(stub.RetireAdapter(pb.RetireAdapterRequest(persona_id="anchor", version=2),
                                                 metadata=AUTH))
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "stable version" in msg
    r = await stub.RollbackAdapter(pb.RollbackAdapterRequest(persona_id="anchor"), metadata=AUTH)
    assert r.persona.stable == 1 and [v.state for v in r.persona.versions] == [STABLE, RETIRED]
    code, _ = await code_of(stub.RollbackAdapter(pb.RollbackAdapterRequest(persona_id="anchor"), metadata=AUTH))
    assert code == grpc.StatusCode.FAILED_PRECONDITION
    p = (await stub.PromoteAdapter(pb.PromoteAdapterRequest(persona_id="anchor", version=2, canary_weight=0.5),
                                   metadata=AUTH)).persona  # a retired version can come back
    assert (p.stable, p.canary) == (1, 2)
    r = await stub.RetireAdapter(pb.RetireAdapterRequest(persona_id="anchor", version=2), metadata=AUTH)
    listed = await stub.ListAdapters(pb.ListAdaptersRequest(persona_id="anchor"), metadata=AUTH)
    assert listed.revision == json.loads((store / "registry.json").read_text())["revision"] == r.revision


async def test_two_retires_of_one_version_at_once(admin, loras):
    stub, store, _ = admin
    await stub.PublishAdapter(pb.PublishAdapterRequest(persona_id="beacon", source_path=str(loras["v3"])),
                              metadata=AUTH)
    rev = json.loads((store / "registry.json").read_text())["revision"]
    calls = [stub.RetireAdapter(pb.RetireAdapterRequest(persona_id="beacon", version=1), metadata=AUTH)
             for _ in range(2)]
    results = await asyncio.gather(*calls, return_exceptions=True)
    ok = [r for r in results if not isinstance(r, Exception)]
    bad = [r for r in results if isinstance(r, grpc.aio.AioRpcError)]
    assert len(ok) == 1 and len(bad) == 1 and bad[0].code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "already retired" in bad[0].details()
    assert json.loads((store / "registry.json").read_text())["revision"] == rev + 1


async def test_cli_lists_and_promotes_with_the_env_token(admin, loras):
    stub, _, stack = admin
    await stub.PublishAdapter(pb.PublishAdapterRequest(persona_id="catalyst", source_path=str(loras["v1"])),
                              metadata=AUTH)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MASCOT_ADMIN_TOKEN": TOKEN}

    def cli(*args, **kw):
        return subprocess.run([sys.executable, "-m", "mascot.cli", "adapters", *args, "--target",
                               stack.target("control")], env=kw.get("env", env), capture_output=True, text=True,
                              timeout=120)

    p = await asyncio.to_thread(cli, "promote", "catalyst", "1")
    assert p.returncode == 0, p.stderr
    p = await asyncio.to_thread(cli, "list", "--json")
    assert p.returncode == 0, p.stderr
    got = json.loads(p.stdout)
    assert got["personas"][0]["persona_id"] == "catalyst" and got["personas"][0]["stable"] == 1
    p = await asyncio.to_thread(cli, "list", env={k: v for k, v in env.items() if k != "MASCOT_ADMIN_TOKEN"})
    assert p.returncode == 2 and "MASCOT_ADMIN_TOKEN" in p.stderr
    p = await asyncio.to_thread(cli, "retire", "catalyst", "1")
    assert p.returncode == 1 and "FAILED_PRECONDITION" in p.stderr and "Traceback" not in p.stderr
    for bad in (["promote", "catalyst", "1", "--canary", "0"], ["promote", "catalyst", "1", "--canary", "1"]):
        p = await asyncio.to_thread(cli, *bad)
        assert p.returncode == 2 and "--canary" in p.stderr
    empty = Path(os.environ.get("TMPDIR", "/tmp")) / f"empty-token-{os.getpid()}"
    empty.write_text("\n")
    try:
        p = await asyncio.to_thread(cli, "list", "--token-file", str(empty))
        assert p.returncode == 2 and "is empty" in p.stderr
    finally:
        empty.unlink()


async def test_training_publishes_through_the_gateway(admin, loras, monkeypatch, tiny_model_dir):
    from mascot_training.common.publish import PublishError, publish_via_gateway

    stub, store, stack = admin
    monkeypatch.setenv("MASCOT_ADMIN_TOKEN", TOKEN)
    gw = stack.target("control")
    res = await asyncio.to_thread(publish_via_gateway, gw, "director", loras["v2"], run_id="p2",
                                  data_ids=["x"], eval_metrics={"gate": {"passed": True}})
    assert (res["name"], res["version"]) == ("director--v1", 1)
    assert json.loads((store / "director" / "v1" / "manifest.json").read_text())["run_id"] == "p2"
    with pytest.raises(PublishError, match="above the serving limit"):
        await asyncio.to_thread(publish_via_gateway, gw, "director", loras["rank8"], run_id="p2", data_ids=[],
                                eval_metrics={})
    monkeypatch.setenv("MASCOT_ADMIN_TOKEN", "wrong")
    with pytest.raises(ValueError, match="UNAUTHENTICATED"):
        await asyncio.to_thread(publish_via_gateway, gw, "director", loras["v3"], run_id="p2", data_ids=[],
                                eval_metrics={})
    token_file = loras["v3"].parent / "publish-token"  # the chart mounts the token as a file (publish.token_file)
    token_file.write_text(TOKEN + "\n")
    res = await asyncio.to_thread(publish_via_gateway, gw, "director", loras["v3"], run_id="p3", data_ids=[],
                                  eval_metrics={}, token_file=str(token_file))
    assert res["version"] == 2


async def test_config_must_match_weights_and_config_only_changes_are_new_versions(admin, loras, tmp_path):
    import shutil

    stub, store, _ = admin
    liar = tmp_path / "liar"
    shutil.copytree(loras["rank8"], liar)
    conf = json.loads((liar / "adapter_config.json").read_text())
    conf["r"] = 4  # the tensors say 8
    (liar / "adapter_config.json").write_text(json.dumps(conf))
    code, msg = await code_of(stub.PublishAdapter(pb.PublishAdapterRequest(persona_id="anchor",
                                                                           source_path=str(liar)), metadata=AUTH))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "does not match the weights" in msg
    r1 = await stub.PublishAdapter(pb.PublishAdapterRequest(persona_id="anchor", source_path=str(loras["v1"])),
                                   metadata=AUTH)
    other = tmp_path / "other-base"
    shutil.copytree(loras["v1"], other)
    conf = json.loads((other / "adapter_config.json").read_text())
    conf["base_model_name_or_path"] = "Qwen/Qwen3-0.6B"  # same weights, another base: refused, not "already"
    (other / "adapter_config.json").write_text(json.dumps(conf))
    code, msg = await code_of(stub.PublishAdapter(pb.PublishAdapterRequest(persona_id="anchor",
                                                                           source_path=str(other)), metadata=AUTH))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "trained on base model" in msg
    alpha = tmp_path / "alpha"
    shutil.copytree(loras["v1"], alpha)
    conf = json.loads((alpha / "adapter_config.json").read_text())
    conf["lora_alpha"] = 32  # same weights, another scaling: a new version
    (alpha / "adapter_config.json").write_text(json.dumps(conf))
    r2 = await stub.PublishAdapter(pb.PublishAdapterRequest(persona_id="anchor", source_path=str(alpha)),
                                   metadata=AUTH)
    assert not r2.already_published and r2.version.version == r1.version.version + 1
    code, msg = await code_of(stub.PublishAdapter(pb.PublishAdapterRequest(persona_id="ghost_persona",
                                                                           source_path=str(loras["v1"])),
                                                  metadata=AUTH))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "unknown persona id" in msg


async def test_a_broken_or_missing_registry_stops_writes_not_chat(admin, loras):
    from mascot.api.conversation.v1 import conversation_pb2 as cpb
    from mascot.api.conversation.v1 import conversation_pb2_grpc as cpb_grpc

    stub, store, stack = admin
    await stub.PublishAdapter(pb.PublishAdapterRequest(persona_id="anchor", source_path=str(loras["v1"])),
                              metadata=AUTH)
    good = (store / "registry.json").read_text()
    conv = cpb_grpc.ConversationServiceStub(channel(stack.target("gateway")))
    for broken in ("{not json", '{"revision": 3, "adapters": {"anchor": 5}}', None):
        if broken is None:
            (store / "registry.json").unlink()
        else:
            (store / "registry.json").write_text(broken)
        code, msg = await code_of(stub.PromoteAdapter(pb.PromoteAdapterRequest(persona_id="anchor", version=1),
                                                      metadata=AUTH))
        assert code == grpc.StatusCode.UNAVAILABLE and "restore" in msg, msg
        code, _ = await code_of(stub.PublishAdapter(pb.PublishAdapterRequest(
            persona_id="anchor", source_path=str(loras["v2"])), metadata=AUTH))
        assert code == grpc.StatusCode.UNAVAILABLE
        c = (await conv.StartConversation(cpb.StartConversationRequest(mode=cpb.MODE_SUPPORT))).conversation
        # the conversation starts, pinned to the base model: no registry was ever read by this gateway, and a
        # service's own choice (e.g. the highest version it has loaded) is never used instead
        assert set(c.adapter_versions.values()) == {"base"} and "director" in c.adapter_versions
    (store / "registry.json").write_text(good)
    assert (await stub.ListAdapters(pb.ListAdaptersRequest(), metadata=AUTH)).revision == 1
    assert not (store / "anchor" / "v2").exists()


async def test_retired_versions_unload_when_unused_and_load_again_on_first_use(engine, tiny_model_dir, loras,
                                                                              tmp_path):
    """the requirements (part): a version no longer served is unloaded once unused for ``retired_unload_s``; a
    conversation pinned to it loads it again on its next turn (ensure). The clock is injected; no sleeps."""
    from mascot.core.adapters import registry as rg
    from mascot.core.adapters import store as st
    from mascot.core.adapters.reconcile import AdapterResolver
    from mascot.core.config import AdaptersConfig
    from mascot.core.engine import GenerationRequest, SamplingParams
    from mascot.core.metrics import Metrics

    pid = "retiree"  # a persona id no other test loads into the session engine
    names = [f"{pid}--v{i}" for i in (1, 2, 3)]
    store = st.open_store(tmp_path / "store")
    for key in ("v1", "v2", "v3"):
        store.publish(pid, loras[key], base_model=str(tiny_model_dir), run_id="r", data_ids=[], eval_metrics={})
    store.update(lambda r: rg.promote(r, pid, 1))
    now, metrics = [1000.0], Metrics()
    res = AdapterResolver(engine, store, metrics, config=AdaptersConfig(retired_unload_s=30), clock=lambda: now[0])

    def info(name, state):
        return metrics.registry.get_sample_value("mascot_adapter_info", {
            "persona": pid, "adapter_version": name, "state": state})

    req = GenerationRequest(engine.render_chat([{"role": "user", "content": "hello there"}]),
                            SamplingParams(max_tokens=8), adapter=names[0])
    try:
        assert await res.reconcile_once() == {}
        assert names[0] in engine.adapters() and info(names[0], "stable") == 1
        before = (await engine.generate(req)).token_ids
        store.update(lambda r: rg.promote(r, pid, 2))  # v1 retired
        now[0] = 1010.0
        assert await res.ensure(names[0], pid) == names[0]  # a conversation pinned to v1 takes a turn at 1010
        assert await res.reconcile_once(now=1039.0) == {}  # unused for 29 s: stays
        assert {names[0], names[1]} <= set(engine.adapters())
        assert info(names[0], "retired") == 1 and info(names[0], "stable") is None  # the old state's series is gone
        await res.reconcile_once(now=1040.0)  # unused for 30 s: unloaded
        assert names[0] not in engine.adapters() and names[1] in engine.adapters()
        assert info(names[0], "retired") == 0 and info(names[1], "stable") == 1
        now[0] = 1050.0
        assert await res.ensure(names[0], pid) == names[0]  # the pinned conversation's next turn loads it again
        assert (await engine.generate(req)).token_ids == before
        await res.reconcile_once(now=1079.0)
        assert names[0] in engine.adapters()
        # a canary replaced by a newer one is staged again: not served to new conversations, unloaded the same way
        store.update(lambda r: rg.promote(r, pid, 3, 0.5))
        await res.reconcile_once(now=1080.0)
        assert names[0] not in engine.adapters() and names[2] in engine.adapters()
        store.update(lambda r: rg.promote(r, pid, 1, 0.5))  # v1 (retired) becomes the canary, v3 staged again
        await res.reconcile_once(now=1090.0)  # v1 loads as canary; v3, loaded at 1080, stays for now
        assert {names[0], names[2]} <= set(engine.adapters()) and info(names[0], "canary") == 1
        await res.reconcile_once(now=1110.0)
        assert names[0] in engine.adapters() and names[2] not in engine.adapters()
        assert info(names[2], "staged") == 0 and info(names[0], "canary") == 1
    finally:
        for name in names:
            if name in engine.adapters():
                await engine.unload_adapter(name)


async def test_an_unreadable_registry_never_serves_a_rolled_back_version(engine, tiny_model_dir, loras, tmp_path,
                                                                        monkeypatch):
    """v1 stable, v2 stable, v3 canary 10%, rollback to v1 (v2 and v3 retired), then registry.json corrupt or deleted:
    new conversations are pinned from the last registry the gateway read (v1) and a request that names no version
    is answered with the stable v1 of the last registry read, never with v3 as the highest version loaded; with the
    registry back, the same."""
    from mascot.api.conversation.v1 import conversation_pb2 as cpb
    from mascot.api.conversation.v1 import conversation_pb2_grpc as cpb_grpc
    from mascot.api.dialogue.v1 import dialogue_pb2 as dpb
    from mascot.api.speaker.v1 import speaker_pb2 as spb
    from mascot.api.speaker.v1 import speaker_pb2_grpc as spb_grpc
    from mascot.core.adapters import registry as rg
    from mascot.core.adapters import store as st

    pid = "anchor"
    names = [f"{pid}--v{i}" for i in (1, 2, 3)]
    root = tmp_path / "store"
    store = st.open_store(root)
    for key in ("v1", "v2", "v3"):
        store.publish(pid, loras[key], base_model=str(tiny_model_dir), run_id="r", data_ids=[], eval_metrics={})
    store.update(lambda r: rg.promote(r, pid, 1))
    store.update(lambda r: rg.promote(r, pid, 2))
    store.update(lambda r: rg.promote(r, pid, 3, 0.1))
    store.update(lambda r: rg.rollback(r, pid))
    reg = json.loads((root / "registry.json").read_text())
    assert reg["adapters"][pid]["stable"] == 1
    cfg = make_config(tmp_path, adapters={"store": str(root), "base_model": str(tiny_model_dir), "max_rank": 4,
                                          "retired_unload_s": 3600}, speaker={"max_tokens": 8},
                      security={"conversations_per_minute": 0})  # it starts ~100 conversations to sample pins
    stack = await start_stack(cfg, ("gateway", "director", "speaker"), engine=engine)
    ch = channel(stack.target("gateway"))
    sch = channel(stack.target("speaker"))
    conv, speaker = cpb_grpc.ConversationServiceStub(ch), spb_grpc.SpeakerServiceStub(sch)

    async def pins(n: int) -> list[str]:
        return [(await conv.StartConversation(cpb.StartConversationRequest(mode=cpb.MODE_SUPPORT, persona_ids=[pid]))
                 ).conversation.adapter_versions[pid] for _ in range(n)]

    async def unpinned_reply_version() -> str:
        req = spb.GenerateReplyRequest(persona_id=pid, directive=dpb.Directive(persona_id=pid, action="Listen.",
                                                                               tone="Calm"),
                                       history=[dpb.Turn(index=0, role=dpb.ROLE_USER, text="Hello.")], seed=1)
        async for ev in speaker.GenerateReply(req):
            if ev.HasField("final"):
                return ev.final.adapter_version
        raise AssertionError("no final event")

    try:
        await engine.load_adapter(names[2], str(loras["v3"]))  # v3 stays loaded from its canary days
        assert await pins(36) == [names[0]] * 36
        assert await unpinned_reply_version() == names[0]
        for broken in ("{not json", None):
            if broken is None:
                (root / "registry.json").unlink()
            else:
                (root / "registry.json").write_text(broken)
            assert await pins(36) == [names[0]] * 36  # from the last registry read, not left to the services
            assert await unpinned_reply_version() == names[0]  # the stable of the last registry, not the highest
        (root / "registry.json").write_text(json.dumps(reg))
        assert await pins(36) == [names[0]] * 36
        assert await unpinned_reply_version() == names[0]
    finally:
        await ch.close()
        await sch.close()
        await stack.stop(0)
        for name in names:
            if name in engine.adapters():
                await engine.unload_adapter(name)
