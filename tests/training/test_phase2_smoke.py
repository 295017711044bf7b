"""`mascot train collaborative` with the shipped smoke config on a fresh run directory: every stage, a
director adapter in the store that loads onto the base model, the manifest fields, and a resume that redoes
nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml

from tests.helpers.paths import ROOT

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _cli(args, cwd):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "mascot.cli", "train", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)


@pytest.fixture
def smoke_config(tmp_path, tiny_model_dir, shared_data):
    cfg = yaml.safe_load((ROOT / "training-jobs" / "configs" / "collaborative_smoke.yaml").read_text())
    cfg["model"] = str(tiny_model_dir)
    cfg["data"]["situations"] = str(shared_data / "empathetic_dialogues" / "test_situations.jsonl")
    conf = tmp_path / "smoke.yaml"
    conf.write_text(yaml.safe_dump(cfg))
    return conf, cfg


def test_smoke_config_runs_standalone_and_leaves_a_director_adapter(smoke_config, tmp_path, tiny_model_dir):
    import torch
    from peft import PeftModel
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM

    conf, cfg = smoke_config
    out = tmp_path / "run"
    p = _cli(["collaborative", "--config", str(conf), "--out", str(out)], tmp_path)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert set(json.loads(p.stdout)) == {"speakers", "rollouts", "group_rm", "director_grpo", "publish"}  # alone
    for stage in ("speakers", "rollouts", "group_rm", "director_grpo", "publish"):
        m = json.loads((out / stage / "manifest.json").read_text())
        assert m["stage"] == stage and m["versions"]["trl"] == "1.16.0" and "seconds" in m["timings"]
    sp = json.loads((out / "speakers" / "manifest.json").read_text())
    assert {a["source"] for a in sp["adapters"].values()} == {"quick"} and set(sp["adapters"]) == set(cfg["personas"])
    lines = p.stderr.splitlines()  # progress: one line per prefix / step with its ETA, then the curves
    n = cfg["data"]["limit"]
    assert any(x.startswith(f"rollouts: prefix {n}/{n} (100%)") for x in lines), lines
    assert [x.split()[2] for x in lines if x.startswith("director_grpo: step ")] == ["1/2", "2/2"], lines
    assert any(x.startswith("group_rm: step 1/") for x in lines), lines
    assert sum(x.startswith("stage ") and " starting at " in x for x in lines) == 5
    for png in ("group_rm/curves.png", "director_grpo/curves.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", png
    ro = json.loads((out / "rollouts" / "manifest.json").read_text())["metrics"]
    assert ro["prefixes"] == cfg["data"]["limit"]
    assert ro["blocks"] == ro["prefixes"] * cfg["phase2"]["group_reward"]["k"]
    assert set(ro["prefix_k"]) <= {"0", "1"}
    grm = json.loads((out / "group_rm" / "manifest.json").read_text())
    assert grm["metrics"]["source"] == "rm" and "group_rm_heldout_accuracy" in grm
    meta = json.loads((out / "group_rm" / "model" / "mascot_reward.json").read_text())
    assert meta["trained"] and meta["sigma"] > 0
    dg = json.loads((out / "director_grpo" / "manifest.json").read_text())
    for k in ("group_reward_mean", "i_div_mean", "persona_distribution_before", "persona_distribution_after"):
        assert k in dg and k in dg["metrics"]
    assert dg["metrics"]["steps"] == cfg["director_grpo"]["max_steps"]
    assert dg["metrics"]["warm_start"]["steps"] == cfg["director"]["warm_start_steps"]  # GRPO continued it
    # every scored GRPO rollout is kept to read: its step, directives, block, outcome and reward
    recs = [json.loads(x) for x in (out / "director_grpo" / "rollouts.jsonl").read_text().splitlines()]
    assert len(recs) == cfg["director_grpo"]["max_steps"] * cfg["director_grpo"]["batch_size"]
    assert [r["step"] for r in recs] == sorted(r["step"] for r in recs) and {r["step"] for r in recs} == {0, 1}
    assert sum(dg["metrics"]["rollouts"].values()) == len(recs)
    for r in recs:
        assert r["outcome"] in ("complete", "invalid", "dropped", "window_full") and r["directives"]
        assert (r["reward"] == cfg["phase2"].get("invalid_reward", -2.0)) if r["outcome"] == "invalid" else True
    for dist in (dg["persona_distribution_before"], dg["persona_distribution_after"]):
        assert set(dist) == set(cfg["personas"]) | {"invalid"} and sum(dist.values()) == pytest.approx(1.0, abs=1e-3)
    # the prefixes the group RM held out are held out of the director's training too, and measured before and after
    from mascot_training.common.data import in_heldout_split

    prefix_ids = [json.loads(x)["prefix_id"] for x in (out / "rollouts" / "prefixes.jsonl").read_text().splitlines()]
    held = [i for i in prefix_ids if in_heldout_split(i, cfg["phase2"]["group_reward"]["pairs"]["heldout_fraction"])]
    assert dg["metrics"].get("heldout_prefixes", 0) == len(held) and len(held) < len(prefix_ids)
    if held:
        for when in ("heldout_before", "heldout_after"):
            got = dg["metrics"][when]
            assert sum(got["rollouts"].values()) == len(held) * 2 and isinstance(got["reward"], float), got
        assert isinstance(dg["heldout_reward_before"], float) and isinstance(dg["heldout_reward_after"], float)
        assert any(x.startswith("director_grpo: 2 steps") and "held-out reward" in x for x in lines), lines
    else:
        assert dg["heldout_reward_before"] is None and dg["heldout_reward_after"] is None
    # training and evaluation ids are disjoint: every prefix comes from the training split
    from mascot_training.common.data import in_train_split

    assert dg["data_ids"] and all(in_train_split(i, 0.5, "mascot-phase1") for i in dg["data_ids"])
    # the store holds director/v1 as staged, and it loads onto the base model
    reg = json.loads((out / "adapters" / "registry.json").read_text())
    assert reg["adapters"]["director"]["versions"]["1"]["state"] == "staged"
    vdir = out / "adapters" / "director" / "v1"
    man = json.loads((vdir / "manifest.json").read_text())
    assert man["name"] == "director--v1" and man["base_model"] == str(tiny_model_dir)
    assert "persona_distribution_after" in man["eval_metrics"]["director_grpo"]
    with safe_open(str(vdir / "adapter_model.safetensors"), "pt") as f:
        assert all("lora_" in k for k in f.keys())
    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model_dir), str(vdir))
    with torch.no_grad():
        assert model(torch.tensor([[1, 2, 3]])).logits.shape[-1] == model.config.vocab_size
    # resume: nothing is redone, nothing is published twice, also with gradient checkpointing switched on (it changes
    # the memory of a step, not what is trained)
    toggled = json.loads(json.dumps(cfg))
    toggled["phase2"]["group_reward"]["rm"]["gradient_checkpointing"] = True
    toggled["director_grpo"]["gradient_checkpointing"] = True
    (tmp_path / "toggled.yaml").write_text(yaml.safe_dump(toggled))
    p2 = _cli(["collaborative", "--config", str(tmp_path / "toggled.yaml"), "--out", str(out)], tmp_path)
    assert p2.returncode == 0, p2.stderr[-2000:]
    assert p2.stderr.count("up to date, skipped") == 5, p2.stderr[-3000:]
    assert json.loads((out / "adapters" / "registry.json").read_text())["revision"] == reg["revision"]
    # a store that vanished is published again on resume (the manifest alone is not trusted)
    import shutil

    shutil.rmtree(out / "adapters")
    p3 = _cli(["collaborative", "--config", str(conf), "--out", str(out), "--stage", "publish"], tmp_path)
    assert p3.returncode == 0, p3.stderr[-2000:]
    assert json.loads((out / "adapters" / "registry.json").read_text())["adapters"]["director"]["versions"]["1"]


def test_bad_config_and_unknown_stage_exit_2_without_work(tmp_path, smoke_config):
    conf, cfg = smoke_config
    cfg["director_grpo"]["batch_size"] = 6
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(cfg))
    p = _cli(["collaborative", "--config", str(bad), "--out", str(tmp_path / "o")], tmp_path)
    assert p.returncode == 2 and "must be divisible by phase2.num_generations" in p.stderr
    assert "Traceback" not in p.stderr and not (tmp_path / "o").exists()
    p = _cli(["collaborative", "--config", str(conf), "--out", str(tmp_path / "o"), "--stage", "train-all"], tmp_path)
    assert p.returncode == 2 and "unknown stage" in p.stderr and not (tmp_path / "o").exists()


def test_a_later_stage_alone_says_what_is_missing(tmp_path, smoke_config):
    conf, _ = smoke_config
    p = _cli(["collaborative", "--config", str(conf), "--out", str(tmp_path / "o"), "--stage", "director-grpo"],
             tmp_path)
    assert p.returncode == 1 and "run the rollouts stage first" in p.stderr, p.stderr[-2000:]
