"""Phase 2 rollouts with a scripted director and scripted frozen speakers/user: prefix/suffix bookkeeping,
the director token sequence equals the serving prompt, invalid directives end the rollout, role flips drop the
episode, group advantages on a hand-made group through TRL, and zero gradient from speaker and user tokens."""

from __future__ import annotations

import re

import pytest

from dataclasses import replace

from mascot.core.dialogue import HistoryTurn
from mascot.core.engine.base import GenerationResult
from mascot.core.guard import GuardSettings
from mascot.core.personas import PersonaCatalog
from mascot.director.directive import DirectiveError, parse_directive
from mascot.director.prompts import build_messages
from mascot_training.collaborative.simulate import (
    DirectorOutput,
    Prefix,
    Rollout,
    RolloutRunner,
    RolloutSettings,
)
from mascot.speaker.reply import RetryPolicy
from tests.helpers.engine import ScriptedEngine

pytestmark = pytest.mark.integration

CAT = PersonaCatalog.load()
ROSTER = [CAT.get(i) for i in ("anchor", "catalyst", "beacon")]
NAMES = {c.id: c.name for c in ROSTER}
PREFIX = Prefix("sit-1#0", "sit-1", "I failed my driving test.", "ashamed", 1,
                [HistoryTurn("user", "I failed my driving test again."),
                 HistoryTurn("agent", "That sounds discouraging.", "anchor",
                             "Agent: The Anchor\nAction: Validate it.\nTone: Warm"),
                 HistoryTurn("user", "I panicked at the roundabout.")])
USER_LINE = "I just freeze whenever a car comes close."
SPEAKER_LINE = "Let us look at that moment together."


def speakers(flip: bool = False):
    def speak(prompt: str) -> str:
        if "You are chatting with a few supportive helpers" in prompt:
            return "It sounds like you are being very hard on yourself." if flip else USER_LINE
        return SPEAKER_LINE
    return speak


@pytest.fixture(scope="module")
def tok(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


def runner(tok, *, p=1.0, n=3, flip=False, cap=2) -> RolloutRunner:
    eng = ScriptedEngine(lambda p_: "unused", speakers(flip))
    return RolloutRunner(eng, tok, ROSTER, RolloutSettings(suffix_agent_turns=n, user_speak_prob=p,
                                                           max_consecutive_turns=cap, speaker_max_tokens=16))


def scripted(tok, script):
    """A DecideFn whose directive text is ``script(rollout, step)``, tokenized + EOS as a policy would emit it."""
    async def decide(active, step):
        outs = []
        for r in active:
            text = script(r, step)
            try:
                d, err = parse_directive(text, ROSTER), ""
            except DirectiveError as e:
                d, err = None, str(e)
            ids = tok(text, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
            outs.append(DirectorOutput(text, d, err, ids, True))
        return outs
    return decide


def directive(name, r, step):
    return f"Agent: {name}\nAction: Step {step} of rollout {r.index}.\nTone: Calm"


def render(tok, history):
    return tok.apply_chat_template(build_messages(ROSTER, history, [], 2), tokenize=False, add_generation_prompt=True)


async def test_prefix_suffix_bookkeeping_and_sequence_equals_serving_prompt(tok):
    run = runner(tok, p=1.0, n=3)
    order = ["The Catalyst", "The Beacon", "The Anchor"]
    r = Rollout(PREFIX, 0, 7)
    await run.run([r], scripted(tok, lambda r_, s: directive(order[s], r_, s)))
    # the prefix is untouched and starts the history; N agent turns, user turns in between do not count
    assert r.history[:3] == PREFIX.history and len(PREFIX.history) == 3
    assert [t.role for t in r.block] == ["agent", "user"] * 3
    assert r.personas == ["catalyst", "beacon", "anchor"] and not r.invalid and not r.dropped
    assert [t.directive for t in r.block if t.role == "agent"] == r.directives
    assert all(t.text == USER_LINE for t in r.block if t.role == "user")
    # the sequence = the serving prompt of the last decision + its directive + EOS
    text = tok.decode(r.prompt_ids + r.completion_ids, skip_special_tokens=False)
    assert text == render(tok, r.history[:-2]) + r.directives[-1] + tok.eos_token
    # director tokens (mask 1) are exactly the directives and their EOS; the rest is speaker/user/template text
    assert len(r.env_mask) == len(r.completion_ids)
    mine = [t for t, m in zip(r.completion_ids, r.env_mask) if m]
    assert tok.decode(mine, skip_special_tokens=False) == "".join(d + tok.eos_token for d in r.directives)
    others = tok.decode([t for t, m in zip(r.completion_ids, r.env_mask) if not m], skip_special_tokens=False)
    # the last turn's reply needs no token; each user line appears in the transcript and is quoted by the next question
    assert others.count(SPEAKER_LINE) == 2 and others.count(USER_LINE) == 4
    rec = r.record()
    assert rec["personas"] == r.personas and rec["prefix_id"] == "sit-1#0" and len(rec["block"]) == 6


async def test_user_speaks_by_a_seeded_bernoulli_draw(tok):
    run = runner(tok, p=0.5, n=4)
    order = ["The Catalyst", "The Beacon"] * 2

    async def users(seed):
        r = Rollout(PREFIX, 0, seed)
        await run.run([r], scripted(tok, lambda r_, s: directive(order[s], r_, s)), sequences=False)
        return [t.role for t in r.block]

    patterns = [await users(s) for s in range(12)]
    assert patterns[3] == await users(3)  # same seed, same draws
    assert all(p.count("agent") == 4 for p in patterns)
    user_counts = {p.count("user") for p in patterns}
    assert len(user_counts) > 1 and 0 < sum(p.count("user") for p in patterns) < 48


async def test_invalid_directive_ends_the_rollout(tok):
    run = runner(tok, p=0.0, n=3)  # no user turn, so the consecutive-turn cap is not reset
    rs = [Rollout(PREFIX, i, i) for i in range(3)]

    def script(r, s):
        if r.index == 0:
            return "Agent: Nobody\nAction: x\nTone: y"  # unknown persona at the first decision
        if r.index == 1 and s == 1:
            return "Who knows"                        # not three lines at the second
        return directive("The Catalyst", r, s)        # the cap (2) forbids a third Catalyst turn in a row
    await run.run(rs, scripted(tok, script))
    assert "not one of the agents" in rs[0].invalid and rs[0].block == []
    assert "exactly three lines" in rs[1].invalid or "every line" in rs[1].invalid
    assert rs[1].personas == ["catalyst"]
    assert "2 turns in a row" in rs[2].invalid and rs[2].personas == ["catalyst", "catalyst"]
    # the rollout's sequence ends with the invalid directive's tokens (they get the -2 advantage)
    assert tok.decode(rs[0].completion_ids, skip_special_tokens=True) == "Agent: Nobody\nAction: x\nTone: y"
    assert all(m == 1 for m in rs[0].env_mask)


async def test_role_flip_drops_the_episode_and_is_counted(tok):
    run = runner(tok, p=1.0, n=3, flip=True)
    rs = [Rollout(PREFIX, i, i) for i in range(2)]
    await run.run(rs, scripted(tok, lambda r, s: directive("The Beacon", r, s)))
    assert all("flipped role" in r.dropped and "supporter phrase" in r.dropped for r in rs)
    assert all(r.personas == ["beacon"] for r in rs)  # dropped right after the first user turn
    assert run.dropped_role_flips == 2
    assert all(t.role == "agent" for r in rs for t in r.block)  # the flipped turn is not kept


class LengthEngine(ScriptedEngine):
    """A scripted engine whose speaker replies all end at the token budget (``finish_reason`` length)."""

    async def stream(self, request):
        async for item in super().stream(request):
            if isinstance(item, GenerationResult):
                item = replace(item, finish_reason="length")
            yield item


def checked_runner(tok, speak, *, p=0.0, n=2, engine_cls=ScriptedEngine):
    eng = engine_cls(lambda p_: "unused", speak)
    return eng, RolloutRunner(eng, tok, ROSTER, RolloutSettings(
        suffix_agent_turns=n, user_speak_prob=p, max_consecutive_turns=2, speaker_max_tokens=16,
        frequency_penalty=0.3, repetition_penalty=1.0, guard=GuardSettings(), retry=RetryPolicy(max_attempts=3)))


async def test_checked_rollouts_drop_the_unfinished_tail_and_use_serving_penalties(tok):
    """With serving's reply checks on, a reply cut at the token budget loses its unfinished last sentence (serving
    never shows it), and the speakers decode with the configured penalties."""
    eng, run = checked_runner(tok, lambda prompt: "That roundabout sounds stressful. What did you notice right before "
                                                  "you froze, and what did you tell", n=1, engine_cls=LengthEngine)
    r = Rollout(PREFIX, 0, 3)
    await run.run([r], scripted(tok, lambda r_, s: directive("The Catalyst", r_, s)), sequences=False)
    assert not r.dropped and [(t.persona_id, t.text) for t in r.block] == [("catalyst",
                                                                             "That roundabout sounds stressful.")]
    assert all(req.sampling.frequency_penalty == 0.3 for req in eng.requests)
    assert run.speaker_replies >= 1 and run.speaker_attempts >= run.speaker_replies


async def test_checked_rollouts_drop_an_episode_whose_speaker_is_refused_on_every_attempt(tok):
    card = CAT.get("catalyst")
    echo = f"I will {card.goal[0].lower()}{card.goal[1:]}"

    def speak(prompt):
        if "You are chatting with a few supportive helpers" in prompt:
            return USER_LINE
        return echo if "You are The Catalyst" in prompt else SPEAKER_LINE if "Step 0" in prompt else \
            "What would help you most right now?"

    eng, run = checked_runner(tok, speak, p=1.0)
    r, ok = Rollout(PREFIX, 0, 1), Rollout(PREFIX, 1, 2)

    def script(r_, s):
        return directive("The Catalyst" if r_.index == 0 else "The Beacon", r_, s)

    # the Catalyst copies its own card on every attempt; the Beacon speaks normally in the other rollout
    await run.run([r, ok], scripted(tok, script), sequences=False)
    assert "refused by the reply checks on every attempt" in r.dropped and "echo" in r.dropped
    assert r.block == [] and run.dropped_refused == 1
    speaker_requests = [q for q in eng.requests if "You are chatting with a few supportive helpers" not in q.prompt]
    catalyst = [q for q in speaker_requests if "You are The Catalyst" in q.prompt]
    # three attempts for the refused turn, each with a higher repetition penalty
    pens = sorted({q.sampling.repetition_penalty for q in catalyst})
    assert len(pens) == 3 and pens[0] == 1.0 and pens[-1] > pens[0]
    assert not ok.dropped and ok.personas == ["beacon", "beacon"]


# ------------------------------------------------------------------------------------------------- through TRL

G = 4
PLANTED = {1: 0.8, 2: 0.2, 3: None}


def hand_made(r, s):
    if r.index == 0:
        return "Agent: Nobody\nAction: x\nTone: y"
    names = {1: ["The Anchor", "The Catalyst"], 2: ["The Anchor", "The Anchor"], 3: ["The Anchor", "The Beacon"]}
    return directive(names[r.index][s], r, s)


def planted_group_reward(items):
    out = []
    for _prefix, block in items:
        i = int(re.search(r"rollout (\d)", block[0].directive).group(1))
        out.append(PLANTED[i])
    return out


@pytest.fixture
def trl_setup(tiny_model_dir, tok, tmp_path):
    import torch

    from mascot_training.collaborative.config import CollaborativeConfig
    from mascot_training.collaborative.director_grpo import LoopThread, RolloutStats, build_trainer

    torch.set_num_threads(1)
    cfg = CollaborativeConfig(phase2={"num_generations": G, "suffix_agent_turns": 2, "user_speak_prob": 1.0},
                              director_grpo={"batch_size": G, "max_steps": 1}, lora={"r": 4, "alpha": 8})
    loop = LoopThread()
    run = runner(tok, p=1.0, n=2)
    stats = RolloutStats()
    trainer = build_trainer(str(tiny_model_dir), {PREFIX.prefix_id: PREFIX}, run, loop, planted_group_reward, cfg,
                            tmp_path, stats, decider_factory=lambda trainer, seed: scripted(tok, hand_made))
    yield trainer, stats
    loop.close()


def test_group_advantages_on_a_hand_made_group(trl_setup):
    """R = [-2 (invalid), 0.8 + 0.5 (brings in the Catalyst, whom the prefix did not hear), 0.2 - 0.5 (the Anchor
    twice, heard in the prefix), None (no group reward)]; TRL normalises within the group ignoring the masked one
    (nanmean, Bessel nanstd, +1e-4) and gives it advantage 0."""
    import statistics

    trainer, stats = trl_setup
    trainer.model.train()
    # TRL 1.16 internal step
    out = trainer._generate_and_score_completions([{"prompt": PREFIX.prefix_id} for _ in range(G)])
    rewards = [-2.0, 1.3, -0.3]
    mean, std = statistics.fmean(rewards), statistics.stdev(rewards)
    expected = [(r - mean) / (std + 1e-4) for r in rewards] + [0.0]
    assert out["advantages"].tolist() == pytest.approx(expected, abs=1e-5)
    assert stats.outcomes == {"invalid": 1, "complete": 3}
    assert stats.failures == {"none": 1}
    assert stats.r_group == [0.8, 0.2] and stats.i_div == [1, -1]


def test_loss_gets_no_gradient_from_speaker_and_user_tokens(trl_setup):
    import torch

    trainer, _ = trl_setup
    model = trainer.model
    model.train()
    inputs = trainer._generate_and_score_completions([{"prompt": PREFIX.prefix_id} for _ in range(G)])
    mask = inputs["completion_mask"] * inputs["tool_mask"]
    assert (inputs["tool_mask"] == 0).any(), "the rollouts must contain speaker/user tokens"
    captured = {}

    def hook(_module, _inp, output):
        output.retain_grad()
        captured["hidden"] = output

    # TRL 1.16 scores with a fused LM head (no logits tensor), so watch the final hidden states instead: the hidden
    # state at position p feeds only the log-prob of token p + 1, after all attention.
    norm = next(m for n, m in model.named_modules() if n.endswith("model.norm"))
    trainer.current_gradient_accumulation_steps = 1  # set by Trainer.train(); one micro-batch here
    handle = norm.register_forward_hook(hook)
    try:
        loss = trainer.compute_loss(model, inputs)
        loss.backward()
    finally:
        handle.remove()
    grad = captured["hidden"].grad.abs().sum(-1)  # [batch, prompt + completion]
    lp = inputs["prompt_ids"].shape[1]
    c = inputs["completion_ids"].shape[1]
    per_tok = grad[:, lp - 1:lp - 1 + c]  # column k: the position whose output predicts completion token k
    assert torch.all(grad[:, :lp - 1] == 0), "a prompt token reached the loss"
    assert torch.all(per_tok[mask == 0] == 0), "a speaker, user or template token reached the loss"
    adv = inputs["advantages"]
    assert (adv.abs() > 1e-6).sum() == 3
    for b in range(mask.shape[0]):
        if adv[b].abs() > 1e-6:
            assert torch.all(per_tok[b][mask[b] == 1] > 0), f"rollout {b}: a director token got no gradient"
        else:
            assert torch.all(per_tok[b] == 0)
    # the masked-out positions hold the speakers' and the user's text
    text = trainer.processing_class.decode(inputs["completion_ids"][1][inputs["tool_mask"][1] == 0].tolist())
    assert SPEAKER_LINE in text and USER_LINE in text


# ------------------------------------------------------------------------------------------------- stages


def _cfg(shared_data, tiny_model_dir, **phase2):
    from mascot_training.collaborative.config import CollaborativeConfig

    return CollaborativeConfig(model=str(tiny_model_dir), personas=["anchor", "catalyst", "beacon"],
                               data={"situations": shared_data / "empathetic_dialogues" / "test_situations.jsonl",
                                     "limit": 3},
                               phase2={"prefix_agent_turns": [1], "suffix_agent_turns": 2,
                                       "group_reward": {"k": 2}, **phase2})


async def test_rollouts_stage_builds_prefixes_and_blocks(tok, tmp_path, shared_data, tiny_model_dir):
    from mascot_training.collaborative import rollouts

    cfg = _cfg(shared_data, tiny_model_dir, user_speak_prob=1.0)
    actions = ["Name one strength you heard.", "Ask what helped them most today.",
               "Invite them to describe that moment.", "Celebrate the effort they put in."]

    def director(prompt):  # a fresh Action per decision of a conversation (the serving director refuses copies)
        return f"Agent: The Beacon\nAction: {actions[prompt.count('Agent: The Beacon') % 4]}\nTone: Warm"

    lines = ["Let us look at that moment together.", "What did the examiner say to you afterwards?",
             "You kept going back, and that persistence counts.", "Which part of the route felt hardest today?",
             "Could a calm practice drive on that road help?", "Feeling ashamed after this makes complete sense."]
    said = {"user": 0, "agent": 0}

    def speak(prompt):  # distinct lines: serving's reply checks (on by default) refuse a copy of an earlier turn
        who = "user" if "You are chatting with a few supportive helpers" in prompt else "agent"
        said[who] += 1
        return (f"I keep thinking about attempt number {said[who]}, honestly." if who == "user"
                else lines[said[who] % len(lines)])

    eng = ScriptedEngine(director, speak)
    m = await rollouts.run(cfg, tmp_path, engine=eng, tokenizer=tok, adapters={}, inputs={"base": "x"})
    assert m["metrics"]["prefixes"] == 3 and m["metrics"]["blocks"] == 6
    assert m["metrics"]["dropped_role_flip"] == {"prefixes": 0, "blocks": 0}
    assert m["metrics"]["dropped_refused"] == {"prefixes": 0, "blocks": 0}
    assert 1.0 <= m["metrics"]["speaker_attempts_per_reply"] < 2.0  # a few first attempts copy an earlier line
    assert all(q.sampling.frequency_penalty == 0.3 for q in eng.requests if "You are the director" not in q.prompt)
    from mascot.core.files import read_jsonl

    pre = [Prefix.from_dict(d) for d in read_jsonl(tmp_path / "rollouts" / "prefixes.jsonl")]
    for p in pre:  # opening, one agent turn by the serving director (its directive kept), the user's answer
        assert [t.role for t in p.history] == ["user", "agent", "user"] and p.k == 1
        assert p.history[1].directive == "Agent: The Beacon\nAction: Name one strength you heard.\nTone: Warm"
        assert p.situation and p.emotion  # for the user simulator only
    rows = read_jsonl(tmp_path / "rollouts" / "blocks.jsonl")
    assert all(len(r["blocks"]) == 2 and all(len(b["personas"]) == 2 and set(b["personas"]) <= {"anchor", "catalyst",
               "beacon"} for b in r["blocks"]) for r in rows), rows[0]
    # the serving director's rest rule (director.rest_turns 2): the prefix's Beacon does not answer the next turn
    assert all(b["personas"][0] != "beacon" for r in rows for b in r["blocks"])
    # resumable: a second call with the same config and inputs returns the same manifest without work
    eng.requests.clear()
    again = await rollouts.run(cfg, tmp_path, engine=eng, tokenizer=tok, adapters={}, inputs={"base": "x"})
    assert again == m and not eng.requests


class _PeakEngine(ScriptedEngine):
    """Counts the generations in flight at once."""

    def __init__(self, *a) -> None:
        super().__init__(*a)
        self.live = self.peak = 0

    async def stream(self, request):
        self.live += 1
        self.peak = max(self.peak, self.live)
        try:
            async for item in super().stream(request):
                yield item
        finally:
            self.live -= 1


async def test_rollouts_stage_runs_prefixes_at_once_with_the_same_rows(tok, tmp_path, shared_data, tiny_model_dir):
    """phase2.rollout_concurrency overlaps prefixes on the engine; the rows (by prefix) are those of one at a time,
    and a finished stage is not redone for another concurrency."""
    from mascot.core.files import read_jsonl
    from mascot_training.collaborative import rollouts

    def director(prompt):
        return f"Agent: The Beacon\nAction: Ask about moment {prompt.count('Agent: The Beacon')}.\nTone: Warm"

    rows, peaks, mans = {}, {}, {}
    for n in (1, 3):
        cfg = _cfg(shared_data, tiny_model_dir, user_speak_prob=1.0, rollout_concurrency=n)
        eng = _PeakEngine(director, speakers())
        mans[n] = await rollouts.run(cfg, tmp_path / str(n), engine=eng, tokenizer=tok, adapters={}, inputs={})
        peaks[n] = eng.peak
        rows[n] = (sorted(read_jsonl(tmp_path / str(n) / "rollouts" / "prefixes.jsonl"), key=lambda d: d["prefix_id"]),
                   sorted(read_jsonl(tmp_path / str(n) / "rollouts" / "blocks.jsonl"), key=lambda d: d["prefix_id"]))
    assert rows[1] == rows[3] and len(rows[1][0]) == 3 and len(rows[1][1]) == 3
    assert peaks[1] <= 2 < peaks[3]  # one prefix: its k = 2 blocks at most; three prefixes overlap
    assert mans[1]["metrics"] == mans[3]["metrics"]
    eng = _PeakEngine(director, speakers())
    cfg = _cfg(shared_data, tiny_model_dir, user_speak_prob=1.0, rollout_concurrency=8)
    again = await rollouts.run(cfg, tmp_path / "1", engine=eng, tokenizer=tok, adapters={}, inputs={})
    assert again == mans[1] and not eng.requests


async def test_rollouts_stage_counts_role_flips(tok, tmp_path, shared_data, tiny_model_dir):
    from mascot_training.collaborative import rollouts

    from mascot.core.config import GuardConfig

    # reply checks off: with them on, serving's user checks refuse the supporter sentence before anyone sees it
    cfg = _cfg(shared_data, tiny_model_dir, user_speak_prob=1.0)
    cfg = cfg.model_copy(update={"guard": GuardConfig(enabled=False)})
    eng = ScriptedEngine(lambda p: "Agent: The Beacon\nAction: Name one strength you heard.\nTone: Warm",
                         speakers(flip=True))
    with pytest.raises(ValueError, match="every prefix was dropped"):
        await rollouts.run(cfg, tmp_path, engine=eng, tokenizer=tok, adapters={}, inputs={})
    from mascot.core.files import read_jsonl

    dropped = read_jsonl(tmp_path / "rollouts.partial" / "dropped.jsonl")
    assert len(dropped) == 3 and not (tmp_path / "rollouts").exists()


def test_judge_group_reward_uses_the_collective_rubric(tiny_model_dir, shared_data):
    """source = judge: (s - 1) / 4 of the local judge's collective mean, per block."""
    from types import SimpleNamespace

    from mascot.core.engine.transformers import TransformersEngine
    from mascot_training.collaborative.director_grpo import LoopThread, judge_group_reward_fn
    from mascot_training.common.judges import build_stage_judges

    loop = LoopThread()
    eng = TransformersEngine(str(tiny_model_dir), max_model_len=2048, batch_wait_ms=2)
    loop.call(eng.start())
    try:
        specs = SimpleNamespace(judge=SimpleNamespace(judges=[{"name": "local"}], max_retries=2),
                                model=str(tiny_model_dir), tiny_dir=tiny_model_dir)
        judges = build_stage_judges(specs, eng, "sqlite://")
        fn = judge_group_reward_fn(judges, ROSTER, loop, timeout_s=120)
        from mascot_training.collaborative.group_rm import judge_blocks

        block = [HistoryTurn("agent", "You did your best.", "anchor"), HistoryTurn("user", "Thanks.")]
        items = [(PREFIX, block), (PREFIX, block[:1])]
        means, _ = loop.call(judge_blocks(judges, ROSTER, items), timeout=120)  # the collective means, 1-5
        assert all(m is not None and 1 <= m <= 5 for m in means)
        assert fn(items) == [pytest.approx((m - 1) / 4) for m in means]
    finally:
        loop.call(eng.close())
        loop.close()


def test_warm_start_rows_clone_every_serving_decision_once(tok):
    from mascot.core.dialogue import history_to_dicts
    from mascot_training.collaborative.director_warm_start import warm_start_rows

    block = [HistoryTurn("agent", "Name one thing you did well.", "beacon",
                         "Agent: The Beacon\nAction: Find a strength.\nTone: Warm"),
             HistoryTurn("user", "I parked well."),
             HistoryTurn("agent", "What happened at the roundabout?", "catalyst",
                         "Agent: The Catalyst\nAction: Explore it.\nTone: Curious")]
    rows = warm_start_rows({PREFIX.prefix_id: PREFIX},
                           [{"prefix_id": PREFIX.prefix_id,
                             "blocks": [{"block": history_to_dicts(block), "dropped": ""},
                                        {"block": history_to_dicts(block[:1]), "dropped": "flipped"}]}],
                           ROSTER, 2)
    # one row for the prefix's directed turn, two for the kept block; the dropped block adds nothing
    assert [r["completion"][0]["content"] for r in rows] == [PREFIX.history[1].directive, block[0].directive,
                                                             block[2].directive]
    assert rows[2]["prompt"] == build_messages(ROSTER, PREFIX.history + block[:2], [], 2)
    assert rows[0]["prompt"] == build_messages(ROSTER, PREFIX.history[:1], [], 2)


async def test_rollout_stops_before_the_model_window(tok):
    """A rollout whose director sequence would pass the window with one more directive stops there (never a
    prompt serving would have to trim)."""
    run = runner(tok, p=0.0, n=3)
    r0 = Rollout(PREFIX, 0, 1)
    run.start(r0)
    first = len(r0.prompt_ids)
    run.s.director_max_tokens = 30
    run.s.max_sequence_tokens = first + 30 + 40  # room for the first directive, not for the turns after it too
    r = Rollout(PREFIX, 0, 1)
    await run.run([r], scripted(tok, lambda r_, s: directive(["The Beacon", "The Anchor", "The Catalyst"][s], r_, s)))
    assert r.window_full and r.personas == ["beacon"] and not r.invalid
    assert r.record()["window_full"] is True


def test_a_resumed_stage_reuses_a_warm_start_only_for_the_same_rows_and_settings(tmp_path):
    import json

    from mascot_training.collaborative.director_grpo import cached_warm_start

    built: list[str] = []

    def build(tag):
        def fn(d):
            d.mkdir(parents=True)
            (d / "adapter_config.json").write_text(json.dumps({"tag": tag}))
            built.append(tag)
            return {"steps": 2, "tag": tag}
        return fn

    assert cached_warm_start(tmp_path, "k1", build("a")) == {"steps": 2, "tag": "a"}
    # a rerun with the same key (a killed stage resumed) keeps the adapter and its figures
    assert cached_warm_start(tmp_path, "k1", build("b")) == {"steps": 2, "tag": "a"} and built == ["a"]
    # other rows or settings: trained again, the old adapter gone
    assert cached_warm_start(tmp_path, "k2", build("c"))["tag"] == "c"
    assert json.loads((tmp_path / "warm_start" / "adapter_config.json").read_text()) == {"tag": "c"}
    # an adapter left without its figures (killed between the two writes, or by older code) is not trusted
    (tmp_path / "warm_start.json").unlink()
    assert cached_warm_start(tmp_path, "k2", build("d"))["tag"] == "d" and built == ["a", "c", "d"]
    (tmp_path / "warm_start.json").write_text("{torn")
    assert cached_warm_start(tmp_path, "k2", build("e"))["tag"] == "e"
