"""Plain dialogue types shared by all components, and their proto conversions."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

from mascot.api.dialogue.v1 import dialogue_pb2 as dpb
from mascot.core.errors import InvalidArgument
from mascot.core.personas import PersonaCard, PersonaCatalog


FALLBACK_ACTION = "Respond to the user's latest message in your role"


@dataclass(frozen=True)
class HistoryTurn:
    """A turn as the director and speakers see it: ``role`` is ``"user"`` or ``"agent"``; ``text`` is visible text."""

    role: str
    text: str
    persona_id: str = ""


def history_from_proto(turns: Iterable[dpb.Turn], known_personas: Sequence[str] | None = None) -> list[HistoryTurn]:
    """Convert proto turns to :class:`HistoryTurn`.

    Raises:
        InvalidArgument: a turn with ROLE_UNSPECIFIED, or an agent turn without a known persona id.
    """
    out = []
    for i, t in enumerate(turns):
        if t.role == dpb.ROLE_USER:
            out.append(HistoryTurn("user", t.text))
        elif t.role == dpb.ROLE_AGENT:
            if known_personas is not None and t.persona_id not in known_personas:
                raise InvalidArgument(f"history[{i}]: agent turn with unknown persona_id {t.persona_id!r}")
            out.append(HistoryTurn("agent", t.text, t.persona_id))
        else:
            raise InvalidArgument(f"history[{i}]: role must be ROLE_USER or ROLE_AGENT")
    return out


def history_from_dicts(turns: Iterable[dict]) -> list[HistoryTurn]:
    """:class:`HistoryTurn` items from transcript/artefact dicts (``role``, ``text``, optional ``persona_id``;
    a missing or null persona id becomes ``""``). Keys beyond these are ignored."""
    return [HistoryTurn(t["role"], t["text"], t.get("persona_id") or "") for t in turns]


def history_to_proto(history: Iterable[HistoryTurn]) -> list[dpb.Turn]:
    """Convert :class:`HistoryTurn` items to proto turns (visible text only)."""
    return [dpb.Turn(role=dpb.ROLE_USER if h.role == "user" else dpb.ROLE_AGENT, persona_id=h.persona_id,
                     text=h.text) for h in history]


def context_from_proto(context: Iterable[dpb.ContextUtterance]) -> list[tuple[str, str]]:
    """``(speaker, content)`` pairs."""
    return [(c.speaker, c.content) for c in context]


MAX_ROSTER = 16


def roster_from_ids(catalog: "PersonaCatalog", ids: list[str]) -> list:
    """Cards for ``ids``. Raises InvalidArgument for none, too many, unknown or duplicate ids."""
    if not ids:
        raise InvalidArgument("persona_ids is empty; name at least one active persona")
    if len(ids) > MAX_ROSTER:
        raise InvalidArgument(f"persona_ids has {len(ids)} entries; at most {MAX_ROSTER}")
    if len(set(ids)) != len(ids):
        raise InvalidArgument("persona_ids has duplicates")
    unknown = [i for i in ids if i not in catalog.cards]
    if unknown:
        raise InvalidArgument(f"unknown persona id {unknown[0]!r}; ListPersonas shows the known ids")
    return [catalog.get(i) for i in ids]


def consecutive_turns(history: Sequence[HistoryTurn], persona_id: str) -> int:
    """How many agent turns in a row ``persona_id`` has at the end of ``history`` (a user turn resets it)."""
    n = 0
    for t in reversed(history):
        if t.role != "agent" or t.persona_id != persona_id:
            break
        n += 1
    return n


def fallback_persona(roster: Sequence[PersonaCard], history: Sequence[HistoryTurn], max_consecutive: int,
                     exclude: Sequence[str] = ()) -> PersonaCard | None:
    """The persona that spoke least recently among those the cap allows (never-spoken first, roster order).

    Args:
        exclude: Persona ids not to pick (e.g. the one whose reply just came back empty).

    Returns:
        The card, or None when every persona is excluded or capped.
    """
    last: dict[str, int] = {}
    for i, t in enumerate(history):
        if t.role == "agent":
            last[t.persona_id] = i
    allowed = [c for c in roster if c.id not in exclude
               and consecutive_turns(history, c.id) + 1 <= max_consecutive]
    if not allowed:
        return None
    return min(allowed, key=lambda c: (last.get(c.id, -1), roster.index(c)))
