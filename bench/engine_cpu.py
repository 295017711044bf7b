"""The transformers engine's CPU fast paths against transformers' own, side by side in one run on the default model.

1. Decode step: ``--rows`` rows over a ``--width``-column left-padded key/value cache, one token per row per step;
   transformers' ``sdpa`` attention with its ``DynamicCache`` (grouped key/value heads copied per query head under
   the mask, the whole cache concatenated per step) against the engine's (:func:`gqa_sdpa_attention`, a cache that
   appends into spare room). Steps alternate between the two paths; prints the median step of each, their ratio
   (goal < 1) and the largest logit difference (goal 0: same numbers).
2. Prefill of a ``--prompt``-token prompt in float32 and in bfloat16 (alternating), and which one
   ``engine.dtype: auto`` picks on this machine (goal: the faster one).

    python bench/engine_cpu.py [--rows 16] [--width 512] [--steps 8] [--prompt 460] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "services"))


def decode_figures(model, rows: int, width: int, steps: int) -> dict:
    import torch
    from transformers import DynamicCache

    from mascot.core.engine.transformers import GQA_SDPA, _kv_cache, _register_attention

    _register_attention()
    torch.manual_seed(0)
    prompt = torch.randint(100, model.config.vocab_size - 1, (rows, width))
    mask = torch.ones((rows, width), dtype=torch.long)
    for r in range(rows // 2):  # the shorter half of the rows is left-padded, as in the engine's batches
        mask[r, : width // 4] = 0
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.inference_mode():
        model.set_attn_implementation("sdpa")
        kv = model(input_ids=prompt, attention_mask=mask, position_ids=pos, use_cache=True, logits_to_keep=1)
        layers = [(lay.keys.clone(), lay.values.clone()) for lay in kv.past_key_values.layers]
    paths = {"transformers": (lambda: DynamicCache(ddp_cache_data=[(k.clone(), v.clone()) for k, v in layers]), "sdpa"),
             "engine": (lambda: _kv_cache(layers), GQA_SDPA)}
    state = {name: {"cache": make(), "mask": mask.clone(), "pos": pos[:, -1:] + 1, "times": [], "logits": []}
             for name, (make, _) in paths.items()}
    ids = torch.randint(100, model.config.vocab_size - 1, (steps, rows, 1))
    with torch.inference_mode():
        for s in range(steps):
            for name, (_, impl) in paths.items():
                st = state[name]
                model.set_attn_implementation(impl)
                st["mask"] = torch.cat([st["mask"], torch.ones((rows, 1), dtype=torch.long)], 1)
                t = time.perf_counter()
                out = model(input_ids=ids[s], attention_mask=st["mask"], position_ids=st["pos"],
                            past_key_values=st["cache"], use_cache=True, logits_to_keep=1)
                st["times"].append(time.perf_counter() - t)
                st["logits"].append(out.logits[:, -1, :])
                st["pos"] = st["pos"] + 1
    model.set_attn_implementation("sdpa")
    diff = max(float((a - b).abs().max()) for a, b in zip(state["transformers"]["logits"], state["engine"]["logits"]))
    ms = {name: 1000 * statistics.median(st["times"][1:] or st["times"]) for name, st in state.items()}
    return {"rows": rows, "width": width, "steps": steps, "transformers_step_ms": round(ms["transformers"], 1),
            "engine_step_ms": round(ms["engine"], 1), "ratio": round(ms["engine"] / ms["transformers"], 3),
            "max_logit_diff": diff}


def prefill_figures(model_dir: str, tokens: int, repeats: int) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    from mascot.core.engine import auto_dtype

    models = {d: AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, d)).eval()
              for d in ("float32", "bfloat16")}
    ids = torch.randint(100, 40000, (1, tokens))
    times: dict[str, list[float]] = {d: [] for d in models}
    with torch.inference_mode():
        for m in models.values():
            m(input_ids=ids[:, :32], logits_to_keep=1)  # first-call set-up out of the figures
        for _ in range(repeats):
            for d, m in models.items():
                t = time.perf_counter()
                m(input_ids=ids, logits_to_keep=1)
                times[d].append(time.perf_counter() - t)
    s = {d: statistics.median(v) for d, v in times.items()}
    auto = auto_dtype("")
    return {"prompt_tokens": tokens, "float32_s": round(s["float32"], 3), "bfloat16_s": round(s["bfloat16"], 3),
            "auto": auto, "auto_is_faster": s[auto] <= min(s.values())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=16)
    ap.add_argument("--width", type=int, default=512)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--prompt", type=int, default=460)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", default="", help="also write the figures here")
    args = ap.parse_args()

    import torch
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    from mascot.core.engine.default_model import MANIFEST, default_model_dir, prepare_default_model

    hf_logging.disable_progress_bar()
    torch.set_num_threads(args.threads)
    model_dir = default_model_dir(ROOT / ".cache" / "models")
    if not (model_dir / MANIFEST).is_file():
        prepare_default_model(model_dir)
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    dec = decode_figures(model, args.rows, args.width, args.steps)
    del model
    pre = prefill_figures(str(model_dir), args.prompt, args.repeats)
    print(f"cpu: {torch.backends.cpu.get_cpu_capability()}, threads {args.threads}")
    print(f"decode step, {dec['rows']} rows x {dec['width']} columns (median of {dec['steps']}): transformers "
          f"{dec['transformers_step_ms']} ms, engine {dec['engine_step_ms']} ms, ratio engine / transformers = "
          f"{dec['ratio']} (goal < 1); max logit difference {dec['max_logit_diff']:.3g} (goal 0)")
    print(f"prefill of {pre['prompt_tokens']} tokens: float32 {pre['float32_s']} s, bfloat16 {pre['bfloat16_s']} s; "
          f"engine.dtype auto picks {pre['auto']} ({'the faster' if pre['auto_is_faster'] else 'NOT the faster'})")
    ok = dec["ratio"] < 1 and dec["max_logit_diff"] == 0 and pre["auto_is_faster"]
    print(f"result: {'PASS' if ok else 'FAIL'}")
    if args.json:
        Path(args.json).write_text(json.dumps({"decode": dec, "prefill": pre, "pass": ok}, indent=2) + "\n")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
