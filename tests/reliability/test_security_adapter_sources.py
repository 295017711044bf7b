"""Adapter sources restricted to an allowlist: PublishAdapter reads only absolute
local directories inside ``adapters.allowed_source_prefixes`` (symlinks resolved); URIs, relative paths, paths
outside and symlinks leading out are INVALID_ARGUMENT with a message naming the setting, and nothing is written."""

from __future__ import annotations

import os
import tempfile

import grpc
import pytest

from mascot.api.adapter.v1 import adapter_pb2 as apb
from mascot.api.adapter.v1 import adapter_pb2_grpc
from mascot.core.config import MascotConfig
from mascot.core.errors import InvalidArgument
from mascot.core.server import channel
from mascot.gateway.admin import check_source_path
from mascot.app.stack import start_stack
from tests.helpers.config import make_config
from tests.helpers.engine import ScriptedEngine

ADMIN = "admin-token-0123456789abcdef"


def adapter_dir(path):
    path.mkdir(parents=True)
    (path / "adapter_config.json").write_text("{}")
    (path / "adapter_model.safetensors").write_bytes(b"\0" * 8)
    return path


def test_default_allows_run_directories_and_the_temp_dir_only():
    assert MascotConfig().adapters.allowed_source_prefixes == ["/runs", tempfile.gettempdir()]
    with pytest.raises(ValueError, match="absolute local directory"):
        MascotConfig(adapters={"allowed_source_prefixes": ["s3://bucket/runs"]})
    with pytest.raises(ValueError, match="absolute local directory"):
        MascotConfig(adapters={"allowed_source_prefixes": ["runs"]})


def test_check_source_path(tmp_path):
    allowed, outside = tmp_path / "allowed", tmp_path / "outside"
    good = adapter_dir(allowed / "run1" / "adapter")
    bad = adapter_dir(outside / "adapter")
    prefixes = [str(allowed)]
    assert check_source_path(str(good), prefixes) == good.resolve()
    assert check_source_path(str(allowed), prefixes) == allowed.resolve()
    os.symlink(bad, allowed / "link")  # a symlink inside the root to a directory outside it
    leaky = adapter_dir(allowed / "leaky")
    os.symlink(bad / "adapter_model.safetensors", leaky / "weights")  # a file leading out
    cases = [str(bad), str(allowed / "link"), str(leaky), f"{allowed}/../outside/adapter", "relative/adapter",
             f"file://{good}", f"s3://bucket{good}", str(tmp_path / "allowedx")]
    for case in cases:
        with pytest.raises(InvalidArgument) as e:
            check_source_path(case, prefixes)
        assert ("allowed_source_prefixes" in e.value.message or "absolute local directory" in e.value.message
                or "leads outside the adapter directory" in e.value.message)
    with pytest.raises(InvalidArgument, match="publishing is off"):
        check_source_path(str(good), [])


def test_a_link_at_any_depth_that_leaves_the_adapter_is_refused(tmp_path):
    allowed = tmp_path / "allowed"
    nested = adapter_dir(allowed / "run" / "adapter")
    (nested / "sub" / "deeper").mkdir(parents=True)
    os.symlink("/etc/passwd", nested / "sub" / "deeper" / "passwd")
    with pytest.raises(InvalidArgument, match="'sub/deeper/passwd' that leads outside the adapter directory"):
        check_source_path(str(nested), [str(allowed)])
    os.unlink(nested / "sub" / "deeper" / "passwd")
    sibling = adapter_dir(allowed / "run" / "other")  # inside the allowed prefix but outside this adapter
    os.symlink(sibling / "adapter_config.json", nested / "sub" / "cfg.json")
    with pytest.raises(InvalidArgument, match="sub/cfg.json"):
        check_source_path(str(nested), [str(allowed)])
    os.unlink(nested / "sub" / "cfg.json")
    os.symlink(nested / "adapter_config.json", nested / "sub" / "cfg.json")  # stays inside the adapter
    assert check_source_path(str(nested), [str(allowed)]) == nested.resolve()


@pytest.mark.integration
async def test_publish_outside_the_allowlist_is_refused_and_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("MASCOT_TEST_ADMIN", ADMIN)
    store = tmp_path / "store"
    cfg = make_config(tmp_path, adapters={"store": str(store), "base_model": "tiny-base",
                                          "admin_token_env": "MASCOT_TEST_ADMIN",
                                          "allowed_source_prefixes": [str(tmp_path / "runs")]})
    stack = await start_stack(cfg, engine=ScriptedEngine(lambda p: "", lambda p: ""))
    outside = adapter_dir(tmp_path / "home" / "adapter")
    (tmp_path / "runs").mkdir()
    os.symlink(outside, tmp_path / "runs" / "sneaky")
    try:
        async with channel(stack.target("control"), token="") as ch:
            stub = adapter_pb2_grpc.AdapterServiceStub(ch)
            auth = (("authorization", f"Bearer {ADMIN}"),)
            nested = adapter_dir(tmp_path / "runs" / "nested")
            (nested / "sub").mkdir()
            os.symlink("/etc/passwd", nested / "sub" / "passwd")
            for src in (str(outside), str(tmp_path / "runs" / "sneaky"), "adapter", f"file://{outside}", str(nested)):
                with pytest.raises(grpc.aio.AioRpcError) as e:
                    await stub.PublishAdapter(apb.PublishAdapterRequest(persona_id="anchor", source_path=src),
                                              metadata=auth)
                assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, src
                assert ("allowed_source_prefixes" in e.value.details() or "not a directory" in e.value.details()
                        or "absolute local directory" in e.value.details()
                        or "leads outside the adapter directory" in e.value.details())
            assert (await stub.ListAdapters(apb.ListAdaptersRequest(), metadata=auth)).revision == 0
            assert not (store / "anchor").exists()
    finally:
        await stack.stop(0)
