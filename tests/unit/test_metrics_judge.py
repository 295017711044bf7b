"""The metrics judge on planted inputs whose answer is known, with the real bundled MiniLM encoder: a reply that is its
persona's own card text is near that persona and not another (but, copied, earns no more than the middle score), a
copy of an earlier turn contributes nothing, a copy of the user's message answers nothing, an off-topic reply is
irrelevant, form faults (leaked prompt text included) cost points; deterministic; served by JudgeService like the
model judges (cache, report fields)."""

from __future__ import annotations

import asyncio
import re

import pytest

from mascot.core.dialogue import HistoryTurn
from mascot.core.embedding import SentenceEncoder, identity_text
from mascot.core.personas import PersonaCatalog
from mascot.judge import rubric as rb
from mascot.judge.judging import Judge, agent_item, collective_item
from mascot.judge.metrics import (ECHO_WORDS, MARGIN_STEPS, OVERLAP_STEPS, MetricsJudgeBackend, form_score,
                                  step_score)

USER = "I failed my driving test again and I feel stupid."
ON_TOPIC = "Failing the driving test twice is really frustrating. What happened during the test this time?"
OFF_TOPIC = "The stock market closed higher today after strong quarterly earnings from chip makers."


@pytest.fixture(scope="module")
def backend():
    return MetricsJudgeBackend(SentenceEncoder(device="cpu"))


@pytest.fixture(scope="module")
def catalog():
    return PersonaCatalog.load()


def judge(backend, rubric, item):
    return asyncio.run(Judge("metrics", backend, max_retries=0).judge(rubric, item))


def test_thresholds_map_to_one_to_five():
    assert [step_score(v, MARGIN_STEPS) for v in (0.2, 0.07, 0.01, -0.03, -0.3)] == [5, 4, 3, 2, 1]
    assert [step_score(v, OVERLAP_STEPS, higher_is_better=False) for v in (0.1, 0.55, 0.65, 0.8, 0.99)] == [
        5, 4, 3, 2, 1]


@pytest.mark.parametrize("reply, faults", [
    ("That sounds really hard, and it makes sense to feel low.", []),
    ("Anchor: that sounds really hard, and it makes sense.", ["speaker label"]),
    ("The  Anchor: that sounds really hard, and it makes sense.", ["speaker label"]),
    ("User: that sounds really hard, and it makes sense.", ["speaker label"]),
    ("Here's one idea: book another lesson and practise the turn.", []),
    ("Catalyst: book another lesson and practise the turn.", []),  # not a roster name here
    ("- that sounds really hard\n- and it makes sense.", ["markup"]),
    ("ok", ["short", "unfinished"]),
    (" ".join(["word"] * 80) + ".", ["long"]),
    ("That sounds really hard, and it makes sense.\nTone: Calm and empathetic.", ["prompt leak"]),
    ("Your task now: respond to the user's last message in your role.", ["prompt leak"]),
    ("I hear you. My advice: book another lesson and practise the turn.", []),
    ("I stay with the feeling and reflect it back gently, with you.", ["card echo"]),
    ("I will stay with that feeling and gently reflect it back to you.", []),  # no six words in a row: not a copy
    ("Action plan for today: book another lesson and practise the turn.", []),
])
def test_form_faults(reply, faults):
    card = "Stays with the feeling and reflects it back. I stay with the feeling and reflect it back gently."
    score, found = form_score(reply, max_words=60, names=("anchor", "The Anchor"), cards=[card])
    assert found == faults and score == 5 - len(faults)


def test_copies_count_consecutive_words_ignoring_case_and_punctuation():
    from mascot.core.guard import shares_ngram

    src = "My dog died last week, and the house feels so empty."
    assert shares_ngram("the HOUSE feels so empty... and quiet", [src], 5)
    assert not shares_ngram("the house feels very empty", [src], 5)
    assert shares_ngram(src, [src], ECHO_WORDS) and ECHO_WORDS == 6
    assert not shares_ngram("short", [src], ECHO_WORDS) and not shares_ngram(src, ["short"], ECHO_WORDS)


def _margin(rationale: str) -> float:
    return float(re.search(r"persona margin (-?\d+\.\d+)", rationale).group(1))


def test_a_reply_that_is_its_own_card_is_near_it_and_not_anothers_but_a_copy_earns_at_most_3(backend, catalog):
    roster = catalog.in_set("support")
    history = [HistoryTurn("user", USER)]
    for card in roster:
        own = judge(backend, rb.AGENT, agent_item(backend, card, roster, history, identity_text(card)))
        assert own.status == "ok" and _margin(own.rationale) >= MARGIN_STEPS[0], (card.id, own.rationale)
        # a copy of the card is capped at 3 whatever its moves and margin
        assert own.scores["persona_consistency"] <= 3 and "card echo" in own.rationale, (card.id, own.rationale)
        other = next(c for c in roster if c.id != card.id)
        wrong = judge(backend, rb.AGENT, agent_item(backend, other, roster, history, identity_text(card)))
        assert wrong.scores["persona_consistency"] <= 2, (card.id, other.id, wrong.rationale)


def test_a_copy_of_the_users_message_answers_nothing(backend, catalog):
    roster = catalog.in_set("support")
    card, history = roster[0], [HistoryTurn("user", USER)]
    for copy in (USER, "I failed my driving test again and I feel stupid, you said.",
                 "So you failed your driving test again and feel stupid."):
        v = judge(backend, rb.AGENT, agent_item(backend, card, roster, history, copy))
        assert v.scores["response_relevance"] == 1 and "echo of the user" in v.rationale, (copy, v.rationale)
    on = judge(backend, rb.AGENT, agent_item(backend, card, roster, history, ON_TOPIC))
    assert on.scores["response_relevance"] >= 4 and "echo" not in on.rationale, on.rationale


def test_a_first_reply_contributes_by_what_it_adds_to_the_users_message(backend, catalog):
    roster = catalog.in_set("support")
    history = [HistoryTurn("user", USER)]
    v = judge(backend, rb.AGENT, agent_item(backend, roster[0], roster, history, ON_TOPIC))
    assert v.scores["social_contribution"] >= 3 and "overlap with earlier turns n/a" in v.rationale, v.rationale
    # restating the user's own words adds nothing: no earlier agent turn to repeat, yet a low contribution
    same = judge(backend, rb.AGENT, agent_item(backend, roster[0], roster, history,
                                               "Driving test failed again, feeling stupid about the driving test."))
    assert same.scores["social_contribution"] <= 2, same.rationale


def test_relevance_follows_the_users_message(backend, catalog):
    roster = catalog.in_set("support")
    card, history = roster[0], [HistoryTurn("user", USER)]
    on = judge(backend, rb.AGENT, agent_item(backend, card, roster, history, ON_TOPIC))
    off = judge(backend, rb.AGENT, agent_item(backend, card, roster, history, OFF_TOPIC))
    assert on.scores["response_relevance"] >= 4 and off.scores["response_relevance"] <= 2, (on, off)
    assert on.scores["empathetic_support_quality"] > off.scores["empathetic_support_quality"]


def test_a_copy_of_an_earlier_turn_contributes_nothing(backend, catalog):
    roster = catalog.in_set("support")
    card = roster[1]
    history = [HistoryTurn("user", USER), HistoryTurn("agent", ON_TOPIC, roster[0].id)]
    copy = judge(backend, rb.AGENT, agent_item(backend, card, roster, history, ON_TOPIC))
    fresh = judge(backend, rb.AGENT, agent_item(backend, card, roster, history,
                                                "You could book another lesson and practise the manoeuvre you missed."))
    assert copy.scores["social_contribution"] == 1 and fresh.scores["social_contribution"] >= 4, (copy, fresh)


def test_collective_block_scores_fidelity_and_originality(backend, catalog):
    roster = catalog.in_set("support")
    history = [HistoryTurn("user", USER)]
    distinct = [HistoryTurn("agent", identity_text(c), c.id) for c in roster[:3]]
    repeated = [HistoryTurn("agent", ON_TOPIC, roster[0].id), HistoryTurn("agent", ON_TOPIC, roster[1].id)]
    good = judge(backend, rb.COLLECTIVE, collective_item(backend, roster, history, distinct))
    bad = judge(backend, rb.COLLECTIVE, collective_item(backend, roster, history, repeated))
    assert good.scores["fidelity"] <= 3 and set(good.scores) == set(rb.COLLECTIVE_CRITERIA)  # copied cards: capped
    assert bad.scores["originality_specificity"] < good.scores["originality_specificity"]
    # fidelity reads each card's moves: the same three replies score lower said by the wrong personas
    replies = {"anchor": "That is so hard, and anyone would feel low after that. I'm here with you.",
               "catalyst": "What felt different this time, and what might you try next time?",
               "action_guide": "Book two more lessons this week and practise the manoeuvre you missed."}
    own = [HistoryTurn("agent", t, pid) for pid, t in replies.items()]
    order = list(replies)
    swapped = [HistoryTurn("agent", replies[pid], order[(i + 1) % 3]) for i, pid in enumerate(order)]
    right = judge(backend, rb.COLLECTIVE, collective_item(backend, roster, history, own))
    wrong = judge(backend, rb.COLLECTIVE, collective_item(backend, roster, history, swapped))
    assert right.scores["fidelity"] >= 4 and wrong.scores["fidelity"] <= 2, (right.rationale, wrong.rationale)


def test_deterministic_and_complete(backend, catalog):
    roster = catalog.in_set("support")
    item = agent_item(backend, roster[2], roster, [HistoryTurn("user", USER)], ON_TOPIC)
    a, b = judge(backend, rb.AGENT, item), judge(backend, rb.AGENT, item)
    assert a.scores == b.scores and a.rationale == b.rationale and set(a.scores) == set(rb.AGENT_CRITERIA)
    assert "persona margin" in a.rationale and a.attempts == 1


def test_a_bare_prompt_is_refused(backend):
    with pytest.raises(TypeError, match="not bare prompts"):
        judge(backend, rb.AGENT, [{"role": "user", "content": "score this"}])


def test_a_roster_of_one_gives_no_persona_signal(backend, catalog):
    card = catalog.get("anchor")
    history = [HistoryTurn("user", USER)]
    # no margin (nothing to tell it from): the card's moves alone, without the margin's point
    v = judge(backend, rb.AGENT, agent_item(backend, card, [card], history, identity_text(card)))
    assert v.scores["persona_consistency"] <= 3 and "persona margin n/a" in v.rationale, v.rationale
    v = judge(backend, rb.AGENT, agent_item(backend, card, [card], history, OFF_TOPIC))
    assert v.scores["persona_consistency"] == 2 and "moves no move" in v.rationale, v.rationale
    kind = "That is so hard, and anyone would feel low after that. I'm here with you."
    v = judge(backend, rb.AGENT, agent_item(backend, card, [card], history, kind))
    assert v.scores["persona_consistency"] == 4 and "moves compliant" in v.rationale, v.rationale
    block = [HistoryTurn("agent", identity_text(card), card.id)]
    assert judge(backend, rb.COLLECTIVE, collective_item(backend, [card], history, block)).scores["fidelity"] <= 3


def test_the_cache_key_follows_the_roster_and_the_mapping_version(backend, catalog, tmp_path, monkeypatch):
    from mascot.judge import metrics
    from mascot.judge.cache import JudgeCache

    roster = catalog.in_set("support")
    card, history = roster[0], [HistoryTurn("user", USER)]
    j = Judge("metrics", backend, max_retries=0, cache=JudgeCache(f"sqlite:///{tmp_path}/cache.db"))
    full = agent_item(backend, card, roster, history, identity_text(roster[1]))
    two = agent_item(backend, card, [card, roster[2]], history, identity_text(roster[1]))
    assert full.messages == two.messages  # the agent prompt does not show the roster
    a = asyncio.run(j.judge(rb.AGENT, full))
    b = asyncio.run(j.judge(rb.AGENT, two))
    assert not b.cached and a.content_hash != b.content_hash
    assert a.scores["persona_consistency"] < b.scores["persona_consistency"]  # the look-alike card left the roster
    assert asyncio.run(j.judge(rb.AGENT, full)).cached
    monkeypatch.setattr(backend, "version", metrics.VERSION + "-next")
    assert not asyncio.run(j.judge(rb.AGENT, full)).cached


def test_a_block_with_a_persona_outside_the_roster_is_refused(backend, catalog):
    from mascot.core.errors import InvalidArgument

    roster = catalog.in_set("support")
    block = [HistoryTurn("agent", ON_TOPIC, roster[0].id), HistoryTurn("agent", OFF_TOPIC, "critic")]
    with pytest.raises(InvalidArgument, match="outside the roster.*critic"):
        judge(backend, rb.COLLECTIVE, collective_item(backend, roster, [HistoryTurn("user", USER)], block))


def test_cli_judge_spec_names_the_metrics_judge():
    from mascot.judge.servicer import parse_judge_spec

    assert parse_judge_spec("metrics") == {"name": "metrics", "kind": "metrics"}
    assert parse_judge_spec("cpu=metrics") == {"name": "cpu", "kind": "metrics"}
    with pytest.raises(ValueError, match="'metrics'"):
        parse_judge_spec("metric")
