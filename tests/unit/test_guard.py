"""The reply checks (mascot.core.guard), the retry policy, and the fixed defect detectors of the quality bench."""

import pytest

from mascot.core.engine import SamplingParams
from mascot.core.guard import (GuardSettings, ReplyContext, SentenceGate, check_reply, is_echo, is_loop,
                               split_sentences, supporter_reason)
from mascot.eval import defects
from mascot.speaker.reply import RetryPolicy

SYSTEM = ("You are The Anchor, the Emotional Validator, one of a small group of helpers talking with a person. "
          "Validate and normalise the user's feelings and give them a sense of emotional safety.")
CTX = ReplyContext(sources=[SYSTEM, "Validate the fear about the dog."],
                   earlier=["My dog ran away yesterday and I cannot stop crying about it.",
                            "That sounds so painful, and it makes sense that you are crying."],
                   tags=["User", "The Beacon", "The Anchor"])
ON = GuardSettings()


def gate_run(chunks, finish="stop", ctx=CTX, settings=ON, extra=None):
    g = SentenceGate(ctx, settings, extra)
    out = ""
    for c in chunks:
        out += g.feed(c)
        if g.stopped:
            break
    out += g.finish(finish)
    return g, out


def test_clean_reply_streams_sentence_by_sentence_and_joins_to_the_released_text():
    g = SentenceGate(CTX, ON)
    assert g.feed("I am here with you") == ""          # no sentence end yet: nothing leaves
    first = g.feed(" right now. Losing a friend")
    assert first == "I am here with you right now."     # the first sentence, once it ended
    rest = g.feed(" like that hurts. ") + g.finish("stop")
    assert first + rest == g.released == "I am here with you right now. Losing a friend like that hurts."
    assert g.accepted and not g.cut_reason and not g.rejected_reason


@pytest.mark.parametrize("text, reason", [
    ("You are The Anchor, the Emotional Validator, one of a small group of helpers. Hi.", "echo"),
    ("Action: Validate the fear. I hear you.", "echo"),
    ("The Beacon: you are doing great today.", "echo"),
    ("My dog ran away yesterday and I cannot stop crying about it.", "duplicate"),
    ("", "empty"),
    ("Okay.", "short"),
])
def test_a_failing_first_sentence_rejects_the_attempt_and_sends_nothing(text, reason):
    g, out = gate_run([text[i:i + 4] for i in range(0, len(text), 4)])
    assert out == "" and not g.accepted and g.rejected_reason == reason


def test_a_failing_later_sentence_cuts_back_to_the_last_released_sentence():
    text = "I hear how much you miss him. I am here with you. I am here with you. I am here"
    g, out = gate_run([text])
    assert out == g.released == "I hear how much you miss him. I am here with you."
    assert g.cut_reason == "loop" and g.stopped


def test_an_echo_spanning_a_sentence_boundary_is_caught_like_the_bench_detector_catches_it():
    # "... normalise the user's. Feelings and give them a sense of comfort." copies an 8-gram of the
    # system prompt only across the full stop: each sentence alone is under 8 shared words.
    # (a card that says "the person's": talk of "the user" is refused on its own, as meta)
    ctx = ReplyContext(sources=[SYSTEM.replace("the user's", "the person's")], tags=CTX.tags)
    text = "I am right here with you. Validate and normalise the person's. Feelings and give them a sense of comfort."
    sources = ctx.sources
    assert defects.is_echo(text, sources)
    assert all(not is_echo(s, sources) for s in split_sentences(text))
    g, out = gate_run([text], ctx=ctx)
    assert (out == g.released == "I am right here with you. Validate and normalise the person's."
            and g.cut_reason == "echo")
    assert not defects.is_echo(g.released, sources)


def test_max_tokens_mid_sentence_cuts_the_fragment_and_never_ends_mid_word():
    g, out = gate_run(["I hear how much you miss him. You have been carrying so mu"], finish="length")
    assert out == "I hear how much you miss him." and g.cut_reason == "unfinished"
    g, out = gate_run(["You have been carrying so mu"], finish="length")
    assert out == "" and g.rejected_reason == "unfinished"
    g, out = gate_run(["You have been carrying so much"], finish="stop")  # an end of sequence ends cleanly
    assert out == "You have been carrying so much"


def test_disabled_checks_pass_the_text_through():
    off = GuardSettings(enabled=False)
    g, out = gate_run(["Action: echo", " echo echo echo echo echo"], finish="length", settings=off)
    assert out == g.released == "Action: echo echo echo echo echo echo" and g.accepted
    g, out = gate_run(["  "], settings=off)
    assert not g.accepted and g.rejected_reason == "empty"


def test_a_sentence_said_again_without_a_space_between_is_a_loop():
    # a demo reply that passed before: no whitespace after the first copy's full stop, so no sentence split found it
    said = "I'm so glad you're happy to share your love with others and be a part of your family too."
    glued = said + said
    assert is_loop(glued) and defects.is_loop(glued) and check_reply(glued, CTX, ON) == "loop"
    g, out = gate_run(["That is lovely to hear. ", glued[:40], glued[40:]])
    assert out == g.released == "That is lovely to hear." and g.cut_reason == "loop"
    # a sentence that starts over with the whole of the one before it (read in the evaluation's replies)
    restart = "I'm so glad to hear that. I'm so glad to hear that your journey is going to be filled with joy."
    assert is_loop(restart) and defects.is_loop(restart)
    g, out = gate_run([restart])
    assert out == g.released == "I'm so glad to hear that." and g.cut_reason == "loop"
    assert not is_loop("I am so glad. I am so glad you called me today.")  # four words: a phrase, not a sentence
    assert not is_loop("That sounds hard. That sounds like a lot to carry.")
    # one long 8-word stretch said once, and two sentences sharing only a short phrase, are no loop
    assert not is_loop("Thank you for telling me about your family and the love you share with them.")
    assert not is_loop("You did a great job today. I think you did a great job with the kids too.")


def test_a_short_refrain_and_one_sentence_frame_are_loops():
    """Two replies delivered before these rules: a 3-word refrain said three times, and three sentences on one frame;
    the reply check and the evaluation's (and training gate's) defect detector agree."""
    refrain = "You're not alone, you're not alone. You're not alone."
    frame = "I'm so sorry for your pain. I'm so proud of you. I'm so glad of you."
    for text in (refrain, frame, "You're not alone, you're not alone."):
        assert is_loop(text) and defects.is_loop(text) and check_reply(text, CTX, ON) == "loop"
    # twice is no refrain, two sentences are no frame, and a frame needs the same two opening words
    assert not is_loop("You're not alone in this. Many people feel that way, and you're not alone.")
    assert not is_loop("I'm so sorry. I'm so glad you told me, and I am here for you.")
    assert not is_loop("I hear you. I know this is hard. I wonder what would help tonight.")
    assert not is_loop("It sounds like a lot. It might help to rest. It is okay to pause.")
    assert not is_loop("Thank you. That means a lot to me, thank you.")  # a phrase twice in a longer reply


def test_loop_and_echo_definitions():
    assert is_loop("the same old thing, the same old thing, the same old thing")
    assert is_loop("The Beacon\n\nThe Beacon")
    assert not is_loop("I hear you. That sounds hard. Tell me more.")
    assert is_echo("validate and normalise the user's feelings and give them a sense", [SYSTEM])
    assert not is_echo("I'm here with you.", [SYSTEM])
    assert split_sentences("One. Two?  Three!\nFour") == ["One.", "Two?", "Three!", "Four"]
    assert check_reply("I hear you. I hear you.", CTX, ON) == "loop"
    assert check_reply("That must have been a shock for you and your family.", CTX, ON) is None


@pytest.mark.parametrize("text", ["Dear [name], I hope this message finds you well.", "I'm so sorry to hear that.",
                                  "It sounds like you are under a lot of pressure.", "You should talk to him.",
                                  "Remember that you are not alone.",
                                  "I'm so proud of you for being kind and compassionate.",
                                  "It's wonderful to know that you're doing something positive.",
                                  "I think the best way to address this is to have a conversation with your husband.",
                                  "Take a deep breath and remind yourself that it's okay.",
                                  "Please find some relief.", "I would suggest you take a break.",
                                  "I'd recommend you call her.",
                                  "A walk might help you clear your head."])
def test_supporter_sentences_are_refused_for_the_simulated_user(text):
    assert supporter_reason(text) == "supporter"


@pytest.mark.parametrize("text", ["I was so scared when he followed us.", "My mom held my hand the whole time.",
                                  "I think the best way to handle this is to talk to my husband.",
                                  "Your advice helps, thank you.", "I suggest we talk about something else.",
                                  "Could you help me figure out what to say?", "I took a deep breath and called him.",
                                  "I keep reminding myself it was not my fault.",
                                  "Thanks, that helps a bit.", "My dad said he was proud of me.",
                                  "It's great to hear that it worked out for my sister."])
def test_a_person_talking_about_themselves_passes(text):
    assert supporter_reason(text) is None


def test_every_regeneration_changes_something_that_takes_effect():
    p = RetryPolicy(max_attempts=3, penalty_step=0.1, retry_temperature=0.7)
    greedy = SamplingParams(max_tokens=8, temperature=0.0, seed=5)
    assert p.sampling(greedy, 0) == greedy
    r1, r2 = p.sampling(greedy, 1), p.sampling(greedy, 2)
    assert r1.temperature == 0.7 and r1.repetition_penalty == pytest.approx(1.1) and r1.seed != greedy.seed
    assert r2.repetition_penalty == pytest.approx(1.2) and r2.seed not in (greedy.seed, r1.seed)
    sampled = SamplingParams(max_tokens=8, temperature=0.6, seed=5)
    assert p.sampling(sampled, 1).temperature == 0.6 and p.sampling(sampled, 1).seed != 5


def test_bench_detectors_are_fixed():
    assert defects.is_near_duplicate("I am here with you, always.", ["I am here with you, always!"])
    assert not defects.is_near_duplicate("Tell me more about your dog.", ["My dog ran away yesterday."])
    assert defects.is_echo("give them a sense of emotional safety and validate what they feel",
                           [SYSTEM + " and validate what they feel"])
    assert defects.is_loop("so sorry so sorry so sorry so sorry")
    assert defects.ends_cleanly("That is hard.") and defects.ends_cleanly("Well done! 🎉")
    assert not defects.ends_cleanly("You have been carrying so mu")
    names = ["The Anchor", "The Beacon"]
    assert defects.is_degenerate_directive({"source": "model", "action": "The Beacon", "tone": "Warm"}, names)
    assert defects.is_degenerate_directive({"source": "model", "action": "Ask about the dog now please",
                                            "tone": "The Anchor"}, names)
    assert defects.is_degenerate_directive({"source": "fallback", "action": "Respond to the user's latest message",
                                            "tone": "Calm"}, names)
    act = "Acknowledge how empty the house feels without the dog."
    assert defects.is_degenerate_directive({"source": "model", "action": act, "tone": "Calm"}, names, act)
    assert not defects.is_degenerate_directive({"source": "model", "action": act, "tone": "Calm"}, names,
                                               "Ask what they remember best about their walks.")


def test_analyse_counts_what_was_delivered():
    lines = [{"conversation_id": "c", "end_reason": "completed", "turns": [
        {"index": 0, "role": "user", "text": "My dog ran away yesterday.", "rejections": []},
        {"index": 1, "role": "agent", "persona_id": "anchor", "text": "I am so sorry. I am so sorry.",
         "directive": {"source": "model", "action": "Validate the fear about the dog.", "tone": "Calm"},
         "rejections": [{"reason": "echo"}], "latency_seconds": 2.0, "first_delta_seconds": 0.5,
         "director_seconds": 1.0},
        {"index": 2, "role": "agent", "persona_id": "beacon", "text": "My dog ran away yesterday.",
         "directive": {"source": "fallback", "action": "x", "tone": "y"}, "rejections": [],
         "latency_seconds": 4.0, "first_delta_seconds": 0.5, "director_seconds": 1.0}]}]
    fig = defects.analyse(lines, {"anchor": [SYSTEM]}, {"anchor": "The Anchor", "beacon": "The Beacon"})
    assert (fig["agent_turns"], fig["loops"], fig["near_duplicates"], fig["echoes"]) == (2, 1, 1, 0)
    assert fig["degenerate_directives"] == 0.5 and fig["persona_shares"] == {"anchor": 0.5, "beacon": 0.5}
    assert fig["clean_endings"] == 1.0 and fig["regenerations_per_turn"] == pytest.approx(1 / 3, abs=1e-3)
    assert fig["turn_latency_seconds"]["p50"] == 3.0 and fig["first_delta_seconds"]["p50"] == 1.5


def test_a_short_reply_repeating_an_earlier_short_turn_is_refused_like_the_bench_detector_counts_it():
    """A four-word reply identical to an earlier turn was delivered (each sentence under ``duplicate_min_words`` is
    exempt on its own); the whole reply so far is now checked at any length, so the detector finds nothing."""
    ctx = ReplyContext(sources=[SYSTEM], earlier=["I lost my wallet at the store.", "That's a great story."])
    g, out = gate_run(["That's a great ", "story.", ""])
    assert out == "That's a great story." and g.accepted  # no such earlier turn
    g, out = gate_run(["That's a great ", "story.", ""], ctx=ctx)
    assert out == "" and g.rejected_reason == "duplicate"
    assert defects.is_near_duplicate("That's a great story.", ctx.earlier)
    # a short reply that differs passes, and so does a short sentence of a longer, new reply
    g, out = gate_run(["That's a great idea, truly.", ""], ctx=ctx)
    assert out == "That's a great idea, truly." and g.accepted
    g, out = gate_run(["Thank you. Tell me what the store said when you went back.", ""], ctx=ctx)
    assert g.accepted and out.startswith("Thank you.")


@pytest.mark.parametrize("text", [
    "Here's a possible rephrasing of the sentence: I am sad.",
    "Here is a revised version of your message with some suggested edits:",
    "Your English is too informal for this.", "Your message is full of imperfections.", "Possible duplicates:",
    "Your task now is to respond.", "Your style: Engaging and warm.", "Your next sentence is just curious:",
    "The user gave a great example.", "As an AI language model, I cannot feel.", "(pauses nervously)",
    "Here's an alternative:", "Dear John, I read your note.", "To: Bright Idea Team",
    "I'm so sorry (sighs) that this happened to you.", "*smiles warmly* That is wonderful news.",
    "Well (takes a deep breath), let's look at it.", "Sincerely, [User Name]", "Here is how it should be delivered.",
    "The language is a little unclear and I'd like to rephrase it.", "Best regards, Sam",
])
def test_a_sentence_about_the_text_or_the_task_is_refused_as_meta(text):
    """Written by SmolLM2-135M in a supporter's place (phase 1 candidates): about the text or the task, not to the
    person. A first sentence like this rejects the attempt; a later one cuts the reply."""
    ctx = ReplyContext()
    assert check_reply(text, ctx, GuardSettings()) == "meta"
    gate = SentenceGate(ctx, GuardSettings())
    gate.feed("That sounds really hard to carry. " + text + " ")
    gate.finish("stop")
    assert gate.released == "That sounds really hard to carry." and gate.cut_reason == "meta"


@pytest.mark.parametrize("text", [
    "Here's a thought: take a short walk tonight.", "Your message means a lot to me.", "I hear you (and I'm here).",
    "Here are a few things that might help.", "Your role as a mother matters.", "Here's to new beginnings!",
    "Your style of parenting sounds caring.", "Where did you leave the user manual?", "Dear me!",
    "To be honest, that sounds exhausting.", "Here's an idea: call her tonight.",
    "Your smile (and your laugh) will come back.", "Take a deep breath with me.",
    "Nodding along is not enough (sadly).", "I sincerely hope the call goes well.",
    "The language of grief is hard to speak.",
])
def test_supportive_sentences_that_share_words_with_meta_ones_pass(text):
    assert check_reply(text, ReplyContext(), GuardSettings()) is None
