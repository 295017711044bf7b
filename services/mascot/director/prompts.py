"""Director prompt assembly (REFERENCE.md section 2; the wording is our default).

The director sees the roster (names, roles, goals), the seed context and the history with speaker tags,
and answers with the Agent / Action / Tone lines. Its own earlier directives appear as its assistant turns, so the
prompt of a decision is the previous prompt, the previous answer and the turns since (the Phase-2 rollout sequence).
A retry appends the bad answer and the parse error.
"""

from __future__ import annotations

from typing import Callable, Sequence

from mascot.core.context import fit_history
from mascot.core.personas import PersonaCard
from mascot.core.dialogue import HistoryTurn

SYSTEM_TEMPLATE = """You are the director of a group of companion agents who talk with a user together.
Decide which agent speaks next and tell that agent what to do, so that the group stays helpful, varied and true to each agent's role.

Agents:
{roster}

Rules:
- Pick exactly one agent from the list.
- No agent may speak more than {max_consecutive} turns in a row.
- Answer with exactly three lines and nothing else:
Agent: <agent name>
Action: <what the agent should do now, one sentence>
Tone: <the tone to take, a few words>"""

RETRY_TEMPLATE = ("Your answer was invalid: {error}. Answer again with exactly three lines: "
                  "'Agent: <name>', 'Action: <sentence>', 'Tone: <words>'.")


def roster_block(roster: Sequence[PersonaCard]) -> str:
    """One line per persona: ``- Name (Role): goal``."""
    return "\n".join(f"- {c.name} ({c.role}): {c.goal}" for c in roster)


def speaker_tag(turn: HistoryTurn, names: dict[str, str]) -> str:
    """``User`` for user turns, the persona's display name for agent turns."""
    return "User" if turn.role == "user" else names.get(turn.persona_id, turn.persona_id)


def transcript(items: Sequence[tuple[str, str]]) -> str:
    """``Tag: text`` lines."""
    return "\n".join(f"{tag}: {text}" for tag, text in items)


QUESTION = "Who speaks next, and what should they do?"


def build_messages(roster: Sequence[PersonaCard], history: Sequence[HistoryTurn], context: Sequence[tuple[str, str]],
                   max_consecutive: int, failed: Sequence[tuple[str, str]] = ()) -> list[dict[str, str]]:
    """Chat messages for one director decision: a multi-turn chat holding the director's own earlier answers.

    Layout: system (roles, rules); a user message with the seed context, the transcript up to the first directed
    agent turn and the question; then, for every agent turn whose ``directive`` is known, an assistant message
    with that directive followed by a user message with the turns since ("Since then:") and the question again.
    Rendering this chat with ``add_generation_prompt`` extends the previous decision's rendered prompt plus its
    answer, so a whole rollout's director tokens form one sequence (REFERENCE.md section 6, step 5).

    Args:
        roster: Active personas.
        history: Visible history, oldest first (agent turns may carry ``directive``).
        context: Seed context lines ``(speaker, content)`` (meeting excerpt), shown first.
        max_consecutive: The consecutive-turn cap, stated in the rules.
        failed: Earlier attempts of this decision, ``(raw_text, parse_error)``, for the retry prompt.

    Returns:
        ``[{"role", "content"}, ...]``: system, user, (assistant, user)* per directed turn, then assistant/user
        pairs per failed attempt.
    """
    names = {c.id: c.name for c in roster}
    msgs = [{"role": "system", "content": SYSTEM_TEMPLATE.format(roster=roster_block(roster),
                                                                  max_consecutive=max_consecutive)}]
    chunk: list[tuple[str, str]] = []
    first = True

    def flush() -> None:
        parts = []
        if first and context:
            parts.append("Meeting transcript:\n" + transcript(context))
        if chunk:
            parts.append(("Conversation so far:\n" if first else "Since then:\n") + transcript(chunk))
        elif first:
            parts.append("The conversation has not started yet.")
        parts.append(QUESTION)
        msgs.append({"role": "user", "content": "\n\n".join(parts)})

    for t in history:
        if t.role == "agent" and t.directive:
            flush()
            first, chunk = False, []
            msgs.append({"role": "assistant", "content": t.directive})
        chunk.append((speaker_tag(t, names), t.text))
    flush()
    for raw, error in failed:
        msgs.append({"role": "assistant", "content": raw})
        msgs.append({"role": "user", "content": RETRY_TEMPLATE.format(error=error)})
    return msgs


def fit_messages(roster: Sequence[PersonaCard], history: Sequence[HistoryTurn], context: Sequence[tuple[str, str]],
                 max_consecutive: int, failed: Sequence[tuple[str, str]], render: Callable[[list], str],
                 count_tokens: Callable[[str], int], budget_tokens: int) -> list[dict[str, str]]:
    """:func:`build_messages` with context and history trimmed oldest first to fit ``budget_tokens``.

    The latest user turn is never dropped. Raises ValueError when even that does not fit.
    """
    return fit_history(lambda h, c: build_messages(roster, h, c, max_consecutive, failed), history, context, render,
                       count_tokens, budget_tokens)
