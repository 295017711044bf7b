"""GPU check: on a machine with a CUDA GPU and the GPU vLLM build, run the vllm engine tests and
one generation at real size, and print the figures. Never needed for CI.

Real size means the Qwen3-8B architecture: either the weights at ``--weights DIR`` (a local Qwen3-8B snapshot), or,
by default, random weights vLLM initialises from the Qwen3-8B ``config.json`` alone (``load_format="dummy"``: no
16 GB download, same shapes, same kernels, same memory). A rank-16 LoRA of the same shapes is written without
loading the model (random A, small random B), so multi-LoRA runs at real size too.

    python bench/gpu_check.py                  # pytest -m vllm, then the 8B-shape generation figures
    python bench/gpu_check.py --weights /models/Qwen3-8B
    python bench/gpu_check.py --shape tiny --skip-tests   # the same path on CPU with a tiny shape (CI smoke)
"""

from __future__ import annotations

import argparse
import asyncio
import json
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


async def generation_figures(model: str, dummy: bool, lora: Path, dtype: str) -> dict:
    """Start the vllm engine on ``model`` and time one greedy generation, 16 concurrent, and one through the LoRA."""
    from mascot.core.engine import GenerationRequest, SamplingParams
    from mascot.core.engine.vllm import VllmEngine

    engine = VllmEngine(model, dtype=dtype, max_model_len=4096, max_batch_size=32, max_loras=2, max_lora_rank=16,
                        load_format="dummy" if dummy else "auto")
    t0 = time.perf_counter()
    await engine.start()
    figures = {"engine_start_s": round(time.perf_counter() - t0, 1)}
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--weights", default="", help="a local Qwen3-8B directory (default: dummy 8B-shape weights)")
    ap.add_argument("--shape", choices=("8b", "tiny"), default="8b", help="architecture when --weights is not given")
    ap.add_argument("--skip-tests", action="store_true", help="do not run pytest -m vllm first")
    args = ap.parse_args()
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
    figures = asyncio.run(generation_figures(str(model), dummy, lora, dtype))
    print(json.dumps({"model": str(args.weights or f"random {args.shape} shape"), **figures}))


if __name__ == "__main__":
    main()
