"""What the main job (`mascot run`) writes: transcripts.jsonl and summary.json, checked on the tiny model."""

from __future__ import annotations

import json
from collections import Counter

#: The keys of every turn of a transcript.
TURN_KEYS = {"index", "role", "persona_id", "directive", "adapter_version", "text", "think", "safety",
             "latency_seconds", "first_delta_seconds", "director_seconds", "rejections", "cut_reason"}


def check_outputs(out_dir, mode, n, personas):
    """The main job's outputs in ``out_dir``: ``n`` completed conversations of ``mode`` in transcripts.jsonl (one
    user turn, 6 agent turns of ``personas``, every key), and a summary.json that adds them up; returns the
    transcript records."""
    lines = [json.loads(x) for x in (out_dir / "transcripts.jsonl").read_text().splitlines()]
    assert len(lines) == n
    for ln in lines:
        assert set(ln) == {"conversation_id", "mode", "source_id", "personas", "turns", "director_retries",
                           "director_fallbacks", "end_reason", "model", "situation_index"}
        assert ln["end_reason"] == "completed"
        assert ln["model"]["name"] == "tiny-random-qwen3" and len(ln["model"]["digest"]) == 64
        assert ln["mode"] == mode and set(ln["personas"]) == personas and ln["source_id"]
        assert ln["turns"][0]["role"] == "user"
        agent = [t for t in ln["turns"] if t["role"] == "agent"]
        assert len(agent) == 6
        for t in ln["turns"]:
            assert set(t) == TURN_KEYS
        for t in agent:
            assert set(t["directive"]) == {"persona_id", "action", "tone", "source", "raw"}
            assert t["directive"]["source"] in ("model", "retry", "fallback")
            assert t["persona_id"] in personas and t["latency_seconds"] > 0
        assert [t["index"] for t in ln["turns"]] == list(range(len(ln["turns"])))
    s = json.loads((out_dir / "summary.json").read_text())
    assert s["conversations"] == n and s["agent_turns"] == 6 * n
    assert s["user_turns"] == sum(1 for ln in lines for t in ln["turns"] if t["role"] == "user")
    assert sum(s["persona_counts"].values()) == 6 * n
    assert s["adapter_versions"] == dict(Counter(t["adapter_version"] for ln in lines for t in ln["turns"]
                                                 if t["role"] == "agent"))
    assert 0 <= s["director_fallback_rate"] <= 1
    assert 0 < s["turn_latency_seconds"]["p50"] <= s["turn_latency_seconds"]["p95"]
    assert s["model"] == lines[0]["model"] and s["early_round_ends"] == 0
    assert s["rejections"] == {} and s["cut_replies"] == 0  # checks off
    assert s["failed"] == [] and s["resumed"] == 0
    assert [ln["situation_index"] for ln in lines] == list(range(n))
    return lines
