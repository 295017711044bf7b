"""Director prompt assembly.

The director sees the roster (names, roles, goals), the seed context and the history with speaker tags,
and answers with the Agent / Action / Tone lines. Its own earlier directives appear as its assistant turns, so the
prompt of a decision is the previous prompt, the previous answer and the turns since (the Phase-2 rollout sequence).
A retry appends the bad answer and the parse error.
"""

from __future__ import annotations

from typing import Callable, Sequence

from mascot.core.context import fit_history
from mascot.core.formatting import meeting_transcript
from mascot.core.personas import PersonaCard
from mascot.core.dialogue import HistoryTurn

SYSTEM_TEMPLATE = """You are the director of a small group of helpers who talk with a person together.
After each message you choose which helper speaks next and tell that helper what to do, so that the group stays helpful, varied and true to each helper's role.

Helpers:
{roster}

Answer with exactly three lines and nothing else:
Agent: <the name of one helper>
Action: <one sentence telling that helper what to do now about what was just said>
Tone: <that helper's tone, in two or three words>

Example, after the person said "My dog died last week and the house feels so empty.":
Agent: {example_agent}
Action: Acknowledge how empty the house feels without the dog and stay with that sadness.
Tone: {example_tone}

Rules:
- The Action names something from the conversation; it is never just a helper's name.
- Never repeat an earlier Action; each one asks for something new.
- Prefer a helper who has not spoken yet. No helper speaks more than {max_consecutive} turns in a row."""  # noqa: E501 - prompt lines are not wrapped

RETRY_TEMPLATE = ("Your answer was invalid: {error}. Answer again with exactly three lines: "
                  "'Agent: <name>', 'Action: <a new sentence about the conversation>', 'Tone: <words>'.")


def roster_block(roster: Sequence[PersonaCard]) -> str:
    """One line per persona: ``- Name (Role): goal Tone: default tone.`` (the Tone a directive gives that persona
    unless the turn calls for another of its tone words)."""
    return "\n".join(f"- {c.name} ({c.role}): {c.goal} Tone: {c.default_tone.strip().rstrip('.')}." for c in roster)


def speaker_tag(turn: HistoryTurn, names: dict[str, str]) -> str:
    """``User`` for user turns, the persona's display name for agent turns."""
    return "User" if turn.role == "user" else names.get(turn.persona_id, turn.persona_id)


def transcript(items: Sequence[tuple[str, str]]) -> str:
    """``Tag: text`` lines."""
    return "\n".join(f"{tag}: {text}" for tag, text in items)


QUESTION = "Who speaks next, and what should they do?"


def question(history: Sequence[HistoryTurn]) -> str:
    """The closing question of a director prompt, quoting the latest user message (at most 300 characters) so that
    the Action is grounded in it."""
    last = next((t.text for t in reversed(history) if t.role == "user"), "")
    if not last:
        return QUESTION
    quote = " ".join(last.split())
    quote = quote if len(quote) <= 300 else quote[:297] + "..."
    return f'The person\'s latest message: "{quote}"\n{QUESTION}'


EXAMPLE_ACTION = "Acknowledge how empty the house feels without the dog and stay with that sadness."


def build_messages(roster: Sequence[PersonaCard], history: Sequence[HistoryTurn], context: Sequence[tuple[str, str]],
                   max_consecutive: int, failed: Sequence[tuple[str, str]] = (),
                   all_names: dict[str, str] | None = None) -> list[dict[str, str]]:
    """Chat messages for one director decision: a multi-turn chat holding the director's own earlier answers.

    Layout: system (roles, rules); a user message with the seed context, the transcript up to the first directed
    agent turn and the question; then, for every agent turn whose ``directive`` is known, an assistant message
    with that directive followed by a user message with the turns since ("Since then:") and the question again.
    Rendering this chat with ``add_generation_prompt`` extends the previous decision's rendered prompt plus its
    answer, so a whole rollout's director tokens form one sequence.

    Args:
        roster: Active personas.
        history: Visible history, oldest first (agent turns may carry ``directive``).
        context: Seed context lines ``(speaker, content)`` (meeting excerpt), shown first.
        max_consecutive: The consecutive-turn cap, stated in the rules.
        failed: Earlier attempts of this decision, ``(raw_text, parse_error)``, for the retry prompt; an empty
            ``raw_text`` adds the error to the last user message without showing the rejected answer.
        all_names: Display names of personas outside ``roster`` that appear in the history (excluded ones).

    Returns:
        ``[{"role", "content"}, ...]``: system, user, (assistant, user)* per directed turn, then assistant/user
        pairs per failed attempt.
    """
    names = {c.id: c.name for c in roster}
    names.update(dict(all_names or {}))
    msgs = [{"role": "system", "content": SYSTEM_TEMPLATE.format(roster=roster_block(roster),
                                                                  example_agent=roster[0].name,
                                                                  example_tone=roster[0].default_tone,
                                                                  max_consecutive=max_consecutive)}]
    chunk: list[tuple[str, str]] = []
    first = True

    def flush() -> None:
        parts = []
        if first and context:
            parts.append(meeting_transcript(context))
        if chunk:
            parts.append(("Conversation so far:\n" if first else "Since then:\n") + transcript(chunk))
        elif first:
            parts.append("The conversation has not started yet.")
        parts.append(question(seen))
        msgs.append({"role": "user", "content": "\n\n".join(parts)})

    seen: list[HistoryTurn] = []
    for t in history:
        if t.role == "agent" and t.directive:
            flush()
            first, chunk = False, []
            msgs.append({"role": "assistant", "content": t.directive})
        chunk.append((speaker_tag(t, names), t.text))
        seen.append(t)
    flush()
    for raw, error in failed:
        if not raw:  # the reason without the rejected answer (a copy would be copied again)
            msgs[-1] = {**msgs[-1], "content": msgs[-1]["content"] + "\n\n" + RETRY_TEMPLATE.format(error=error)}
            continue
        msgs.append({"role": "assistant", "content": raw})
        msgs.append({"role": "user", "content": RETRY_TEMPLATE.format(error=error)})
    return msgs


def fit_messages(roster: Sequence[PersonaCard], history: Sequence[HistoryTurn], context: Sequence[tuple[str, str]],
                 max_consecutive: int, failed: Sequence[tuple[str, str]], render: Callable[[list], str],
                 count_tokens: Callable[[str], int], budget_tokens: int,
                 all_names: dict[str, str] | None = None) -> list[dict[str, str]]:
    """:func:`build_messages` with context and history trimmed oldest first to fit ``budget_tokens``.

    The latest user turn is never dropped. Raises ValueError when even that does not fit.
    """
    return fit_history(lambda h, c: build_messages(roster, h, c, max_consecutive, failed, all_names), history,
                       context, render, count_tokens, budget_tokens)
