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
            instead of instructing a helper), ``directive_addressee`` (Action has the helper speak to someone other
            than the user), ``directive_person`` (Action names someone the conversation does not mention) or
            ``directive_copy`` (Action repeats an earlier one or the example).
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


#: How directives name the one the helpers talk with ("Ask the user what ...", "the person's fear").
USER_WORDS = frozenset({"user", "person"})
#: Words naming a person the conversation may speak of, by kind: a word of a kind counts as mentioned when any word of
#: that kind is ("your partner" after "my husband", "the child" after "my son"). Plurals and possessives are reduced
#: to these ("parents'", "kids").
PEOPLE_KINDS: dict[str, str] = {
    **dict.fromkeys(("mother", "mom", "mum", "mommy", "mummy", "mama", "father", "dad", "daddy", "papa", "parent",
                     "stepmother", "stepfather", "stepmom", "stepdad"), "parent"),
    **dict.fromkeys(("child", "children", "kid", "son", "daughter", "baby", "toddler", "teenager", "stepson",
                     "stepdaughter"), "child"),
    **dict.fromkeys(("husband", "wife", "partner", "spouse", "boyfriend", "girlfriend", "fiance", "fiancee"),
                    "partner"),
    **dict.fromkeys(("brother", "sister", "sibling"), "sibling"),
    **dict.fromkeys(("grandmother", "grandma", "granny", "grandfather", "grandpa", "grandparent"), "grandparent"),
    **dict.fromkeys(("uncle", "aunt", "cousin", "niece", "nephew", "relative", "stepbrother", "stepsister"),
                    "relative"),
    **dict.fromkeys(("friend", "bestie", "buddy", "pal"), "friend"),
    **dict.fromkeys(("boss", "manager", "supervisor", "employer"), "boss"),
    **dict.fromkeys(("colleague", "coworker", "co-worker", "teammate"), "colleague"),
    **dict.fromkeys(("teacher", "professor", "tutor", "coach", "classmate", "student"), "school"),
    **dict.fromkeys(("neighbour", "neighbor"), "neighbour"),
    **dict.fromkeys(("doctor", "therapist", "counsellor", "counselor", "nurse"), "carer"),
    **dict.fromkeys(("roommate", "flatmate", "housemate", "landlord"), "housemate"),
    "ex": "ex",
}
#: Words for people in general or a group: someone other than the user when addressed ("Share it with others"), but
#: too vague to count as naming a person the conversation lacks.
OTHER_PEOPLE = frozenset({"him", "her", "himself", "herself", "themselves", "yourself", "yourselves", "others",
                          "everyone", "everybody", "someone", "somebody", "anyone", "anybody", "people", "family",
                          "team", "group", "relatives"})
#: Pronouns that are a whole addressee ("tell them it will pass": "them", not "them it will pass").
_PRONOUNS = frozenset({"them", "him", "her", "you", "us", "himself", "herself", "themselves", "yourself", "yourselves",
                       "others", "everyone", "everybody", "someone", "somebody", "anyone", "anybody"})
#: Verbs whose object is who the helper speaks to ("Ask the user ...", "Tell the child's parents ...").
ADDRESS_VERBS = frozenset({"ask", "tell", "remind", "invite", "encourage", "urge", "reassure", "thank", "praise",
                           "advise", "warn", "comfort", "console", "congratulate", "compliment", "assure", "contact",
                           "call", "text", "email", "message", "greet"})
#: Verbs whose "to"/"with" phrase is who the helper speaks to ("Offer a kind message to the child's parents",
#: "Reach out to her sister", "Share it with others").
TO_VERBS = frozenset({"offer", "give", "send", "say", "write", "share", "explain", "suggest", "pass", "deliver",
                      "extend", "express", "show", "recommend", "read", "convey", "bring", "address", "direct",
                      "present", "describe", "reach", "speak", "talk", "reply", "respond", "apologise", "apologize",
                      "turn"})
#: Words that may come between a clause's start and its verb ("and gently ask", ", then tell").
_ADVERBS = frozenset({"gently", "directly", "kindly", "softly", "carefully", "warmly", "calmly", "briefly", "also",
                      "then", "now", "first", "next", "finally", "just", "simply", "clearly", "quietly"})
_CLAUSE_START = frozenset({",", ";", ":", "and", "then", "or", "but"})
#: Words that end the noun phrase of an addressee ("the user *who* ...", "them *to* ...").
_PHRASE_END = frozenset({",", ";", ":", "who", "whom", "which", "that", "what", "how", "why", "when", "where",
                         "whether", "if", "to", "about", "for", "of", "with", "and", "or", "in", "on", "at", "by",
                         "from", "so", "as", "because", "than", "into", "is", "are", "was", "were", "has", "have",
                         "had"})
_DETERMINERS = frozenset({"the", "a", "an", "his", "her", "their", "your", "my", "our", "its", "this", "that", "these",
                          "those", "some", "any", "all", "every", "each", "them", "him", "us", "you"})
#: Subjects of a clause of the user's own ("suggest they speak to ...", "how you've helped someone with ...").
_SUBJECTS = frozenset({"they", "you", "he", "she", "we", "they're", "you're", "he's", "she's", "we're", "they've",
                       "you've", "we've", "they'd", "you'd", "they'll", "you'll"})
_TOKEN_RE = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9'’-]*[A-Za-z0-9])?|[,;:]")


def _people_word(token: str) -> str | None:
    """The kind (:data:`PEOPLE_KINDS`) of a lower-case token, its plural or possessive ("parents'", "kids",
    "sister's"), or None."""
    t = token.replace("’", "'").removesuffix("'s").removesuffix("'")
    for form in (t, t[:-1] if t.endswith("s") else "", t[:-2] if t.endswith("es") else ""):
        if form in PEOPLE_KINDS:
            return PEOPLE_KINDS[form]
    return None


def _addressee(phrase: Sequence[str], raw: Sequence[str], user_before: bool) -> str | None:
    """Who a noun phrase addresses, when it is not the user: the phrase (as written) for a person or group other
    than the user (its last person word decides: "the user's parents" is the parents), an ambiguous "them" with no
    mention of the user before it in the Action, or a name; None for the user or no person at all ("a story")."""
    from sklearn.feature_extraction.text import ENGLISH_STOP_WORDS

    head = None
    for i, (t, r) in enumerate(zip(phrase, raw)):
        bare = t.removesuffix("'s").removesuffix("'")
        loved_ones = t == "loved" and i + 1 < len(phrase) and phrase[i + 1] in ("one", "ones")
        if bare in USER_WORDS:
            head = "user"
        elif _people_word(t) or bare in OTHER_PEOPLE or loved_ones or (t == "them" and not user_before):
            head = "other"
        elif r[:1].isupper() and t not in _DETERMINERS and t not in ENGLISH_STOP_WORDS:
            head = "other"  # a name ("Tell Maria ...")
    return " ".join(raw) if head == "other" else None


def _phrase(tokens: Sequence[str], start: int, limit: int = 6) -> tuple[int, int]:
    """``(start, end)`` of the noun phrase at ``start`` (up to :data:`_PHRASE_END` or ``limit`` tokens; a pronoun
    alone, "her" with the person word after it: "tell them it will pass", "ask her sister")."""
    first = tokens[start] if start < len(tokens) else ""
    if first in _PRONOUNS:
        nxt = tokens[start + 1] if start + 1 < len(tokens) else ""
        return start, start + (2 if first == "her" and _people_word(nxt) else 1)
    end = start
    while end < len(tokens) and end - start < limit and tokens[end] not in _PHRASE_END:
        end += 1
    return start, end


def wrong_addressee(action: str) -> str | None:
    """Whom the Action has the helper speak to, when that is someone other than the user, or None.

    An imperative verb (at the start of the Action or of a clause after ",", ";", "and", "then", an adverb such as
    "gently" allowed between) of :data:`ADDRESS_VERBS` takes its object as the addressee; one of :data:`TO_VERBS`
    the phrase after its first "to" or "with" when that phrase starts with a determiner, a pronoun or a person word
    ("Offer a kind word to the child's parents", not "Suggest a way to talk to their sister", whose "to" opens a
    step for the user). The addressee is someone else when its last person word names another person or group
    (:data:`PEOPLE_KINDS`, :data:`OTHER_PEOPLE`, a capitalised name), or it is "them" and the Action has not named
    the user before it (among several helpers "them" may be the others). Verbs after "to" or a subject ("Encourage
    the user to ask their sister", "suggest they call a friend") are the user's steps, not an address.

    "and" after such an infinitive joins the user's steps ("Encourage the user to reflect and share it with
    others").

    Returns:
        The addressee as written ("the child's parents", "them"), or None when the Action speaks to the user or to
        no one.
    """
    raw = _TOKEN_RE.findall(action)
    tokens = [t.lower().replace("’", "'") for t in raw]
    clause_start, infinitive = True, False
    for i, t in enumerate(tokens):
        if t in (",", ";", ":"):
            clause_start, infinitive = True, False
            continue
        if t in _CLAUSE_START:
            # "Encourage the user to reflect and share them with others": after an infinitive, "and" joins the
            # user's steps, it opens no instruction of the helper's
            clause_start = not infinitive
            continue
        nxt = tokens[i + 1] if i + 1 < len(tokens) else ""
        if t == "to" and nxt not in _DETERMINERS and nxt not in OTHER_PEOPLE and nxt not in USER_WORDS:
            infinitive = True
        if clause_start and t in _ADVERBS:
            continue
        imperative, clause_start = clause_start, False
        if not imperative:
            continue
        user_before = any(x.removesuffix("'s") in USER_WORDS for x in tokens[:i])
        if t in ADDRESS_VERBS:
            a, b = _phrase(tokens, i + 1)
            who = _addressee(tokens[a:b], raw[a:b], user_before)
            if who:
                return who
        if t in TO_VERBS:
            for j in range(i + 1, len(tokens)):
                nxt = tokens[j + 1] if j + 1 < len(tokens) else ""
                # a new clause: punctuation, "and"/"then" before a verb, or a subject ("suggest they speak to ...")
                if tokens[j] in (",", ";", ":") or tokens[j] in _SUBJECTS or (
                        tokens[j] in _CLAUSE_START and (nxt in _VERBS or nxt in _ADVERBS)):
                    break
                if tokens[j] in ("to", "with"):
                    if nxt in _DETERMINERS or nxt in OTHER_PEOPLE or nxt in USER_WORDS or _people_word(nxt) \
                            or raw[min(j + 1, len(raw) - 1)][:1].isupper():
                        a, b = _phrase(tokens, j + 1)
                        who = _addressee(tokens[a:b], raw[a:b], user_before)
                        if who:
                            return who
                    break
    return None


def people_not_mentioned(action: str, conversation: Sequence[str]) -> list[str]:
    """The people the Action names that ``conversation`` (its texts) does not mention, as written, in order.

    A person word (:data:`PEOPLE_KINDS`) counts as mentioned when a word of its kind occurs in the conversation ("the
    child's parents" after "my friend has a child" names the parents, who are not mentioned); a capitalised word after
    "to", "with", "about" or one of :data:`ADDRESS_VERBS`, or before "'s", is a name and counts when it occurs (any
    case). Words for people in general (:data:`OTHER_PEOPLE`, "the user") are never counted.
    """
    from sklearn.feature_extraction.text import ENGLISH_STOP_WORDS

    seen_kinds, seen_words = set(), set()
    for text in conversation:
        for w in _TOKEN_RE.findall(text):
            w = w.lower().replace("’", "'")
            seen_words.add(w.removesuffix("'s"))
            if (k := _people_word(w)) is not None:
                seen_kinds.add(k)
    raw = _TOKEN_RE.findall(action)
    out = []
    for i, r in enumerate(raw):
        t = r.lower().replace("’", "'")
        k = _people_word(t)
        if k is not None and k not in seen_kinds:
            out.append(r)
        before = raw[i - 1].lower() if i else ""
        named = i > 0 and r[:1].isupper() and t.removesuffix("'s") not in ENGLISH_STOP_WORDS and (
            before in ("to", "with", "about") or before in ADDRESS_VERBS or t.endswith("'s"))
        if k is None and named and t.removesuffix("'s") not in seen_words:
            out.append(r)
    return list(dict.fromkeys(out))


def check_content(d: ParsedDirective, roster_names: Sequence[str], history: Sequence[HistoryTurn],
                  forbidden_copies: Sequence[str] = (), min_action_words: int = 4,
                  copy_jaccard: float = 0.8, context: Sequence[tuple[str, str]] = ()) -> None:
    """The content rules: Action has ``min_action_words``+ words that are not a helper's name and none of
    :data:`FIRST_PERSON`, Tone is not a helper's name, the Action has the helper speak to the user
    (:func:`wrong_addressee`) and names nobody the conversation (``context`` texts and ``history`` turns) does not
    mention (:func:`people_not_mentioned`), and Action is no copy (character 5-gram Jaccard >= ``copy_jaccard``,
    :func:`mascot.core.guard.jaccard`) of an earlier directive's Action, nor a copy of ``forbidden_copies`` (the
    prompt's example, the cards' goals) or of a part of one (``copy_jaccard`` or more of the Action's 5-grams found
    in it).

    Raises:
        DirectiveError: with reason ``directive_name``, ``directive_voice``, ``directive_addressee``,
            ``directive_person`` or ``directive_copy`` and a message for the retry prompt.
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
    who = wrong_addressee(d.action)
    if who:
        raise DirectiveError(f"the Action must have the helper speak to the user, not to '{who}' (name the user: "
                             "e.g. 'Ask the user what ...')", "directive_addressee")
    missing = people_not_mentioned(d.action, [c for _, c in context] + [t.text for t in history])
    if missing:
        raise DirectiveError(f"the Action names {', '.join(repr(m) for m in missing)}, whom the conversation does not "
                             "mention; speak of the user and of the people they mentioned", "directive_person")
    grams = char_ngrams(d.action)
    for earlier in earlier_actions(history):
        if jaccard(grams, char_ngrams(earlier)) >= copy_jaccard:
            raise DirectiveError("the Action repeats an earlier one; give a new instruction about the latest "
                                 "message", "directive_copy")
    # a shortened copy ("... without the dog.") is a copy too: its n-grams lie in the text (the share of the Action's
    # n-grams found there is never below their Jaccard, so it also catches whole copies)
    for text in forbidden_copies:
        if grams and len(grams & char_ngrams(text)) / len(grams) >= copy_jaccard:
            raise DirectiveError("the Action copies the instructions' example or a helper's goal; give an "
                                 "instruction about the latest message", "directive_copy")


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
#: Verbs that open a new clause after "and" or "then".
_VERBS = ADDRESS_VERBS | TO_VERBS | frozenset(v.split()[-1].lower() for v in ACTION_VERBS)


def action_verbs(history: Sequence[HistoryTurn], recent: int = 2) -> list[str]:
    """:data:`ACTION_VERBS` without those that opened the Actions of the last ``recent`` directives."""
    used = [a.split()[0].lower() for a in earlier_actions(history)[-recent:] if a.split()] if recent else []
    verbs = [v for v in ACTION_VERBS if v.split()[0].lower() not in used]
    return verbs or list(ACTION_VERBS)


def tone_words(card: PersonaCard) -> list[str]:
    """The words a Tone for ``card`` is made of under the grammar (:func:`tone_regex`): the words of its
    ``default_tone`` (lower-case letters, "and" left out), then its ``tone_words``, without repeats. A persona's own
    words only: with one vocabulary for every persona (about forty adjectives), the default model gave "Gentle and
    calm" to 92% of directives, whoever spoke, and a "Gentle and calm" Catalyst or Action Guide is pulled off its
    card."""
    own = [w for w in re.findall(r"[a-z]+", card.default_tone.lower()) if w != "and"]
    return list(dict.fromkeys([*own, *card.tone_words]))


def tone_regex(max_chars: int, vocabulary: Sequence[str] = (), default: str = "") -> str:
    """A Tone under the grammar. With ``vocabulary`` (lower-case words; :func:`tone_words`): one word, or two different
    words joined by " and " or ", " ("Calm and steady", "Warm, hopeful"), the first capitalised, every word of the
    vocabulary (those longer than ``max_chars`` left out); ``default`` (the persona's default tone), when those words
    cannot spell it, is one more alternative as written. Without ``vocabulary``: one to four words, each a letter and
    then lower-case letters, at most ``min(16, max_chars)`` characters. Free text let a small model run on ("Gentle and
    calm, no more than 2-"), a free third word let it repeat one ("Calm and empathetic, empathetic").

    The words are listed alphabetically, and their order decides nothing: the grammar only masks the tokens that
    cannot continue a Tone, and the model's logits choose among the rest (greedy decoding takes the most likely allowed
    token at each step). Which Tone a greedy director writes therefore comes from the prompt, which names each helper's
    default tone (:func:`mascot.director.prompts.roster_block`), and from this vocabulary, which holds only the chosen
    persona's words.

    Raises:
        ValueError: ``vocabulary`` holds no word of at most ``max_chars`` characters.
    """
    if not vocabulary:
        w = rf"[A-Za-z][a-z]{{0,{max(0, min(16, max_chars) - 1)}}}"
        return rf"{w}(,? {w}){{0,3}}"
    kept = sorted({w for w in vocabulary if w.isalpha() and len(w) <= max_chars})
    if not kept:
        raise ValueError(f"no tone word fits director.max_tone_chars={max_chars}")
    # one alternative per first word, its second word any other (a repeated word is what a greedy model wrote)
    phrases = [w[0].upper() + w[1:] + ("(( and |, )(" + "|".join(x for x in kept if x != w) + "))?"
                                       if len(kept) > 1 else "") for w in kept]
    alternatives = "|".join(phrases)
    if default.strip() and not re.fullmatch(alternatives, default.strip()):
        alternatives += "|" + regex_escape(default.strip())
    return f"({alternatives})"


#: Characters an Action must have after its verb under the grammar ("a solution" is too short to be an instruction).
ACTION_MIN_CHARS = 16


def directive_regex(roster: Sequence[PersonaCard], *, max_action_chars: int, max_tone_chars: int,
                    max_think_chars: int = 0, verbs: Sequence[str] | None = None,
                    persona_tones: bool = False) -> str:
    """Regex for constrained decoding: exactly the three lines, ``Agent:`` restricted to the roster names.

    An optional ``<think>`` block of at most ``max_think_chars`` characters may come first (0 disables it). With
    ``verbs`` the Action opens with one of them and is one sentence (then a space and at least
    :data:`ACTION_MIN_CHARS` more characters, no sentence end but an optional last one), so a small model can neither
    run on into a second sentence nor stop at a bare "Offer a solution." that the content rules refuse. With
    ``persona_tones`` the regex branches on the persona the ``Agent`` line names (it comes first), and the Tone is
    made of that persona's words (:func:`tone_words`, :func:`tone_regex` with its default tone); without it the Tone
    is any one to four short words. A newline may end the answer: a greedy model that wanted to end the line after
    a complete Tone otherwise took the likeliest continuation the grammar still allowed (", empathetic").

    Raises:
        ValueError: ``persona_tones`` and a persona has no tone word of at most ``max_tone_chars`` characters.
    """
    # Every name with or without a leading "The " (match_persona accepts both): with the names as written ("The Anchor",
    # "The Catalyst", "The Beacon", "Empathetic Listener", "Action Guide") a model's likely first token "The" would
    # leave only the "The" personas reachable, and constrained decoding would never pick the other two.
    head = rf"(<think>[^<]{{0,{max_think_chars}}}</think>\n)?" if max_think_chars > 0 else ""
    if verbs:  # one sentence: no sentence end inside, an optional one at the end
        opening = "(" + "|".join(regex_escape(v) for v in verbs) + ")"
        longest = max(ACTION_MIN_CHARS, max_action_chars - 12)
        action = rf"{opening} [^\n<\t .!?][^\n<.!?]{{{ACTION_MIN_CHARS - 1},{longest}}}[.!?]?"
    else:
        action = rf"[^\n<\t ][^\n<]{{0,{max_action_chars - 1}}}"
    if not persona_tones:
        names = "|".join(sorted({regex_escape(_bare(c.name)) for c in roster}))
        return rf"{head}Agent: (The )?({names})\nAction: {action}\nTone: {tone_regex(max_tone_chars)}\n?"
    branches = [rf"(The )?{regex_escape(_bare(c.name))}\nAction: {action}\n"
                rf"Tone: {tone_regex(max_tone_chars, tone_words(c), c.default_tone)}"
                for c in sorted(roster, key=lambda c: _bare(c.name))]
    return rf"{head}Agent: ({'|'.join(branches)})\n?"
