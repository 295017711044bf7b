"""`mascot train persona-alignment` with the shipped smoke config: every stage, adapters that load."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest
import yaml

from tests.helpers.paths import ROOT

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_smoke_config_runs_every_stage_and_adapters_load(tmp_path, tiny_model_dir, shared_data):
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    cfg = yaml.safe_load((ROOT / "training-jobs" / "configs" / "persona_alignment_smoke.yaml").read_text())
    cfg["model"] = str(tiny_model_dir)
    cfg["data"]["situations"] = str(shared_data / "empathetic_dialogues" / "test_situations.jsonl")
    conf = tmp_path / "smoke.yaml"
    conf.write_text(yaml.safe_dump(cfg))
    out = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    p = subprocess.run([sys.executable, "-m", "mascot.cli", "train", "persona-alignment", "--config", str(conf),
                        "--out", str(out)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    stages = ("sft_data", "sft", "sample", "judge", "pairs", "persona_rm", "persona_grpo", "publish")
    assert set(json.loads(p.stdout)) == set(stages)
    for stage in stages:
        m = json.loads((out / stage / "manifest.json").read_text())
        assert m["stage"] == stage and m["versions"]["trl"] == "1.16.0" and "seconds" in m["timings"]
    rm = json.loads((out / "persona_rm" / "manifest.json").read_text())
    assert "rm_heldout_accuracy" in rm and set(rm["metrics"]["heldout_by_kind"]) <= {"within", "cross"}
    # the SFT data: sampled contexts (first replies and mid-dialogue ones), rows rendered with the plain serving prompt
    sd = json.loads((out / "sft_data" / "manifest.json").read_text())
    assert sd["metrics"]["contexts_mid_dialogue"] > 0 and sd["metrics"]["rows"] > 0
    sft_rows = [json.loads(x) for x in (out / "sft_data" / "rows.jsonl").read_text().splitlines()]
    from mascot_training.persona.sft_data import load_hints

    hints = load_hints()
    for r in sft_rows:
        system = r["messages"][0]["content"]
        assert "Your task now:" in system and hints[r["persona_id"]].hint not in system
        assert r["messages"][-1]["role"] == "assistant" and r["messages"][1]["role"] == "user"
    assert any(len(r["messages"]) == 4 for r in sft_rows)  # mid-dialogue: user, another persona, the reply
    sft_m = json.loads((out / "sft" / "manifest.json").read_text())
    assert sft_m["data_ids"] == sd["data_ids"] and sft_m["metrics"]["rows"] == len(sft_rows)
    # one SFT adapter per persona (sft.per_persona), each trained on its persona's rows only
    assert sft_m["adapters"] == {p: f"adapters/{p}" for p in cfg["personas"]} and "adapter" not in sft_m
    per = sft_m["metrics"]["per_persona"]
    assert {p: per[p]["rows"] for p in cfg["personas"]} == {
        p: sum(r["persona_id"] == p for r in sft_rows) for p in cfg["personas"]}
    assert all(per[p]["steps"] == 2 for p in cfg["personas"]) and sft_m["metrics"]["steps"] == 4
    # cross-persona pairs beside the within-persona ones
    pairs = [json.loads(x) for x in (out / "pairs" / "pairs.jsonl").read_text().splitlines()]
    assert {r["kind"] for r in pairs} == {"within", "cross"}
    assert all(r["rejected_persona"] != r["persona_id"] for r in pairs if r["kind"] == "cross")
    # Progress a person can follow in a Job log: one unwrapped line per step with its ETA, stage times, curves.
    lines = p.stderr.splitlines()
    grpo = [x for x in lines if x.startswith(f"persona_grpo {cfg['personas'][0]}: step ")]
    assert [x.split()[3] for x in grpo] == ["1/2", "2/2"] and "ETA " in grpo[0] and "reward " in grpo[0], lines
    assert any(x.startswith("sample: group 8/8 (100%)") for x in lines), lines
    assert any(x.startswith("judge: group 8/8 (100%)") for x in lines), lines
    assert any(x.startswith("persona_rm: step 1/") for x in lines), lines
    assert sum(x.startswith("stage ") and " starting at " in x for x in lines) == 8
    for png in (*(f"sft/curves_{p}.png" for p in cfg["personas"]), "persona_rm/curves.png",
                *(f"persona_grpo/curves_{p}.png" for p in cfg["personas"])):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", png
    grpo_log = [json.loads(x) for x in (out / "persona_grpo" / f"curves_{cfg['personas'][0]}.jsonl").read_text()
                .splitlines()]
    assert [e["step"] for e in grpo_log if "reward" in e] == [1, 2]
    man = json.loads((out / "persona_grpo" / "manifest.json").read_text())
    assert man["timings"]["started"] <= man["timings"]["finished"]
    assert man["reward_terms"] == {"rm": True, "format": True, "move": True, "budget_penalty": True}
    assert all("move_first" in man["metrics"][p] and "stopped_on_collapse" in man["metrics"][p]
               for p in cfg["personas"])
    # the groups held out for the reward model are held out of GRPO too and measured before and after on them
    from mascot_training.persona.config import GrpoConfig
    from mascot_training.common.data import in_heldout_split

    groups = [json.loads(x) for x in (out / "sample" / "candidates.jsonl").read_text().splitlines()]
    held = {p: sum(g["persona_id"] == p and in_heldout_split(g["group_id"], 0.25) for g in groups)
            for p in cfg["personas"]}
    assert sum(held.values()) > 0, held
    for p, n in held.items():
        m = man["metrics"][p]
        assert m.get("heldout_prompts", 0) == n
        if n:
            for when in ("heldout_before", "heldout_after"):
                assert m[when]["completions"] == n * GrpoConfig().heldout_samples, m
                assert isinstance(m[when]["reward"], float) and math.isfinite(m[when]["reward"])
    assert man["heldout_personas"] == sorted(p for p, n in held.items() if n)
    assert isinstance(man["heldout_reward_before"], float) and isinstance(man["heldout_reward_after"], float)
    assert any("held-out reward " in x for x in lines), lines
    # what each adapter said at the publish gate, for a person to read
    said = [json.loads(x) for x in (out / "publish" / "gate_replies.jsonl").read_text().splitlines()]
    prompts = cfg["publish"]["gate"]["prompts"]
    assert [r["persona_id"] for r in said] == [p for p in cfg["personas"] for _ in range(prompts)]
    assert all(set(r) == {"persona_id", "message", "reply"} and r["message"] for r in said)
    pub = json.loads((out / "publish" / "manifest.json").read_text())["metrics"]["personas"]
    assert all("texts" not in rec["gate"] for rec in pub.values())
    registry = json.loads((out / "adapters" / "registry.json").read_text())
    assert set(registry["adapters"]) == set(cfg["personas"])
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    ids = torch.tensor([[5, 6, 7, 8]])
    with torch.no_grad():
        ref = base(ids).logits
    for persona in cfg["personas"]:
        v = registry["adapters"][persona]["versions"]["1"]
        assert v["state"] == "staged" and v["name"] == f"{persona}--v1"
        d = out / "adapters" / persona / "v1"
        man = json.loads((d / "manifest.json").read_text())
        assert man["base_model"] == str(tiny_model_dir) and man["rank"] == 16 and man["data_ids"]
        model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model_dir), d)
        with torch.no_grad():
            assert model(ids).logits.shape == ref.shape
    # With sft enabled, GRPO continued each persona's own SFT adapter (pi_SFT): its LoRA B starts from that persona's
    # SFT weights, not zeros and not the other persona's.
    from safetensors.torch import load_file

    sft_w = {p: load_file(out / "sft" / "adapters" / p / "adapter_model.safetensors") for p in cfg["personas"]}
    b_keys = [k for k in sft_w[cfg["personas"][0]] if "lora_B" in k]
    p0, p1 = cfg["personas"]

    def dist(a, b):
        return sum(float((a[k] - b[k]).abs().sum()) for k in b_keys)

    assert b_keys and dist(sft_w[p0], sft_w[p1]) > 0  # trained on different rows
    for p, other in ((p0, p1), (p1, p0)):
        grpo_w = load_file(out / "persona_grpo" / p / "adapter_model.safetensors")
        assert set(b_keys) <= set(grpo_w)
        sft_norm = sum(float(sft_w[p][k].abs().sum()) for k in b_keys)
        assert sft_norm > 0 and dist(grpo_w, sft_w[p]) < 0.5 * sft_norm
        assert dist(grpo_w, sft_w[p]) < dist(grpo_w, sft_w[other])
    # Evaluation refuses the ids this run trained on (its adapter manifest lists them).
    from mascot.core.situations import load_situations
    from mascot.eval.data import check_no_overlap

    sits = load_situations(cfg["data"]["situations"], "support", None)
    with pytest.raises(ValueError, match="used for training"):
        check_no_overlap(sits, [out / "adapters" / cfg["personas"][0] / "v1" / "manifest.json"])
    # A rerun resumes: every stage is skipped, nothing is published twice.
    p = subprocess.run([sys.executable, "-m", "mascot.cli", "train", "persona-alignment", "--config", str(conf),
                        "--out", str(out)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    assert json.loads((out / "adapters" / "registry.json").read_text())["revision"] == registry["revision"]


def test_bad_config_fails_fast_with_every_problem(tmp_path):
    conf = tmp_path / "bad.yaml"
    conf.write_text(yaml.safe_dump({"personas": ["ghost"], "persona_grpo": {"num_generations": 3, "batch_size": 8},
                                    "data": {"situations": str(tmp_path / "none.jsonl")}}))
    p = subprocess.run([sys.executable, "-m", "mascot.cli", "train", "sample", "--config", str(conf), "--out",
                        str(tmp_path / "o")], cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)},
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2
    assert "ghost" in p.stderr and "divisible" in p.stderr and "none.jsonl" in p.stderr and "Traceback" not in p.stderr
    assert not (tmp_path / "o").exists()
    (tmp_path / "afile").write_text("x")
    good = ROOT / "training-jobs" / "configs" / "persona_alignment_smoke.yaml"
    p = subprocess.run([sys.executable, "-m", "mascot.cli", "train", "pairs", "--config", str(good), "--out",
                        str(tmp_path / "afile")], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "not a directory" in p.stderr and "Traceback" not in p.stderr
    # Publishing from a run without GRPO adapters refuses every persona: the command fails (exit 1) and says why.
    p = subprocess.run([sys.executable, "-m", "mascot.cli", "train", "publish", "--config", str(good), "--out",
                        str(tmp_path / "nothing")], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 1 and "refused every adapter" in p.stderr and "Traceback" not in p.stderr

