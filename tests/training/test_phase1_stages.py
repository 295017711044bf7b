"""Phase 1 sample → judge → pairs stages on the tiny model, and resumption."""

from __future__ import annotations

import json

import pytest

from mascot_training.common.data import in_train_split
from mascot.core.files import read_jsonl
from mascot_training.common.manifest import read_manifest
from mascot_training.persona.config import PersonaAlignmentConfig
from mascot_training.persona.pipeline import run

pytestmark = pytest.mark.integration


@pytest.fixture
def cfg(tiny_model_dir, shared_data):
    return PersonaAlignmentConfig(
        model=str(tiny_model_dir), personas=["anchor"], max_model_len=2048,
        data={"situations": shared_data / "empathetic_dialogues" / "test_situations.jsonl", "limit": 2},
        sample={"k": 3, "max_tokens": 16}, pairs={"delta": 0.0},
        guard={"enabled": False})  # random text never ends a sentence: the reply checks would refuse all of it


def test_sample_judge_pairs_and_resume(cfg, tmp_path):
    out = tmp_path / "run"
    res = run(cfg, out, ("sample", "judge", "pairs"), log=lambda m: None)
    groups = read_jsonl(out / "sample" / "candidates.jsonl")
    assert len(groups) == 2 and all(len(g["candidates"]) == 3 for g in groups)
    ids = res["sample"]["data_ids"]
    assert len(ids) == 2 and all(in_train_split(i, cfg.data.train_fraction, cfg.data.salt) for i in ids)
    judged = read_jsonl(out / "judge" / "judgements.jsonl")
    assert [j["group_id"] for j in judged] == [g["group_id"] for g in groups]
    for j in judged:
        for s, m in zip(j["scores"], j["means"]):
            assert s is None or (set(s) == {"emotional_expressiveness", "empathetic_support_quality",
                                            "persona_consistency", "response_relevance", "social_contribution"}
                                 and m == pytest.approx(sum(s.values()) / 5))
    pairs = read_jsonl(out / "pairs" / "pairs.jsonl")
    assert pairs and {p["split"] for p in pairs} <= {"train", "heldout"}
    assert res["pairs"]["metrics"]["pairs"] == len(pairs)
    before = {s: read_manifest(out / s)["timings"] for s in ("sample", "judge", "pairs")}
    again = run(cfg, out, ("sample", "judge", "pairs"), log=lambda m: None)
    assert {s: again[s]["timings"] for s in before} == before          # resumed: nothing ran again
    changed = cfg.model_copy(update={"pairs": cfg.pairs.model_copy(update={"max_per_group": 1})})
    third = run(changed, out, ("pairs",), log=lambda m: None)
    assert third["pairs"]["config"]["pairs"]["max_per_group"] == 1 and third["pairs"]["metrics"]["pairs"] <= 2


def test_judge_needs_sample(cfg, tmp_path):
    with pytest.raises(ValueError, match="run the sample stage first"):
        run(cfg, tmp_path / "empty", ("judge",), log=lambda m: None)
    with pytest.raises(ValueError, match="run the sample and judge stages first"):
        run(cfg, tmp_path / "empty", ("pairs",), log=lambda m: None)
    assert not (tmp_path / "empty" / "judge").exists()
    json.dumps(cfg.model_dump(mode="json"))


def test_sample_concurrency_keeps_every_group_once_in_plan_order(cfg, tmp_path):
    from mascot_training.persona.sample_candidates import groups as plan

    wide = cfg.model_copy(update={"personas": ["anchor", "catalyst"],
                                  "sample": cfg.sample.model_copy(update={"concurrency": 3})})
    res = run(wide, tmp_path / "run", ("sample",), log=lambda m: None)
    rows = read_jsonl(tmp_path / "run" / "sample" / "candidates.jsonl")
    assert [r["group_id"] for r in rows] == [g["group_id"] for g in plan(wide)] and len(rows) == 4
    assert all(len(r["candidates"]) == 3 for r in rows) and res["sample"]["metrics"]["groups"] == 4
