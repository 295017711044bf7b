"""Texts and request shapes several components share come from one home: the meeting-transcript block of every prompt
(mascot.core.formatting), the simulated user's personality (mascot.core.personas.personality) and the JudgeService
requests of the evaluation and training (mascot.judge.requests)."""

from __future__ import annotations

from mascot.api.judge.v1 import judge_pb2 as jpb
from mascot.core.dialogue import HistoryTurn
from mascot.core.formatting import meeting_transcript
from mascot.core.personas import PersonaCatalog
from mascot.core.personas.personality import personality_text
from mascot.director.prompts import build_messages
from mascot.eval import baselines
from mascot.judge.requests import agent_request, collective_request
from mascot.speaker import prompts

CAT = PersonaCatalog.load()
CONTEXT = [("Chair", "Welcome, everyone."), ("Grad B", "The budget is tight.")]


def test_every_prompt_shows_the_meeting_excerpt_the_same_way():
    block = meeting_transcript(CONTEXT)
    assert block == "Meeting transcript:\nChair: Welcome, everyone.\nGrad B: The budget is tight."
    roster = CAT.in_set("meeting")
    history = [HistoryTurn("user", "What was decided?")]
    speaker = prompts.build_persona_messages(roster[0], history, CONTEXT, "Answer.", "Calm", {})
    assert speaker[1] == {"role": "user", "content": block}
    director = build_messages(roster, history, CONTEXT, 2)
    assert director[1]["content"].startswith(block + "\n\n")
    assert baselines._conversation_text(history, {}, CONTEXT).startswith(block + "\n\n")


def test_the_personality_text_has_one_home():
    assert not hasattr(prompts, "personality_text")  # the speaker builds prompts; the text lives in core
    assert personality_text(mbti="intj").startswith("Your personality type is INTJ: you are reserved and reflective")


def test_judge_requests_are_built_in_the_judge_component():
    history = [{"role": "user", "text": "I lost my keys.", "persona_id": None}]
    req = agent_request("j", history, CONTEXT, [("c1", "anchor", "That sounds stressful.")])
    assert (req.rubric, req.judge, len(req.history), req.context[1].content) == (
        jpb.RUBRIC_AGENT, "j", 1, "The budget is tight.")
    assert [(c.candidate_id, c.persona_id, c.text) for c in req.candidates] == [
        ("c1", "anchor", "That sounds stressful.")]
    block = [{"role": "agent", "text": "Let us look together.", "persona_id": "anchor"}]
    req = collective_request("j", history, [], block, ["anchor", "beacon"])
    assert req.rubric == jpb.RUBRIC_COLLECTIVE and list(req.roster_persona_ids) == ["anchor", "beacon"]
    assert req.candidates[0].block[0].persona_id == "anchor"
