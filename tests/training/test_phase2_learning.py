"""Director GRPO learns: a planted group reward that favours persona X raises X's share of the director's
choices, through the real stage code (TRL GRPOTrainer + rollout_func, frozen speakers on the engine).

The random tiny model never writes a valid directive, so the test first gives it the format: its embeddings are
scaled ×8 (the tiny model's logits are otherwise capped near ±1.3) and it is fine-tuned (TRL SFTTrainer, full
weights) on directives naming a uniformly random persona. That base writes a valid directive most of the time,
naming every persona; GRPO then trains a fresh director LoRA on it with R_group = 1 when X speaks, else 0.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from mascot.core.dialogue import HistoryTurn
from mascot.core.personas import PersonaCatalog
from mascot.director.prompts import build_messages

pytestmark = [pytest.mark.integration, pytest.mark.slow]

CAT = PersonaCatalog.load()
ROSTER = [CAT.get(i) for i in ("anchor", "catalyst", "beacon")]
OPENINGS = ["I failed my exam and feel terrible.", "My dog died last week.", "I got the job I wanted!",
            "Nobody at work listens to my ideas.", "I moved to a new city and know no one.",
            "My best friend forgot my birthday.", "I keep putting off a difficult call.",
            "I finally finished my project."]
HELD_OUT = ["My brother stopped talking to me.", "I passed my driving test today!",
            "I can't sleep before my interview."]
SFT_STEPS = 120


@pytest.fixture(scope="module")
def director_base(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("director-base")
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    with torch.no_grad():
        model.get_input_embeddings().weight.mul_(8.0)
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    rng = random.Random(0)
    rows = []
    for i in range(96):
        c = rng.choice(ROSTER)
        rows.append({"prompt": build_messages(ROSTER, [HistoryTurn("user", rng.choice(OPENINGS))], [], 2),
                     "completion": [{"role": "assistant",
                                     "content": f"Agent: {c.name}\nAction: Respond to the user.\nTone: Warm"}]})
    args = SFTConfig(output_dir=str(out / "trainer"), max_steps=SFT_STEPS, learning_rate=2e-3,
                     per_device_train_batch_size=8, logging_steps=40, save_strategy="no", report_to=[], use_cpu=True,
                     bf16=False, disable_tqdm=True, seed=0)
    trainer = SFTTrainer(model=model, args=args, train_dataset=Dataset.from_list(rows), processing_class=tok)
    trainer.train()
    trainer.model.save_pretrained(out / "model")
    tok.save_pretrained(out / "model")
    return out / "model"


def test_planted_group_reward_raises_the_favoured_personas_share(director_base: Path, tmp_path: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from mascot.core.engine.transformers import TransformersEngine
    from mascot_training.collaborative.config import CollaborativeConfig
    from mascot_training.collaborative.director_grpo import LoopThread, persona_distribution, train_director
    from mascot_training.collaborative.simulate import PolicyDirector, Prefix, RolloutRunner, RolloutSettings

    torch.set_num_threads(1)
    tok = AutoTokenizer.from_pretrained(director_base)
    prefixes = {f"p{i}": Prefix(f"p{i}", f"s{i}", o, "sad", 0, [HistoryTurn("user", o)])
                for i, o in enumerate(OPENINGS)}
    held = [Prefix(f"h{i}", f"t{i}", o, "sad", 0, [HistoryTurn("user", o)]) for i, o in enumerate(HELD_OUT)]
    cfg = CollaborativeConfig(
        model=str(director_base), personas=[c.id for c in ROSTER],
        phase2={"num_generations": 8, "suffix_agent_turns": 1, "user_speak_prob": 0.0, "eta": 0.0,
                "min_distinct": 1},
        director={"max_tokens": 24, "decoding": {"temperature": 1.0, "top_p": 1.0}},
        # 28 steps: with the Tone grammar branching on the persona, 16 raised the target by 0.08 only (0.35 -> 0.43);
        # a higher rate (4.5e-3, 6e-3) collapsed the policy to invalid directives
        director_grpo={"batch_size": 16, "lr": 3e-3, "max_steps": 28, "distribution_samples": 12, "seed": 0,
                       "heldout_samples": 12})
    loop = LoopThread()
    engine = TransformersEngine(str(director_base), max_model_len=2048, batch_wait_ms=2)
    loop.call(engine.start())
    try:
        runner = RolloutRunner(engine, tok, ROSTER, RolloutSettings(suffix_agent_turns=1, user_speak_prob=0.0,
                                                                    max_consecutive_turns=2, speaker_max_tokens=2))
        base = PolicyDirector(AutoModelForCausalLM.from_pretrained(director_base), tok, max_tokens=24,
                              temperature=1.0, top_p=1.0)
        start = persona_distribution(runner, base, list(prefixes.values()), 12, seed=99)
        # favour the persona the base names least often (but at all): the hardest one to raise
        target = min((c.id for c in ROSTER if start[c.id] >= 0.03), key=lambda p: start[p])

        def planted(items):
            return [1.0 if any(t.persona_id == target for t in block if t.role == "agent") else 0.0
                    for _prefix, block in items]

        _, m = train_director(str(director_base), prefixes, runner, loop, planted, cfg, tmp_path, heldout=held)
    finally:
        loop.call(engine.close())
        loop.close()
    before, after = m["persona_distribution_before"], m["persona_distribution_after"]
    print(f"target {target}: before {before} after {after}; reward {m['reward_first']} -> {m['reward_last']}")
    assert m["steps"] == 28 and m["rollouts"].get("complete", 0) > 0
    assert before["invalid"] < 0.5, "the warm base should mostly write valid directives"
    assert after[target] >= before[target] + 0.2, (target, before, after)
    # the prefixes hold no agent turn, so every suffix brings in a persona not heard yet (phase2.diversity new_persona)
    assert m["group_reward_mean"] is not None and m["i_div_mean"] == 1.0
    # on openings GRPO never trained on, the same seeds before and after: the favoured persona speaks more often
    hb, ha = m["heldout_before"], m["heldout_after"]
    print(f"held-out: before {hb} after {ha}")
    assert m["heldout_prefixes"] == 3 and sum(hb["rollouts"].values()) == sum(ha["rollouts"].values()) == 36
    assert ha["group_reward"] >= hb["group_reward"] + 0.15, (hb, ha)


def test_warm_start_clones_the_serving_director(tiny_model_dir: Path, tmp_path: Path) -> None:
    """director.warm_start_steps: SFT of a fresh director LoRA on serving decisions lowers its loss on them and
    saves a LoRA-only adapter on the base. (On the tiny model that is all it can show: even with scaled embeddings a
    q/k/v/o LoRA of a 64-wide, 2-layer model needs far more steps to write valid directives at temperature 0.7,
    about 4 in 10 after 150 steps with one fixed tone; the GRPO learning test above warms its base up instead.)"""
    import torch
    from safetensors import safe_open

    from mascot_training.collaborative.config import CollaborativeConfig
    from mascot_training.collaborative.director_warm_start import warm_start

    torch.set_num_threads(1)
    rng = random.Random(1)
    rows = [{"prompt": build_messages(ROSTER, [HistoryTurn("user", rng.choice(OPENINGS))], [], 2),
             "completion": [{"role": "assistant", "content": f"Agent: {c.name}\nAction: Respond to the user.\n"
                             f"Tone: {c.default_tone}"}]} for c in (rng.choice(ROSTER) for _ in range(32))]
    cfg = CollaborativeConfig(model=str(tiny_model_dir), lora={"r": 8, "alpha": 16},
                              director={"warm_start_steps": 12, "warm_start_lr": 1e-2})
    m = warm_start(str(tiny_model_dir), rows, cfg, tmp_path / "warm")
    assert m["steps"] == 12 and m["rows"] == 32
    assert m["loss_last"] < m["loss_first"] - 0.5, m
    conf = (tmp_path / "warm" / "adapter_config.json").read_text()
    assert str(tiny_model_dir) in conf and '"r": 8' in conf
    with safe_open(str(tmp_path / "warm" / "adapter_model.safetensors"), "pt") as f:
        assert all("lora_" in k for k in f.keys())
