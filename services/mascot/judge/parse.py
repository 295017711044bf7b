"""Parse and validate a judge's answer.

A valid answer is one JSON object holding an integer 1-5 for every criterion of the rubric and a string
``rationale``. Text around the object (e.g. a code fence) is tolerated; anything else is rejected with a
reason that is fed back to the judge on retry.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from mascot.judge.rubric import CRITERIA, MAX_RATIONALE_CHARS


class JudgementError(ValueError):
    """The answer is not a valid judgement; the message says why (shown to the judge on retry)."""


@dataclass(frozen=True)
class Parsed:
    """A valid judgement: ``scores`` maps every criterion key to an int 1-5."""

    scores: dict[str, int]
    rationale: str

    @property
    def mean(self) -> float:
        """Unweighted mean of the scores, 1.0-5.0 (the docs, s(y))."""
        return sum(self.scores.values()) / len(self.scores)


def _extract_object(text: str) -> dict:
    s = text.strip()
    start, end = s.find("{"), s.rfind("}")
    if start < 0 or end <= start:
        raise JudgementError("no JSON object found")
    try:
        # strict=False: a raw control character (tab, newline) inside the rationale string is kept, not fatal;
        # xgrammar 0.2.8's JSON grammar lets the constrained judge write one
        obj = json.loads(s[start:end + 1], strict=False)
    except json.JSONDecodeError as e:
        raise JudgementError(f"invalid JSON ({e.msg} at character {e.pos})") from None
    if not isinstance(obj, dict):
        raise JudgementError("the answer is not a JSON object")
    return obj


def parse_judgement(text: str, rubric: str) -> Parsed:
    """Validate a judge answer against ``rubric`` (``"agent"`` or ``"collective"``).

    Integers given as integral floats (``4.0``) are accepted; booleans, strings and fractions are not.
    Extra keys are ignored.

    Raises:
        JudgementError: no JSON object, a missing criterion, a non-integer or out-of-range score (1-5), or a
            missing/non-string rationale. The message names the first problem.
        KeyError: unknown rubric.
    """
    keys = CRITERIA[rubric]
    obj = _extract_object(text)
    missing = [k for k in keys if k not in obj]
    if missing:
        raise JudgementError(f"missing criteria: {', '.join(missing)}")
    scores = {}
    for k in keys:
        v = obj[k]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or (isinstance(v, float) and not v.is_integer()):
            raise JudgementError(f"{k}: {v!r} is not an integer")
        if not 1 <= int(v) <= 5:
            raise JudgementError(f"{k}: {int(v)} is out of range 1-5")
        scores[k] = int(v)
    rationale = obj.get("rationale")
    if not isinstance(rationale, str):
        raise JudgementError("rationale: missing or not a string")
    return Parsed(scores=scores, rationale=rationale.strip()[:MAX_RATIONALE_CHARS])
