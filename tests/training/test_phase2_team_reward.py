"""The team reward (``phase2.group_reward.source: team``) on planted blocks whose answer is known, with the real
MiniLM encoder and the support cards' moves: complementary moves beat one move said three times, an off-topic block
scores below the same moves on topic, a copy of the user's message earns no relevance; the formula, its settings and
the stages that skip the group reward model."""

from __future__ import annotations

import pytest

from mascot.core.dialogue import HistoryTurn
from mascot.core.moves import assess, round_moves
from mascot.core.personas import PersonaCatalog
from mascot_training.common.rewards import TeamTerms, team_reward, team_terms

USER = "I lost my job today after ten years and I feel awful."
HISTORY = [HistoryTurn("user", USER)]


@pytest.fixture(scope="module")
def embed():
    import torch

    torch.set_num_threads(1)
    from mascot.core.embedding import SentenceEncoder

    return SentenceEncoder(device="cpu").embed


@pytest.fixture(scope="module")
def moves():
    return round_moves(PersonaCatalog.load().in_set("support"))


def _agents(*turns: tuple[str, str]) -> list[HistoryTurn]:
    return [HistoryTurn("agent", text, pid) for pid, text in turns]


#: A validation, a step and a question: three card moves from three personas.
COMPLEMENTARY = _agents(("anchor", "That sounds so hard."),
                        ("action_guide", "Tonight, write down three things you want to ask your manager."),
                        ("catalyst", "What part of losing this job weighs on you the most right now?"))
#: The same validation three times, nearly word for word.
VALIDATIONS = _agents(("anchor", "That sounds so hard."), ("beacon", "That sounds really hard."),
                      ("catalyst", "That must be so hard."))
#: A step and a question about the user's job, and the same moves about something else.
ON_TOPIC = _agents(("action_guide", "Tonight, write down three things you want to ask your manager about the layoff."),
                   ("catalyst", "What part of losing this job weighs on you the most?"))
OFF_TOPIC = _agents(("action_guide", "Tonight, write down three recipes you want to cook this weekend."),
                    ("catalyst", "What part of the football match did you enjoy the most?"))


def _fired(block: list[HistoryTurn], moves) -> list[set[str]]:
    return [set(assess(moves, t.text, USER).required) for t in block]


def test_complementary_moves_score_above_one_validation_said_three_times(embed, moves):
    assert _fired(COMPLEMENTARY, moves) == [{"feeling_label"}, {"concrete_step"},
                                            {"reflective_question", "invite_elaboration"}]
    assert _fired(VALIDATIONS, moves) == [{"feeling_label"}] * 3
    good, same = team_terms(HISTORY, COMPLEMENTARY, moves, embed), team_terms(HISTORY, VALIDATIONS, moves, embed)
    print(f"complementary {good} -> {team_reward(good):.3f}; validations {same} -> {team_reward(same):.3f}")
    assert good.agent_turns == same.agent_turns == 3
    assert good.complementarity == 1.0 and same.complementarity == pytest.approx(1 / 3)
    assert good.redundancy < 0.5 < 0.7 < same.redundancy
    assert team_reward(good) > team_reward(same) + 0.3
    # each criterion alone orders them the same way where it reads a difference
    assert team_reward(good, 1.0, 0.0, 0.0) > team_reward(same, 1.0, 0.0, 0.0)
    assert team_reward(good, 0.0, 0.0, 1.0) > team_reward(same, 0.0, 0.0, 1.0)


def test_an_off_topic_block_scores_below_the_same_moves_on_topic(embed, moves):
    assert _fired(ON_TOPIC, moves) == _fired(OFF_TOPIC, moves) == [{"concrete_step"},
                                                                    {"reflective_question", "invite_elaboration"}]
    on, off = team_terms(HISTORY, ON_TOPIC, moves, embed), team_terms(HISTORY, OFF_TOPIC, moves, embed)
    print(f"on topic {on} -> {team_reward(on):.3f}; off topic {off} -> {team_reward(off):.3f}")
    assert on.complementarity == off.complementarity == 1.0
    assert on.relevance > off.relevance + 0.2
    assert team_reward(on) > team_reward(off) + 0.05
    # turns on the user's topic share it: below the floor that is not redundancy
    assert on.redundancy < 0.5 and team_reward(on, 0.0, 0.0, 1.0) == team_reward(off, 0.0, 0.0, 1.0) == 1.0


def test_relevance_answers_the_latest_user_message_and_a_copy_of_it_earns_none(embed, moves):
    copy = _agents(("empathetic_listener", "You lost your job today after ten years and you feel awful."))
    t = team_terms(HISTORY, copy, moves, embed)
    assert t.relevance == 0.0 and t.redundancy is None and t.complementarity == 1.0  # a paraphrase is a move
    # a user turn inside the block is what the turns after it answer
    block = [*ON_TOPIC[:1], HistoryTurn("user", "I also broke my leg at football."), *OFF_TOPIC[1:]]
    mixed = team_terms(HISTORY, block, moves, embed)
    alone = team_terms(HISTORY, [*ON_TOPIC[:1], *OFF_TOPIC[1:]], moves, embed)
    assert mixed.relevance > alone.relevance
    # empty turns bring no move and no relevance; a block without agent turns has no terms
    empty = team_terms(HISTORY, _agents(("anchor", "")), moves, embed)
    assert empty == TeamTerms(1, 0.0, 0.0, None) and team_reward(empty) == 0.0
    assert team_terms(HISTORY, [HistoryTurn("user", "hm")], moves, embed) == TeamTerms(0, None, None, None)
    assert team_reward(TeamTerms(0, None, None, None)) is None


def test_the_formula_weighs_what_has_a_value_and_refuses_bad_settings():
    t = TeamTerms(2, 0.5, 0.4, 0.75)  # redundancy 0.75: half-way from the floor 0.5 to 1
    assert team_reward(t) == pytest.approx((1.0 * 0.5 + 0.5 * 0.4 + 0.5 * 0.5) / 2.0)
    assert team_reward(t, 1.0, 1.0, 1.0, redundancy_floor=0.0) == pytest.approx((0.5 + 0.4 + 0.25) / 3)
    assert team_reward(TeamTerms(1, 1.0, 0.2, None)) == pytest.approx((1.0 + 0.5 * 0.2) / 1.5)  # no pair: no term
    assert team_reward(TeamTerms(1, None, 0.2, None), 1.0, 0.0, 1.0) is None  # nothing weighted has a value
    for bad in ({"w_moves": 1.5}, {"w_relevance": -0.1}, {"redundancy_floor": 1.0}):
        with pytest.raises(ValueError, match=r"\[0, 1"):
            team_reward(t, **bad)


def test_the_group_reward_function_embeds_a_batch_once_and_matches_the_terms(embed, moves):
    from mascot_training.collaborative.director_grpo import team_group_reward
    from mascot_training.collaborative.simulate import Prefix

    calls = []

    def counting(texts):
        calls.append(list(texts))
        return embed(texts)

    roster = PersonaCatalog.load().in_set("support")
    prefix = Prefix("p", "s", "", "sad", 0, HISTORY)
    blocks = [COMPLEMENTARY, VALIDATIONS, ON_TOPIC, OFF_TOPIC]
    got = team_group_reward(roster, counting)([(prefix, b) for b in blocks])
    assert len(calls) == 1 and len(calls[0]) == len(set(calls[0]))
    assert got == [pytest.approx(team_reward(team_terms(HISTORY, b, moves, embed)), abs=1e-6) for b in blocks]
    assert got[0] > got[1] and got[2] > got[3]


def test_the_team_source_is_a_setting_and_trains_no_group_reward_model(tmp_path, shared_data):
    import asyncio
    import json

    from mascot_training.collaborative import group_rm
    from mascot_training.collaborative.config import load
    from mascot_training.collaborative.pipeline import _reward_inputs
    from mascot_training.common.config import ConfigError
    from tests.helpers.training import phase2_config

    cfg = load(phase2_config(tmp_path, **{"phase2.group_reward.source": "team"}))
    team = cfg.phase2.group_reward.team
    assert (team.w_moves, team.w_relevance, team.w_redundancy, team.redundancy_floor) == (1.0, 0.5, 0.5, 0.5)
    for over, fragment in (({"phase2.group_reward.team.w_moves": 1.5}, "w_moves"),
                           ({"phase2.group_reward.team.w_moves": 0.0, "phase2.group_reward.team.w_relevance": 0.0,
                             "phase2.group_reward.team.w_redundancy": 0.0}, "at least one team reward weight")):
        with pytest.raises(ConfigError, match=fragment):
            load(phase2_config(tmp_path, **{"phase2.group_reward.source": "team", **over}))
    out = tmp_path / "run"
    m = asyncio.run(group_rm.run(cfg, out, engine=None, base_model="unused"))
    assert m["metrics"] == {"source": "team"} and not (out / "group_rm" / "model").exists()
    assert json.loads((out / "group_rm" / "manifest.json").read_text())["metrics"]["source"] == "team"
    inputs = _reward_inputs(cfg, out)
    assert inputs["group_reward"].startswith("team:")
    cfg2 = load(phase2_config(tmp_path, **{"phase2.group_reward.source": "team",
                                           "phase2.group_reward.team.w_relevance": 0.25}))
    assert _reward_inputs(cfg2, out) != inputs  # another weight is another reward: the stage reruns
    # the pipeline's reward function for the stage: the roster's moves and the bundled MiniLM, no engine or loop
    from mascot.core.personas import PersonaCatalog
    from mascot_training.collaborative.pipeline import _group_reward_fn
    from mascot_training.collaborative.simulate import Prefix

    roster = [PersonaCatalog.load().get(p) for p in cfg.personas]
    fn = _group_reward_fn(cfg, out, None, roster, None)
    good, same = fn([(Prefix("p", "s", "", "sad", 0, HISTORY), b) for b in (COMPLEMENTARY, VALIDATIONS)])
    assert 0.0 <= same < good <= 1.0
