"""Directive parsing, validation, the consecutive-turn cap and the fallback.

Pure functions over plain data; the servicer and the Phase-2 rollouts call them directly.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Sequence

from mascot.core.dialogue import FALLBACK_ACTION, HistoryTurn, consecutive_turns
from mascot.core.engine.base import regex_escape
from mascot.core.personas import PersonaCard

_FIELD_RE = re.compile(r"^\s*(agent|action|tone)\s*:(.*)$", re.IGNORECASE)


@dataclass(frozen=True)
class ParsedDirective:
    """A directive that passed the parse rules: the persona id and non-empty action and tone."""

    persona_id: str
    action: str
    tone: str


class DirectiveError(ValueError):
    """The director text breaks a parse rule; the message says which, for the retry prompt.

    Attributes:
        reason: ``directive_invalid`` (format, unknown agent, cap), ``directive_name`` (Action or Tone is only a
            helper's name, or too short), ``directive_voice`` (Action speaks to the person in the first person
            instead of instructing a helper) or ``directive_copy`` (Action repeats an earlier one or the example).
    """

    def __init__(self, message: str, reason: str = "directive_invalid") -> None:
        super().__init__(message)
        self.reason = reason


_ACTION_LINE_RE = re.compile(r"^\s*action\s*:(.*)$", re.IGNORECASE | re.MULTILINE)


def earlier_actions(history: Sequence[HistoryTurn]) -> list[str]:
    """The Action of every earlier directive in ``history`` (agent turns' directive messages), oldest first."""
    out = []
    for t in history:
        if t.role == "agent" and t.directive:
            m = _ACTION_LINE_RE.search(visible_part(t.directive))
            if m and m.group(1).strip():
                out.append(m.group(1).strip())
    return out


#: Words of a first-person Action ("Acknowledge how brave you are, and I'm so proud of you."): a small model
#: continues a helper's reply inside the Action instead of instructing the helper.
FIRST_PERSON = frozenset({"i", "i'm", "im", "i've", "i'll", "i'd", "me", "my", "mine", "myself"})


def check_content(d: ParsedDirective, roster_names: Sequence[str], history: Sequence[HistoryTurn],
                  forbidden_copies: Sequence[str] = (), min_action_words: int = 4,
                  copy_jaccard: float = 0.8) -> None:
    """The content rules: Action has ``min_action_words``+ words that are not a helper's name and none of
    :data:`FIRST_PERSON`, Tone is not a helper's name, and Action is no copy (character 5-gram Jaccard >=
    ``copy_jaccard``, :func:`mascot.core.guard.jaccard`) of an earlier directive's Action or of ``forbidden_copies``
    (the prompt's example).

    Raises:
        DirectiveError: with reason ``directive_name``, ``directive_voice`` or ``directive_copy`` and a message for
            the retry prompt.
    """
    from mascot.core.guard import char_ngrams, jaccard, words

    # "the" of "The Anchor" is no name word: "Acknowledge the user's experience" has four real words; an Action that
    # is only a name ("The Anchor") still has fewer than min_action_words
    name_words = {w for n in roster_names for w in words(n)} - {"the"} | {"agent", "helper"}
    rest = [w for w in words(d.action) if w not in name_words]
    if len(rest) < min_action_words:
        raise DirectiveError("the Action must be a sentence of at least "
                             f"{min_action_words} words saying what to do, not a helper's name", "directive_name")
    if FIRST_PERSON.intersection(words(d.action)):
        raise DirectiveError("the Action must tell the helper what to do (e.g. 'Ask what ...'), not speak to the "
                             "person with 'I'", "directive_voice")
    # a Tone is a helper's name when nothing is left once the whole names are taken out: "Empathetic Listener" or
    # "The Anchor" is refused, "Empathetic, calm" (a word of a name, used as a tone word) is not
    tone = " ".join(words(d.tone))
    for n in sorted((" ".join(words(x)).removeprefix("the ") for x in roster_names), key=len, reverse=True):
        tone = re.sub(rf"\b(?:the )?{re.escape(n)}\b", " ", tone) if n else tone
    if not [w for w in tone.split() if w not in {"the", "agent", "helper", "and"}]:
        raise DirectiveError("the Tone must describe a tone (e.g. 'Warm and calm'), not name a helper",
                             "directive_name")
    grams = char_ngrams(d.action)
    for earlier in [*earlier_actions(history), *forbidden_copies]:
        if jaccard(grams, char_ngrams(earlier)) >= copy_jaccard:
            raise DirectiveError("the Action repeats an earlier one; give a new instruction about the latest "
                                 "message", "directive_copy")


def visible_part(text: str) -> str:
    """The text after the last ``</think>`` (all of it when there is none)."""
    k = text.rfind("</think>")
    return text[k + len("</think>"):] if k != -1 else text


def _norm(name: str) -> str:
    n = " ".join(name.strip().strip("*").strip().lower().split())
    return n[4:] if n.startswith("the ") else n


def _bare(name: str) -> str:
    """``name`` without a leading "The " (any case); the name itself when nothing would remain."""
    n = name.strip()
    return n[4:].strip() if n.lower().startswith("the ") and n[4:].strip() else n


def match_persona(name: str, roster: Sequence[PersonaCard]) -> str:
    """Map an ``Agent:`` value to exactly one persona id of ``roster``.

    Matching is case-insensitive, a leading "The " is optional, and the persona id also matches.

    Raises:
        DirectiveError: no persona or several personas match.
    """
    want = _norm(name)
    if not want:
        raise DirectiveError("the Agent line is empty")
    hits = [c.id for c in roster if want in (_norm(c.name), c.id)]
    if len(hits) == 1:
        return hits[0]
    if len(hits) > 1:
        raise DirectiveError(f"the Agent line matches several agents ({', '.join(hits)})")
    named = [c.name for c in roster if _norm(c.name) in want]
    if len(named) > 1:
        raise DirectiveError("the Agent line names several agents; name exactly one")
    raise DirectiveError(f"'{name.strip()[:60]}' is not one of the agents: " + ", ".join(c.name for c in roster))


def parse_directive(text: str, roster: Sequence[PersonaCard]) -> ParsedDirective:
    """Parse director output into a directive.

    Rules: read the text after any ``</think>``; it must hold exactly one ``Agent:``,
    one ``Action:`` and one ``Tone:`` line, in that order, and nothing else (blank lines aside). Field names
    are case-insensitive. ``Agent`` must name exactly one active persona; Action and Tone must be non-empty.

    Raises:
        DirectiveError: with a message naming the broken rule.
    """
    lines = [ln for ln in visible_part(text).splitlines() if ln.strip()]
    fields: list[tuple[str, str]] = []
    for ln in lines:
        m = _FIELD_RE.match(ln)
        if not m:
            raise DirectiveError("every line must be 'Agent: ...', 'Action: ...' or 'Tone: ...'")
        fields.append((m.group(1).lower(), m.group(2).strip()))
    names = [f for f, _ in fields]
    if names != ["agent", "action", "tone"]:
        raise DirectiveError("the answer must have exactly three lines, Agent, Action and Tone, in that order")
    agent, action, tone = (v for _, v in fields)
    persona_id = match_persona(agent, roster)
    if not action:
        raise DirectiveError("the Action line is empty")
    if not tone:
        raise DirectiveError("the Tone line is empty")
    return ParsedDirective(persona_id, action, tone)


def check_cap(persona_id: str, history: Sequence[HistoryTurn], max_consecutive: int) -> None:
    """Raise :class:`DirectiveError` when speaking again would exceed ``max_consecutive`` turns in a row."""
    if consecutive_turns(history, persona_id) + 1 > max_consecutive:
        raise DirectiveError(f"{persona_id} has already spoken {max_consecutive} turns in a row; pick another agent")



def fallback_directive(card: PersonaCard) -> ParsedDirective:
    """The fallback directive for ``card``: the standard action and the persona's default tone."""
    return ParsedDirective(card.id, FALLBACK_ACTION, card.default_tone)


#: Verbs an Action may open with under constrained decoding: imperative instructions to a helper. A small model
#: copies its previous directive or a helper's goal ("Help the user see ..."); opening with a verb not used by the
#: latest directives (:func:`action_verbs`) breaks the copy where the rest of the answer would repeat it. "Thank" and
#: "Invite" are left out: after them a small model writes a reply to the person ("Thank you for your kindness.",
#: "Invite you, I'm glad ...") rather than an instruction.
ACTION_VERBS = ("Acknowledge", "Ask", "Reflect", "Name", "Validate", "Reassure", "Suggest", "Offer", "Encourage",
                "Explore", "Celebrate", "Point out", "Normalise", "Praise", "Remind", "Share", "Gently ask",
                "Recognise")


def action_verbs(history: Sequence[HistoryTurn], recent: int = 2) -> list[str]:
    """:data:`ACTION_VERBS` without those that opened the Actions of the last ``recent`` directives."""
    used = [a.split()[0].lower() for a in earlier_actions(history)[-recent:] if a.split()] if recent else []
    verbs = [v for v in ACTION_VERBS if v.split()[0].lower() not in used]
    return verbs or list(ACTION_VERBS)


#: Tone words a constrained directive may use (with the roster's default-tone words, :func:`tone_words`). Letters
#: alone let SmolLM2-135M spell new words ("Gentle and uncertain, Amentaeclanteflo"), which then reached the speaker's
#: prompt and the next directives.
TONE_WORDS = ("gentle", "calm", "warm", "kind", "soft", "steady", "patient", "attentive", "empathetic", "caring",
              "tender", "thoughtful", "curious", "open", "honest", "sincere", "respectful", "supportive",
              "reassuring", "encouraging", "hopeful", "positive", "upbeat", "cheerful", "bright", "playful", "light",
              "friendly", "relaxed", "quiet", "serious", "grounded", "practical", "clear", "direct", "firm",
              "confident", "concise", "neutral", "precise", "constructive", "organised", "compassionate", "lively")


def tone_words(roster: Sequence[PersonaCard] = ()) -> list[str]:
    """:data:`TONE_WORDS` and the words of the roster's default tones (lower-case, letters only, in that order, no
    repeats; "and" left out), the vocabulary of :func:`tone_regex`."""
    extra = [w for c in roster for w in re.findall(r"[a-z]+", c.default_tone.lower()) if w != "and"]
    return list(dict.fromkeys([*TONE_WORDS, *extra]))


def tone_regex(max_chars: int, vocabulary: Sequence[str] = ()) -> str:
    """A Tone under the grammar: one to three words joined by " and " or ", " ("Gentle and calm", "Warm, curious"),
    the first capitalised. With ``vocabulary`` (lower-case words; :func:`tone_words`) every word is one of them (those
    longer than ``max_chars`` left out); without it, a word is a letter and then lower-case letters, at most
    ``min(16, max_chars)`` characters. Free text let a small model run on ("Gentle and calm, no more than 2-").

    Raises:
        ValueError: ``vocabulary`` holds no word of at most ``max_chars`` characters.
    """
    if vocabulary:
        kept = sorted({w for w in vocabulary if w.isalpha() and len(w) <= max_chars}, key=lambda w: (-len(w), w))
        if not kept:
            raise ValueError(f"no tone word fits director.max_tone_chars={max_chars}")
        first = "(" + "|".join(w[0].upper() + w[1:] for w in kept) + ")"
        word = "(" + "|".join(kept) + ")"
        return rf"{first}(( and |, ){word}){{0,2}}"
    w = rf"[A-Za-z][a-z]{{0,{max(0, min(16, max_chars) - 1)}}}"
    return rf"{w}(,? {w}){{0,3}}"

#: Characters an Action must have after its verb under the grammar ("a solution" is too short to be an instruction).
ACTION_MIN_CHARS = 16


def directive_regex(roster: Sequence[PersonaCard], *, max_action_chars: int, max_tone_chars: int,
                    max_think_chars: int = 0, verbs: Sequence[str] | None = None,
                    tones: Sequence[str] = ()) -> str:
    """Regex for constrained decoding: exactly the three lines, ``Agent:`` restricted to the roster names.

    An optional ``<think>`` block of at most ``max_think_chars`` characters may come first (0 disables it). With
    ``verbs`` the Action opens with one of them and is one sentence (then a space and at least
    :data:`ACTION_MIN_CHARS` more characters, no sentence end but an optional last one), so a small model can neither
    run on into a second sentence nor stop at a bare "Offer a solution." that the content rules refuse. With
    ``tones`` the Tone's words come from that vocabulary (:func:`tone_regex`).
    """
    # Every name with or without a leading "The " (match_persona accepts both): with the names as written ("The Anchor",
    # "The Catalyst", "The Beacon", "Empathetic Listener", "Action Guide") a model's likely first token "The" would
    # leave only the "The" personas reachable, and constrained decoding would never pick the other two.
    names = "|".join(sorted({regex_escape(_bare(c.name)) for c in roster}))
    head = rf"(<think>[^<]{{0,{max_think_chars}}}</think>\n)?" if max_think_chars > 0 else ""
    if verbs:  # one sentence: no sentence end inside, an optional one at the end
        opening = "(" + "|".join(regex_escape(v) for v in verbs) + ")"
        longest = max(ACTION_MIN_CHARS, max_action_chars - 12)
        action = rf"{opening} [^\n<\t .!?][^\n<.!?]{{{ACTION_MIN_CHARS - 1},{longest}}}[.!?]?"
    else:
        action = rf"[^\n<\t ][^\n<]{{0,{max_action_chars - 1}}}"
    return (rf"{head}Agent: (The )?({names})\nAction: {action}\n"
            rf"Tone: {tone_regex(max_tone_chars, tones)}")
