"""Persona cards loaded from YAML.

A persona file holds ``persona_set`` and a list ``personas`` of cards. Unknown keys are rejected, and
a bad file raises :class:`PersonaFileError` naming the file, the line and the field. The text fields that prompts
show on one line (``name``, ``role``, ``goal``, ``default_tone`` and each item of ``expertise``, ``allowed_moves``,
``forbidden_moves``, ``style``) must be single lines; ``tone_words`` are single lower-case words. The support and
meeting sets ship with the package; users add their own files (``personas.extra_files``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

import yaml
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, field_validator

from mascot.core.moves import CardMoves

SHIPPED_DIR = Path(__file__).parent
SHIPPED_FILES = (SHIPPED_DIR / "support.yaml", SHIPPED_DIR / "meeting.yaml", SHIPPED_DIR / "baselines.yaml")
#: Persona sets only the evaluation baselines use (the single-voice ``supporter``): never listed or served in a
#: conversation.
EVALUATION_SETS = frozenset({"baselines"})
#: The shipped set of each conversation mode; a card of one mode's set is refused in the other mode. Sets users add
#: (``personas.extra_files``) may join conversations of either mode.
MODE_SETS = {"support": "support", "meeting": "meeting"}
Level = Literal["low", "mid", "high"]
#: A persona id: snake_case, 1-63 characters, starting with a letter (``\Z``: no trailing newline either).
ID_PATTERN = "[a-z][a-z0-9_]{0,62}"
ID_RE = re.compile(rf"^{ID_PATTERN}\Z")
#: Line and paragraph separators (where :meth:`str.splitlines` splits): refused in the one-line card fields.
LINE_BREAKS = re.compile("[\n\r\x0b\x0c\x1c-\x1e\x85\u2028\u2029]")
#: Deepest nesting of YAML mappings and lists a persona file may have (a card with moves needs about 8).
MAX_YAML_DEPTH = 32


def _single_line(v: str) -> str:
    """``v`` unchanged; ValueError when it holds a line break (:data:`LINE_BREAKS`): a card field is shown on one line
    of the director's and speakers' prompts, and a line break would carry extra lines into them."""
    m = LINE_BREAKS.search(v)
    if m:
        raise ValueError(f"must be a single line but holds the line break U+{ord(m.group()):04X} (it would carry extra "
                         "lines into the prompts); write it on one line (in YAML a plain or quoted scalar, or '>-' "
                         "for a folded one)")
    return v


#: A card text shown on one line of a prompt.
OneLine = Annotated[str, AfterValidator(_single_line)]
#: A tone word of a card (``tone_words``): lower-case letters only, as the director's Tone grammar spells them.
ToneWord = Annotated[str, Field(pattern=r"^[a-z]{1,32}$")]


class Disposition(BaseModel):
    """Big Five disposition, each trait ``low``, ``mid`` or ``high``."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    openness: Level
    conscientiousness: Level
    extraversion: Level
    agreeableness: Level
    neuroticism: Level


class PersonaCard(BaseModel):
    """One persona card. Field meanings: the docs

    ``id`` is snake_case (1-63 characters, starts with a letter) and names adapters ``<id>--v<N>``.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)
    id: str
    name: OneLine = Field(min_length=1, max_length=64)
    role: OneLine = Field(min_length=1, max_length=128)
    goal: OneLine = Field(min_length=1, max_length=1000)
    disposition: Disposition
    expertise: list[OneLine] = Field(default_factory=list)
    allowed_moves: list[OneLine] = Field(min_length=1)
    forbidden_moves: list[OneLine] = Field(default_factory=list)
    style: list[OneLine] = Field(default_factory=list)
    default_tone: OneLine = Field(min_length=1, max_length=200)
    #: Tone words that fit the persona besides those of ``default_tone``: the director's Tone for this persona is made
    #: of these and the default tone's words (:func:`mascot.director.directive.tone_words`). Empty: the default
    #: tone's words only.
    tone_words: list[ToneWord] = Field(default_factory=list, max_length=64)
    max_answer_words: int = Field(80, ge=5, le=2000)
    #: The card's moves as detectors (:mod:`mascot.core.moves`): what a reply must do and must not. Optional: a card
    #: without them has no move compliance in the evaluation.
    moves: CardMoves | None = None
    persona_set: str = ""

    @field_validator("id")
    @classmethod
    def _snake(cls, v: str) -> str:
        if not ID_RE.match(v):
            raise ValueError("must be snake_case: lower-case letters, digits and '_', starting with a letter")
        return v

    @field_validator("name")
    @classmethod
    def _no_colon(cls, v: str) -> str:
        if ":" in v:
            raise ValueError("must be one line without ':' (it is a speaker tag in prompts)")
        return v


class PersonaFile(BaseModel):
    """The top level of a persona YAML file."""

    model_config = ConfigDict(extra="forbid")
    persona_set: str = Field(pattern=r"^[a-z][a-z0-9_]{0,31}$")
    personas: list[PersonaCard] = Field(min_length=1)


class PersonaFileError(ValueError):
    """A persona file is unreadable or invalid. The message reads ``FILE:LINE: field PATH: problem``."""


def _line_of(node: yaml.Node | None, loc: tuple) -> int:
    """Walk a composed YAML node tree along a pydantic error location; return the 1-based line."""
    line = node.start_mark.line + 1 if node is not None else 1
    for part in loc:
        if isinstance(node, yaml.MappingNode):
            nxt = None
            for k, v in node.value:
                if k.value == part:
                    nxt = v
                    break
            if nxt is None:
                break
            node = nxt
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
            node = node.value[part]
        else:
            break
        line = node.start_mark.line + 1
    return line


def _check_depth(text: str, path: Path) -> None:
    """Refuse YAML nested deeper than :data:`MAX_YAML_DEPTH` before it is composed (composing and constructing
    recurse once per level: thousands of nested lists would end in RecursionError). Reads the event stream, which
    does not recurse, and stops at the first level too deep.

    Raises:
        PersonaFileError: too deep (``FILE:LINE: ...``).
        yaml.YAMLError: the text does not parse.
    """
    depth = 0
    for ev in yaml.parse(text, Loader=yaml.SafeLoader):
        if isinstance(ev, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
            depth += 1
            if depth > MAX_YAML_DEPTH:
                raise PersonaFileError(f"{path}:{ev.start_mark.line + 1}: mappings and lists nested more than "
                                       f"{MAX_YAML_DEPTH} levels deep; a persona file needs a few")
        elif isinstance(ev, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
            depth -= 1


def load_persona_file(path: str | Path) -> list[PersonaCard]:
    """Load and validate one persona file.

    Args:
        path: A YAML file with ``persona_set`` and ``personas``.

    Returns:
        The cards, each with ``persona_set`` filled in.

    Raises:
        PersonaFileError: unreadable file, text that is not UTF-8, bad YAML, YAML nested more than
            :data:`MAX_YAML_DEPTH` levels, unknown key, missing or invalid field (a line break in a one-line field
            included), duplicate id. The message names the file.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise PersonaFileError(f"{path}: cannot read persona file: {e.strerror or e}") from None
    except UnicodeDecodeError as e:
        raise PersonaFileError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start}); save the persona file as "
                               "UTF-8") from None
    try:
        return _load_cards(text, path)
    except RecursionError:  # a backstop: _check_depth refuses deep nesting first (aliases can still build cycles)
        raise PersonaFileError(f"{path}: the YAML is nested too deeply or refers to itself (aliases); write the "
                               "cards out plainly") from None


def _load_cards(text: str, path: Path) -> list[PersonaCard]:
    """The cards of persona file ``path`` holding ``text`` (checks and errors: :func:`load_persona_file`)."""
    try:
        _check_depth(text, path)
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = mark.line + 1 if mark is not None else 1
        raise PersonaFileError(f"{path}:{line}: invalid YAML: {getattr(e, 'problem', e)}") from None
    if not isinstance(data, dict):
        raise PersonaFileError(f"{path}:1: expected a mapping with 'persona_set' and 'personas'")
    try:
        parsed = PersonaFile.model_validate(data)
    except ValidationError as e:
        err = e.errors()[0]
        loc = tuple(err["loc"])
        field = ".".join(str(p) for p in loc) or "(top level)"
        who = ""
        if len(loc) > 2 and loc[0] == "personas" and isinstance(loc[1], int):
            items = data.get("personas") if isinstance(data.get("personas"), list) else []
            pid = items[loc[1]].get("id") if loc[1] < len(items) and isinstance(items[loc[1]], dict) else None
            who = f" (persona {pid!r})" if pid else ""
        fix = ""
        if "moves" in loc:
            fix = ("; fix: write each move as {detector: NAME, params: {...}} with a detector of mascot.core.moves "
                   "(docs/evaluation.md, 'Persona adherence', lists them with their parameters)")
        msg = err["msg"].removeprefix("Value error, ")
        raise PersonaFileError(f"{path}:{_line_of(node, loc)}: field {field}{who}: {msg}{fix}") from None
    seen: dict[str, int] = {}
    cards = []
    for i, card in enumerate(parsed.personas):
        if card.id in seen:
            raise PersonaFileError(f"{path}:{_line_of(node, ('personas', i, 'id'))}: field personas.{i}.id: "
                                   f"duplicate persona id '{card.id}'")
        seen[card.id] = i
        cards.append(card.model_copy(update={"persona_set": parsed.persona_set}))
    return cards


@dataclass(frozen=True)
class PersonaCatalog:
    """All known persona cards by id, with the default roster per mode.

    Raises (from :meth:`load`): PersonaFileError for a bad file or an id defined twice across files.
    """

    cards: dict[str, PersonaCard]

    @classmethod
    def load(cls, extra_files: list[Path] | tuple[Path, ...] = ()) -> "PersonaCatalog":
        """Load the shipped sets plus ``extra_files`` (a user card may not reuse a shipped id)."""
        cards: dict[str, PersonaCard] = {}
        for f in (*SHIPPED_FILES, *extra_files):
            for card in load_persona_file(f):
                if card.id in cards:
                    raise PersonaFileError(f"{f}: field personas.id: persona id '{card.id}' is already defined "
                                           f"in set '{cards[card.id].persona_set}'")
                cards[card.id] = card
        return cls(cards)

    def get(self, persona_id: str) -> PersonaCard:
        """Return a card. Raises KeyError for an unknown id."""
        return self.cards[persona_id]

    def in_set(self, persona_set: str) -> list[PersonaCard]:
        """Cards of one set, in file order."""
        return [c for c in self.cards.values() if c.persona_set == persona_set]

    def unusable_reason(self, card: PersonaCard, mode: str) -> str | None:
        """Why ``card`` may not speak in a conversation of ``mode`` ("support" or "meeting"), or None when it may.

        Evaluation-only sets (:data:`EVALUATION_SETS`) never may; a shipped mode's set is refused in the other mode.
        """
        if card.persona_set in EVALUATION_SETS:
            return f"persona {card.id!r} is evaluation-only (set {card.persona_set!r})"
        other = {s for m, s in MODE_SETS.items() if m != mode}
        if card.persona_set in other:
            return f"persona {card.id!r} belongs to the {card.persona_set} set, not to {mode} conversations"
        return None

    def servable(self, mode: str | None = None) -> list[PersonaCard]:
        """Cards a conversation may use, in file order: every card but the evaluation-only ones; with ``mode``, only
        those :meth:`unusable_reason` accepts for that mode."""
        return [c for c in self.cards.values()
                if (c.persona_set not in EVALUATION_SETS if mode is None else self.unusable_reason(c, mode) is None)]
