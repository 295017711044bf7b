"""Golden files for prompt assembly (reviewed by hand; regenerate with MASCOT_UPDATE_GOLDEN=1 and review the diff),
and the visible-text filter (think split, tags, whitespace)."""

import json
import os
from pathlib import Path

import pytest

from mascot.core.dialogue import HistoryTurn
from mascot.core.personas import PersonaCatalog
from mascot.core.personas.personality import personality_text
from mascot.director.prompts import build_messages
from mascot.speaker.prompts import VisibleTextFilter, build_persona_messages, build_user_sim_messages, stop_strings

GOLDEN = Path(__file__).resolve().parents[1] / "golden"
CAT = PersonaCatalog.load()
ROSTER = [CAT.get(i) for i in ("anchor", "catalyst", "beacon")]
NAMES = {c.id: c.name for c in ROSTER}
HISTORY = [HistoryTurn("user", "I failed my driving test again."),
           HistoryTurn("agent", "That sounds really discouraging.", "anchor"),
           HistoryTurn("agent", "What do you think went differently this time?", "catalyst"),
           HistoryTurn("user", "I panicked at the roundabout.")]


def check(name, messages):
    path = GOLDEN / f"{name}.json"
    text = json.dumps(messages, indent=2, ensure_ascii=False) + "\n"
    if os.environ.get("MASCOT_UPDATE_GOLDEN") == "1":
        path.write_text(text)
    assert text == path.read_text(), f"{name} prompt changed; review and update tests/golden/{name}.json"


def test_director_prompt_golden():
    check("director", build_messages(ROSTER, HISTORY, [], 2))


DIRECTED = [HistoryTurn("user", "I failed my driving test again."),
            HistoryTurn("agent", "That sounds really discouraging.", "anchor",
                        "Agent: The Anchor\nAction: Validate the disappointment.\nTone: Warm"),
            HistoryTurn("agent", "What do you think went differently this time?", "catalyst",
                        "Agent: The Catalyst\nAction: Ask what changed.\nTone: Curious"),
            HistoryTurn("user", "I panicked at the roundabout.")]


def test_director_prompt_with_directives_golden():
    msgs = build_messages(ROSTER, DIRECTED, [("Meeting", "Budget is fixed.")], 2)
    check("director_directed", msgs)
    # the director's own directives are its assistant turns; the turns since each follow as a user message
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "user", "assistant", "user"]
    assert msgs[2]["content"] == DIRECTED[1].directive
    assert msgs[1]["content"].startswith("Meeting transcript:")
    assert "Meeting transcript" not in msgs[3]["content"]
    assert msgs[5]["content"].startswith("Since then:\nThe Catalyst: What do you think")
    assert "User: I panicked at the roundabout." in msgs[5]["content"]


def test_director_prompt_extends_previous_decision():
    """Decision t+1's rendered prompt = decision t's prompt + its answer + end token + the turns since."""
    from mascot.core.engine.tiny import CHAT_TEMPLATE
    from jinja2 import Template

    def render(m, gen=True):
        return Template(CHAT_TEMPLATE).render(messages=m, add_generation_prompt=gen)

    for k in range(1, len(DIRECTED)):
        if DIRECTED[k].role != "agent":
            continue
        before = render(build_messages(ROSTER, DIRECTED[:k], [], 2))
        after = render(build_messages(ROSTER, DIRECTED[:k + 1], [], 2))
        assert after.startswith(before + DIRECTED[k].directive + "<|im_end|>"), k


def test_director_retry_prompt_golden():
    check("director_retry", build_messages(ROSTER, HISTORY[:1], [("Meeting", "Budget is fixed.")], 2,
                                           failed=[("Agent: Bob", "'Bob' is not one of the agents")]))


def test_persona_prompt_golden():
    msgs = build_persona_messages(CAT.get("catalyst"), HISTORY, [], "Reframe the panic.", "Curious", NAMES)
    check("speaker_catalyst", msgs)
    # a plain chat: the person's turns are user messages, every agent turn an assistant one, no speaker tags; the
    # directive ends the system text
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "assistant", "user"]
    assert msgs[0]["content"].endswith("Your task now: Reframe the panic. Tone: Curious.")
    assert not any(m["content"].startswith(("User:", "The Anchor:")) for m in msgs[1:])


def test_user_simulator_prompt_golden():
    msgs = build_user_sim_messages("I failed my driving test.", "ashamed", personality_text(mbti="infp"),
                                   HISTORY, [], NAMES)
    check("user_simulator", msgs)


def test_personality_texts():
    assert personality_text(big_five={"openness": "high", "agreeableness": "low"}).count(".") == 2
    assert personality_text() == ""
    for bad in ({"mbti": "ABCD"}, {"mbti": "INF"}, {"big_five": {"openness": "mid"}}):
        with pytest.raises(ValueError):
            personality_text(**bad)


def run_filter(chunks, own="The Anchor", foreign=("User", "The Beacon")):
    f = VisibleTextFilter(own_tag=own, foreign_tags=list(foreign))
    out = [f.feed(c) for c in chunks] + [f.feed("", final=True)]
    return f, "".join(out)


@pytest.mark.parametrize("chunks", [["<think>plan</think>\nHello there."],
                                    ["<th", "ink>pl", "an</thi", "nk>Hel", "lo there."],
                                    list("<think>plan</think> Hello there.  ")])
def test_think_split_in_any_chunking(chunks):
    f, streamed = run_filter(chunks)
    assert (f.think, f.visible, streamed) == ("plan", "Hello there.", "Hello there.")


def test_own_tag_stripped_and_foreign_tag_cuts():
    f, streamed = run_filter(["The Anchor: I am ", "here."])
    assert streamed == f.visible == "I am here."
    f, streamed = run_filter(["User: I feel", " better"])
    assert streamed == "" and f.truncated
    f, streamed = run_filter(["Plain reply"])
    assert streamed == "Plain reply" and not f.truncated


def test_unclosed_think_yields_no_visible_text():
    f, streamed = run_filter(["<think>never closed"])
    assert streamed == "" and f.think == "never closed"


MID_REPLY = {
    # raw reply -> (visible, think): tags later in a reply never reach the user
    "think-block-mid-reply": ("Hello there <think>secret plan</think> friend.", "Hello there friend.", "secret plan"),
    "stray-close-tag": ("Valid</think>tionale", "Validtionale", ""),
    "unclosed-open-tag": ("I hear you.<think> and then my private reasoning", "I hear you.", "and then my private "
                          "reasoning"),
    "two-blocks": ("<think>a</think>One <think>b</think>two</think> three", "One two three", "a\nb"),
    "partial-tag-at-end": ("Almost done <thi", "Almost done <thi", ""),
}


@pytest.mark.parametrize("step", [1, 2, 3, 5, 1000], ids=lambda n: f"{n}-char-deltas")
@pytest.mark.parametrize("raw, visible, think", list(MID_REPLY.values()), ids=list(MID_REPLY))
def test_think_tags_anywhere_are_never_visible(raw, visible, think, step):
    f, streamed = run_filter([raw[i:i + step] for i in range(0, len(raw), step)])
    assert (streamed, f.visible, f.think) == (visible, visible, think)


def test_stop_strings_cover_other_tags():
    assert stop_strings("The Anchor", ["The Anchor", "The Beacon"]) == ("\nUser:", "\nDirector:", "\nThe Beacon:")
