"""Phase 2 pure rules: I_div (both modes, on persona sequences the serving rules allow), the rollout reward, judge
mapping, role-flip detection, config validation."""

from __future__ import annotations

import math
import re

import pytest

from mascot.core.personas import PersonaCatalog
from mascot_training.collaborative.config import load
from mascot_training.collaborative.simulate import detect_role_flip
from mascot_training.common.config import ConfigError
from mascot_training.common.rewards import i_div, judge_group_reward, rollout_reward
from tests.helpers.training import phase2_config

ROSTER = [PersonaCatalog.load().get(i) for i in ("anchor", "catalyst", "beacon")]


@pytest.mark.parametrize("personas,min_distinct,expected", [
    (["anchor", "catalyst", "anchor", "anchor"], 2, 1),
    (["anchor", "anchor", "anchor", "anchor"], 2, -1),
    ([], 2, -1),
    (["anchor"], 1, 1),
    (["anchor", "catalyst"], 3, -1),
    (["anchor", "catalyst", "beacon"], 3, 1),
])
def test_i_div_distinct(personas, min_distinct, expected):
    assert i_div(personas, min_distinct, mode="distinct") == expected


@pytest.mark.parametrize("personas,heard,expected", [
    (["anchor", "catalyst"], [], 1),  # nobody heard yet: any speaker is new
    (["action_guide", "anchor"], ["anchor", "catalyst", "beacon"], 1),  # the Action Guide is new
    (["anchor", "catalyst"], ["anchor", "catalyst", "beacon"], -1),  # both heard before
    (["catalyst"], ["catalyst"], -1),
    ([], ["anchor"], -1),  # a suffix without agent turns brings in nobody
])
def test_i_div_new_persona(personas, heard, expected):
    assert i_div(personas, mode="new_persona", heard=heard) == expected
    assert i_div(personas, 5, heard=heard) == expected  # the default mode, min_distinct unread


def test_i_div_unknown_mode_is_refused():
    with pytest.raises(ValueError, match="unknown diversity mode 'vibes'; use one of new_persona, distinct"):
        i_div(["anchor"], mode="vibes")


def _serving_sequences(roster: list, k: int, n: int) -> list[tuple[list[str], list[str]]]:
    """Every ``(prefix speakers, suffix speakers)`` of k + n agent turns that serving's rules allow a director to pick
    (:func:`mascot.director.decide.choosable_personas` with serving's defaults: no persona of the last two agent
    turns, the consecutive-turn cap), with a user turn between agent turns (the rules count agent turns only)."""
    from mascot.core.config import DirectorConfig
    from mascot.core.dialogue import HistoryTurn
    from mascot.director.decide import choosable_personas

    cfg = DirectorConfig()
    out = []

    def grow(history: list, spoke: list[str]) -> None:
        if len(spoke) == k + n:
            out.append((spoke[:k], spoke[k:]))
            return
        for card in choosable_personas(roster, history, cfg)[1]:
            grow([*history, HistoryTurn("agent", "...", card.id), HistoryTurn("user", "ok")], [*spoke, card.id])

    grow([HistoryTurn("user", "I lost my job.")], [])
    return out


@pytest.mark.parametrize("k", [0, 1, 2, 3, 4])
def test_i_div_on_the_persona_sequences_serving_allows(k):
    """The paper's indicator is +1 on every suffix of 2 agent turns serving can produce (the rest rule forbids a repeat
    within 3 agent turns): it cannot tell rollouts apart. The redefined one is +1 when the suffix brings in a persona
    the prefix did not hear and -1 otherwise: both values once the prefix holds 3 or more agent turns."""
    roster = PersonaCatalog.load().in_set("support")
    seqs = _serving_sequences(roster, k, 2)
    assert len(seqs) == 5 * 4 * 3 ** k  # 5 personas; from the third turn on, the last two speakers rest
    for p, s in seqs:  # the rest rule: any 3 consecutive agent turns are 3 different personas
        turns = p + s
        assert all(len(set(turns[i:i + 3])) == len(turns[i:i + 3]) for i in range(len(turns)))
    assert {i_div(s, 2, mode="distinct") for _, s in seqs} == {1}
    new = [i_div(s, mode="new_persona", heard=p) for p, s in seqs]
    minus = sum(v == -1 for v in new) / len(new)
    print(f"k={k}: {len(new)} sequences, new_persona I_div -1 in {minus:.0%}")
    if k <= 2:  # the suffix's first speaker is always one the prefix did not hear
        assert set(new) == {1}
    else:
        assert set(new) == {1, -1} and 0.0 < minus < 1.0
    if k == 3:  # anchor, catalyst, beacon; then anchor and catalyst again: -1; the Action Guide instead: +1
        assert (["anchor", "catalyst", "beacon"], ["anchor", "catalyst"]) in seqs
        assert i_div(["anchor", "catalyst"], heard=["anchor", "catalyst", "beacon"]) == -1
        assert i_div(["action_guide", "catalyst"], heard=["anchor", "catalyst", "beacon"]) == 1


@pytest.mark.parametrize("kw,expected", [
    ({"invalid": True, "dropped": False, "r_group": 0.9, "personas": ["anchor", "catalyst"]}, -2.0),
    ({"invalid": False, "dropped": True, "r_group": 0.9, "personas": ["anchor", "catalyst"]}, None),
    ({"invalid": True, "dropped": True, "r_group": None, "personas": []}, None),  # dropped wins: nothing learnt
    ({"invalid": False, "dropped": False, "r_group": 0.25, "personas": ["anchor", "catalyst"]}, 0.75),
    ({"invalid": False, "dropped": False, "r_group": 0.25, "personas": ["anchor", "anchor"]}, -0.25),
    ({"invalid": False, "dropped": False, "r_group": -1.5, "personas": ["beacon", "anchor"]}, -1.0),
    ({"invalid": False, "dropped": False, "r_group": None, "personas": ["anchor", "catalyst"]}, None),
    ({"invalid": False, "dropped": False, "r_group": math.nan, "personas": ["anchor", "catalyst"]}, None),
    ({"invalid": False, "dropped": False, "r_group": math.inf, "personas": ["anchor", "catalyst"]}, None),
])
def test_rollout_reward_table(kw, expected):
    got = rollout_reward(**kw, eta=0.5, min_distinct=2, invalid_reward=-2.0, diversity="distinct")
    assert got == (pytest.approx(expected) if expected is not None else None)


@pytest.mark.parametrize("personas,heard,expected", [
    (["anchor", "catalyst"], [], 0.75),
    (["anchor", "catalyst"], ["anchor", "catalyst", "beacon"], -0.25),
    (["action_guide", "catalyst"], ["anchor", "catalyst", "beacon"], 0.75),
])
def test_rollout_reward_new_persona(personas, heard, expected):
    got = rollout_reward(invalid=False, dropped=False, r_group=0.25, personas=personas, eta=0.5, min_distinct=2,
                         invalid_reward=-2.0, diversity="new_persona", heard=heard)
    assert got == pytest.approx(expected)


def test_the_reward_function_reads_the_prefix_for_i_div():
    """make_reward_func gives I_div from what the prefix heard: the same suffix scores +1 after a short prefix and -1
    after one that heard its personas already; the stats keep both."""
    from mascot.core.dialogue import HistoryTurn
    from mascot_training.collaborative.config import Phase2Config
    from mascot_training.collaborative.director_grpo import RolloutStats, make_reward_func
    from mascot_training.collaborative.simulate import Prefix

    opening = HistoryTurn("user", "I lost my job.")
    heard = [HistoryTurn("agent", "x", p) for p in ("anchor", "catalyst", "beacon")]
    prefixes = {"short": Prefix("short", "s1", "", "sad", 0, [opening]),
                "long": Prefix("long", "s2", "", "sad", 3, [opening, *heard])}
    block = [{"role": "agent", "text": "y", "persona_id": p} for p in ("anchor", "catalyst")]
    rollout = [{"prefix_id": pid, "block": block, "personas": ["anchor", "catalyst"], "invalid": "",
                "dropped": "", "window_full": False, "directives": []} for pid in ("short", "long")]
    stats = RolloutStats()
    fn = make_reward_func(prefixes, lambda items: [0.5] * len(items), Phase2Config(), 10.0, stats)
    assert fn(prompts=["short", "long"], completions=["", ""], rollout=rollout) == [pytest.approx(1.0),
                                                                                   pytest.approx(0.0)]
    assert stats.i_div == [1, -1] and stats.summary()["i_div_mean"] == 0.0
    distinct = make_reward_func(prefixes, lambda items: [0.5] * len(items), Phase2Config(diversity="distinct"), 10.0,
                                RolloutStats())
    assert distinct(prompts=["short", "long"], completions=["", ""], rollout=rollout) == [pytest.approx(1.0)] * 2


def test_judge_group_reward_maps_1_5_to_0_1():
    assert judge_group_reward(1.0) == 0.0
    assert judge_group_reward(5.0) == 1.0
    assert judge_group_reward(3.5) == pytest.approx(0.625)
    for bad in (0.5, 5.01):
        with pytest.raises(ValueError, match="1, 5"):
            judge_group_reward(bad)


@pytest.mark.parametrize("text", [
    "It sounds like you're carrying a lot right now.",
    "I'm here for you, whatever happens.",
    "You're not alone in feeling this way.",
    "Have you tried talking to your manager about it?",
    "As an AI, I can't feel that, but I understand.",
    "The Anchor: that must be so hard for you.",
    "Anchor: I hear you.",
    "Director: Agent: The Beacon",
    "**Catalyst**: what else could explain it?",
    "That must have been really painful.",
    # what a reader found simulated users saying in phase 2 rollouts, refused in serving already
    "I'm here to support you, and I'm here to help make your friend's life easier.",
    "I'm so sorry to hear that you lost it.",
    "Thank you for sharing this with me.",
])
def test_role_flip_detected(text):
    assert detect_role_flip(text, ROSTER)


@pytest.mark.parametrize("text", [
    "I just feel like nobody at work listens to me.",
    "My dog died last week and I keep thinking about him.",
    "Honestly I don't know what to do, my anchor in life was my mum.",
    "You guys are nice, but I still feel stuck.",
    "Note: I did call my sister yesterday.",
    "I tried that already and it didn't help.",
])
def test_user_turns_are_not_flagged(text):
    assert detect_role_flip(text, ROSTER) == ""


def test_config_problems_are_listed_together(tmp_path, shared_data):
    f = phase2_config(tmp_path, **{"director_grpo.batch_size": 6, "phase2.num_generations": 4, "personas": ["anchor"],
                                   "phase2.diversity": "distinct",
                                   "speakers.adapters": {"catalyst": str(tmp_path)}, "user.personality": "XYZW",
                                   "phase2.group_reward.judge.target": "127.0.0.1:50071"})
    with pytest.raises(ConfigError) as e:
        load(f)
    msg = str(e.value)
    assert "director_grpo.batch_size (6) must be divisible by phase2.num_generations (4)" in msg
    assert "phase2.min_distinct (2) exceeds the 1 active persona(s)" in msg
    assert "has no adapter_config.json" in msg
    assert "user.personality" in msg
    assert "phase2.group_reward.judge.target is not supported" in msg  # never silently ignored


def test_config_rejects_unknown_keys_and_bad_values(tmp_path, shared_data):
    with pytest.raises(ConfigError, match="phase2.etaa"):
        load(phase2_config(tmp_path, **{"phase2.etaa": 1}))
    with pytest.raises(ConfigError, match="phase2.group_reward.source"):
        load(phase2_config(tmp_path, **{"phase2.group_reward.source": "vibes"}))
    with pytest.raises(ConfigError, match="prefix_agent_turns"):
        load(phase2_config(tmp_path, **{"phase2.prefix_agent_turns": [0, -1]}))
    with pytest.raises(ConfigError, match="num_generations"):
        load(phase2_config(tmp_path, **{"phase2.num_generations": 1}))


def test_smoke_config_is_valid_and_uses_the_reference_defaults_it_does_not_override(tmp_path, shared_data):
    cfg = load(phase2_config(tmp_path))
    assert cfg.phase2.eta == 0.5 and cfg.phase2.min_distinct == 2 and cfg.phase2.invalid_reward == -2.0
    assert cfg.phase2.user_speak_prob == 0.5 and cfg.phase2.group_reward.source == "rm"
    assert cfg.phase2.diversity == "new_persona"  # our deviation (docs/method.md): the paper's is +1 for every valid
    # suffix of 3 agent turns or fewer
    assert cfg.phase2.num_generations == 4  # the CPU profile



@pytest.mark.parametrize("over,fragment", [
    ({"personas": ["anchor", "anchor"]}, "lists an id twice"),
    ({"personas": ["anchor", "minutes_scribe"]}, "not in the support set"),
    ({"director_grpo.max_steps": 0}, "max_steps is 0"),
    ({"director_grpo.loss_type": "nonsense"}, "director_grpo.loss_type"),
    ({"director_grpo.scale_rewards": "nonsense"}, "director_grpo.scale_rewards"),
    ({"phase2.eta": float("nan")}, "phase2.eta"),
    ({"phase2.eta": -0.5}, "phase2.eta"),
    ({"max_model_len": 128}, "max_model_len"),
    ({"director.decoding.temperature": 0.0}, "director.decoding.temperature is 0"),  # GRPO needs samples
    ({"director.temperature": 1.0}, "director.temperature"),  # the decoding is one setting: director.decoding
])
def test_more_config_mistakes_are_caught_before_work(tmp_path, shared_data, over, fragment):
    with pytest.raises(ConfigError, match=re.escape(fragment)):
        load(phase2_config(tmp_path, **over))


def test_a_store_missing_some_personas_is_a_config_error(tmp_path, shared_data):
    import json

    store = tmp_path / "store"
    store.mkdir()
    (store / "registry.json").write_text(json.dumps({"revision": 1, "adapters": {"anchor": {
        "versions": {"1": {"state": "staged", "name": "anchor--v1"}}, "stable": None}}}))
    with pytest.raises(ConfigError, match=r"no phase 1 adapter for persona\(s\) \['catalyst', 'beacon'\]"):
        load(phase2_config(tmp_path, **{"speakers.store": str(store)}))
    (store / "registry.json").write_text(json.dumps({"revision": 1, "adapters": {}}))
    with pytest.raises(ConfigError, match="no phase 1 adapter"):  # none at all: no silent quick stand-ins
        load(phase2_config(tmp_path, **{"speakers.store": str(store)}))
    (store / "registry.json").write_text(json.dumps({"revision": 1, "adapters": {"anchor": {
        "versions": {"1": {"state": "staged", "name": "anchor--v1"}}, "stable": None}}}))
    cfg = load(phase2_config(tmp_path, **{"speakers.store": str(store), "personas": ["anchor"],
                                          "phase2.min_distinct": 1}))
    assert cfg.personas == ["anchor"]


def _worst_block(tokenizer, personas: list[str], agent_turns: int, agent_tokens: int, user_tokens: int) -> list:
    """Agent turns of exactly ``agent_tokens`` tokens, each followed by a user turn of ``user_tokens``: the longest
    block a rollout with these budgets can hold."""
    from mascot.core.dialogue import HistoryTurn

    word = tokenizer(" okay")["input_ids"][0]

    def text(n: int) -> str:
        return tokenizer.decode([word] * n)

    block = []
    for k in range(agent_turns):
        block += [HistoryTurn("agent", text(agent_tokens), personas[k % len(personas)]),
                  HistoryTurn("user", text(user_tokens))]
    return block


def test_group_rm_length_is_checked_against_the_longest_block_before_judging(real_model_dir):
    from mascot_training.collaborative.group_rm import check_rm_length
    from mascot_training.common.reward_model import load_rm_tokenizer

    tok = load_rm_tokenizer(str(real_model_dir))
    ids = [c.id for c in ROSTER]
    short, long = _worst_block(tok, ids, 1, 8, 8), _worst_block(tok, ids, 2, 40, 30)
    need = check_rm_length(tok, 4096, ROSTER, [short, long])
    assert need == check_rm_length(tok, 4096, ROSTER, [long]) > check_rm_length(tok, 4096, ROSTER, [short])
    assert check_rm_length(tok, need, ROSTER, [short, long]) == need  # exactly enough is enough
    with pytest.raises(ValueError, match=rf"rm\.max_length={need - 1} .*at least {need}\b"):
        check_rm_length(tok, need - 1, ROSTER, [short, long])


def test_cpu_recipe_group_rm_holds_its_longest_possible_block(real_model_dir):
    """collaborative_cpu.yaml's reward model length holds the roster of every support persona and a block of its
    suffix length with every reply at the speakers' and the user's token budgets (it once did not, and the run
    stopped after its rollouts)."""
    from pathlib import Path

    import yaml

    from mascot_training.collaborative.group_rm import check_rm_length
    from mascot_training.common.reward_model import load_rm_tokenizer

    cfg = yaml.safe_load((Path(__file__).parents[2] / "training-jobs" / "configs" / "collaborative_cpu.yaml")
                         .read_text())
    assert cfg["personas"] == []  # every support persona
    cards = PersonaCatalog.load().in_set(cfg["mode"])
    tok = load_rm_tokenizer(str(real_model_dir))
    block = _worst_block(tok, [c.id for c in cards], cfg["phase2"]["suffix_agent_turns"],
                         cfg["speakers"]["max_tokens"], cfg["user"]["max_tokens"])
    max_length = cfg["phase2"]["group_reward"]["rm"]["max_length"]
    assert check_rm_length(tok, max_length, cards, [block]) <= max_length


def test_directives_are_sampled_at_the_serving_decoding_everywhere(tmp_path):
    """One setting, ``director.decoding``, with serving's default: the serving director of the rollouts, the policy's
    samples (GRPO and the measures) and TRL's log-probabilities all read it."""
    from types import SimpleNamespace

    from mascot.core.config import DirectorConfig, DirectorDecoding, MascotConfig
    from mascot_training.collaborative.config import CollaborativeConfig
    from mascot_training.collaborative.director_grpo import grpo_args, policy_decider_factory
    from mascot_training.collaborative.rollouts import serving_director_config

    assert CollaborativeConfig().director.decoding == DirectorConfig().decoding == DirectorDecoding()
    assert MascotConfig.model_fields["director"].default.decoding == DirectorDecoding()
    assert DirectorDecoding().temperature > 0  # served sampled, so it can be trained as served
    cfg = CollaborativeConfig(director={"decoding": {"temperature": 0.5, "top_p": 0.8}})
    assert serving_director_config(cfg).decoding == DirectorDecoding(temperature=0.5, top_p=0.8)
    args = grpo_args(cfg, tmp_path)
    assert (args.temperature, args.top_p) == (0.5, 0.8)
    tok = SimpleNamespace(eos_token_id=0, pad_token_id=0)
    model = SimpleNamespace(generation_config=None)
    trainer = SimpleNamespace(model=model, accelerator=SimpleNamespace(unwrap_model=lambda m: m))
    runner = SimpleNamespace(tokenizer=tok, policy_decider=lambda director, seed: director)
    director = policy_decider_factory(runner, cfg, vllm=False)(trainer, 0)
    assert (director.temperature, director.top_p) == (0.5, 0.8)


def test_usage_balance_ranks_the_under_used_persona_first():
    """B = mean of clip(1 - K * share, -1, 1) over the suffix's turns: a persona never counted +1, one at its 1/K
    share 0, one at twice its share or more -1; nothing counted yet or no turn: 0."""
    from collections import Counter

    from mascot_training.common.rewards import usage_balance

    roster = ["empathetic_listener", "anchor", "catalyst", "action_guide", "beacon"]
    counts = Counter({"beacon": 6, "catalyst": 2, "anchor": 2})  # beacon 0.6, catalyst and anchor 0.2 each
    assert usage_balance(["empathetic_listener"], counts, roster) == pytest.approx(1.0)
    assert usage_balance(["catalyst"], counts, roster) == pytest.approx(0.0)
    assert usage_balance(["beacon"], counts, roster) == pytest.approx(-1.0)
    assert usage_balance(["empathetic_listener", "beacon"], counts, roster) == pytest.approx(0.0)
    assert usage_balance(["beacon"], Counter(), roster) == 0.0 and usage_balance([], counts, roster) == 0.0
    with pytest.raises(ValueError, match="roster"):
        usage_balance(["beacon"], counts, [])


def test_the_reward_function_adds_usage_balance_from_earlier_batches():
    """With phase2.balance β = 1, the first batch is scored against nothing (B 0) and the next against the first
    batch's speakers: a suffix of the favoured personas loses, one of the unheard ones gains; β 0 leaves R alone."""
    from mascot.core.dialogue import HistoryTurn
    from mascot_training.collaborative.config import Phase2Config
    from mascot_training.collaborative.director_grpo import RolloutStats, make_reward_func
    from mascot_training.collaborative.simulate import Prefix

    roster = ["empathetic_listener", "anchor", "catalyst", "action_guide", "beacon"]
    prefixes = {"p": Prefix("p", "s1", "", "sad", 0, [HistoryTurn("user", "I lost my job.")])}

    def roll(*personas):
        block = [{"role": "agent", "text": "y", "persona_id": p} for p in personas]
        return {"prefix_id": "p", "block": block, "personas": list(personas), "invalid": "", "dropped": "",
                "window_full": False, "directives": []}

    stats = RolloutStats()
    fn = make_reward_func(prefixes, lambda items: [0.5] * len(items), Phase2Config(balance=1.0), 10.0, stats,
                          roster=roster)
    first = [roll("beacon", "catalyst"), roll("beacon", "anchor")]
    assert fn(prompts=["p"] * 2, completions=[""] * 2, rollout=first) == [pytest.approx(1.0)] * 2  # 0.5 + 0.5 I_div
    # counted: beacon 2, catalyst 1, anchor 1 of 4 -> B(beacon, catalyst) = (-1 + -0.25) / 2; unheard pair +1
    got = fn(prompts=["p"] * 2, completions=[""] * 2, rollout=[roll("beacon", "catalyst"),
                                                              roll("empathetic_listener", "action_guide")])
    assert got == [pytest.approx(1.0 - 0.625), pytest.approx(2.0)]
    assert stats.balance == [0.0, 0.0, pytest.approx(-0.625), pytest.approx(1.0)]
    plain = make_reward_func(prefixes, lambda items: [0.5] * len(items), Phase2Config(), 10.0, RolloutStats())
    assert plain(prompts=["p"] * 2, completions=[""] * 2, rollout=first) == [pytest.approx(1.0)] * 2
    with pytest.raises(ValueError, match="roster"):
        make_reward_func(prefixes, lambda items: [0.5] * len(items), Phase2Config(balance=1.0), 10.0, RolloutStats())
