"""director.sampling: serving. The director policy's directives in GRPO are sampled under the serving director's
grammar for the turn and checked by its rules, with no loss on the tokens the grammar forced; the real default model
(SmolLM2-135M-Instruct) writes a valid directive under the grammar where, sampled free, it almost never does."""

from __future__ import annotations

import collections
import re

import pytest

from mascot.core.config import DirectorConfig
from mascot.core.dialogue import HistoryTurn
from mascot.core.personas import PersonaCatalog
from mascot.director.decide import choosable_personas, decision_regex
from mascot.director.directive import action_verbs, match_persona, tone_words
from mascot_training.collaborative.simulate import (
    PolicyDirector,
    Prefix,
    Rollout,
    RolloutRunner,
    RolloutSettings,
)
from tests.helpers.engine import ScriptedEngine

CAT = PersonaCatalog.load()
ROSTER = [CAT.get(i) for i in ("empathetic_listener", "anchor", "catalyst", "action_guide", "beacon")]
OPENING = "I failed my driving test for the third time and I feel like an idiot."
PREFIX = Prefix("sit-1#0", "sit-1", OPENING, "ashamed", 1,
                [HistoryTurn("user", OPENING),
                 HistoryTurn("agent", "That sounds really frustrating.", "catalyst",
                             "Agent: The Catalyst\nAction: Ask what went wrong on the test.\nTone: Gentle")])
RULES = DirectorConfig(max_consecutive_turns=2, max_tokens=64, decoding={"temperature": 1.0, "top_p": 1.0})
SPEAKER_LINE = "Failing a test three times does not make you an idiot."


def runner(tok, rules=RULES, n=1) -> RolloutRunner:
    eng = ScriptedEngine(lambda p_: "unused", lambda p_: SPEAKER_LINE)
    return RolloutRunner(eng, tok, ROSTER, RolloutSettings(suffix_agent_turns=n, user_speak_prob=0.0,
                                                           max_consecutive_turns=2, speaker_max_tokens=16,
                                                           director_rules=rules))


@pytest.fixture(scope="module")
def policy(real_model_dir):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(2)
    tok = AutoTokenizer.from_pretrained(real_model_dir)
    model = AutoModelForCausalLM.from_pretrained(real_model_dir, dtype=torch.float32)
    return PolicyDirector(model, tok, max_tokens=64, temperature=1.0, top_p=1.0)


@pytest.mark.integration
@pytest.mark.slow
def test_the_real_model_writes_served_directives_under_the_grammar_and_not_free(policy):
    recent, choosable = choosable_personas(ROSTER, PREFIX.history, RULES)
    assert recent == {"catalyst"} and "catalyst" not in {c.id for c in choosable}
    regex = decision_regex(ROSTER, choosable, PREFIX.history, RULES)
    verbs = action_verbs(PREFIX.history, RULES.fresh_verbs)
    assert "Ask" not in verbs  # the Catalyst's Action opened with it

    served = runner(policy.tokenizer)
    rs = [Rollout(PREFIX, i, i) for i in range(8)]
    for r in rs:
        served.start(r)
    outs = served.policy_decisions(policy, rs, seed=1)
    for o in outs:
        # the serving grammar held: three lines, a choosable persona, a fresh verb, tone words of that persona
        assert o.stopped and re.fullmatch(regex, o.text), o.text
        agent, action, tone = o.text.strip("\n").split("\n")
        assert agent.removeprefix("Agent: ") not in ("The Catalyst", "Catalyst")
        assert any(action.startswith(f"Action: {v} ") for v in verbs), action
        own = set(tone_words(CAT.get(match_persona(agent.removeprefix("Agent: "), ROSTER))))
        assert set(re.findall(r"[a-z]+", tone.removeprefix("Tone: ").lower())) - {"and"} <= own, tone
        # a choice per generated token; at least the persona name, the Action's words and the stop were chosen,
        # and some template token was forced
        assert len(o.choices) == len(o.token_ids) and 0 < sum(o.choices) < len(o.choices)
    valid = [o for o in outs if o.directive is not None]
    assert len(valid) >= 6, [(o.text, o.error) for o in outs]  # the content rules may refuse a few

    free = runner(policy.tokenizer, rules=None)
    fr = [Rollout(PREFIX, i, i) for i in range(8)]
    for r in fr:
        free.start(r)
    free_outs = free.policy_decisions(policy, fr, seed=1)
    assert all(o.choices is None for o in free_outs)
    assert sum(o.directive is not None for o in free_outs) <= 2, [o.text for o in free_outs]


@pytest.mark.integration
@pytest.mark.slow
async def test_a_rollout_puts_no_loss_on_forced_tokens(policy):
    served = runner(policy.tokenizer, n=2)
    r = Rollout(PREFIX, 0, 3)
    await served.run([r], served.policy_decider(policy, seed=5))
    assert not r.invalid and len(r.personas) == 2 and r.personas[0] != "catalyst"
    assert len(r.env_mask) == len(r.completion_ids)
    # the directive tokens are the rollout's only loss-bearing tokens, and among them exactly the grammar's choices
    tok = policy.tokenizer
    text = tok.decode(r.prompt_ids + r.completion_ids, skip_special_tokens=False)
    assert text.count(SPEAKER_LINE) == 1  # the first reply sits between the two directives, with env_mask 0
    forced = [t for t, m in zip(r.completion_ids, r.env_mask) if m == 0]
    assert SPEAKER_LINE in tok.decode(forced, skip_special_tokens=False)
    assert 0 < sum(r.env_mask) < len(r.env_mask)


class ScriptedPolicy:
    """A director policy that writes the given directives (under whatever grammar it is handed, which it records)."""

    def __init__(self, tok, texts):
        self.tok, self.texts, self.stop_ids, self.regexes = tok, texts, [tok.eos_token_id], []

    def sample(self, sequences, seed, regexes=None):
        self.regexes.append(regexes)
        out = []
        for text in self.texts[:len(sequences)]:
            ids = self.tok(text, add_special_tokens=False)["input_ids"] + [self.tok.eos_token_id]
            out.append((ids, [1] * len(ids)))
        return out


def test_serving_rules_refuse_what_a_served_first_attempt_could_not_be(tiny_model_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    texts = ["Agent: The Anchor\nAction: Ask what part of the test felt hardest today.\nTone: Warm",
             f"Agent: The Beacon\nAction: {CAT.get('beacon').goal}\nTone: Warm",             # the card's goal
             "Agent: The Anchor\nAction: Tell them I failed my test too once.\nTone: Calm",    # speaks as "I"
             "Agent: The Catalyst\nAction: Ask which road they found hardest to drive.\nTone: Calm"]  # resting
    run = runner(tok)
    rs = [Rollout(PREFIX, i, i) for i in range(4)]
    for r in rs:
        run.start(r)
    pol = ScriptedPolicy(tok, texts)
    outs = run.policy_decisions(pol, rs, seed=0)
    # every sequence was handed serving's grammar for this turn: the resting Catalyst is not in it
    (regexes,) = pol.regexes
    assert len(regexes) == 4 and all("Catalyst" not in x and "Anchor" in x for x in regexes)
    assert outs[0].directive is not None and outs[0].directive.persona_id == "anchor"
    assert outs[1].directive is None and "a helper's goal" in outs[1].error
    assert outs[2].directive is None and "not speak to the person" in outs[2].error
    assert outs[3].directive is None and "spoke in the last" in outs[3].error
    # free, the same answers are only parsed: the copy, the "I" and the resting persona pass (the cap allows them)
    free = runner(tok, rules=None)
    pol_free = ScriptedPolicy(tok, texts)
    pol_free.generate = lambda seqs, seed: [ids for ids, _ in pol_free.sample(seqs, seed)]
    assert collections.Counter(o.directive is not None for o in free.policy_decisions(pol_free, rs, 0))[True] == 4
    assert pol_free.regexes == [None]


def test_serving_sampling_with_the_vllm_backend_is_refused_with_a_way_out():
    from mascot_training.collaborative.config import CollaborativeConfig, validate

    cfg = CollaborativeConfig(director_grpo={"generation": {"backend": "vllm"}})
    problems = validate(cfg)
    assert any("director.sampling: serving" in p and "sampling: free" in p for p in problems), problems
    cfg = CollaborativeConfig(director={"sampling": "free"}, director_grpo={"generation": {"backend": "vllm"}})
    assert not any("director.sampling" in p for p in validate(cfg))


# ------------------------------------------------------------------------- persona-balanced warm start


class PersonaScriptedPolicy:
    """A director policy that writes, for the one persona its grammar allows, that persona's next scripted text
    (scripts per persona name; the last one repeats), recording each draw's persona."""

    def __init__(self, tok, scripts):
        self.tok, self.scripts, self.stop_ids, self.draws = tok, scripts, [tok.eos_token_id], []

    def sample(self, sequences, seed, regexes=None):
        out = []
        for regex in regexes:
            (name,) = [n for n in self.scripts if n in regex]  # the grammar names exactly one persona
            k = sum(1 for d in self.draws if d == name)
            self.draws.append(name)
            text = self.scripts[name][min(k, len(self.scripts[name]) - 1)]
            ids = self.tok(text, add_special_tokens=False)["input_ids"] + [self.tok.eos_token_id]
            out.append((ids, [1] * len(ids)))
        return out


def test_persona_rows_give_every_choosable_persona_one_served_directive(tiny_model_dir):
    from transformers import AutoTokenizer

    from mascot.director.prompts import build_messages
    from mascot_training.collaborative.director_warm_start import persona_rows

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    goal = CAT.get("anchor").goal
    scripts = {
        "Empathetic Listener": ["Agent: The Empathetic Listener\nAction: Name the shame they feel about the test."
                                "\nTone: Warm"],
        # refused twice (a copy of the card's goal, then speaking as "I"), served at the third draw
        "Anchor": [f"Agent: The Anchor\nAction: {goal}\nTone: Calm",
                   "Agent: The Anchor\nAction: Tell them I failed my test too once.\nTone: Calm",
                   "Agent: The Anchor\nAction: Help them slow down and breathe before they judge the test."
                   "\nTone: Calm"],
        "Action Guide": ["Agent: The Action Guide\nAction: Suggest one thing to practise before the next test."
                         "\nTone: Practical"],
        # refused on every draw
        "Beacon": [f"Agent: The Beacon\nAction: {CAT.get('beacon').goal}\nTone: Warm"],
        "Catalyst": ["Agent: The Catalyst\nAction: Ask which road they found hardest to drive.\nTone: Calm"],
    }
    pol = PersonaScriptedPolicy(tok, scripts)
    opening = Prefix("sit-2#0", "sit-2", "My sister forgot my birthday.", "sad", 0,
                     [HistoryTurn("user", "My sister forgot my birthday.")])
    rows, fig = persona_rows(runner(tok), pol, [PREFIX, opening], tries=3, seed=0)
    # PREFIX: the Catalyst rests, so four personas are asked for; the opening: all five
    assert fig["decisions"] == 9
    # draw 1: 9 draws; the Anchor's first two scripted texts are refused (one per prefix), the Beacon's always.
    # Draw 2: the two Anchors (now at the served text) and the two Beacons; draw 3: the two Beacons.
    assert fig["per_persona"] == {"empathetic_listener": 2, "anchor": 2, "catalyst": 1, "action_guide": 2,
                                  "beacon": 0}
    assert fig["rows"] == len(rows) == 7 and fig["draws"] == 9 + 4 + 2
    assert sum(fig["refused"].values()) == fig["draws"] - fig["rows"]
    first = [r for r in rows if r["prompt"] == build_messages(ROSTER, PREFIX.history, PREFIX.context, 2)]
    assert [r["persona_id"] for r in first] == ["empathetic_listener", "anchor", "action_guide"]
    assert first[1]["completion"] == [{"role": "assistant", "content": scripts["Anchor"][2]}]
    with pytest.raises(ValueError, match="sampling: serving"):
        persona_rows(runner(tok, rules=None), pol, [PREFIX], tries=1, seed=0)
    r = Rollout(PREFIX, 0, 0)
    runner(tok).start(r)
    with pytest.raises(ValueError, match="2 agents for 1 rollouts"):
        runner(tok).policy_decisions(pol, [r], 0, [ROSTER[0], ROSTER[1]])
    with pytest.raises(ValueError, match="needs serving's grammar"):
        runner(tok, rules=None).policy_decisions(pol, [r], 0, [ROSTER[0]])


@pytest.mark.integration
@pytest.mark.slow
def test_the_real_model_gives_every_choosable_persona_a_served_directive(policy):
    from mascot.director.decide import check_decision
    from mascot.director.directive import parse_directive
    from mascot_training.collaborative.director_warm_start import persona_rows

    rows, fig = persona_rows(runner(policy.tokenizer), policy, [PREFIX], tries=4, seed=0)
    print(fig, [r["completion"][0]["content"] for r in rows])
    assert fig["per_persona"] == {"empathetic_listener": 1, "anchor": 1, "catalyst": 0, "action_guide": 1,
                                  "beacon": 1}
    recent, choosable = choosable_personas(ROSTER, PREFIX.history, RULES)
    for row in rows:
        d = parse_directive(row["completion"][0]["content"], ROSTER)
        assert d.persona_id == row["persona_id"]
        check_decision(d, ROSTER, recent, choosable, PREFIX.history, RULES, [c.name for c in ROSTER])



def test_grouped_order_keeps_each_decisions_personas_together_and_shuffles_the_decisions():
    from mascot_training.collaborative.director_warm_start import grouped_order

    rows = [{"prompt": [{"role": "user", "content": f"p{p}"}], "completion": [], "persona_id": f"{p}-{k}"}
            for p, n in ((0, 3), (1, 5), (2, 4), (3, 4)) for k in range(n)]  # 16 rows of 4 decisions
    out = grouped_order(rows, 40, seed=7)
    assert len(out) == 40
    ids = [r["persona_id"] for r in out]
    # every decision's rows come side by side, in their order, in each pass over the 16 rows
    for k in range(2):
        passed = ids[16 * k:16 * (k + 1)]
        assert sorted(passed) == sorted(r["persona_id"] for r in rows)
        starts = [i for i, a in enumerate(passed) if a.endswith("-0")]
        for i in starts:
            p = passed[i].split("-")[0]
            n = sum(r["persona_id"].startswith(f"{p}-") for r in rows)
            assert passed[i:i + n] == [f"{p}-{j}" for j in range(n)]
    passes = [[a.split("-")[0] for a in ids[16 * k:16 * (k + 1)] if a.endswith("-0")] for k in range(2)]
    assert passes[0] != passes[1]  # the decisions are shuffled again for each pass
    assert grouped_order(rows, 40, seed=7) == out
    assert [r["persona_id"] for r in grouped_order(rows, 40, seed=8)] != ids
    assert len(grouped_order(rows, 5, seed=0)) == 5
    with pytest.raises(ValueError, match="positive total"):
        grouped_order(rows, 0, seed=0)
    with pytest.raises(ValueError, match="needs rows"):
        grouped_order([], 3, seed=0)
