"""Phase 1 pure logic: pair filtering, reward functions, config validation, id split, manifests."""

from __future__ import annotations

import json
import math

import pytest
import yaml

from mascot_training.common.config import ConfigError
from mascot_training.common.data import in_train_split
from mascot.core.files import read_jsonl
from mascot_training.common.manifest import digest_obj, is_done, read_manifest, stage_dir
from mascot_training.common.preference_pairs import build_pairs
from mascot_training.common.rewards import composite_reward, format_reward, split_think
from mascot_training.persona.config import PersonaAlignmentConfig, load, validate


def test_pairs_keep_margin_cap_and_order():
    cands = ["a", "b", "c", "d", "e"]
    means = [4.6, 4.0, 3.9, 2.0, None]
    pairs, dropped = build_pairs(cands, means, delta=0.5, max_per_group=4)
    # Qualifying: (0,1) .6, (0,2) .7, (0,3) 2.6, (1,3) 2.0, (2,3) 1.9; largest margin first, capped at 4.
    assert pairs == [(0, 3, 2.6), (1, 3, 2.0), (2, 3, 1.9), (0, 2, 0.7)]
    assert dropped == {"unjudged": 1, "identical": 0, "over_cap": 1}


def test_pairs_below_delta_identical_text_and_ties():
    pairs, dropped = build_pairs(["x", "x", "y"], [5.0, 3.0, 4.8], delta=0.5, max_per_group=4)
    assert pairs == [(2, 1, 1.8)] and dropped["identical"] == 1   # (0,1) is the same text; (0,2) is 0.2 < delta
    assert build_pairs(["p", "q"], [3.0, 3.0], delta=0.5, max_per_group=4)[0] == []
    # delta 0 keeps a tie once, in index order.
    assert build_pairs(["p", "q"], [3.0, 3.0], delta=0.0, max_per_group=4)[0] == [(0, 1, 0.0)]


@pytest.mark.parametrize("text,expected", [
    ("<think>why</think> Short answer here.", 1.0),
    ("No think block at all.", -1.0),
    ("<think></think> answer", -1.0),
    ("<think>  </think> answer", -1.0),
    ("<think>why</think>   ", -1.0),
    ("<think>a</think><think>b</think> answer", -1.0),
    ("<think>why</think> " + "w " * 120, 1.0 - 0.5 * 40 / 80),
    ("<think>why</think> " + "w " * 400, -1.0),
    ("  <think>why</think>" + "w " * 80, 1.0),
])
def test_format_reward_table(text, expected):
    assert format_reward(text, l_max=80, lam=0.5) == pytest.approx(expected)


@pytest.mark.parametrize("text,expected", [
    ("Short answer here.", 1.0),
    ("<think>why</think> Short answer here.", -1.0),   # no thinking mode: a think tag is a format error
    ("An answer that mentions </think> midway.", -1.0),
    ("   ", -1.0),
    ("w " * 120, 1.0 - 0.5 * 40 / 80),
    ("w " * 400, -1.0),
])
def test_format_reward_without_a_thinking_mode(text, expected):
    assert format_reward(text, l_max=80, lam=0.5, think=False) == pytest.approx(expected)


def test_split_think_and_composite():
    assert split_think("<think>t</think> a") == ("t", " a")
    assert split_think("plain") == (None, "plain")
    assert composite_reward(0.5, 1.0) == 1.5
    assert composite_reward(0.5, -1.0, w_rm=2.0, w_fmt=0.5) == 0.5
    for bad in (None, math.nan, math.inf):
        assert composite_reward(bad, 1.0) is None and composite_reward(1.0, bad) is None


def _write(tmp_path, data):
    p = tmp_path / "c.yaml"
    p.write_text(yaml.safe_dump(data))
    return p


def test_config_validation_lists_every_problem(tmp_path, shared_data):
    sit = str(shared_data / "empathetic_dialogues" / "test_situations.jsonl")
    ok = load(_write(tmp_path, {"data": {"situations": sit}, "personas": ["anchor"]}))
    assert ok.persona_grpo.num_generations == 8 and ok.pairs.delta == 0.5 and ok.lora.r == 16
    with pytest.raises(ConfigError) as e:
        load(_write(tmp_path, {"data": {"situations": str(tmp_path / "missing.jsonl")}, "personas": ["ghost"],
                               "persona_grpo": {"num_generations": 3, "batch_size": 16}}))
    msg = str(e.value)
    assert "divisible" in msg and "ghost" in msg and "missing.jsonl" in msg
    with pytest.raises(ConfigError, match="num_generations"):
        load(_write(tmp_path, {"data": {"situations": sit}, "persona_grpo": {"num_generations": 1}}))
    with pytest.raises(ConfigError, match="typo_key"):
        load(_write(tmp_path, {"data": {"situations": sit}, "typo_key": 1}))
    with pytest.raises(ConfigError, match="does not exist"):
        load(tmp_path / "nope.yaml")
    assert validate(PersonaAlignmentConfig(data={"situations": sit})) == []
    assert validate(PersonaAlignmentConfig(data={"situations": sit}, model="Qwen/Qwen3-0.6B")) == []
    for model in ("/nonexistent/model", "./nope", "no-slash-name", "a/b/c"):
        assert any("neither a model directory" in m for m in validate(PersonaAlignmentConfig(
            data={"situations": sit}, model=model))), model
    assert any("training split" in m for m in validate(PersonaAlignmentConfig(
        data={"situations": sit, "train_fraction": 0.0001, "limit": 2})))
    (tmp_path / "s.yaml").write_text("just a string")
    with pytest.raises(ConfigError, match="must be a YAML mapping"):
        load(tmp_path / "s.yaml")
    (tmp_path / "b.yaml").write_bytes(b"\x00\xff\xfe")
    with pytest.raises(ConfigError, match="not UTF-8"):
        load(tmp_path / "b.yaml")


def test_train_split_is_deterministic_and_disjoint_from_eval():
    ids = [f"hit:{i}" for i in range(2000)]
    train = {i for i in ids if in_train_split(i, 0.5, "s")}
    assert train == {i for i in ids if in_train_split(i, 0.5, "s")}
    assert 0.45 < len(train) / len(ids) < 0.55
    assert train != {i for i in ids if in_train_split(i, 0.5, "other-salt")}


def test_stage_dir_publishes_atomically_and_resumes(tmp_path):
    conf, inputs = {"a": 1}, {"x": "digest"}
    with pytest.raises(RuntimeError):
        with stage_dir(tmp_path, "s", conf, inputs) as (part, m):
            (part / "half.txt").write_text("partial")
            raise RuntimeError("crash")
    assert not (tmp_path / "s").exists() and (tmp_path / "s.partial" / "half.txt").exists()
    assert not is_done(tmp_path, "s", conf, inputs)
    with stage_dir(tmp_path, "s", conf, inputs) as (part, m):
        (part / "out.txt").write_text("done")
        m["metrics"] = {"n": 1}
    man = read_manifest(tmp_path / "s")
    assert man["config_digest"] == digest_obj(conf) and man["metrics"] == {"n": 1} and "torch" in man["versions"]
    assert is_done(tmp_path, "s", conf, inputs) and not is_done(tmp_path, "s", {"a": 2}, inputs)
    assert not (tmp_path / "s.partial").exists()


def test_a_partial_stage_left_under_other_settings_is_cleared_not_resumed(tmp_path):
    inputs = {"x": "digest"}
    with pytest.raises(RuntimeError):
        with stage_dir(tmp_path, "s", {"k": 4}, inputs) as (part, m):
            (part / "rows.jsonl").write_text('{"made": "with k 4"}\n')
            raise RuntimeError("crash")
    with pytest.raises(RuntimeError):  # the same settings resume it
        with stage_dir(tmp_path, "s", {"k": 4}, inputs) as (part, m):
            assert (part / "rows.jsonl").is_file()
            raise RuntimeError("crash again")
    with stage_dir(tmp_path, "s", {"k": 6}, inputs) as (part, m):  # other settings: nothing of the old run
        assert not (part / "rows.jsonl").exists()
        (part / "rows.jsonl").write_text('{"made": "with k 6"}\n')
    assert not (tmp_path / "s" / ".stage_key").exists()  # the key file is not published
    # a partial directory without a key (left by an older version) is resumed as before
    (tmp_path / "t.partial").mkdir()
    (tmp_path / "t.partial" / "rows.jsonl").write_text("{}\n")
    with stage_dir(tmp_path, "t", {"k": 1}, inputs) as (part, m):
        assert (part / "rows.jsonl").is_file()


def test_read_jsonl_drops_a_torn_line(tmp_path):
    p = tmp_path / "x.jsonl"
    p.write_text(json.dumps({"a": 1}) + "\n" + '{"a": 2')
    assert read_jsonl(p) == [{"a": 1}] and p.read_text().endswith("\n")


def test_publish_gate_refuses_looping_and_card_copying_replies():
    """The gate's verdict on planted replies: healthy ones pass; a reply that loops (as a phase 1 adapter's did:
    "... a more productive tomorrow tomorrow tomorrow ...") or copies its card counts against the share limits."""
    from mascot.core.personas import PersonaCatalog
    from mascot.core.defects import card_source_text
    from mascot_training.persona.config import GateConfig
    from mascot_training.persona.publish_personas import gate_verdict

    card = PersonaCatalog.load().get("catalyst")
    healthy = ["That sounds like a lot to carry. What part of tomorrow worries you most?",
               "Moving somewhere new is brave. Which places near you could you try this week?",
               "Finishing it after months is a real win. What finally got you unstuck?",
               "It hurts when ideas go unheard. What happened the last time you spoke up?"]
    loop = "I'm here to help you create a more productive tomorrow tomorrow tomorrow tomorrow tomorrow tomorrow."
    copy = " ".join(card_source_text(card).split()[:12]) + "."
    cfg = GateConfig(prompts=4, max_tokens=48, min_mean_words=3.0, min_distinct_2=0.3)
    ok = gate_verdict(healthy, card, cfg)
    assert ok["passed"] and ok["reason"] == "" and ok["loop_rate"] == ok["echo_rate"] == 0.0
    one = gate_verdict([loop, *healthy[1:]], card, cfg)  # one in four: inside the default share of 0.25
    assert one["passed"] and one["loop_rate"] == 0.25
    two = gate_verdict([loop, copy, copy, healthy[3]], card, cfg)
    assert not two["passed"] and two["echo_rate"] == 0.5
    assert "copy the persona's prompt or card" in two["reason"] and "loop" not in two["reason"]
    loops = gate_verdict([loop, loop + " Again.", *healthy[2:]], card, cfg)
    assert not loops["passed"] and "50% of the replies loop, over gate.max_loop_rate 0.25" in loops["reason"]
    strict = gate_verdict([loop, *healthy[1:]], card, GateConfig(max_loop_rate=0.0))
    assert not strict["passed"]


def test_judging_stages_key_their_cache_on_the_rubric_and_metrics_mapping_versions(monkeypatch):
    """A judge or group_rm stage resumed with another rubric or metrics-judge mapping judges again: the versions are
    part of the stage's cache key (its config), so old verdicts are not kept."""
    from mascot.core.config import JudgeSpec
    from mascot.judge import metrics, rubric
    from mascot_training.common.judges import judging_versions
    from mascot_training.common.manifest import digest_obj

    local = [JudgeSpec(name="local", kind="local")]
    both = [*local, JudgeSpec(name="cpu", kind="metrics")]
    assert judging_versions(local) == {"rubric": rubric.rubric_version()}
    before = judging_versions(both)
    assert before == {"rubric": rubric.rubric_version(), "metrics": metrics.VERSION}
    monkeypatch.setattr(metrics, "VERSION", metrics.VERSION + "-next")
    assert digest_obj(judging_versions(both)) != digest_obj(before)
    assert judging_versions(local) == {"rubric": rubric.rubric_version()}  # no metrics judge: its mapping is moot
