"""A few turns of real language through the gateway on the default model: the reply checks on (product defaults),
and the fixed defect detectors of the quality bench find nothing in what was delivered."""

import re

import pytest

from mascot.api.conversation.v1 import conversation_pb2 as cpb
from mascot.api.dialogue.v1 import dialogue_pb2 as dpb
from mascot.core.config import DirectorDecoding
from mascot.core.personas import PersonaCatalog
from mascot.director.directive import tone_words
from mascot.eval.defects import analyse
from mascot.app.runjob import transcript_line
from mascot.speaker.prompts import persona_system_prompt
from mascot.app.stack import start_stack
from tests.helpers.config import make_config
from tests.helpers.dialogue import Client
from tests.helpers.rpc import collect

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PRODUCT = {"guard": {"enabled": True},
           "director": {"check_content": True, "rest_turns": 2, "decoding": DirectorDecoding().model_dump()}}


async def test_real_model_self_play_delivers_no_defect(real_engine, real_model_dir, tmp_path):
    stack = await start_stack(make_config(tmp_path, engine={"model": str(real_model_dir)}, **PRODUCT),
                              engine=real_engine)
    client = Client(stack)
    conv = await client.start(persona_ids=["anchor", "catalyst", "beacon"])
    events = await collect(client.stub.RunSelfPlay(cpb.RunSelfPlayRequest(
        conversation_id=conv.id, agent_turns=3, user_speak_prob=0.5, seed=3,
        opening_text="I failed my driving test for the second time and I feel like an idiot.",
        user=dpb.UserSimulation(situation="I failed my driving test again.", emotion="ashamed"))))
    got = await client.get(conv.id, think=True)
    line = transcript_line(got, "support")
    for t in got.conversation.turns[1:]:  # deltas join to the stored text: nothing regenerated was streamed
        streamed = "".join(e.turn_delta.text for e in events
                           if e.HasField("turn_delta") and e.turn_delta.index == t.index)
        assert streamed == t.text
    cards = {c.id: c for c in PersonaCatalog.load().in_set("support")}
    prompts = {i: [persona_system_prompt(c)] for i, c in cards.items()}
    fig = analyse([line], prompts, {i: c.name for i, c in cards.items()})
    assert fig["agent_turns"] >= 2, line
    assert (fig["echoes"], fig["loops"], fig["near_duplicates"], fig["empty"]) == (0, 0, 0, 0), fig["examples"]
    # the Tone under the grammar: words of the speaking persona's own vocabulary only
    tones = [(t.persona_id, t.directive.tone) for t in got.conversation.turns if t.HasField("directive")]
    assert tones and all(set(re.findall(r"[a-z]+", x.lower())) - {"and"} <= set(tone_words(cards[p]))
                         for p, x in tones), tones
    words = [w for t in line["turns"][1:] for w in t["text"].split()]
    assert len(words) >= 20 and sum(w.isalpha() for w in words) / len(words) > 0.7  # English words, not noise
    await client.ch.close()
    await stack.stop(0)


async def test_greedy_director_gives_each_persona_its_default_tone(real_engine):
    """Under the grammar of a decision that must pick one persona, the default model decoding greedily writes that
    persona's default tone: the prompt names it and the grammar offers that persona's words only (with one shared
    vocabulary it wrote "Gentle and calm" for nearly every persona). Greedy ties are close: on one machine the Action
    Guide wrote "Encouraging and supportive" (its own words) instead of its default "Practical and encouraging", so
    one persona may differ from its default within its own words."""
    from mascot.core.config import DirectorConfig
    from mascot.core.dialogue import HistoryTurn
    from mascot.core.engine import GenerationRequest, SamplingParams, StructuredOutput
    from mascot.director.decide import decision_regex
    from mascot.director.directive import parse_directive
    from mascot.director.prompts import fit_messages

    roster = PersonaCatalog.load().in_set("support")
    history = [HistoryTurn("user", "I have been so stressed at work, my boss keeps piling on tasks.")]
    cfg = DirectorConfig()
    msgs = fit_messages(roster, history, [], cfg.max_consecutive_turns, [], real_engine.render_chat,
                        real_engine.count_tokens, real_engine.max_context_tokens - cfg.max_tokens)
    prompt = real_engine.render_chat(msgs)
    got = {}
    for card in roster:
        regex = decision_regex(roster, [card], history, cfg)
        result = await real_engine.generate(GenerationRequest(
            prompt, SamplingParams(max_tokens=cfg.max_tokens, temperature=0.0), structured=StructuredOutput(regex)))
        d = parse_directive(result.text, roster)
        got[d.persona_id] = d.tone
    defaults = {c.id: c.default_tone for c in roster}
    assert set(got) == set(defaults) and len(set(got.values())) == len(roster), got  # a tone of its own each
    for card in roster:  # from the persona's own words (the grammar), most of them its default tone exactly
        assert set(re.findall(r"[a-z]+", got[card.id].lower())) - {"and"} <= set(card.tone_words) | set(
            re.findall(r"[a-z]+", card.default_tone.lower())), (card.id, got[card.id])
    assert sum(got[k] == v for k, v in defaults.items()) >= len(roster) - 1, got
