"""Stage ``persona_grpo`` with real TRL 1.16 GRPO + PEFT LoRA on a tiny random Qwen3.

The learning test plants a reward (+1 per occurrence of a target string in the visible answer, given as ``rm_fn``
so it runs through the stage's reward code path). The tiny model's embeddings (std 0.02, tied) cap every logit at
about ±1.3, which no q/k/v/o LoRA can change; the learning test therefore scales the base model's embeddings ×8 so
its output distribution is as peaked as a trained LM's (entropy about 1.4 nats) and a LoRA can move it.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from mascot.core.dialogue import HistoryTurn
from mascot.core.metrics import Metrics
from mascot.core.personas import PersonaCatalog
from mascot_training.common.config import LoraConfig
from mascot_training.common.rewards import format_reward
from mascot_training.persona import persona_grpo as pg
from mascot_training.persona.config import GrpoConfig, PersonaAlignmentConfig
from tests.helpers.paths import ROOT

STEPS, SEED = 14, 0  # seeds 0-4 at 12 steps all learned (last-3 mean 4.8-6.8 vs first-3 -1.0-1.6)
USER_LINES = ["I feel so anxious about my exam tomorrow.", "My dog died last week.", "I got promoted!",
              "Someone stole my bike this morning."]
HELD_OUT_LINES = ["My sister is moving abroad next month.", "I lost my wallet on the train."]


@pytest.fixture(scope="module")
def catalog() -> PersonaCatalog:
    return PersonaCatalog.load()


@pytest.fixture(scope="module")
def tiny_rm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from mascot.reward.scorer import build_tiny_reward_model

    return build_tiny_reward_model(tmp_path_factory.mktemp("grpo-rm") / "rm")


def rows_for(catalog: PersonaCatalog, pid: str) -> list[dict]:
    """Serving prompts: a user line, sometimes another agent's turn and a seed context."""
    card, names = catalog.get(pid), {c.id: c.name for c in catalog.in_set("support")}
    rows = []
    for i, line in enumerate(USER_LINES):
        hist = [HistoryTurn("user", line)]
        if i % 2:
            hist += [HistoryTurn("agent", "That sounds hard.", "beacon"), HistoryTurn("user", "Yes, it is.")]
        ctx = [("Note", "The user has been stressed for weeks.")] if i == 3 else []
        rows.append(pg.prompt_row(card, hist, ctx, names, group_id=f"{pid}-g{i}"))
    return rows


def call(f, texts: list[str], pid: str = "anchor", history=None, context=None) -> list[float | None]:
    """Call a reward function the way TRL 1.16 does (conversational completions, extra kwargs)."""
    n = len(texts)
    hist = history if history is not None else [{"role": "user", "text": USER_LINES[0], "persona_id": ""}]
    return f(prompts=[[{"role": "user", "content": "x"}]] * n,
             completions=[[{"role": "assistant", "content": t}] for t in texts], completion_ids=[[1]] * n,
             persona_id=[pid] * n, history=[hist] * n, context=[context or []] * n, group_id=["g"] * n,
             trainer_state=None, log_extra=None, log_metric=None)


TEXTS = ["<think>plan</think> I'm here with you.", "no think block at all", "<think>x</think> " + "word " * 100,
         "<think></think> empty think"]


def test_prompt_row_is_the_serving_prompt(catalog: PersonaCatalog) -> None:
    from mascot.core.dialogue import FALLBACK_ACTION
    from mascot.speaker.prompts import build_persona_messages

    card = catalog.get("anchor")
    hist = [HistoryTurn("user", "hi"), HistoryTurn("agent", "hello", "beacon")]
    row = pg.prompt_row(card, hist, [("A", "b")], {"beacon": "The Beacon"}, group_id="g1")
    assert row["prompt"] == build_persona_messages(card, hist, [("A", "b")], FALLBACK_ACTION, card.default_tone,
                                                   {"beacon": "The Beacon", "anchor": card.name})
    assert row["history"][1] == {"role": "agent", "text": "hello", "persona_id": "beacon"}
    assert row["context"] == [["A", "b"]] and row["persona_id"] == "anchor" and row["group_id"] == "g1"


def test_composite_with_planted_rm_scores(catalog: PersonaCatalog) -> None:
    g = GrpoConfig(w_rm=2.0, w_format=0.5)
    seen: list[str] = []
    z = [0.5, -1.0, 3.0, 0.0]

    def rm(texts):
        seen.extend(texts)
        return z

    out = call(pg.make_reward_func(None, catalog, g, rm_fn=rm), TEXTS)
    assert out == pytest.approx([2.0 * zi + 0.5 * format_reward(t) for zi, t in zip(z, TEXTS)])
    assert out[0] == pytest.approx(2.0 * 0.5 + 0.5 * 1.0) and out[1] == pytest.approx(-2.0 - 0.5)
    # the RM sees card + history + the visible answer only, never the think block
    assert all("<think>" not in s and "</think>" not in s for s in seen)
    assert seen[0].startswith("[Persona] The Anchor") and seen[0].endswith("[Reply by The Anchor]\nI'm here with you.")
    # no RM at all: format reward only
    assert call(pg.make_reward_func(None, catalog, g), TEXTS) == pytest.approx([0.5 * format_reward(t) for t in TEXTS])


@pytest.mark.parametrize("bad, reason", [(None, "none"), (math.nan, "nan"), (math.inf, "nan")])
def test_bad_rm_scores_are_masked_and_counted(catalog: PersonaCatalog, bad, reason: str) -> None:
    m = Metrics()
    f = pg.make_reward_func(None, catalog, GrpoConfig(), metrics=m, rm_fn=lambda t: [1.0, bad, bad, 0.0])
    out = call(f, TEXTS)
    assert out[1] is None and out[2] is None and out[0] == pytest.approx(2.0) and out[3] == pytest.approx(-1.0)
    assert m.registry.get_sample_value("mascot_reward_failures_total", {"reason": reason}) == 2.0
    assert f.failures == {reason: 2}


def test_rm_timeout_masks_the_batch(catalog: PersonaCatalog) -> None:
    m, release = Metrics(), threading.Event()
    f = pg.make_reward_func(None, catalog, GrpoConfig(reward_timeout_s=0.05), metrics=m,
                            rm_fn=lambda t: [0.0] * len(t) if release.wait(30) else [])
    try:
        assert call(f, TEXTS) == [None] * 4
    finally:
        release.set()
    assert m.registry.get_sample_value("mascot_reward_failures_total", {"reason": "timeout"}) == 4.0


def test_real_scorer_scores_the_visible_answer(catalog: PersonaCatalog, tiny_rm: Path) -> None:
    from mascot.reward.scorer import RewardScorer

    scorer = RewardScorer(tiny_rm, max_length=512)
    card, hist = catalog.get("catalyst"), [HistoryTurn("user", USER_LINES[1])]
    ctx = [("Note", "weeks of stress")]
    out = call(pg.make_reward_func(scorer, catalog, GrpoConfig()), TEXTS[:2], pid="catalyst",
               history=[{"role": "user", "text": USER_LINES[1], "persona_id": ""}], context=[list(c) for c in ctx])
    names = {c.id: c.name for c in catalog.cards.values()}
    for o, answer, t in zip(out, ["I'm here with you.", "no think block at all"], TEXTS[:2]):
        text = scorer.build_inputs(card, hist, [answer], ctx, names)[0][0]
        assert o == pytest.approx(scorer.standardize(scorer.score_texts([text])[0]) + format_reward(t), abs=1e-4)


@pytest.fixture(scope="module")
def peaked_base(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model with embeddings ×8 (tied): a peaked output distribution a LoRA can move."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = tmp_path_factory.mktemp("peaked") / "model"
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    with torch.no_grad():
        model.get_input_embeddings().weight.mul_(8.0)
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(tiny_model_dir).save_pretrained(out)
    return out


def pick_targets(model_dir: Path, prompts: list[list[dict]], k: int = 3) -> list[str]:
    """The k most likely word-like tokens (≥ 3 letters) under the base model's sampling (top_k 0, as TRL)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok, model = AutoTokenizer.from_pretrained(model_dir), AutoModelForCausalLM.from_pretrained(model_dir)
    avg = 0
    for p in prompts:
        enc = tok.apply_chat_template(p, add_generation_prompt=True, return_tensors="pt", return_dict=True)
        torch.manual_seed(0)
        seq = model.generate(**enc, do_sample=True, max_new_tokens=8, num_return_sequences=8, top_k=0, top_p=1.0)
        with torch.no_grad():
            avg = avg + model(seq).logits[:, enc["input_ids"].shape[1] - 1:-1].softmax(-1).mean((0, 1))
    words = [s for s in (tok.decode([i]).strip() for i in avg.argsort(descending=True).tolist())
             if len(s) >= 3 and s.isalpha()]
    return list(dict.fromkeys(words))[:k]


@pytest.mark.slow
def test_grpo_learns_a_planted_reward(catalog: PersonaCatalog, peaked_base: Path, tmp_path: Path) -> None:
    rows = [{"prompt": [{"role": "user", "content": m}], "persona_id": "anchor",
             "history": [{"role": "user", "text": m, "persona_id": ""}], "context": []} for m in USER_LINES] * 16
    targets = pick_targets(peaked_base, [r["prompt"] for r in rows[:4]])
    g = GrpoConfig(num_generations=8, batch_size=16, lr=2e-2, max_completion_length=8, max_steps=STEPS,
                   seed=SEED)

    def planted(texts: list[str]) -> list[float]:  # +1 per target occurrence in the reply (the text's last part)
        return [float(sum(t.rsplit("]\n", 1)[-1].count(w) for w in targets)) for t in texts]

    f = pg.make_reward_func(None, catalog, g, rm_fn=planted)
    # prompts GRPO never sees: the reward measured on them before and after training (same seeds both times)
    held = [{"prompt": [{"role": "user", "content": m}], "persona_id": "anchor",
             "history": [{"role": "user", "text": m, "persona_id": ""}], "context": []} for m in HELD_OUT_LINES]
    trainer, m = pg.train_persona(str(peaked_base), rows, f, g.model_copy(update={"heldout_samples": 8}),
                                  LoraConfig(), tmp_path, heldout=held,
                                  heldout_func=pg.make_reward_func(None, catalog, g, rm_fn=planted))
    r = [e["reward"] for e in trainer.state.log_history if "reward" in e]
    first, last = sum(r[:3]) / 3, sum(r[-3:]) / 3
    before, after = m["heldout_before"], m["heldout_after"]
    print(f"targets {targets}: rewards {[round(x, 2) for x in r]}; first-3 {first:.2f}, last-3 {last:.2f}; "
          f"held-out {before} -> {after}")
    assert m["steps"] == STEPS and len(r) == STEPS and not f.failures
    assert last >= first + 2.0, (targets, r)  # max is 8 (completions of 8 tokens) minus the format reward's 1
    assert m["heldout_prompts"] == 2 and before["completions"] == after["completions"] == 16
    assert before["scored"] == after["scored"] == 16
    assert after["reward"] >= before["reward"] + 1.0, (before, after)  # it generalises to unseen prompts


def test_heldout_prompts_are_the_groups_the_reward_model_never_trained_on(catalog: PersonaCatalog) -> None:
    from mascot_training.common.data import in_heldout_split

    rows = [dict(r, group_id=f"sit-{i}|anchor") for i, r in enumerate(rows_for(catalog, "anchor") * 10)]
    train, held = pg.split_heldout(rows, 0.25)
    assert len(train) + len(held) == 40 and 4 <= len(held) <= 18  # about a quarter (a fixed hash)
    assert all(in_heldout_split(r["group_id"], 0.25) for r in held)
    assert not any(in_heldout_split(r["group_id"], 0.25) for r in train)
    assert pg.split_heldout(rows, 0.0) == (rows, []) and pg.split_heldout(rows, 1.0) == ([], rows)
    no_id = [dict(r, group_id="") for r in rows[:3]]
    assert pg.split_heldout(no_id, 1.0) == (no_id, [])  # a row without a group id always trains


def test_heldout_summary_averages_personas_measured_both_times() -> None:
    m = {"anchor": {"heldout_before": {"reward": 0.5}, "heldout_after": {"reward": 1.0}},
         "beacon": {"heldout_before": {"reward": -0.5}, "heldout_after": {"reward": 0.25}},
         "catalyst": {"heldout_before": None, "heldout_after": None},
         "action_guide": {"steps": 3}}
    none = {"heldout_refused_before": None, "heldout_refused_after": None, "heldout_completions": 0}
    assert pg.heldout_summary(m) == {"heldout_reward_before": 0.0, "heldout_reward_after": 0.625,
                                     "heldout_personas": ["anchor", "beacon"], **none}
    assert pg.heldout_summary({"catalyst": m["catalyst"]}) == {
        "heldout_reward_before": None, "heldout_reward_after": None, "heldout_personas": [], **none}


def test_heldout_reward_scores_seeded_samples(catalog: PersonaCatalog, tiny_model_dir: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok, model = AutoTokenizer.from_pretrained(tiny_model_dir), AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    g = GrpoConfig(max_completion_length=6, format={"think": False, "l_max": 60})
    rows = rows_for(catalog, "anchor")[:2]
    seen: list[str] = []

    def rm(texts: list[str]) -> list[float | None]:  # planted: the reply's length in characters, one masked
        seen.extend(texts)
        return [None if i == 0 else float(len(t.rsplit("]\n", 1)[-1])) for i, t in enumerate(texts)]

    f = pg.make_reward_func(None, catalog, g, rm_fn=rm)
    texts = pg.sample_completions(model, tok, rows, g, 3, seed=7)
    assert [len(t) for t in texts] == [3, 3] and texts == pg.sample_completions(model, tok, rows, g, 3, seed=7)
    assert texts != pg.sample_completions(model, tok, rows, g, 3, seed=8)
    seen.clear()
    model.train()  # a trainer's model: generation switches to eval mode and back
    out = pg.heldout_reward(model, tok, rows, f, g, 3, seed=7)
    flat = [t for ts in texts for t in ts]
    want = [len(t.strip()) + format_reward(t, l_max=60, think=False) for t in flat[1:]]
    assert out["completions"] == 6 and out["scored"] == 5  # the masked score is left out, not counted as 0
    assert out["reward"] == pytest.approx(sum(want) / 5, abs=1e-4)
    assert out["format"] == pytest.approx(sum(format_reward(t, l_max=60, think=False) for t in flat) / 6, abs=1e-4)
    assert len(seen) == 6 and model.training is True
    assert pg.heldout_reward(model, tok, [], f, g, 3, seed=7) is None
    # measuring leaves the global RNG where it was: training samples the same with or without the measure
    import torch

    torch.manual_seed(5)
    want = torch.rand(3)
    torch.manual_seed(5)
    pg.heldout_reward(model, tok, rows, f, g, 2, seed=7)
    assert torch.equal(torch.rand(3), want)


@pytest.mark.slow
def test_all_none_rewards_give_zero_advantage_not_nan(catalog: PersonaCatalog, tiny_model_dir: Path,
                                                      tmp_path: Path) -> None:
    """TRL 1.16 turns None into NaN, zeroes NaN advantages: a fully masked batch leaves the LoRA untouched."""
    import torch

    rows = rows_for(catalog, "anchor")
    g = GrpoConfig(num_generations=2, batch_size=4, max_completion_length=4, max_steps=1, lr=1e-2)
    m = Metrics()
    f = pg.make_reward_func(None, catalog, g, metrics=m, rm_fn=lambda t: [None] * len(t))
    trainer, _ = pg.train_persona(str(tiny_model_dir), rows, f, g, LoraConfig(), tmp_path)
    assert math.isfinite(trainer.state.log_history[0]["loss"])
    b = [p for n, p in trainer.model.named_parameters() if "lora_B" in n]
    assert b and all(torch.count_nonzero(p) == 0 for p in b)
    assert m.registry.get_sample_value("mascot_reward_failures_total", {"reason": "none"}) == 4.0


@pytest.mark.slow
def test_stage_writes_lora_adapters_and_resumes(catalog: PersonaCatalog, tiny_model_dir: Path, tiny_rm: Path,
                                                tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import torch
    from peft import PeftModel
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM

    cfg = PersonaAlignmentConfig(persona_grpo={"num_generations": 2, "batch_size": 4, "max_completion_length": 8,
                                               "max_steps": 2}, guard={"enabled": False})
    personas = ["anchor", "catalyst"]
    prompts = {p: rows_for(catalog, p) for p in personas}
    calls, real = [], pg.train_persona

    def spy(base, rows, *a, **k):
        calls.append(rows[0]["persona_id"])
        if calls == ["anchor", "catalyst"]:
            raise RuntimeError("planted crash")
        return real(base, rows, *a, **k)

    monkeypatch.setattr(pg, "train_persona", spy)
    kw = dict(base_model=str(tiny_model_dir), rm_dir=str(tiny_rm), personas=personas, prompts=prompts)
    with pytest.raises(RuntimeError, match="planted crash"):
        pg.run(cfg, tmp_path, **kw)
    assert (tmp_path / "persona_grpo.partial" / "anchor" / pg.DONE_MARKER).is_file()
    assert not (tmp_path / "persona_grpo").exists()

    man = pg.run(cfg, tmp_path, metrics=Metrics(), **kw)
    assert calls == ["anchor", "catalyst", "catalyst"]  # anchor was complete in the partial dir
    for p in personas:
        m = man["metrics"][p]
        assert m["steps"] == 2 and m["reward_failures"] == {} and m["seconds"] > 0
        assert math.isfinite(m["reward_first"]) and math.isfinite(m["reward_last"])
    assert len(man["data_ids"]) == 8 and man["inputs"]["rm"] and man["config"]["lora"]["r"] == 16

    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    ids = torch.tensor([[5, 17, 42, 99, 7]])
    with torch.no_grad():
        ref = base(ids).logits
    for p in personas:
        d = tmp_path / "persona_grpo" / p
        conf = json.loads((d / "adapter_config.json").read_text())
        assert conf["modules_to_save"] is None and set(conf["target_modules"]) == {"q_proj", "k_proj", "v_proj",
                                                                                   "o_proj"}
        assert conf["r"] == 16 and conf["lora_alpha"] == 32
        with safe_open(str(d / "adapter_model.safetensors"), "pt") as fh:
            keys = list(fh.keys())
            assert keys and all("lora_" in k for k in keys)
            assert any(torch.count_nonzero(fh.get_tensor(k)) for k in keys if "lora_B" in k)  # it trained
        model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model_dir), d)
        with torch.no_grad():
            change = (model(ids).logits - ref).abs().max().item()
        print(p, "max |logit change| after 2 steps at lr 1e-5:", change)
        assert change > 0

    stamp = (tmp_path / "persona_grpo" / "manifest.json").stat().st_mtime_ns
    assert pg.run(cfg, tmp_path, **kw) == man  # resume: a no-op
    assert calls == ["anchor", "catalyst", "catalyst"]
    assert (tmp_path / "persona_grpo" / "manifest.json").stat().st_mtime_ns == stamp


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.serial
def test_grpo_step_bench_prints_ratio(tiny_model_dir: Path) -> None:
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "grpo_step.py"), "--size", "small", "--model",
                          str(tiny_model_dir)], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "ratio ours / bare TRL = " in out.stdout
    assert "goal met" in out.stdout or "goal missed" in out.stdout
