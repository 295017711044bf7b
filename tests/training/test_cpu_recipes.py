"""The CPU recipes (training-jobs/configs/*_cpu.yaml) on the default real model: the shipped files validate and
say what they promise, and both run end to end at a smoke size (phase 2 over phase 1's published adapters) with the
metrics judge, the format reward of a model without a thinking mode, progress lines and curves."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.helpers.paths import ROOT

CONFIGS = ROOT / "training-jobs" / "configs"
P1, P2 = CONFIGS / "persona_alignment_cpu.yaml", CONFIGS / "collaborative_cpu.yaml"


def _set(cfg: dict, **over) -> dict:
    for k, v in over.items():
        node = cfg
        *path, last = k.split("__")
        for p in path:
            node = node.setdefault(p, {})
        node[last] = v
    return cfg


def _train(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "2"}
    return subprocess.run([sys.executable, "-m", "mascot.cli", "train", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=900)


def test_the_recipes_validate_and_train_only_on_the_training_part(tmp_path, monkeypatch):
    from mascot_training.collaborative.config import CollaborativeConfig
    from mascot_training.common.config import ConfigError
    from mascot_training.persona.config import load

    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs" / "splits").mkdir(parents=True)
    (tmp_path / "runs" / "splits" / "train.jsonl").write_text(json.dumps(
        {"id": "t1", "emotion": "sad", "situation": "My dog died.", "first_utterance": "I miss my dog."}) + "\n")
    p1 = load(P1)
    assert p1.model == "" and p1.data.situations == Path("runs/splits/train.jsonl") and p1.data.train_fraction == 1.0
    assert [j["kind"] for j in p1.judge.judges] == ["metrics"] and p1.persona_grpo.format.think is False
    assert p1.persona_grpo.max_steps * 5 >= 80 and not p1.personas  # every support persona, 80 steps in all
    # the SFT base policy from move-compliant replies, cross-persona pairs, and a reward that carries the moves
    assert p1.sft_data.enabled and p1.sft.enabled and p1.sft_data.require_moves and p1.sft_data.limit > p1.data.limit
    assert p1.sft.per_persona  # one SFT adapter per persona
    assert p1.pairs.cross_per_group > 0 and p1.persona_rm.require_better_than_chance
    g = p1.persona_grpo
    assert g.w_move > 0 and g.budget_penalty > 0 and g.format.l_max_from_card and g.beta > 0
    assert g.collapse_stop.enabled and g.fallback_share < 1 and g.mid_dialogue_share > 0
    # the phase 2 recipe reads phase 1's store, which must exist
    with pytest.raises(ConfigError, match="speakers.store runs/p1/adapters has no registry.json"):
        from mascot_training.collaborative.config import load as load2

        load2(P2)
    p2 = CollaborativeConfig.model_validate(yaml.safe_load(P2.read_text()))
    assert p2.model == "" and p2.data.situations == Path("runs/splits/train.jsonl") and p2.data.train_fraction == 1.0
    assert p2.director_grpo.max_steps >= 30 and p2.speakers.store == "runs/p1/adapters"
    assert p2.publish.store == "runs/p1/adapters"
    assert [j["kind"] for j in p2.phase2.group_reward.judge.judges] == ["metrics"]
    # R_group measured on the block (the group reward model was at chance on held-out pairs); the paper's I_div is
    # +1 for every valid suffix of 2 agent turns under the rest rule, the redefined one is the default
    assert p2.phase2.group_reward.source == "team" and p2.phase2.diversity == "new_persona"
    # GRPO starts from a persona-balanced warm start (every persona sampled, valid directives the rule) and the reward
    # pays for using the whole team
    assert p2.director.warm_start_steps > 0 and p2.director.warm_start_source == "personas"
    assert p2.phase2.balance > 0
    # both fit a 24 GB machine with the trainers' activations recomputed in the backward pass (docs/training.md)
    assert p1.persona_rm.gradient_checkpointing and p1.persona_grpo.gradient_checkpointing
    assert p2.phase2.group_reward.rm.gradient_checkpointing and p2.director_grpo.gradient_checkpointing


def test_the_serving_config_of_the_recipes_gates_promotion_on_the_gate_split(tmp_path, monkeypatch):
    from mascot.core.config import MascotConfig

    monkeypatch.chdir(tmp_path)
    data = yaml.safe_load((CONFIGS / "serve_trained_cpu.yaml").read_text())
    with pytest.raises(ValueError, match="promote_gate.situations runs/splits/gate.jsonl is not a file"):
        MascotConfig(**data)
    (tmp_path / "runs" / "splits").mkdir(parents=True)
    (tmp_path / "runs" / "splits" / "gate.jsonl").write_text("")
    cfg = MascotConfig(**data)
    p1 = yaml.safe_load(P1.read_text())
    # the store both recipes publish into, gated by the judge the config serves, at the speakers' reply budget
    assert cfg.adapters.store == "runs/p1/adapters" == yaml.safe_load(P2.read_text())["publish"]["store"]
    gate = cfg.adapters.promote_gate
    assert gate.enabled and gate.judge in {j.name for j in cfg.judge.judges} and gate.max_tokens == p1["sample"][
        "max_tokens"]
    assert [j.kind for j in cfg.judge.judges] == ["metrics"]


@pytest.mark.integration
@pytest.mark.slow
def test_both_recipes_run_at_a_smoke_size_on_the_real_model(tmp_path, shared_data, real_model_dir):
    from mascot.core.situations import load_situations, split_situations

    (tmp_path / ".cache").mkdir()  # the runs resolve the default model under ./.cache/models: the prepared one
    (tmp_path / ".cache" / "models").symlink_to(real_model_dir.parent, target_is_directory=True)

    situations = shared_data / "empathetic_dialogues" / "test_situations.jsonl"
    split_situations(situations, "support", tmp_path / "runs" / "splits", eval_n=100, gate_n=40)
    train_ids = {s.id for s in load_situations(tmp_path / "runs" / "splits" / "train.jsonl", "support")}
    personas = ["anchor", "catalyst"]

    # candidates go through serving's reply checks (one with no finished sentence within its budget is refused), so
    # they get room for a sentence
    cfg1 = _set(yaml.safe_load(P1.read_text()), personas=personas, data__limit=1, sample__k=3,
                sft_data__limit=1, sft_data__k_teacher=2, sft_data__k_plain=1, sft_data__max_tokens=32,
                sft_data__mid_dialogue_share=0.0, sft__max_steps=1, sft__batch_size=2,  # mid-dialogue: the tiny smoke
                # one situation may leave a persona without a compliant reply; per-persona SFT: the tiny smoke
                sft__per_persona=False,
                sample__max_tokens=32, pairs__delta=0.0, pairs__heldout_fraction=0.25, persona_rm__batch_size=4,
                persona_rm__epochs=1,
                persona_grpo__num_generations=2, persona_grpo__batch_size=2, persona_grpo__max_completion_length=12,
                persona_grpo__max_steps=1,
                publish__gate={"prompts": 2, "max_tokens": 12, "min_mean_words": 0.0, "min_distinct_2": 0.0,
                              "max_loop_rate": 1.0, "max_echo_rate": 1.0})
    (tmp_path / "p1.yaml").write_text(yaml.safe_dump(cfg1))
    p = _train(["persona-alignment", "--config", "p1.yaml", "--out", "runs/p1"], tmp_path)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    out1 = tmp_path / "runs" / "p1"
    lines = p.stderr.splitlines()
    assert any(x.startswith("persona_grpo anchor: step 1/1 (100%)") and "reward " in x for x in lines), lines
    assert not any(x.startswith("{'loss'") for x in lines)  # the trainer's own dict lines are gone
    # the SFT data on the real model: teacher and plain candidates, kept only when they do the card's moves
    sd = json.loads((out1 / "sft_data" / "manifest.json").read_text())
    assert sd["metrics"]["candidates"] == 3 * sd["metrics"]["contexts"] and set(sd["data_ids"]) <= train_ids
    pool = [json.loads(x) for x in (out1 / "sft_data" / "pool.jsonl").read_text().splitlines()]
    from mascot.core.moves import assess
    from mascot.core.personas import PersonaCatalog

    cards = PersonaCatalog.load()
    for g in pool:
        assert [c["prompt"] for c in g["candidates"]] == ["teacher", "teacher", "plain"]
        for c in g["candidates"]:
            if c["eligible"]:
                assert assess(cards.get(g["persona_id"]).moves, c["text"], g["user"]).compliant, c
    assert sd["metrics"]["rows"] == sum(sd["metrics"]["rows_by_persona"].values()) >= 1
    sample = json.loads((out1 / "sample" / "manifest.json").read_text())
    assert set(sample["data_ids"]) <= train_ids and len(sample["data_ids"]) == 1
    assert sample["config"]["guard"]["enabled"] and sample["metrics"]["attempts_per_candidate"] >= 1.0
    judge = json.loads((out1 / "judge" / "manifest.json").read_text())["metrics"]
    assert judge["judges"] == ["metrics"] and judge["unparseable"] == 0
    judged = [json.loads(x) for x in (out1 / "judge" / "judgements.jsonl").read_text().splitlines()]
    means = [m for j in judged for m in j["means"]]
    scored = [m for m in means if m is not None]  # a refused candidate is not judged
    assert len(means) == 6 and len(scored) == 6 - sample["metrics"]["refused"]
    assert len(set(scored)) > 1  # the metrics judge tells real replies apart
    assert json.loads((out1 / "pairs" / "manifest.json").read_text())["metrics"]["pairs"] > 0
    grpo = json.loads((out1 / "persona_grpo" / "manifest.json").read_text())["metrics"]
    # without a thinking mode the format reward is the verbosity ramp (1 for a short answer), not -1 for every reply
    assert all(grpo[p]["steps"] == 1 and grpo[p]["reward_first"] is not None for p in personas)
    assert (out1 / "persona_grpo" / "curves_anchor.png").is_file()
    registry = json.loads((out1 / "adapters" / "registry.json").read_text())
    assert set(registry["adapters"]) == set(personas)
    adapter = json.loads((out1 / "adapters" / "anchor" / "v1" / "manifest.json").read_text())
    assert Path(adapter["base_model"]).name == real_model_dir.name and set(adapter["data_ids"]) <= train_ids

    # replies go through serving's reply checks (a reply with no finished sentence within its budget is refused), so
    # the speakers get room for one sentence
    cfg2 = _set(yaml.safe_load(P2.read_text()), personas=personas, data__limit=1, speakers__max_tokens=32,
                user__max_tokens=16, phase2__num_generations=2, phase2__suffix_agent_turns=1,
                phase2__prefix_agent_turns=[0], phase2__group_reward__k=3,
                phase2__group_reward__pairs={"delta": 0.0, "max_per_group": 1, "heldout_fraction": 0.25},
                phase2__group_reward__rm={"epochs": 1, "batch_size": 2, "max_length": 768},
                director__max_tokens=48, director__warm_start_steps=1, director_grpo__batch_size=2,
                director_grpo__max_steps=1, director_grpo__distribution_samples=1,
                publish__gate__max_valid_rate_drop=1.0)  # one rollout per share at this size: the rate is noise
    (tmp_path / "p2.yaml").write_text(yaml.safe_dump(cfg2))
    p = _train(["collaborative", "--config", "p2.yaml", "--out", "runs/p2"], tmp_path)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    out2 = tmp_path / "runs" / "p2"
    speakers = json.loads((out2 / "speakers" / "manifest.json").read_text())
    assert {pid: a["source"] for pid, a in speakers["adapters"].items()} == {p: "store:v1" for p in personas}
    rollouts = json.loads((out2 / "rollouts" / "manifest.json").read_text())
    assert set(rollouts["data_ids"]) <= train_ids
    # the team reward needs no blocks and trains no group reward model
    assert rollouts["metrics"]["prefixes"] >= 1 and rollouts["metrics"]["blocks"] == 0
    assert rollouts["metrics"]["speaker_attempts_per_reply"] is None  # prefixes of 0 agent turns: no reply yet
    assert json.loads((out2 / "group_rm" / "manifest.json").read_text())["metrics"] == {"source": "team"}
    dg = json.loads((out2 / "director_grpo" / "manifest.json").read_text())
    assert dg["metrics"]["steps"] == 1 and set(dg["persona_distribution_after"]) >= {"invalid"}
    # the warm start drew a directive for each of the two personas of the one prefix, and trained on them
    warm = dg["metrics"]["warm_start"]
    assert warm["steps"] == 1 and warm["drawn"]["decisions"] == 2 and warm["rows"] == warm["drawn"]["rows"] >= 1
    recs = [json.loads(x) for x in (out2 / "director_grpo" / "rollouts.jsonl").read_text().splitlines()]
    assert all(0.0 <= r["r_group"] <= 1.0 for r in recs if r["r_group"] is not None)
    assert (out2 / "director_grpo" / "curves.png").is_file() or dg["metrics"]["reward_first"] is None
    assert any(x.startswith("director_grpo: step 1/1 (100%)") for x in p.stderr.splitlines())
    # the director is published into phase 1's store: one store holds everything to promote and serve
    served = json.loads((out1 / "adapters" / "registry.json").read_text())["adapters"]
    assert set(served) == {*personas, "director"} and served["director"]["versions"]["1"]["state"] == "staged"
    assert not (out2 / "adapters").exists()


def test_the_sft_only_recipe_validates_and_publishes_the_sft_adapter(tmp_path, monkeypatch):
    """training-jobs/configs/persona_sft_cpu.yaml: the measured SFT-only run (docs/evaluation.md)."""
    from mascot_training.persona.config import load, validate

    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs" / "splits").mkdir(parents=True)
    (tmp_path / "runs" / "splits" / "train.jsonl").write_text(json.dumps(
        {"id": "t1", "emotion": "sad", "situation": "My dog died.", "first_utterance": "I miss my dog."}) + "\n")
    cfg = load(CONFIGS / "persona_sft_cpu.yaml")
    assert cfg.sft_data.enabled and cfg.sft.enabled and not cfg.persona_grpo.enabled and validate(cfg) == []
    assert cfg.sft_data.require_moves and cfg.sft.per_persona and "gate_proj" in cfg.lora.target_modules
    # the same sft_data and sft settings as the whole recipe: the two runs share those stages
    p1 = load(P1)
    assert cfg.sft_data == p1.sft_data and cfg.sft == p1.sft and cfg.lora == p1.lora and cfg.data == p1.data
