"""The baselines' step loop: a step the reply checks refuse whole is generated again before the user speaks (as the
product's speakers regenerate a refused reply), refusals after the last delivered turn stay with the dialogue, and
the prompting baselines' group turns go round the whole roster."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest

from mascot.core.engine import regex_escape
from mascot.core.personas import PersonaCatalog
from mascot.core.situations import Situation
from mascot.eval import baselines
from mascot.eval.assemble import reply_check_counts
from mascot.eval.baselines import BaselineContext, group_order, run_baseline


@pytest.fixture(scope="module")
def roster():
    return PersonaCatalog.load().in_set("support")


class GroupEngine:
    """Writes a group turn in the order the request's constraint names the personas; ``bad_calls`` of the first
    calls write lines the test's checks refuse."""

    supports_structured_output = True
    max_context_tokens = 100_000

    def __init__(self, roster, bad_calls: int = 0) -> None:
        self.roster, self.bad_calls, self.calls = roster, bad_calls, []

    def render_chat(self, messages, **_):
        return "\n".join(m["content"] for m in messages)

    def count_tokens(self, text: str) -> int:
        return len(text.split())

    def names(self, request):
        """The personas the request's constraint names, in its order."""
        rx = request.structured.regex
        return sorted((c for c in self.roster if regex_escape(c.name) in rx), key=lambda c: rx.index(
            regex_escape(c.name)))

    async def generate(self, request):
        names = self.names(request)
        bad = len(self.calls) < self.bad_calls
        self.calls.append(request)
        text = "\n".join(f"{c.name}: {'BAD' if bad else 'Fine'} reply {len(self.calls)} of {c.id}."
                         for c in names)
        return SimpleNamespace(text=text, finish_reason="stop")


class UserStub:
    """The simulated user's SpeakerService: one fixed line per call."""

    def __init__(self) -> None:
        self.calls = 0

    def GenerateReply(self, request, timeout=None):
        self.calls += 1
        n = self.calls

        async def events():
            yield SimpleNamespace(HasField=lambda f: f == "final", final=SimpleNamespace(text=f"User line {n}."))

        return events()


def _ctx(roster, engine, attempts=3):
    return BaselineContext(engine=engine, speaker=UserStub(), roster=list(roster), supporter=None, agent_turns=3,
                           user_speak_prob=0.0, max_tokens=32, temperature=0.7, sft_adapter=None, embedder=None,
                           mode="support", step_attempts=attempts)


SIT = Situation(id="s1", situation="My dog got sick.", emotion="sad", opening="My dog got sick last night.",
                split="negative")


@pytest.fixture()
def refuse_bad(monkeypatch):
    def checked(ctx, pid, text, turns, finish_reason="stop"):
        return ("", "loop") if "BAD" in text else (text, "")

    monkeypatch.setattr(baselines, "_checked", checked)


async def test_a_refused_step_is_generated_again_before_the_user_speaks(roster, refuse_bad):
    eng = GroupEngine(roster, bad_calls=2)
    ctx = _ctx(roster, eng)
    d = await run_baseline("zero-shot", ctx, SIT, seed=11)
    roles = [t["role"] for t in d["turns"]]
    assert roles == ["user", "agent", "agent", "agent"]  # no user turn forced in by the refused attempts
    assert len(eng.calls) == 3 and ctx.speaker.calls == 0
    seeds = [c.sampling.seed for c in eng.calls]
    assert len(set(seeds)) == 3  # each attempt samples anew
    # sampled as the speakers sample (ReplySampling's defaults = the speaker and guard config defaults), the
    # repetition penalty rising by one step per regeneration
    assert [c.sampling.repetition_penalty for c in eng.calls] == pytest.approx([1.0, 1.1, 1.2])
    assert {(c.sampling.top_p, c.sampling.frequency_penalty, c.sampling.temperature) for c in eng.calls} == {
        (0.9, 0.3, 0.7)}
    first = d["turns"][1]
    assert [r["attempt"] for r in first["rejections"]] == [0, 0, 0, 1, 1, 1]
    assert "rejections" not in d


async def test_a_step_refused_on_every_attempt_counts_and_its_refusals_are_kept(roster, refuse_bad):
    eng = GroupEngine(roster, bad_calls=99)
    d = await run_baseline("zero-shot", _ctx(roster, eng, attempts=2), SIT, seed=11)
    assert [t["role"] for t in d["turns"]] == ["user", "user", "user"]  # two empty steps end it
    assert len(eng.calls) == 4  # 2 steps x 2 attempts
    assert len(d["rejections"]) == 12  # 3 lines per attempt
    counts = reply_check_counts([d])
    assert counts["rejections"] == {"loop": 12} and counts["agent_turns"] == 0


async def test_group_turns_go_round_the_roster(roster, refuse_bad):
    ids = [c.id for c in roster]
    assert [c.id for c in group_order(roster, 3)] == ids[3:] + ids[:3]
    assert group_order(roster, len(roster) + 1) == group_order(roster, 1)
    seen = set()
    for seed in range(12):
        eng = GroupEngine(roster)
        ctx = _ctx(roster, eng)
        ctx.agent_turns = 7
        d = await run_baseline("few-shot", ctx, SIT, seed=seed)
        spoke = [t["persona_id"] for t in d["turns"] if t["role"] == "agent"]
        start = random.Random(f"{seed}:order").randrange(len(roster))
        # one cycle through the roster from the dialogue's drawn start, across group turns
        assert spoke == [ids[(start + i) % len(ids)] for i in range(7)], (seed, spoke)
        seen.add(spoke[0])
    assert len(seen) >= 3  # the first speaker varies between dialogues


class CappedEngine(GroupEngine):
    """Writes each persona's line as one finished sentence followed by words up to the constraint's character cap
    (as the grammar closes a line that fills it, mid-word), the last line of the turn ending normally."""

    async def generate(self, request):
        names = self.names(request)
        self.calls.append(request)
        lines = []
        for k, c in enumerate(names):
            head = f"That sounds really hard for you, {c.id} here."
            if k < len(names) - 1:
                body = (" " + head + " Something else about the dog and the vet and the long night").ljust(
                    baselines.LINE_CHARS + 40, "x")[:baselines.LINE_CHARS]
            else:
                body = " " + head + " The vet will know what to do next."
            lines.append(f"{c.name}:{body}")
        return SimpleNamespace(text="\n".join(lines), finish_reason="stop")


async def test_a_line_cut_at_the_character_cap_loses_its_unfinished_sentence(roster):
    ctx = _ctx(roster, CappedEngine(roster))
    out = await run_baseline("zero-shot", ctx, SIT, seed=3)
    agent = [t for t in out["turns"] if t["role"] == "agent"]
    assert len(agent) == 3
    capped, last = agent[:2], agent[2]
    for t in capped:  # the finished first sentence is kept, the cut one dropped
        assert t["text"] == f"That sounds really hard for you, {t['persona_id']} here.", t["text"]
        assert t["cut_reason"] == "unfinished"
    assert last["text"].endswith("The vet will know what to do next.") and last["cut_reason"] == ""


def test_a_whole_reply_cut_by_its_token_budget_drops_the_unfinished_tail():
    from mascot.core.guard import GuardSettings, ReplyContext, cut_back

    rctx = ReplyContext(sources=[""], earlier=[], tags=["User"])
    text = "I am sorry your dog is sick. Dogs often recover well when the vet sees th"
    assert cut_back(text, rctx, GuardSettings(), "length") == ("I am sorry your dog is sick.", "unfinished")
    delivered, _ = cut_back(text, rctx, GuardSettings(), "stop")
    assert delivered.endswith("sees th")


class OutOfTokensEngine(GroupEngine):
    """Writes the first persona's line whole (no final punctuation), then ``tail`` for the second persona before
    the token budget runs out (``finish_reason="length"``); a step that asks for one line gets it whole."""

    def __init__(self, roster, tail: str) -> None:
        super().__init__(roster)
        self.tail = tail

    async def generate(self, request):
        names = self.names(request)
        self.calls.append(request)
        if len(names) == 1:  # a later step that needs one more line: written whole
            return SimpleNamespace(text=f"{names[0].name}: Fine reply of {names[0].id}.", finish_reason="stop")
        first = f"{names[0].name}: I am here with you {names[0].id} and I am listening"
        return SimpleNamespace(text=f"{first}\n{names[1].name}:{self.tail}", finish_reason="length")


@pytest.mark.parametrize("tail, second, refused", [
    (" That must hurt a lot. Tell me what the vet sa", "That must hurt a lot.", []),  # cut inside: tail dropped
    (" Tell me what the vet sa", None, ["unfinished"]),  # no finished sentence before the cut: refused whole
    ("", None, []),  # cut right after the name: nothing to deliver, and the line before it is whole
])
async def test_a_turn_out_of_tokens_cuts_only_the_reply_it_stopped_in(roster, tail, second, refused):
    ctx = _ctx(roster, OutOfTokensEngine(roster, tail), attempts=1)
    ctx.agent_turns = 2
    out = await run_baseline("zero-shot", ctx, SIT, seed=3)
    agent = [t for t in out["turns"] if t["role"] == "agent"]
    assert len(agent) == 2
    assert agent[0]["text"].endswith("and I am listening") and agent[0]["cut_reason"] == ""
    if second is not None:
        assert agent[1]["text"] == second and agent[1]["cut_reason"] == "unfinished"
    else:  # the next step's line, after the refused (or empty) one
        assert agent[1]["text"].startswith("Fine reply of") and len(ctx.engine.calls) == 2
    assert [r["reason"] for r in agent[1]["rejections"]] == refused


class EscEngine:
    """MultiAgentESC's calls: analysis lines, strategy names, one reply per chosen strategy cut by its token budget
    (``finish_reason="length"``) and judge votes."""

    supports_structured_output = True
    max_context_tokens = 100_000

    def render_chat(self, messages, **_):
        return "\n".join(m["content"] for m in messages)

    def count_tokens(self, text: str) -> int:
        return len(text.split())

    async def generate(self, request):
        rx = request.structured.regex if request.structured else ""
        if rx.startswith("Response"):
            return SimpleNamespace(text="Response 1", finish_reason="stop")
        if rx:
            return SimpleNamespace(text=baselines.ESCONV_STRATEGIES[0], finish_reason="stop")
        if "Write the supporter's next reply" in request.prompt:
            return SimpleNamespace(text="I hear how worried you are. Your dog is lucky to have someone who ca",
                                   finish_reason="length")
        return SimpleNamespace(text="The user is sad about the dog.", finish_reason="stop")


async def test_a_multiagentesc_reply_cut_by_its_token_budget_loses_its_unfinished_sentence():
    from mascot.core.personas import PersonaCatalog as Catalog

    supporter = Catalog.load().get("supporter")
    ctx = BaselineContext(engine=EscEngine(), speaker=UserStub(), roster=[], supporter=supporter, agent_turns=1,
                          user_speak_prob=0.0, max_tokens=32, temperature=0.7, sft_adapter=None, embedder=None,
                          mode="support", step_attempts=1)
    out = await run_baseline("multiagentesc", ctx, SIT, seed=5)
    agent = [t for t in out["turns"] if t["role"] == "agent"]
    assert [t["text"] for t in agent] == ["I hear how worried you are."] and agent[0]["cut_reason"] == "unfinished"


def test_reply_sampling_follows_the_speakers_retry_policy():
    from mascot.core.config import MascotConfig
    from mascot.core.engine import SamplingParams
    from mascot.speaker.reply import RetryPolicy

    cfg = MascotConfig()
    rs = baselines.ReplySampling()
    # its defaults are the product's: a changed speaker or guard default must change both
    assert (rs.top_p, rs.frequency_penalty, rs.repetition_penalty, rs.penalty_step, rs.retry_temperature) == (
        cfg.speaker.top_p, cfg.speaker.frequency_penalty, cfg.speaker.repetition_penalty,
        cfg.guard.retry_penalty_step, cfg.guard.retry_temperature)
    policy = RetryPolicy(max_attempts=3, penalty_step=0.1, retry_temperature=0.7)
    base = SamplingParams(max_tokens=48, temperature=0.0, top_p=0.9, seed=5, frequency_penalty=0.3)
    for attempt in range(3):  # the same repetition penalty and temperature the speakers use on that attempt
        mine, theirs = rs.params(48, 0.0, 5, attempt), policy.sampling(base, attempt)
        assert (mine.repetition_penalty, mine.temperature) == pytest.approx(
            (theirs.repetition_penalty, theirs.temperature))
    assert rs.params(48, 0.0, 5).top_p == 1.0  # greedy first attempt: no nucleus
    assert baselines.ReplySampling(repetition_penalty=9.95).params(8, 0.5, 1, attempt=4).repetition_penalty == 10.0
    for bad in ({"top_p": 0.0}, {"frequency_penalty": 3.0}, {"repetition_penalty": 0.0}, {"penalty_step": -0.1},
                {"retry_temperature": 0.0}):
        with pytest.raises(ValueError):
            baselines.ReplySampling(**bad)


async def test_multiagentesc_samples_its_reply_as_a_speaker_and_its_votes_plainly():
    from mascot.core.personas import PersonaCatalog as Catalog

    eng = EscEngine()
    calls = []
    generate = eng.generate

    async def spy(request):
        calls.append(request)
        return await generate(request)

    eng.generate = spy
    ctx = BaselineContext(engine=eng, speaker=UserStub(), roster=[], supporter=Catalog.load().get("supporter"),
                          agent_turns=1, user_speak_prob=0.0, max_tokens=32, temperature=0.7, sft_adapter=None,
                          embedder=None, mode="support", step_attempts=1,
                          sampling=baselines.ReplySampling(frequency_penalty=0.5))
    await run_baseline("multiagentesc", ctx, SIT, seed=5)
    replies = [c for c in calls if "Write the supporter's next reply" in c.prompt]
    others = [c for c in calls if c not in replies]
    assert replies and others
    assert {c.sampling.frequency_penalty for c in replies} == {0.5}
    assert {c.sampling.frequency_penalty for c in others} == {0.0}
