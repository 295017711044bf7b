"""Phase 1 trains on the text serving would deliver: the sampled candidates pass serving's reply checks, and GRPO
scores each completion on its delivered text (a refusal gets ``persona_grpo.refused_reward``).

Scripted engines stand in for the model (the checks are about text, not about a model); the judge is the metrics
judge on the real MiniLM encoder.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from mascot.core.dialogue import FALLBACK_ACTION, HistoryTurn
from mascot.core.engine import GenerationResult, StreamDelta
from mascot.core.files import read_jsonl
from mascot.core.guard import GuardSettings
from mascot.core.personas import PersonaCatalog
from mascot.speaker.reply import ReplyOutcome, RetryPolicy, persona_reply, served_persona_text
from mascot_training.common.rewards import format_reward
from mascot_training.persona import persona_grpo as pg
from mascot_training.persona.config import GrpoConfig, PersonaAlignmentConfig
from tests.helpers.engine import ScriptedEngine

CAT = PersonaCatalog.load()
ANCHOR = CAT.get("anchor")
ROSTER = CAT.in_set("support")
NAMES = {c.id: c.name for c in ROSTER}
USER = "My landlord says I have to move out by Friday and I have nowhere to go."
HIST = [HistoryTurn("user", USER)]
ECHO = f"I will {ANCHOR.goal[0].lower()}{ANCHOR.goal[1:]}"  # the card's own goal: an echo of the prompt
CLEAN = "That is a frightening deadline. Where could you stay for the first few nights?"
UNFINISHED = "That is a frightening deadline. Who could you call tonight to"


class FinishEngine(ScriptedEngine):
    """A scripted engine whose replies end with a given finish reason (``length``: the token budget)."""

    def __init__(self, speaker, finish: str = "stop") -> None:
        super().__init__(lambda p: "unused", speaker)
        self.finish = finish

    async def stream(self, request):
        async for item in super().stream(request):
            yield replace(item, finish_reason=self.finish) if isinstance(item, GenerationResult) else item


def streamed(text: str, finish: str) -> ReplyOutcome:
    """What serving's streamed, checked persona reply delivers when the model writes ``text`` (one attempt)."""
    eng = FinishEngine(lambda p: text, finish)

    async def go() -> ReplyOutcome:
        out = None
        async for item in persona_reply(eng, ANCHOR, ROSTER, HIST, [], FALLBACK_ACTION, ANCHOR.default_tone,
                                        max_tokens=48, temperature=1.0, top_p=0.95, seed=1, adapter=None,
                                        guard=GuardSettings(min_words=4), policy=RetryPolicy(max_attempts=1)):
            if isinstance(item, ReplyOutcome):
                out = item
        return out

    return asyncio.run(go())


def system_prompt() -> str:
    return pg.prompt_row(ANCHOR, HIST, [], NAMES)["prompt"][0]["content"]


@pytest.mark.parametrize("text, finish", [
    (CLEAN, "stop"),
    (UNFINISHED, "length"),                                                   # the fragment after the budget goes
    (f"The Anchor: {CLEAN}", "stop"),                                         # its own tag is dropped
    (ECHO, "stop"),                                                           # refused: echoes the card
    (f"{CLEAN} {ECHO}", "stop"),                                              # cut at the echo
    ("Take a breath. Take a breath. Take a breath. Take a breath.", "stop"),  # a loop
    ("Action Guide: you should pack tonight.", "stop"),                       # another speaker's tag: nothing
    ("Okay.", "stop"),                                                        # too short
])
def test_served_text_of_a_whole_completion_is_what_the_streamed_reply_delivers(text: str, finish: str) -> None:
    out = streamed(text, finish)
    got, why = served_persona_text(ANCHOR, NAMES, system_prompt(), HIST, text, finish, GuardSettings(min_words=4),
                                   FALLBACK_ACTION, ANCHOR.default_tone)
    assert got == out.text
    assert why == (out.rejections[0]["reason"] if out.rejected else out.cut_reason)


def test_served_text_stops_where_serving_decoding_stops() -> None:
    text = f"{CLEAN}\nUser: thanks, that helps\nThe Anchor: glad to hear"
    got, why = served_persona_text(ANCHOR, NAMES, system_prompt(), HIST, text, "length", GuardSettings(),
                                   FALLBACK_ACTION, ANCHOR.default_tone)
    assert (got, why) == (CLEAN, "")  # cut at the stop sequence, which also ends generation as a stop
    assert served_persona_text(ANCHOR, NAMES, system_prompt(), HIST, ECHO, "stop", GuardSettings(enabled=False),
                               FALLBACK_ACTION, ANCHOR.default_tone) == (ECHO, "")  # checks off: as generated


def call(f, texts: list[str], ids: list[list[int]]) -> list[float | None]:
    """Call a reward function as TRL 1.16 does (conversational prompts and completions, token ids, extra kwargs)."""
    n = len(texts)
    row = pg.prompt_row(ANCHOR, HIST, [], NAMES, group_id="g")
    return f(prompts=[row["prompt"]] * n, completions=[[{"role": "assistant", "content": t}] for t in texts],
             completion_ids=ids, persona_id=["anchor"] * n, history=[row["history"]] * n, context=[[]] * n,
             group_id=["g"] * n, trainer_state=None, log_extra=None, log_metric=None)


def test_grpo_reward_scores_the_delivered_text_and_gives_a_refusal_its_reward() -> None:
    g = GrpoConfig(max_completion_length=12, refused_reward=-3.0, format={"think": False, "l_max": 60})
    seen: list[str] = []

    def rm(texts: list[str]) -> list[float]:
        seen.extend(texts)
        return [0.5] * len(texts)

    f = pg.make_reward_func(None, CAT, g, rm_fn=rm, guard=GuardSettings())
    texts = [CLEAN, ECHO, UNFINISHED, UNFINISHED]
    ids = [[1] * 9, [1] * 9, [1] * 12, [1] * 9]  # the third ran into the budget, the fourth ended on its own
    out = call(f, texts, ids)
    cut = "That is a frightening deadline."
    assert out[0] == pytest.approx(0.5 + format_reward(CLEAN, l_max=60, think=False))
    assert out[1] == -3.0                                            # refused: echoes the card, never scored
    assert out[2] == pytest.approx(0.5 + format_reward(cut, l_max=60, think=False))
    assert out[3] == pytest.approx(0.5 + format_reward(UNFINISHED, l_max=60, think=False))  # a stop: kept whole
    assert len(seen) == 3 and seen[1].endswith(cut) and seen[2].endswith(UNFINISHED)
    assert not any(ECHO in s.rsplit("]\n", 1)[-1] for s in seen)
    assert f.refusals == {"echo": 1} and f.checks
    # a completion whose text is all refused: no RM call at all
    seen.clear()
    assert call(f, [ECHO, "Fine."], [[1], [1]]) == [-3.0, -3.0] and seen == []
    assert f.refusals == {"echo": 2, "short": 1}
    # without checks every completion is scored as generated
    off = pg.make_reward_func(None, CAT, g, rm_fn=rm, guard=GuardSettings(enabled=False))
    assert None not in call(off, texts, ids) and -3.0 not in call(off, texts, ids) and not off.checks


def test_heldout_summary_counts_refusals_before_and_after() -> None:
    m = {"anchor": {"heldout_before": {"reward": 0.5, "refused": 3, "completions": 8},
                    "heldout_after": {"reward": 1.0, "refused": 1, "completions": 8}},
         "beacon": {"heldout_before": {"reward": -0.5, "refused": 2, "completions": 4},
                    "heldout_after": {"reward": 0.25, "refused": 2, "completions": 4}}}
    s = pg.heldout_summary(m)
    assert (s["heldout_refused_before"], s["heldout_refused_after"], s["heldout_completions"]) == (5, 3, 12)
    m["beacon"]["heldout_after"]["refused"] = None  # one persona measured without checks: no total
    assert pg.heldout_summary(m)["heldout_refused_after"] is None


class SeedEngine(ScriptedEngine):
    """Candidate k of group 0 (seed k; a regeneration adds 7919 to the seed): k=0 echoes the card on every
    attempt, k=1 echoes it on its first attempt only, k=2 runs into the token budget mid-sentence, k=3 is clean."""

    def __init__(self) -> None:
        super().__init__(lambda p: "unused", lambda p: "unused")

    async def stream(self, request):
        self.requests.append(request)
        k, attempt = request.sampling.seed % 7919, request.sampling.seed // 7919
        text = {0: ECHO, 1: ECHO if attempt == 0 else CLEAN, 2: UNFINISHED, 3: CLEAN}[k % 97]
        for i in range(0, len(text), 5):
            yield StreamDelta(text[i:i + 5])
        yield GenerationResult(text=text, token_ids=tuple(range(9)), finish_reason="length" if k == 2 else "stop",
                               prompt_tokens=1, adapter="base")


def test_sampled_candidates_are_served_replies_and_refusals_are_not_judged(shared_data, tmp_path) -> None:
    from mascot_training.persona import pairs, sample_candidates, score_candidates

    cfg = PersonaAlignmentConfig(
        personas=["anchor"], data={"situations": shared_data / "empathetic_dialogues" / "test_situations.jsonl",
                                   "limit": 1, "train_fraction": 1.0},
        sample={"k": 4, "max_tokens": 48}, judge={"judges": [{"name": "metrics", "kind": "metrics"}]},
        pairs={"delta": 0.0})
    eng = SeedEngine()
    man = asyncio.run(sample_candidates.run(cfg, tmp_path, engine=eng))
    (row,) = read_jsonl(tmp_path / "sample" / "candidates.jsonl")
    assert row["candidates"] == ["", CLEAN, "That is a frightening deadline.", CLEAN]
    assert row["refused"] == ["echo", "", "", ""] and row["attempts"] == [3, 2, 1, 1]
    assert row["cut"] == ["", "", "unfinished", ""]
    assert [r["reason"] for r in row["rejections"][0]] == ["echo"] * 3
    m = man["metrics"]
    assert (m["refused"], m["refused_by_reason"], m["cut"], m["empty_answers"]) == (1, {"echo": 1}, 1, 0)
    assert m["attempts_per_candidate"] == pytest.approx(4 / 3, abs=1e-3)
    # serving's speaker penalties, and a higher repetition penalty on each regeneration
    assert {r.sampling.frequency_penalty for r in eng.requests} == {0.3}
    assert sorted(r.sampling.repetition_penalty for r in eng.requests if r.sampling.seed % 7919 == 0) == \
        pytest.approx([1.0, 1.1, 1.2])
    asyncio.run(score_candidates.run(cfg, tmp_path, engine=None))
    (j,) = read_jsonl(tmp_path / "judge" / "judgements.jsonl")
    assert j["scores"][0] is None and j["means"][0] is None and all(x is not None for x in j["means"][1:])
    p = pairs.run(cfg, tmp_path)
    assert p["metrics"]["dropped"]["refused"] == 1 and p["metrics"]["dropped"]["unjudged"] == 0
    assert all("" not in (r["chosen"], r["rejected"]) for r in read_jsonl(tmp_path / "pairs" / "pairs.jsonl"))
