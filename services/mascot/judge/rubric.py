"""Rubric definitions and judge prompts.

The agent-specific rubric scores one reply in context on five criteria; the collective rubric scores an
N-turn block on four. Every criterion is an integer 1-5 with the anchors 1 = absent or violating,
3 = partial, 5 = fully and specifically. The judge answers JSON ``{criterion: int, ..., "rationale": str}``.
Dialogue text is laid out by :mod:`mascot.core.formatting` (the same layout training uses).
"""

from __future__ import annotations

import hashlib
import json
from typing import Mapping, Sequence

from mascot.core import formatting
from mascot.core.dialogue import HistoryTurn
from mascot.core.personas import PersonaCard

AGENT = "agent"
COLLECTIVE = "collective"

#: Agent-specific criteria, in the paper's column order (Emotion, Empathy, Consistency, Relevance, Contribution).
AGENT_CRITERIA: dict[str, str] = {
    "emotional_expressiveness": "conveys affect that fits both the persona and the user's emotion; neither flat "
                                "nor over-dramatic.",
    "empathetic_support_quality": "recognises the user's state accurately and offers support that is helpful and "
                                  "safe.",
    "persona_consistency": "stays within the assigned persona's goal, moves and style, without drifting into "
                           "generic-assistant behaviour or another persona's job.",
    "response_relevance": "addresses the user's latest message and the dialogue context, including its valence "
                          "(celebrating a loss scores low).",
    "social_contribution": "adds something new and constructive relative to earlier turns rather than echoing or "
                           "flattering.",
}
#: Collective criteria, in the paper's column order (Fidelity, Originality, Relevance, Engagement).
COLLECTIVE_CRITERIA: dict[str, str] = {
    "fidelity": "each persona stays true to its role across the block.",
    "originality_specificity": "turns are concrete and do not repeat each other.",
    "relevance_coherence": "the block flows logically, keeps a consistent global state, and does not re-litigate "
                           "settled points.",
    "engagement_contribution": "the block draws the user in, and each agent adds value.",
}
CRITERIA = {AGENT: AGENT_CRITERIA, COLLECTIVE: COLLECTIVE_CRITERIA}
MAX_RATIONALE_CHARS = 1000

SYSTEM = ("You are an impartial expert judge of conversations between a user and a group of persona-specialised "
          "companion agents. Score strictly against the rubric. Every criterion is an integer from 1 to 5: "
          "1 = absent or violating, 3 = partial, 5 = fully and specifically. Answer with one JSON object only, "
          "with exactly the keys {keys} (integers) and \"rationale\" (one or two sentences).")

AGENT_USER = """Persona of the agent being judged:
{card}
{context}Conversation so far:
{transcript}

Reply to judge, by {name}:
{reply}

Criteria:
{criteria}"""

COLLECTIVE_USER = """Active personas:
{roster}
{context}Conversation before the block:
{transcript}

Block of turns to judge:
{block}

Criteria:
{criteria}"""

RETRY_USER = ("Your previous answer was rejected: {error}. Answer again with one JSON object only, with integer "
              "scores 1-5 for {keys} and a \"rationale\" string.")


def _criteria_lines(criteria: Mapping[str, str]) -> str:
    return "\n".join(f"- {k}: {v}" for k, v in criteria.items())


def _keys(rubric: str) -> str:
    return ", ".join(f'"{k}"' for k in CRITERIA[rubric])


def rubric_version() -> str:
    """Hex digest (12 characters) of every prompt template and criterion text; part of the judge cache key."""
    blob = json.dumps([SYSTEM, AGENT_USER, COLLECTIVE_USER, RETRY_USER, AGENT_CRITERIA, COLLECTIVE_CRITERIA,
                       formatting.FORMAT_VERSION], sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def _context_block(context: Sequence[tuple[str, str]]) -> str:
    return f"Context:\n{formatting.context_text(context)}\n" if context else ""


def agent_messages(card: PersonaCard, history: Sequence[HistoryTurn], reply: str,
                   context: Sequence[tuple[str, str]] = (), names: Mapping[str, str] | None = None) -> list[dict]:
    """Chat messages asking the judge to score one reply on the agent-specific rubric (section 4.1)."""
    names = {**(names or {}), card.id: card.name}
    user = AGENT_USER.format(card=formatting.persona_card_text(card), context=_context_block(context),
                             transcript=formatting.transcript_text(history, names), name=card.name,
                             reply=reply.strip(), criteria=_criteria_lines(AGENT_CRITERIA))
    return [{"role": "system", "content": SYSTEM.format(keys=_keys(AGENT))}, {"role": "user", "content": user}]


def collective_messages(cards: Sequence[PersonaCard], history: Sequence[HistoryTurn], block: Sequence[HistoryTurn],
                        context: Sequence[tuple[str, str]] = ()) -> list[dict]:
    """Chat messages asking the judge to score an N-turn block on the collective rubric (section 4.2)."""
    names = {c.id: c.name for c in cards}
    user = COLLECTIVE_USER.format(roster=formatting.roster_text(cards), context=_context_block(context),
                                  transcript=formatting.transcript_text(history, names),
                                  block=formatting.block_text(block, names),
                                  criteria=_criteria_lines(COLLECTIVE_CRITERIA))
    return [{"role": "system", "content": SYSTEM.format(keys=_keys(COLLECTIVE))}, {"role": "user", "content": user}]


def retry_messages(messages: list[dict], answer: str, error: str, rubric: str) -> list[dict]:
    """The conversation for a re-prompt: the judge's rejected answer and the reason (section 4.3)."""
    return [*messages, {"role": "assistant", "content": answer},
            {"role": "user", "content": RETRY_USER.format(error=error, keys=_keys(rubric))}]


def json_schema(rubric: str) -> dict:
    """JSON schema of a judgement: each criterion an integer in 1..5, plus a non-empty rationale.

    Used for structured output (xgrammar locally; ``response_format`` json_schema on OpenAI-compatible servers).
    """
    props: dict = {k: {"type": "integer", "enum": [1, 2, 3, 4, 5]} for k in CRITERIA[rubric]}
    props["rationale"] = {"type": "string", "minLength": 1, "maxLength": 300}
    return {"type": "object", "properties": props, "required": [*CRITERIA[rubric], "rationale"],
            "additionalProperties": False}
