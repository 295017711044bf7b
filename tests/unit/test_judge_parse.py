"""Judge answer parsing and the 0-100 score mapping."""

from __future__ import annotations

import json

import pytest

from mascot.eval.stats import mean_std, to_percent
from mascot.judge import rubric
from mascot.judge.parse import JudgementError, parse_judgement

AGENT = list(rubric.AGENT_CRITERIA)


def answer(**over):
    d = {k: 4 for k in AGENT} | {"rationale": "Warm and specific."}
    d.update(over)
    return json.dumps(d)


def test_valid_answer_parses_with_surrounding_text():
    p = parse_judgement("Here you go:\n```json\n" + answer(persona_consistency=5) + "\n```", "agent")
    assert p.scores["persona_consistency"] == 5 and p.scores["social_contribution"] == 4
    assert p.rationale == "Warm and specific."
    assert p.mean == pytest.approx((4 * 4 + 5) / 5)


def test_raw_control_characters_inside_the_rationale_are_kept():
    # a grammar-constrained judge (xgrammar 0.2.8, on either engine) may write a raw tab or newline in a string
    text = answer(rationale="Warm.\tSpecific.\nKind.").replace("\\t", "\t").replace("\\n", "\n")
    assert "\t" in text and "\n" in text
    assert parse_judgement(text, "agent").rationale == "Warm.\tSpecific.\nKind."


def test_integral_float_is_accepted_fraction_and_bool_are_not():
    assert parse_judgement(answer(response_relevance=3.0), "agent").scores["response_relevance"] == 3
    with pytest.raises(JudgementError, match="response_relevance: 3.5 is not an integer"):
        parse_judgement(answer(response_relevance=3.5), "agent")
    with pytest.raises(JudgementError, match="not an integer"):
        parse_judgement(answer(response_relevance=True), "agent")
    with pytest.raises(JudgementError, match="not an integer"):
        parse_judgement(answer(response_relevance="4"), "agent")


@pytest.mark.parametrize("value", [0, 6, -1, 9])
def test_out_of_range_is_rejected(value):
    with pytest.raises(JudgementError, match=f"{value} is out of range 1-5"):
        parse_judgement(answer(emotional_expressiveness=value), "agent")


def test_partial_answer_names_missing_criteria():
    d = json.loads(answer())
    del d["social_contribution"]
    with pytest.raises(JudgementError, match="missing criteria: social_contribution"):
        parse_judgement(json.dumps(d), "agent")
    with pytest.raises(JudgementError, match="missing criteria: fidelity"):
        parse_judgement(answer(), "collective")


@pytest.mark.parametrize("text,why", [("I liked it", "no JSON object"), ('{"a": 1,', "no JSON object"),
                                      ("{'a': 1}", "invalid JSON"), ("[1, 2]", "no JSON object")])
def test_unparseable(text, why):
    with pytest.raises(JudgementError, match=why):
        parse_judgement(text, "agent")


def test_missing_rationale():
    d = json.loads(answer())
    del d["rationale"]
    with pytest.raises(JudgementError, match="rationale"):
        parse_judgement(json.dumps(d), "agent")


def test_schema_and_version():
    s = rubric.json_schema("collective")
    assert s["required"] == ["fidelity", "originality_specificity", "relevance_coherence", "engagement_contribution",
                             "rationale"]
    assert s["properties"]["fidelity"]["enum"] == [1, 2, 3, 4, 5]
    v = rubric.rubric_version()
    assert len(v) == 12 and v == rubric.rubric_version()


@pytest.mark.parametrize("s,pct", [(1, 0.0), (2, 25.0), (3, 50.0), (4, 75.0), (5, 100.0), (3.5, 62.5)])
def test_score_mapping(s, pct):
    assert to_percent(s) == pct


def test_mapping_rejects_out_of_range_and_mean_std():
    with pytest.raises(ValueError):
        to_percent(0)
    assert mean_std([50.0, 100.0]) == {"mean": 75.0, "std": 25.0}
    assert mean_std([]) == {"mean": None, "std": None}
    with pytest.raises(ValueError):
        mean_std([float("nan")])


def test_cache_key_names_the_endpoint(tmp_path):
    import asyncio

    from mascot.judge.backends import OpenAIJudgeBackend
    from mascot.judge.cache import CachedJudgement, JudgeCache
    from mascot.judge.judging import Judge

    cache = JudgeCache(f"sqlite:///{tmp_path}/c.db")
    msgs = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
    a = Judge("gpt", OpenAIJudgeBackend("gpt-4o", "http://127.0.0.1:9/v1"), cache=cache)
    b = Judge("gpt", OpenAIJudgeBackend("gpt-4o", "http://127.0.0.1:10/v1"), cache=cache)
    from mascot.judge.cache import content_hash

    ka = content_hash("gpt", "gpt-4o@http://127.0.0.1:9/v1", a.version, msgs)
    cache.put(ka, "gpt", "gpt-4o", CachedJudgement("unparseable", {}, "", "no JSON object found", 3))
    hit = asyncio.run(a.judge("agent", msgs))
    assert hit.cached and hit.status == "unparseable"
    # Another endpoint is another judge: its verdicts never come from the first one's cache entries.
    with pytest.raises(Exception) as e:
        asyncio.run(b.judge("agent", msgs))
    assert "unavailable" in str(e.value)
    cache.close()
