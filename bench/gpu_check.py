"""GPU check: on a machine with a CUDA GPU and the GPU vLLM build, run the vllm engine tests and
one generation at real size, and print the figures. Never needed for CI.

Real size means the Qwen3-8B architecture: either the weights at ``--weights DIR`` (a local Qwen3-8B snapshot), or,
by default, random weights vLLM initialises from the Qwen3-8B ``config.json`` alone (``load_format="dummy"``: no
16 GB download, same shapes, same kernels, same memory). A rank-16 LoRA of the same shapes is written without
loading the model (random A, small random B), so multi-LoRA runs at real size too.

    python bench/gpu_check.py                  # pytest -m vllm, then the 8B-shape generation figures
    python bench/gpu_check.py --weights /models/Qwen3-8B
    python bench/gpu_check.py --shape tiny --skip-tests   # the same path on CPU with a tiny shape (CI smoke)
    python bench/gpu_check.py --shape tiny --skip-tests --memory-share 0.06   # ... with a smaller KV cache
    python bench/gpu_check.py --no-vllm        # the transformers path (what runs where vLLM does not import)

GRPO with vLLM generation: then, with CUDA, two optimiser steps of each phase's GRPO with ``generation.backend: vllm``
in colocate mode on the tiny model, each in a subprocess of its own (``--grpo-step persona|director``): the persona
stage's ``train_persona`` (format reward) and the director stage's trainer (rollouts on scripted speakers, directives
sampled by :class:`~mascot_training.collaborative.director_grpo.VllmDirector`). Without CUDA they are skipped with the
reason printed (TRL's vLLM generation needs CUDA); ``--skip-grpo`` leaves them out.

Shared engine: then, with CUDA, ``bench/shared_engine.py --engine vllm`` (director and speaker on one vLLM engine
against one engine each, the same memory budget in all; the real model at ``--weights``, else the bundled default
model): the throughput ratio on the GPU, and host memory (RSS) of the serving processes; GPU memory is the same in
both by construction (``--memory-share``). Skipped without CUDA; ``--skip-shared`` leaves it out.

Without vLLM (it does not import: no GPU build installed, or ``--no-vllm``): one line says why, and the transformers
path of our own code runs on the GPU instead of the vLLM parts (:func:`transformers_figures`): our
:class:`~mascot.core.engine.transformers.TransformersEngine` with ``device="cuda"`` on the same shape with random
weights (bf16 for ``8b``): one grammar-constrained request with the speakers' penalties (its text must match the
regex), tokens/s at batch 1 and 16 (and 16 with a LoRA mixed in), peak GPU memory, and ``model.generate`` of the same
model for comparison. Then one LoRA GRPO optimiser step of the persona phase with transformers generation on the tiny
model (``train_persona``; a subprocess).
TRL, datasets, pydantic and xgrammar can travel to such a machine as wheels: ``bench/gpu_check_wheels.txt``.

The figures are printed as one JSON line (the last line of stdout) and written to ``$OUT/gpu_check.json`` when
``OUT`` is set.

Tensor parallelism: the engine shards the model over the visible GPUs (``CUDA_VISIBLE_DEVICES`` selects them; the
largest count the model's attention heads divide, see :func:`tensor_parallel_size`), as the Helm chart sets
``engine.tensor_parallel_size`` to a service's ``gpu.count``; ``--tensor-parallel-size N`` fixes it. On CPU it is 1.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "services"))

#: Qwen3-8B's architecture (config.json of Qwen/Qwen3-8B); the tokenizer is ours, so ids stay below its vocab.
QWEN3_8B = {"hidden_size": 4096, "intermediate_size": 12288, "num_hidden_layers": 36, "num_attention_heads": 32,
            "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936, "max_position_embeddings": 40960,
            "rope_theta": 1000000, "rms_norm_eps": 1e-6, "tie_word_embeddings": False}


def write_shape_model(out: Path, shape: str) -> Path:
    """A model directory with our locally trained tokenizer and a ``config.json`` of ``shape`` (``8b``: Qwen3-8B;
    ``tiny``: the tiny test shape). Weights are written only for ``tiny``; ``8b`` is loaded with dummy weights."""
    from mascot.core.engine.tiny import build_tiny_qwen3

    build_tiny_qwen3(out)
    if shape == "8b":
        conf = json.loads((out / "config.json").read_text())
        conf.update(QWEN3_8B, torch_dtype="bfloat16", dtype="bfloat16")
        # per-layer attention types are derived from num_hidden_layers (transformers refuses a list of the tiny
        # model's length), and transformers 5 reads rope_theta from rope_parameters
        conf.pop("layer_types", None)
        if isinstance(conf.get("rope_parameters"), dict):
            conf["rope_parameters"]["rope_theta"] = QWEN3_8B["rope_theta"]
        (out / "config.json").write_text(json.dumps(conf, indent=1))
        for f in out.glob("*.safetensors"):
            f.unlink()
    return out


def write_random_lora(model_dir: Path, out: Path, rank: int = 16, seed: int = 0) -> Path:
    """A PEFT LoRA (q_proj, v_proj) with the shapes of ``model_dir``'s config, written without loading the model."""
    import torch
    from safetensors.torch import save_file

    c = json.loads((model_dir / "config.json").read_text())
    hidden, heads, kv = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"]
    head_dim = c.get("head_dim") or hidden // heads
    g = torch.Generator().manual_seed(seed)
    tensors = {}
    for i in range(c["num_hidden_layers"]):
        for mod, out_dim in (("q_proj", heads * head_dim), ("v_proj", kv * head_dim)):
            key = f"base_model.model.model.layers.{i}.self_attn.{mod}"
            tensors[f"{key}.lora_A.weight"] = torch.randn(rank, hidden, generator=g) / hidden ** 0.5
            tensors[f"{key}.lora_B.weight"] = torch.randn(out_dim, rank, generator=g) * 0.01
    out.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(out / "adapter_model.safetensors"))
    (out / "adapter_config.json").write_text(json.dumps({
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": str(model_dir), "r": rank,
        "lora_alpha": 2 * rank, "lora_dropout": 0.0, "bias": "none", "target_modules": ["q_proj", "v_proj"]}))
    return out


def visible_gpus() -> int:
    """CUDA devices this process sees (``CUDA_VISIBLE_DEVICES`` applies); 0 without CUDA."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def tensor_parallel_size(model_dir: Path, gpus: int) -> int:
    """The largest tensor-parallel size <= ``gpus`` vLLM can shard ``model_dir`` over: it divides the attention
    heads, and divides or is a multiple of the key/value heads (vLLM replicates them beyond their count); 1 for
    ``gpus`` < 2 (CPU, or one GPU).

    Raises:
        OSError / KeyError: ``config.json`` is missing or lacks ``num_attention_heads``.
    """
    c = json.loads((model_dir / "config.json").read_text())
    heads = c["num_attention_heads"]
    kv = c.get("num_key_value_heads") or heads
    for size in range(max(1, gpus), 1, -1):
        if heads % size == 0 and (kv % size == 0 or size % kv == 0):
            return size
    return 1


async def generation_figures(model: str, dummy: bool, lora: Path, dtype: str, tp: int = 1,
                             memory_share: float | None = None) -> dict:
    """Start the vllm engine on ``model`` sharded over ``tp`` GPUs (tensor parallelism, 1 = one device) with
    ``memory_share`` as its ``gpu_memory_utilization`` (None: the engine's default) and time one greedy generation,
    16 concurrent, and one through the LoRA."""
    from mascot.core.engine import GenerationRequest, SamplingParams
    from mascot.core.engine.vllm import VllmEngine

    engine = VllmEngine(model, dtype=dtype, max_model_len=4096, max_batch_size=32, max_loras=2, max_lora_rank=16,
                        load_format="dummy" if dummy else "auto", tensor_parallel_size=tp,
                        gpu_memory_utilization=memory_share)
    t0 = time.perf_counter()
    await engine.start()
    figures = {"engine_start_s": round(time.perf_counter() - t0, 1),
               "tensor_parallel_size": engine.vllm_args.tensor_parallel_size}
    try:
        await engine.load_adapter("persona--v1", str(lora))
        prompt = engine.render_chat([{"role": "user", "content": "I lost my job today and I feel awful."}])

        def req(i: int, adapter: str | None = None) -> GenerationRequest:
            return GenerationRequest(prompt, SamplingParams(max_tokens=128, temperature=1.0, seed=i), adapter=adapter)

        await engine.generate(req(0))
        t0 = time.perf_counter()
        one = await engine.generate(req(1))
        figures["single_tok_s"] = round(len(one.token_ids) / (time.perf_counter() - t0), 1)
        t0 = time.perf_counter()
        many = await asyncio.gather(*[engine.generate(req(i, "persona--v1" if i % 2 else None)) for i in range(16)])
        figures["concurrent16_mixed_lora_tok_s"] = round(
            sum(len(r.token_ids) for r in many) / (time.perf_counter() - t0), 1)
        t0 = time.perf_counter()
        la = await engine.generate(req(2, "persona--v1"))
        figures["lora_single_tok_s"] = round(len(la.token_ids) / (time.perf_counter() - t0), 1)
        figures["platform"] = "cpu" if engine._on_cpu else "gpu"
    finally:
        await engine.close()
    return figures


def vllm_unavailable() -> str:
    """Why vLLM does not import here (``"ModuleNotFoundError: No module named 'vllm'"``), or ``""`` when it does."""
    try:
        import vllm  # noqa: F401
    except Exception as e:  # noqa: BLE001 - ImportError, or a build that breaks at import (CUDA, torch)
        return f"{type(e).__name__}: {e}"
    return ""


@contextlib.contextmanager
def random_weights_on(device: str, weights: bool = False):
    """While active, ``AutoModelForCausalLM.from_pretrained(dir, dtype=...)`` builds ``dir``'s architecture from its
    ``config.json`` with random init directly on ``device`` (no weights read: the 8B shape has none), or with
    ``weights`` loads them onto ``device``. How the benchmark gives :class:`TransformersEngine`, which loads with a
    plain ``from_pretrained`` on the CPU, a model of the real shape on the GPU."""
    import torch
    import transformers

    cls = transformers.AutoModelForCausalLM
    own = cls.__dict__.get("from_pretrained")
    load = cls.from_pretrained

    def fake(klass, name, *a, dtype=None, **kw):
        if weights:
            return load(name, *a, dtype=dtype, device_map=device)
        with torch.device(device):
            return cls.from_config(transformers.AutoConfig.from_pretrained(name), dtype=dtype)

    cls.from_pretrained = classmethod(fake)
    try:
        yield
    finally:
        if own is None:
            del cls.from_pretrained
        else:
            cls.from_pretrained = own


class _BatchErrors:
    """Catches what the engine logs when a batch fails (``engine batch failed``, with the exception): the engine
    answers the caller only ``generation failed: <type>``; this keeps the message and the engine line it came from."""

    def __init__(self) -> None:
        import logging

        self.errors: list[dict] = []
        outer = self

        class H(logging.Handler):
            def emit(self, record):
                if record.exc_info and record.exc_info[1] is not None:
                    outer.errors.append(_describe(record.exc_info[1]))

        self.handler = H()
        self.logger = logging.getLogger("mascot.core.engine.transformers")

    def __enter__(self):
        self.logger.addHandler(self.handler)
        return self

    def __exit__(self, *exc):
        self.logger.removeHandler(self.handler)


def _describe(e: BaseException) -> dict:
    """``{"error": "Type: message", "engine_frame": "transformers.py:LINE in FUNC: code"}`` (the last frame in our
    engine module)."""
    import traceback

    frames = [f for f in traceback.extract_tb(e.__traceback__) if f.filename.endswith("engine/transformers.py")]
    out = {"error": f"{type(e).__name__}: {str(e)[:600]}"}
    if frames:
        f = frames[-1]
        out["engine_frame"] = f"mascot/core/engine/transformers.py:{f.lineno} in {f.name}: {(f.line or '').strip()}"
    return out


def _sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _gib(fn: str) -> float | None:
    import torch

    return round(getattr(torch.cuda, fn)() / 2**30, 2) if torch.cuda.is_available() else None


def _reset_peak() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()


def hf_generate_figures(model, tok, prompt: str, device: str, new_tokens: int = 128) -> dict:
    """Plain ``model.generate`` (sampling, exactly ``new_tokens`` each) at batch 1 and 16 of the same prompt: what
    transformers alone does with the same model, to set the engine's figures against."""
    import torch

    out: dict = {}
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    with torch.inference_mode():
        for b in (1, 16):
            enc = tok([prompt] * b, return_tensors="pt", add_special_tokens=False).to(device)
            kw = dict(do_sample=True, temperature=1.0, top_p=1.0, top_k=0, pad_token_id=pad)
            model.generate(**enc, max_new_tokens=4, min_new_tokens=4, **kw)  # warm-up
            _reset_peak()
            _sync()
            t0 = time.perf_counter()
            gen = model.generate(**enc, max_new_tokens=new_tokens, min_new_tokens=new_tokens, **kw)
            _sync()
            n = (gen.shape[1] - enc["input_ids"].shape[1]) * b
            out[f"hf_generate_b{b}_tok_s"] = round(n / (time.perf_counter() - t0), 1)
            out[f"hf_generate_b{b}_peak_gib"] = _gib("max_memory_allocated")
    return out


async def transformers_figures(model: Path, weights: bool, lora: Path, dtype: str, device: str,
                               new_tokens: int = 128) -> dict:
    """Our transformers engine on ``device`` with ``model``'s shape (random weights unless ``weights``): a request under
    a regex with repetition and frequency penalties and top-p (``grammar_ok``: its text matches), tokens/s of one
    request, of 16 concurrent ones (one batch), of 16 with a LoRA on every other row, peak GPU memory of each, and
    :func:`hf_generate_figures` of the same model."""

    import torch

    from mascot.core.engine import GenerationRequest, SamplingParams, StructuredOutput
    from mascot.core.engine.transformers import TransformersEngine

    figures: dict = {"engine": "transformers", "device": device, "dtype": dtype,
                     "platform": "gpu" if device == "cuda" else "cpu"}
    if device == "cuda":
        figures["gpu"] = torch.cuda.get_device_name()
    kw = dict(dtype=dtype, max_model_len=4096, max_batch_size=16, batch_wait_ms=50.0)
    messages = [{"role": "user", "content": "I lost my job today and I feel awful."}]

    def req(i: int, n: int = new_tokens, adapter: str | None = None) -> GenerationRequest:
        return GenerationRequest(prompt, SamplingParams(max_tokens=n, temperature=1.0, seed=i), adapter=adapter)

    async def timed(reqs: list) -> tuple[list, float]:
        _sync()
        t0 = time.perf_counter()
        res = await asyncio.gather(*[engine.generate(r) for r in reqs])
        _sync()
        return res, time.perf_counter() - t0

    kw["device"] = device
    engine = TransformersEngine(str(model), **kw)
    t0 = time.perf_counter()
    with random_weights_on(device, weights):
        await engine.start()
    figures["engine_load_s"] = round(time.perf_counter() - t0, 1)
    figures["weights_gib"] = _gib("memory_allocated")
    prompt = engine.render_chat(messages)
    figures["prompt_tokens"] = engine.count_tokens(prompt)
    try:
        with _BatchErrors() as caught:
            try:
                await engine.generate(req(0, 8))  # warm-up (CUDA context, kernels)
                rx = r"Anchor: [a-z ]{1,40}\nBeacon: [a-z ]{1,40}"
                g = await engine.generate(GenerationRequest(prompt, SamplingParams(
                    max_tokens=200, temperature=0.7, top_p=0.9, seed=3, repetition_penalty=1.2,
                    frequency_penalty=0.3), structured=StructuredOutput(regex=rx)))
                figures["grammar_ok"] = bool(re.fullmatch(rx, g.text))
                figures["grammar_text"] = g.text[:120]
                _reset_peak()
                (one,), dt = await timed([req(1)])
                figures["engine_b1_tok_s"] = round(len(one.token_ids) / dt, 1)
                figures["engine_b1_tokens"] = len(one.token_ids)
                figures["engine_b1_peak_gib"] = _gib("max_memory_allocated")
                _reset_peak()
                engine.batch_sizes.clear()
                many, dt = await timed([req(10 + i) for i in range(16)])
                figures["engine_b16_tok_s"] = round(sum(len(r.token_ids) for r in many) / dt, 1)
                figures["engine_b16_tokens"] = sum(len(r.token_ids) for r in many)
                figures["engine_b16_max_batch"] = max(engine.batch_sizes, default=0)
                figures["engine_b16_peak_gib"] = _gib("max_memory_allocated")
            except Exception as e:  # noqa: BLE001 - reported in the figures
                figures["engine_error"] = {"caller_saw": f"{type(e).__name__}: {e}",
                                           **(caught.errors[0] if caught.errors else _describe(e))}
        print(f"transformers engine figures: {json.dumps(figures)}")
        if "engine_error" not in figures:
            try:
                figures.update(hf_generate_figures(engine.model, engine.tokenizer, prompt, device, new_tokens))
            except Exception as e:  # noqa: BLE001 - reported in the figures
                figures["hf_generate_error"] = _describe(e)
            with _BatchErrors() as caught:
                try:
                    await engine.load_adapter("persona--v1", str(lora))
                    _reset_peak()
                    mixed, dt = await timed([req(40 + i, adapter="persona--v1" if i % 2 else None)
                                             for i in range(16)])
                    figures["engine_b16_mixed_lora_tok_s"] = round(sum(len(r.token_ids) for r in mixed) / dt, 1)
                    figures["engine_b16_mixed_lora_peak_gib"] = _gib("max_memory_allocated")
                except Exception as e:  # noqa: BLE001 - reported in the figures
                    figures["engine_lora_error"] = {"caller_saw": f"{type(e).__name__}: {e}",
                                                    **(caught.errors[0] if caught.errors else _describe(e))}
    finally:
        await engine.close()
    peaks = [v for k, v in figures.items() if k.endswith("peak_gib") and v is not None]
    figures["peak_gpu_gib"] = max(peaks) if peaks else None
    return figures


def _versions() -> dict:
    import importlib.metadata as md

    out = {}
    for name in ("torch", "transformers", "peft", "accelerate", "trl", "datasets", "pydantic", "xgrammar"):
        try:
            out[name] = md.version(name)
        except md.PackageNotFoundError:
            out[name] = None
    return out


GRPO_MESSAGES = ["I failed my driving test again and I feel stupid.", "My best friend is moving to another country.",
                 "I finally finished my thesis!", "I can't stop worrying about my mother's health."]


def grpo_vllm_step(phase: str, model_dir: Path, work: Path, backend: str = "vllm") -> dict:
    """Two GRPO optimiser steps (one for ``director``) on ``model_dir`` with ``generation.backend: vllm`` in colocate
    mode: ``phase`` ``persona`` runs :func:`mascot_training.persona.persona_grpo.train_persona` (format reward, 4
    completions of 16 tokens per prompt); ``director`` runs the director stage's trainer on 4 rollouts of one prefix
    with scripted speakers, its directives sampled by TRL's vLLM engine. Needs CUDA.

    ``backend`` ``transformers`` (persona only): one optimiser step with TRL's transformers generation instead, on
    whatever device torch has (CUDA when present), timed per step (``step_s``) with its peak GPU memory.

    Returns:
        ``{"steps", "seconds", "use_vllm", "vllm_mode", ...}`` (persona: ``reward_first``, ``reward_last``; director:
        ``rollouts`` by outcome and ``directive_tokens`` of a direct sample after training).

    Raises:
        mascot_training.common.config.ConfigError: ``vllm`` without a CUDA GPU.
        ValueError: ``transformers`` for the director phase.
    """
    if backend == "transformers":
        if phase != "persona":
            raise ValueError("the transformers-generation GRPO check covers the persona phase only")
        return grpo_transformers_step(model_dir, work)
    sys.path[:0] = [str(ROOT / "training-jobs"), str(ROOT)]
    from mascot.core.dialogue import HistoryTurn
    from mascot.core.personas import PersonaCatalog
    from mascot_training.common.config import LoraConfig
    from mascot_training.persona.config import GrpoConfig

    cat = PersonaCatalog.load()
    gen = {"backend": "vllm", "vllm_mode": "colocate", "vllm_gpu_memory_utilization": 0.2}
    t0 = time.perf_counter()
    if phase == "persona":
        from mascot_training.persona.persona_grpo import make_reward_func, prompt_row, train_persona

        names = {c.id: c.name for c in cat.cards.values()}
        rows = [prompt_row(cat.get("anchor"), [HistoryTurn("user", m)], [], names, f"g{i}")
                for i, m in enumerate(GRPO_MESSAGES * 2)]
        g = GrpoConfig(num_generations=4, batch_size=8, max_completion_length=16, max_steps=2, generation=gen)
        trainer, m = train_persona(str(model_dir), rows, make_reward_func(None, cat, g), g, LoraConfig(r=4, alpha=8),
                                   work, max_model_len=1024)
        out = {"steps": m["steps"], "reward_first": m["reward_first"], "reward_last": m["reward_last"]}
    else:
        from transformers import AutoTokenizer

        from mascot_training.collaborative.config import CollaborativeConfig
        from mascot_training.collaborative.director_grpo import LoopThread, RolloutStats, VllmDirector, build_trainer
        from mascot_training.collaborative.simulate import PolicyDirector, Prefix, RolloutRunner, RolloutSettings
        from tests.helpers.engine import ScriptedEngine

        tok = AutoTokenizer.from_pretrained(model_dir)
        roster = [cat.get(i) for i in ("anchor", "catalyst", "beacon")]
        runner = RolloutRunner(ScriptedEngine(lambda p: "unused", lambda p: "Let us look at that together."), tok,
                               roster, RolloutSettings(suffix_agent_turns=2, user_speak_prob=1.0,
                                                       max_consecutive_turns=2, speaker_max_tokens=16,
                                                       max_sequence_tokens=1024))
        prefix = Prefix("sit-1#0", "sit-1", "I failed my driving test.", "ashamed", 0,
                        [HistoryTurn("user", "I failed my driving test again.")])
        cfg = CollaborativeConfig(max_model_len=1024, lora={"r": 4, "alpha": 8},
                                  phase2={"num_generations": 4, "suffix_agent_turns": 2, "user_speak_prob": 1.0},
                                  director_grpo={"batch_size": 4, "max_steps": 1, "generation": gen})
        loop, stats = LoopThread(), RolloutStats()
        try:
            trainer = build_trainer(str(model_dir), {prefix.prefix_id: prefix}, runner, loop,
                                    lambda items: [0.5] * len(items), cfg, work, stats)
            trainer.train()
            stops = PolicyDirector(trainer.model, tok, max_tokens=8, temperature=1.0, top_p=1.0).stop_ids
            sample = VllmDirector(trainer.vllm_generation.llm, stops, max_tokens=8, temperature=1.0,
                                  top_p=1.0).generate([tok("Agent:", add_special_tokens=False)["input_ids"]], 0)
        finally:
            loop.close()
        out = {"steps": trainer.state.global_step, "rollouts": dict(stats.outcomes),
               "directive_tokens": len(sample[0])}
    return {**out, "use_vllm": trainer.use_vllm, "vllm_mode": trainer.vllm_mode,
            "seconds": round(time.perf_counter() - t0, 1)}


def grpo_transformers_step(model_dir: Path, work: Path) -> dict:
    """One LoRA GRPO optimiser step of the persona phase (:func:`~mascot_training.persona.persona_grpo.train_persona`,
    format reward, 2 prompts x 4 completions of 16 tokens) with TRL's transformers generation, on CUDA when present.

    Returns:
        ``{"steps", "seconds" (load + train), "step_s" (each optimiser step: generation, scoring, backward, update),
        "reward_first", "reward_last", "use_vllm", "device", "peak_gpu_gib"}``.
    """
    sys.path[:0] = [str(ROOT / "training-jobs"), str(ROOT)]
    import torch
    from transformers import TrainerCallback

    from mascot.core.dialogue import HistoryTurn
    from mascot.core.personas import PersonaCatalog
    from mascot_training.common.config import LoraConfig
    from mascot_training.persona.config import GrpoConfig
    from mascot_training.persona.persona_grpo import make_reward_func, prompt_row, train_persona

    cuda = torch.cuda.is_available()

    class StepTimer(TrainerCallback):
        def __init__(self) -> None:
            self.t0, self.steps = 0.0, []

        def on_step_begin(self, args, state, control, **kw):
            if cuda:
                torch.cuda.synchronize()
            self.t0 = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            if cuda:
                torch.cuda.synchronize()
            self.steps.append(round(time.perf_counter() - self.t0, 3))

    cat = PersonaCatalog.load()
    names = {c.id: c.name for c in cat.cards.values()}
    rows = [prompt_row(cat.get("anchor"), [HistoryTurn("user", m)], [], names, f"g{i}")
            for i, m in enumerate(GRPO_MESSAGES * 2)]
    g = GrpoConfig(num_generations=4, batch_size=8, max_completion_length=16, max_steps=1,
                   generation={"backend": "transformers"})
    timer = StepTimer()
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    trainer, m = train_persona(str(model_dir), rows, make_reward_func(None, cat, g), g, LoraConfig(r=4, alpha=8),
                               work, callbacks=[timer])
    return {"steps": m["steps"], "seconds": m["seconds"], "step_s": timer.steps, "reward_first": m["reward_first"],
            "reward_last": m["reward_last"], "use_vllm": trainer.use_vllm,
            "device": str(next(trainer.model.parameters()).device),
            "peak_gpu_gib": round(torch.cuda.max_memory_allocated() / 2**30, 3) if cuda else None}


def grpo_transformers_check(no_vllm: bool, timeout_s: float = 240) -> dict:
    """:func:`grpo_transformers_step` in a subprocess on a fresh tiny model; its figures, or the error and stderr
    tail (a missing TRL or datasets is a finding, not a crash of the check)."""
    from mascot.core.engine.tiny import build_tiny_qwen3

    tmp = Path(tempfile.mkdtemp(prefix="mascot-gpu-check-grpo-"))
    model = build_tiny_qwen3(tmp / "tiny")
    cmd = [sys.executable, __file__, "--grpo-step", "persona", "--grpo-backend", "transformers", "--grpo-model",
           str(model), "--grpo-work", str(tmp / "persona"), *(["--no-vllm"] if no_vllm else [])]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, cwd=ROOT)
    except subprocess.TimeoutExpired:
        out = {"error": f"timed out after {timeout_s:.0f} s"}
    else:
        last = next((ln for ln in reversed(proc.stdout.splitlines()) if ln.startswith('{"steps"')), "")
        out = json.loads(last) if proc.returncode == 0 and last else {
            "error": f"exit code {proc.returncode}", "stderr": proc.stderr[-2000:]}
    print(f"GRPO persona with transformers generation: {json.dumps(out)[:2500]}")
    return {"grpo_transformers": out}


def grpo_vllm_checks(timeout_s: float = 900) -> dict:
    """Run :func:`grpo_vllm_step` for both phases, each in a subprocess, on a fresh tiny model; skipped (the reason
    printed and returned) without CUDA."""
    import torch

    if not torch.cuda.is_available():
        why = "no CUDA device: TRL's vLLM generation (generation.backend: vllm) runs on CUDA GPUs only"
        print(f"GRPO with vLLM generation (colocate): skipped, {why}")
        return {"grpo_vllm_colocate": {"skipped": why}}
    from mascot.core.engine.tiny import build_tiny_qwen3

    tmp = Path(tempfile.mkdtemp(prefix="mascot-gpu-check-grpo-"))
    model = build_tiny_qwen3(tmp / "tiny")
    results = {}
    for phase in ("persona", "director"):
        proc = subprocess.run([sys.executable, __file__, "--grpo-step", phase, "--grpo-model", str(model),
                               "--grpo-work", str(tmp / phase)], capture_output=True, text=True, timeout=timeout_s,
                              cwd=ROOT)
        # the figures are the last JSON line (vLLM may log on stdout after it, at exit)
        last = next((ln for ln in reversed(proc.stdout.splitlines()) if ln.startswith('{"steps"')), "")
        results[phase] = json.loads(last) if proc.returncode == 0 and last else {
            "error": f"exit code {proc.returncode}", "stderr": proc.stderr[-2000:]}
        print(f"GRPO {phase} with vLLM generation (colocate): {json.dumps(results[phase])[:2500]}")
    return {"grpo_vllm_colocate": results}


def shared_engine_check(weights: str, timeout_s: float = 1800) -> dict:
    """``bench/shared_engine.py`` on the vLLM engine (one shared director+speaker engine against one engine each, the
    same KV-cache budget in all): the GPU throughput and memory ratios. Skipped (the reason printed and returned)
    without CUDA, where two vLLM engines on a few cores measure the CPU, not the sharing."""
    import re

    import torch

    if not torch.cuda.is_available():
        why = "no CUDA device: the shared-engine throughput ratio is a GPU figure (the CPU one is make bench's)"
        print(f"shared engine vs one per component (vllm): skipped, {why}")
        return {"shared_engine": {"skipped": why}}
    cmd = [sys.executable, str(ROOT / "bench" / "shared_engine.py"), "--size", "full", "--engine", "vllm",
           "--memory-share", "0.8", *(["--model", weights] if weights else [])]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, cwd=ROOT)
    print(proc.stdout[-3000:])
    mem = re.search(r"memory separate / shared = ([\d.]+)", proc.stdout)
    thr = re.search(r"throughput shared / separate = ([\d.]+)", proc.stdout)
    if proc.returncode or not (mem and thr):
        return {"shared_engine": {"error": f"exit code {proc.returncode}", "stderr": proc.stderr[-2000:]}}
    return {"shared_engine": {"memory_separate_over_shared": float(mem.group(1)),
                              "throughput_shared_over_separate": float(thr.group(1))}}


def engine_tests_on(device: str, timeout_s: float = 300) -> dict:
    """The transformers engine's own tests (``tests/integration/test_engine.py``: batching with mixed LoRA adapters
    equal to sequential output, continuous batching, the prefix cache, streaming, stop strings, grammars, jump-forward,
    close) on a machine where the engine's default ``device: auto`` puts them on ``device`` (a CUDA GPU). The file runs
    from a copy beside ``tests/conftest.py``, so the integration folder's own fixtures (the chart, a Kubernetes mock)
    are not imported where their packages are absent.

    Returns:
        ``{"exit_code", "summary" (pytest's last line), "seconds"}``.
    """
    import shutil

    copy = ROOT / "tests" / "test_engine_gpu_copy.py"
    shutil.copy(ROOT / "tests" / "integration" / "test_engine.py", copy)
    t0 = time.perf_counter()
    try:
        p = subprocess.run([sys.executable, "-m", "pytest", str(copy), "-q", "-p", "no:cacheprovider"],
                           cwd=ROOT, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {"exit_code": None, "summary": f"timed out after {timeout_s:.0f} s", "device": device}
    finally:
        copy.unlink(missing_ok=True)
    print(p.stdout[-4000:] + p.stderr[-2000:])
    lines = [ln for ln in p.stdout.splitlines() if ln.strip()]
    return {"exit_code": p.returncode, "summary": lines[-1] if lines else "", "device": device,
            "seconds": round(time.perf_counter() - t0, 1)}


def transformers_path(args: argparse.Namespace, why: str) -> dict:
    """What runs instead of the vLLM parts where vLLM does not import (``why``): :func:`transformers_figures` on the
    chosen shape, then (unless ``--skip-grpo``) :func:`grpo_transformers_check`."""
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    print(f"vLLM not importable ({why}): running the transformers engine path on {device} instead of the vLLM parts")
    skipped = "vLLM does not import here: " + why
    engine_tests = None
    if not args.skip_tests:
        print(f"pytest -m vllm: skipped, {skipped}")
        if device == "cuda":
            engine_tests = engine_tests_on(device)
    tmp = Path(tempfile.mkdtemp(prefix="mascot-gpu-check-"))
    if args.weights:
        model, weights = Path(args.weights), True
    else:
        model, weights = write_shape_model(tmp / "model", args.shape), False
    lora = write_random_lora(model, tmp / "lora")
    # bf16 on the GPU (and for the 8B shape); the tiny shape on the CPU in float32 as the vLLM path runs it
    dtype = "bfloat16" if device == "cuda" or args.shape == "8b" or args.weights else "float32"
    figures = {"vllm_unavailable": why, "versions": _versions(),
               **asyncio.run(transformers_figures(model, weights, lora, dtype, device))}
    if not args.skip_grpo:
        figures.update(grpo_transformers_check(args.no_vllm))
    figures["vllm_tests"] = {"skipped": skipped}
    if engine_tests is not None:
        figures["engine_tests"] = engine_tests
    if not args.skip_shared:
        figures["shared_engine"] = {"skipped": skipped + " (bench/shared_engine.py --engine vllm)"}
    return figures


def emit(summary: dict) -> None:
    """Print the figures as the last line of stdout, and write them to ``$OUT/gpu_check.json`` when ``OUT`` names a
    directory."""
    line = json.dumps(summary)
    out = os.environ.get("OUT")
    if out and Path(out).is_dir():
        (Path(out) / "gpu_check.json").write_text(line + "\n")
    print(line)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--weights", default="", help="a local Qwen3-8B directory (default: dummy 8B-shape weights)")
    ap.add_argument("--shape", choices=("8b", "tiny"), default="8b", help="architecture when --weights is not given")
    ap.add_argument("--skip-tests", action="store_true", help="do not run pytest -m vllm first")
    ap.add_argument("--skip-grpo", action="store_true", help="do not run the GRPO steps with vLLM generation")
    ap.add_argument("--skip-shared", action="store_true", help="do not run the shared-engine comparison")
    ap.add_argument("--no-vllm", action="store_true",
                    help="run as if vLLM did not import: the transformers engine path and GRPO with transformers "
                         "generation")
    ap.add_argument("--grpo-step", choices=("persona", "director"), default="",
                    help="(internal) run one phase's GRPO step with vLLM generation and print its figures as JSON")
    ap.add_argument("--grpo-backend", choices=("vllm", "transformers"), default="vllm",
                    help="(internal) the generation backend of --grpo-step")
    ap.add_argument("--grpo-model", default="", help="(internal) the model of --grpo-step")
    ap.add_argument("--grpo-work", default="", help="(internal) the work directory of --grpo-step")
    ap.add_argument("--memory-share", type=float, default=0.0,
                    help="the vLLM engine's gpu_memory_utilization (fraction of GPU memory, on CPU of NUMA node 0 "
                         "memory, for weights and KV cache); default 0: the engine's (0.9 on a GPU, 0.3 on CPU, "
                         "where allocating that KV cache is a third of the tiny shape's start-up)")
    ap.add_argument("--tensor-parallel-size", type=int, default=0,
                    help="GPUs to shard the model over (default 0: every visible GPU the model's heads allow; "
                         "1 on CPU)")
    args = ap.parse_args()
    if args.no_vllm:
        sys.modules["vllm"] = None  # `import vllm` fails, and find_spec (TRL, transformers) reports it absent
    if args.grpo_step:
        print(json.dumps(grpo_vllm_step(args.grpo_step, Path(args.grpo_model), Path(args.grpo_work),
                                        args.grpo_backend)))
        return
    why = vllm_unavailable()
    if why:
        emit({"model": str(args.weights or f"random {args.shape} shape"), **transformers_path(args, why)})
        return
    if not args.skip_tests:
        rc = subprocess.run([sys.executable, "-m", "pytest", "-m", "vllm", "-q", "-p", "no:cacheprovider"],
                            cwd=ROOT).returncode
        print(f"pytest -m vllm: exit code {rc}")
        if rc:
            sys.exit(rc)
    tmp = Path(tempfile.mkdtemp(prefix="mascot-gpu-check-"))
    if args.weights:
        model, dummy = Path(args.weights), False
    else:
        model, dummy = write_shape_model(tmp / "model", args.shape), args.shape == "8b"
    lora = write_random_lora(model, tmp / "lora")
    dtype = "float32" if args.shape == "tiny" and not args.weights else "bfloat16"
    tp = args.tensor_parallel_size or tensor_parallel_size(model, visible_gpus())
    figures = asyncio.run(generation_figures(str(model), dummy, lora, dtype, tp, args.memory_share or None))
    if not args.skip_grpo:
        figures.update(grpo_vllm_checks())
    if not args.skip_shared:
        figures.update(shared_engine_check(args.weights))
    emit({"model": str(args.weights or f"random {args.shape} shape"), **figures})


if __name__ == "__main__":
    main()
