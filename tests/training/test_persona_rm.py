"""Stage ``persona_rm`` with real TRL 1.16 on a tiny random Qwen3 (planted lexical-cue pairs: plumbing, not quality).

Chosen replies carry a cue sentence (single-token cue words "courage"/"together" in the tiny BPE vocabulary);
rejected replies carry a curt filler instead. The stage must learn it, score held-out pairs through the serving
scorer, write μ/σ, resume without retraining, and tokenize training samples exactly as the scorer does.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from mascot.core import formatting
from mascot.core.dialogue import HistoryTurn
from mascot.core.personas import PersonaCatalog

SUPPORT = ["empathetic_listener", "anchor", "catalyst", "action_guide", "beacon"]
USER_LINES = [
    "I feel so anxious about my exam tomorrow.",
    "My dog died last week and I miss him so much.",
    "I lost my job and I do not know what to do.",
    "My best friend moved away and the house feels empty.",
    "I have a job interview on Monday and I cannot sleep.",
    "My sister and I had a big fight yesterday.",
]
BASES = [
    "I'm here with you.",
    "That sounds really hard.",
    "Tell me more about what happened.",
    "What is one small step you could take today?",
    "Thank you for telling me this.",
]
CUES = ["You showed real courage.", "We will get through this together.", "That took courage.",
        "Let's plan the next step together."]
FILLERS = ["Okay.", "Moving on to the next item.", "State the facts only.", "Fine, whatever you say."]
CONTEXTS = [[], [["Listener", "The user has been stressed for weeks."]], [],
            [["Note", "Earlier the user mentioned a meeting."], ["Note", "They prefer short answers."]]]
EPOCHS, LR, BATCH, MAX_LENGTH = 2.0, 5e-3, 8, 512


def pair_record(i: int, split: str) -> dict:
    """One planted pair: the chosen reply has a cue sentence, the rejected one a filler; order varies."""
    persona = SUPPORT[i % len(SUPPORT)]
    base = BASES[(i // 2) % len(BASES)]
    cue, filler = CUES[(i // 3) % len(CUES)], FILLERS[(i // 5) % len(FILLERS)]
    chosen, rejected = ((f"{cue} {base}", f"{filler} {base}") if i % 2 else (f"{base} {cue}", f"{base} {filler}"))
    history = [{"role": "user", "persona_id": "", "text": USER_LINES[i % len(USER_LINES)]}]
    if i % 3 == 0:
        other = SUPPORT[(i + 1) % len(SUPPORT)]
        history += [{"role": "agent", "persona_id": other, "text": BASES[(i + 2) % len(BASES)]},
                    {"role": "user", "persona_id": "", "text": "Yes, that is it."}]
    return {"group_id": f"g{i}", "situation_id": f"{split}-sit-{i // 2:03d}", "persona_id": persona,
            "history": history, "context": CONTEXTS[i % len(CONTEXTS)], "chosen": chosen, "rejected": rejected,
            "margin": 1.0 + (i % 3) * 0.5, "split": split}


def write_pairs(out: Path, n_train: int = 64, n_heldout: int = 16) -> list[dict]:
    recs = [pair_record(i, "train") for i in range(n_train)]
    recs += [pair_record(1000 + i, "heldout") for i in range(n_heldout)]
    (out / "pairs").mkdir(parents=True, exist_ok=True)
    (out / "pairs" / "pairs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs), encoding="utf-8")
    return recs


def make_cfg(**rm):
    from mascot_training.persona.config import PersonaAlignmentConfig

    return PersonaAlignmentConfig(run_id="t1", sample={"seed": 0},
                                  persona_rm={"epochs": EPOCHS, "lr": LR, "batch_size": BATCH,
                                              "max_length": MAX_LENGTH, **rm})


@pytest.fixture(scope="module")
def trained(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    """The stage run once on 64 train / 16 held-out planted pairs: ``(cfg, out, records, manifest, seconds)``."""
    from mascot_training.persona.persona_rm import run

    out = tmp_path_factory.mktemp("rm_run")
    recs = write_pairs(out)
    cfg = make_cfg()
    t0 = time.perf_counter()
    manifest = run(cfg, out, base_model=str(tiny_model_dir))
    return cfg, out, recs, manifest, time.perf_counter() - t0


@pytest.mark.slow
def test_learns_planted_cue_and_writes_metadata(trained):
    _, out, recs, m, seconds = trained
    assert set(m["metrics"]) == {"rm_heldout_accuracy", "heldout_pairs", "train_pairs", "train_loss", "mu", "sigma",
                                 "heldout_interval", "heldout_by_kind"}
    assert m["rm_used_by_grpo"] and m["metrics"]["heldout_by_kind"]["within"]["pairs"] == m["metrics"]["heldout_pairs"]
    assert m["metrics"]["rm_heldout_accuracy"] >= 0.9, m["metrics"]
    assert m["rm_heldout_accuracy"] == m["metrics"]["rm_heldout_accuracy"]
    assert m["metrics"]["train_pairs"] == 64 and m["metrics"]["heldout_pairs"] == 16
    assert m["metrics"]["train_loss"] > 0
    assert m["data_ids"] == sorted({r["situation_id"] for r in recs})
    assert m["stage"] == "persona_rm" and m["config"]["epochs"] == EPOCHS
    model_dir = out / "persona_rm" / "model"
    assert not (out / "persona_rm.partial").exists() and not (out / "persona_rm" / "_trainer").exists()
    meta = json.loads((model_dir / "mascot_reward.json").read_text())
    assert meta["trained"] is True and meta["sigma"] > 0 and meta["name"] == "persona-rm-t1"
    assert meta["mu"] == pytest.approx(m["metrics"]["mu"]) and meta["sigma"] == pytest.approx(m["metrics"]["sigma"])
    assert meta["format_version"] == formatting.FORMAT_VERSION
    print(f"persona_rm stage: {seconds:.2f} s, metrics {m['metrics']}")


@pytest.mark.slow
def test_accuracy_recomputed_from_saved_model(trained):
    """Independent re-scoring (own model + tokenizer load, one text at a time, no padding) gives the same number."""
    import statistics

    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    _, out, recs, m, _ = trained
    model_dir = out / "persona_rm" / "model"
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForSequenceClassification.from_pretrained(model_dir, dtype=torch.float32).eval()
    catalog = PersonaCatalog.load()
    names = {pid: c.name for pid, c in catalog.cards.items()}

    def score(rec: dict, reply: str) -> float:
        hist = [HistoryTurn(h["role"], h["text"], h["persona_id"]) for h in rec["history"]]
        text, cut = formatting.reward_text(catalog.get(rec["persona_id"]), hist, reply,
                                           context=[tuple(c) for c in rec["context"]], names=names)
        assert not cut
        with torch.no_grad():
            ids = tok(formatting.with_eos(text, tok.eos_token), return_tensors="pt")
            return float(model(**ids).logits[0, 0])

    held = [r for r in recs if r["split"] == "heldout"]
    scores = [(score(r, r["chosen"]), score(r, r["rejected"])) for r in held]
    acc = sum(c > r for c, r in scores) / len(held)
    assert acc == m["metrics"]["rm_heldout_accuracy"]
    flat = [s for pair in scores for s in pair]
    assert statistics.fmean(flat) == pytest.approx(m["metrics"]["mu"], abs=1e-4)
    assert statistics.pstdev(flat) == pytest.approx(m["metrics"]["sigma"], rel=1e-3)


@pytest.mark.slow
def test_second_run_resumes_without_training(trained, tiny_model_dir, monkeypatch):
    import trl

    from mascot_training.persona.persona_rm import run

    cfg, out, _, m, _ = trained
    weights = next((out / "persona_rm" / "model").glob("*.safetensors"))
    mtime = weights.stat().st_mtime_ns

    def refuse(*_a, **_k):
        raise AssertionError("RewardTrainer must not be built on resume")

    monkeypatch.setattr(trl, "RewardTrainer", refuse)
    t0 = time.perf_counter()
    again = run(cfg, out, base_model=str(tiny_model_dir))
    assert time.perf_counter() - t0 < 5
    assert again == m
    assert again["timings"] == m["timings"]
    assert weights.stat().st_mtime_ns == mtime
    # gradient checkpointing changes a step's memory, not the model: a run resumed with it switched keeps the stage
    toggled = cfg.model_copy(update={"persona_rm": cfg.persona_rm.model_copy(update={"gradient_checkpointing": True})})
    assert run(toggled, out, base_model=str(tiny_model_dir)) == m


def test_missing_pairs_file_is_actionable(tmp_path, tiny_model_dir):
    from mascot_training.persona.persona_rm import run

    with pytest.raises(ValueError, match=r"pairs\.jsonl does not exist: run the 'pairs' stage first"):
        run(make_cfg(), tmp_path, base_model=str(tiny_model_dir))
    assert not (tmp_path / "persona_rm").exists() and not (tmp_path / "persona_rm.partial").exists()


def test_no_train_pairs_is_actionable(tmp_path, tiny_model_dir):
    from mascot_training.persona.persona_rm import run

    (tmp_path / "pairs").mkdir()
    (tmp_path / "pairs" / "pairs.jsonl").write_text(json.dumps(pair_record(1, "heldout")) + "\n")
    with pytest.raises(ValueError, match=r"no pair with split 'train'.*heldout_fraction"):
        run(make_cfg(), tmp_path, base_model=str(tiny_model_dir))


@pytest.mark.slow
def test_trl_tokenization_equals_scorer(trained, tmp_path):
    """TRL 1.16 RewardTrainer's own dataset preparation yields the ids RewardScorer feeds the model at serving time.

    Checked twice: for the stage's texts (already ending in EOS: TRL must not add a second one) and for the bare
    ``reward_text`` (TRL appends ``eos_token`` itself; ``formatting.with_eos`` must do the same).
    """
    import torch
    from datasets import Dataset
    from transformers import AutoModelForSequenceClassification, AutoTokenizer
    from trl import RewardConfig, RewardTrainer

    from mascot.reward.scorer import RewardScorer
    from mascot_training.persona.persona_rm import build_dataset, load_pairs

    _, out, recs, _, _ = trained
    model_dir = out / "persona_rm" / "model"
    catalog = PersonaCatalog.load()
    names = {pid: c.name for pid, c in catalog.cards.items()}
    pair = next(p for p in load_pairs(out / "pairs" / "pairs.jsonl", catalog) if p.context and len(p.history) > 1)
    tok = AutoTokenizer.from_pretrained(model_dir)
    staged, skipped = build_dataset([pair], tok, MAX_LENGTH, catalog)
    assert skipped == 0
    card = catalog.get(pair.persona_id)
    bare = [formatting.reward_text(card, pair.history, y, context=pair.context, names=names)[0]
            for y in (pair.chosen, pair.rejected)]
    raw = Dataset.from_dict({"chosen": [bare[0]], "rejected": [bare[1]]})

    scorer = RewardScorer(model_dir, max_length=MAX_LENGTH)
    served = [t for t, _ in scorer.build_inputs(card, pair.history, [pair.chosen, pair.rejected],
                                                context=pair.context, names=names)]
    assert [staged[0]["chosen"], staged[0]["rejected"]] == served
    # Exactly what RewardScorer.score_texts does to a batch, one row each.
    served_ids = [scorer.tokenizer([t], padding=True, truncation=True, max_length=MAX_LENGTH)["input_ids"][0]
                  for t in served]

    for ds in (staged, raw):
        model = AutoModelForSequenceClassification.from_pretrained(model_dir, dtype=torch.float32)
        args = RewardConfig(output_dir=str(tmp_path / "trl"), bf16=False, gradient_checkpointing=False,
                            use_cpu=True, report_to=[], save_strategy="no", max_length=MAX_LENGTH)
        trainer = RewardTrainer(model=model, args=args, train_dataset=ds,
                                processing_class=AutoTokenizer.from_pretrained(model_dir))
        row = trainer.train_dataset[0]
        assert [row["chosen_ids"], row["rejected_ids"]] == served_ids
        for ids in served_ids:
            assert ids[-1] == tok.eos_token_id and ids.count(tok.eos_token_id) == 1
        assert trainer.processing_class.pad_token == tok.pad_token == "<|pad|>"
        assert model.config.pad_token_id == tok.pad_token_id != tok.eos_token_id


def test_micro_batches_accumulate_to_the_configured_batch(tmp_path, tiny_model_dir):
    """``micro_batch_size`` lowers the pairs per pass, not the update: 16 pairs at batch 8 are 2 optimiser steps
    whether they pass 8 or 2 at a time; a micro batch that does not divide the batch is refused."""
    from pydantic import ValidationError

    from mascot_training.persona.persona_rm import run

    with pytest.raises(ValidationError, match="micro_batch_size 3 must divide batch_size 8"):
        make_cfg(micro_batch_size=3)
    write_pairs(tmp_path, n_train=16, n_heldout=4)
    run(make_cfg(epochs=1.0, micro_batch_size=2), tmp_path, base_model=str(tiny_model_dir))
    log = [json.loads(x) for x in (tmp_path / "persona_rm" / "curves.jsonl").read_text().splitlines()]
    assert [e["step"] for e in log if "loss" in e] == [1, 2]  # 8 passes of 2 pairs, 2 updates of 8


def test_gradient_checkpointing_is_switched_on_and_leaves_the_update_unchanged(tmp_path, tiny_model_dir,
                                                                                monkeypatch):
    """``gradient_checkpointing: true`` turns transformers' checkpointing on for the reward model's training, and
    recomputing activations in the backward pass changes neither loss nor gradient norm: the same pairs and seed
    give the same curve."""
    from transformers import PreTrainedModel

    from mascot_training.persona.persona_rm import run

    enabled = []
    real = PreTrainedModel.gradient_checkpointing_enable

    def spy(self, *a, **kw):
        enabled.append(type(self).__name__)
        return real(self, *a, **kw)

    monkeypatch.setattr(PreTrainedModel, "gradient_checkpointing_enable", spy)
    curves = {}
    for gc in (False, True):
        out = tmp_path / f"gc-{gc}"
        write_pairs(out, n_train=16, n_heldout=4)
        run(make_cfg(epochs=1.0, gradient_checkpointing=gc), out, base_model=str(tiny_model_dir))
        # the loss of step 2 and the gradient norm of every step depend on the backward pass
        curves[gc] = [(e["loss"], e["grad_norm"]) for e in map(json.loads, (out / "persona_rm" / "curves.jsonl")
                                                                .read_text().splitlines()) if "loss" in e]
        assert bool(enabled) is gc, enabled
    assert len(curves[True]) == 2 and all(g > 0 for _, g in curves[True])
    assert [x for pair in curves[True] for x in pair] == pytest.approx([x for pair in curves[False] for x in pair],
                                                                       rel=1e-4, abs=1e-5)
