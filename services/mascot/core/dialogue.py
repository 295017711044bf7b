"""Plain dialogue types shared by all components, and their proto conversions."""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

from mascot.api.dialogue.v1 import dialogue_pb2 as dpb
from mascot.core.enums import enum_name, enum_value
from mascot.core.errors import InvalidArgument
from mascot.core.personas import PersonaCard, PersonaCatalog


FALLBACK_ACTION = "Respond to the user's latest message in your role"

#: C0 controls other than tab, newline and carriage return; DEL; C1 controls. Refused in user input and removed from
#: generated text: they are never text a person typed or should read, NUL cannot be stored in PostgreSQL text, and
#: escape sequences would reach terminals.
CONTROL_CHARS = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")


def strip_control_chars(text: str) -> str:
    """``text`` without :data:`CONTROL_CHARS` (model output: a random or confused model can emit NUL or ESC)."""
    return CONTROL_CHARS.sub("", text)


#: Categories of characters that show nothing on their own: controls (Cc), format characters (Cf: zero-width space
#: and joiners, BOM, bidi marks, tags), private use (Co: no glyph without a private font), surrogates (Cs) and
#: separators (Zs, Zl, Zp). Unassigned code points (Cn) are not among them: emoji newer than this Python's Unicode
#: tables are Cn here.
INVISIBLE_CATEGORIES = frozenset(("Cc", "Cf", "Co", "Cs", "Zs", "Zl", "Zp"))
#: Characters of other categories that show nothing: Unicode's default-ignorable code points outside Cf (combining
#: grapheme joiner, Khmer inherent vowels, Mongolian and other variation selectors, the reserved default-ignorable
#: ranges) and the blank fillers read as spaces by the safety rules (Hangul fillers, braille blank).
INVISIBLE_CHARS = frozenset(
    "\u034f\u115f\u1160\u17b4\u17b5\u180b\u180c\u180d\u180f\u2065\u2800\u3164\uffa0"
    + "".join(map(chr, range(0xFE00, 0xFE10))) + "".join(map(chr, range(0xFFF0, 0xFFF9))))


def is_noncharacter(c: str) -> bool:
    """True for one of Unicode's 66 non-characters: U+FDD0..U+FDEF and the last two code points of every plane
    (U+FFFE, U+FFFF, U+1FFFE, ... U+10FFFF)."""
    cp = ord(c)
    return 0xFDD0 <= cp <= 0xFDEF or cp & 0xFFFE == 0xFFFE


def is_invisible(c: str) -> bool:
    """True for a character that shows nothing on its own (:data:`INVISIBLE_CATEGORIES`, :data:`INVISIBLE_CHARS`,
    a non-character, or a code point of the default-ignorable plane-14 block U+E0000..U+E0FFF)."""
    return (c in INVISIBLE_CHARS or unicodedata.category(c) in INVISIBLE_CATEGORIES or is_noncharacter(c)
            or 0xE0000 <= ord(c) <= 0xE0FFF)


def has_visible_text(text: str) -> bool:
    """True when ``text`` holds at least one character that shows: a letter, digit, punctuation, symbol or emoji of
    any script, or a combining mark. False for empty text and for text of only whitespace, control, format,
    private-use and non-characters (:func:`is_invisible`)."""
    return not all(is_invisible(c) for c in text)


@dataclass(frozen=True)
class HistoryTurn:
    """A turn as the director and speakers see it: ``role`` is ``"user"`` or ``"agent"``; ``text`` is visible text.

    ``directive`` (agent turns only) is the director's answer that chose the turn, exactly as the director's own
    chat shows it (:func:`directive_message`); "" when unknown. The director prompt renders it as an assistant
    message before the turn.
    """

    role: str
    text: str
    persona_id: str = ""
    directive: str = ""


#: Directive sources whose raw text is the director's own answer (a fallback's raw is a failed attempt).
_OWN_ANSWER_SOURCES = ("", "model", "retry")


def directive_lines(name: str, action: str, tone: str) -> str:
    """The canonical directive text: ``Agent: name`` / ``Action: action`` / ``Tone: tone``."""
    return f"Agent: {name}\nAction: {action}\nTone: {tone}"


def directive_message(name: str, action: str, tone: str, source: str = "model", raw: str = "") -> str:
    """The text the director sees as its own earlier answer for a turn.

    Args:
        name: Display name of the chosen persona.
        action: Directive action.
        tone: Directive tone.
        source: ``model``, ``retry``, ``fallback``, ``random``, ``safety`` or "" (unknown).
        raw: The director's raw text of the deciding attempt.

    Returns:
        ``raw`` when the model's own answer was used (source model, retry or unknown) and ``raw`` is non-empty;
        else the canonical lines; "" when ``action`` is empty too (nothing to show).
    """
    if raw and source in _OWN_ANSWER_SOURCES:
        return raw
    return directive_lines(name, action, tone) if action else ""


def _source_name(source: int) -> str:
    """The :func:`directive_message` source of a proto DirectiveSource: "" when unspecified (unknown), its name
    otherwise, ``other`` for a value this build does not know."""
    if source == dpb.DIRECTIVE_SOURCE_UNSPECIFIED:
        return ""
    return enum_name(dpb.DirectiveSource, source, default="other")


def directive_source_name(source: int) -> str:
    """A proto DirectiveSource as stored with a turn and written to transcripts (``model``, ``retry``, ``fallback``,
    ``safety``, ``random``): ``model`` when unspecified or unknown to this build."""
    if source == dpb.DIRECTIVE_SOURCE_UNSPECIFIED:
        return "model"
    return enum_name(dpb.DirectiveSource, source, default="model")


def directive_source_value(name: str) -> int:
    """:func:`directive_source_name`'s inverse: the proto DirectiveSource of a stored name, unspecified (0) for a
    name it does not know."""
    return enum_value(dpb.DirectiveSource, name, default=dpb.DIRECTIVE_SOURCE_UNSPECIFIED)


#: Most history turns and context entries a model-service request may carry (the gateway sends its history window,
#: 64 turns by default; a meeting excerpt has tens of utterances). Empty entries count like any other.
MAX_REQUEST_ENTRIES = 10_000


def history_from_proto(turns: Sequence[dpb.Turn], known_personas: Sequence[str] | None = None,
                       names: Mapping[str, str] | None = None) -> list[HistoryTurn]:
    """Convert proto turns to :class:`HistoryTurn`.

    An agent turn's ``directive`` becomes :func:`directive_message` of it (``names`` maps persona ids to display
    names for the canonical lines; the id is used when absent).

    Raises:
        InvalidArgument: more than :data:`MAX_REQUEST_ENTRIES` turns, a turn with ROLE_UNSPECIFIED, or an agent
            turn without a known persona id.
    """
    if len(turns) > MAX_REQUEST_ENTRIES:
        raise InvalidArgument(f"history has {len(turns)} turns; at most {MAX_REQUEST_ENTRIES} (send the most recent)")
    out = []
    for i, t in enumerate(turns):
        if t.role == dpb.ROLE_USER:
            out.append(HistoryTurn("user", t.text))
        elif t.role == dpb.ROLE_AGENT:
            if known_personas is not None and t.persona_id not in known_personas:
                raise InvalidArgument(f"history[{i}]: agent turn with unknown persona_id {t.persona_id!r}")
            d = t.directive if t.HasField("directive") else None
            text = directive_message((names or {}).get(t.persona_id, t.persona_id), d.action, d.tone,
                                     _source_name(d.source), d.raw) if d is not None else ""
            out.append(HistoryTurn("agent", t.text, t.persona_id, text))
        else:
            raise InvalidArgument(f"history[{i}]: role must be ROLE_USER or ROLE_AGENT")
    return out


def history_from_dicts(turns: Iterable[dict]) -> list[HistoryTurn]:
    """:class:`HistoryTurn` items from transcript/artefact dicts (``role``, ``text``, optional ``persona_id``;
    a missing or null persona id becomes ``""``; ``directive`` is kept when it is a string, as training artefacts
    write it). Keys beyond these are ignored."""
    return [HistoryTurn(t["role"], t["text"], t.get("persona_id") or "",
                        t["directive"] if isinstance(t.get("directive"), str) else "") for t in turns]


def history_to_dicts(history: Iterable[HistoryTurn]) -> list[dict]:
    """The inverse of :func:`history_from_dicts` (``directive`` only when set)."""
    out = []
    for h in history:
        d = {"role": h.role, "text": h.text, "persona_id": h.persona_id}
        if h.directive:
            d["directive"] = h.directive
        out.append(d)
    return out


def history_to_proto(history: Iterable[HistoryTurn]) -> list[dpb.Turn]:
    """Convert :class:`HistoryTurn` items to proto turns (visible text; a turn's ``directive`` text travels as
    ``Directive.raw`` with the source unset, which :func:`history_from_proto` reads back unchanged)."""
    return [dpb.Turn(role=dpb.ROLE_USER if h.role == "user" else dpb.ROLE_AGENT, persona_id=h.persona_id,
                     text=h.text, directive=dpb.Directive(persona_id=h.persona_id, raw=h.directive)
                     if h.directive else None) for h in history]


def context_from_proto(context: Sequence[dpb.ContextUtterance]) -> list[tuple[str, str]]:
    """``(speaker, content)`` pairs.

    Raises:
        InvalidArgument: more than :data:`MAX_REQUEST_ENTRIES` entries.
    """
    if len(context) > MAX_REQUEST_ENTRIES:
        raise InvalidArgument(f"context has {len(context)} entries; at most {MAX_REQUEST_ENTRIES}")
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
