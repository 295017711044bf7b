"""summary.json of the main job from planted transcript lines: agent turns counted per adapter version."""

from __future__ import annotations

from mascot.app.runjob import summarize


def turn(role: str, persona: str | None = None, version: str = "", source: str = "model") -> dict:
    return {"role": role, "persona_id": persona, "adapter_version": version, "latency_seconds": 0.5,
            "directive": {"source": source} if role == "agent" else None, "rejections": [], "cut_reason": ""}


def test_agent_turns_are_counted_per_adapter_version_and_user_turns_are_not():
    lines = [{"turns": [turn("user"), turn("agent", "anchor", "anchor--v1"), turn("agent", "beacon", "base"),
                        turn("user"), turn("agent", "anchor", "anchor--v2", "fallback")], "end_reason": "completed"},
             {"turns": [turn("user"), turn("agent", "anchor", "anchor--v1"), turn("agent", "catalyst", "")],
              "end_reason": "empty_replies"}]
    s = summarize(lines)
    assert s["adapter_versions"] == {"anchor--v1": 2, "anchor--v2": 1, "base": 2}  # no version recorded = base
    assert s["persona_counts"] == {"anchor": 3, "beacon": 1, "catalyst": 1}
    assert (s["agent_turns"], s["user_turns"], s["early_round_ends"]) == (5, 3, 1)
    assert s["director_fallback_rate"] == 0.2
    assert summarize([])["adapter_versions"] == {}
