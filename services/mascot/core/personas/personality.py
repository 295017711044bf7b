"""The simulated user's personality as text: an MBTI type or a Big Five profile in two sentences.

The speaker puts the text into the simulated user's prompt; the gateway checks a requested MBTI type with it before
anything is stored.
"""

from __future__ import annotations

_MBTI = {
    "E": "outgoing and talkative", "I": "reserved and reflective",
    "S": "focused on concrete facts", "N": "drawn to ideas and possibilities",
    "T": "logical and direct", "F": "guided by feelings and values",
    "J": "organised and decisive", "P": "spontaneous and open-ended",
}
_BIG_FIVE = {
    "openness": ("curious and open to new ideas", "conventional and practical"),
    "conscientiousness": ("careful and organised", "easy-going and spontaneous"),
    "extraversion": ("outgoing and energetic", "quiet and reserved"),
    "agreeableness": ("warm and cooperative", "sceptical and blunt"),
    "neuroticism": ("easily worried and stressed", "calm and emotionally steady"),
}


def personality_text(mbti: str = "", big_five: dict[str, str] | None = None) -> str:
    """Two sentences describing an MBTI type or a Big Five profile; '' for none.

    Args:
        mbti: Four letters (E/I, S/N, T/F, J/P), case-insensitive.
        big_five: ``{trait: "high"|"low"}`` for any of the five traits.

    Raises:
        ValueError: an invalid MBTI type or trait level.
    """
    if mbti:
        t = mbti.upper()
        if len(t) != 4 or any(a not in pair for a, pair in zip(t, ("EI", "SN", "TF", "JP"))):
            raise ValueError(f"invalid MBTI type {mbti!r}: four letters from E/I, S/N, T/F, J/P")
        d = [_MBTI[c] for c in t]
        return f"Your personality type is {t}: you are {d[0]} and {d[1]}. You are also {d[2]} and {d[3]}."
    if big_five:
        hi = [_BIG_FIVE[k][0] for k, v in big_five.items() if v == "high"]
        lo = [_BIG_FIVE[k][1] for k, v in big_five.items() if v == "low"]
        bad = [k for k, v in big_five.items() if k not in _BIG_FIVE or v not in ("high", "low")]
        if bad:
            raise ValueError(f"invalid Big Five entries {bad}: traits {sorted(_BIG_FIVE)} with 'high' or 'low'")
        first = "You are " + ", ".join(hi) + "." if hi else "You have no strongly marked traits."
        second = "You are also " + ", ".join(lo) + "." if lo else "You speak in your own natural way."
        return f"{first} {second}"
    return ""
