"""Card moves: what a persona's reply must do and must not do, as named, deterministic detectors.

A persona card's ``moves`` field lists its ``required`` moves (a reply complies when it shows *any* of them) and its
``forbidden`` moves (a reply complies only when it shows *none* of them). Each entry names a detector of
:data:`DETECTORS` and may set that detector's parameters::

    moves:
      required:
        - {detector: reflective_question, params: {min_shared_words: 1}}
        - {detector: reframe}
      forbidden:
        - {detector: direct_instruction}

A detector reads only the reply and the user's latest message (:class:`MoveInput`) and answers True or False. All
detectors are rules and lexicons (regular expressions over the reply's sentences, content words shared with the user's
message): fast (tens of microseconds a reply), deterministic and free of any model, so that a measure built on them
cannot be moved by training against an embedding, and a person can read why a reply was credited
(:func:`assess` names the detectors that fired). What they cannot do is tell a good instance of a move from a poor one:
``concrete_step`` credits "call your sister tonight" and "write a list of your worries" alike, and a reply that says
"tell me more" to a bereaved user is credited with ``invite_elaboration`` whether or not it was kind. docs/evaluation.md
gives their agreement with a careful reader.

A persona set from another file brings its own moves by naming registered detectors; a project adds a detector with
:func:`register`. A card whose ``moves`` names an unknown detector or a bad parameter is refused when its file is
loaded (:class:`mascot.core.personas.PersonaFileError`, naming the file, the persona and the fix).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Callable, Mapping, Sequence

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from mascot.core.guard import split_sentences, words

__all__ = ["DETECTORS", "MoveInput", "MoveSpec", "CardMoves", "MoveVerdict", "Detector", "register", "assess",
           "detect", "content_words", "shared_content_words", "round_moves"]


@dataclass(frozen=True)
class MoveInput:
    """What a detector reads.

    Attributes:
        reply: The persona's reply (visible text).
        user: The user's latest message before the reply ("" when none: detectors that compare with it then find
            no shared words).
    """

    reply: str
    user: str = ""


class _Params(BaseModel):
    """Base of every detector's parameters: unknown keys are refused."""

    model_config = ConfigDict(extra="forbid", frozen=True)


@dataclass(frozen=True)
class Detector:
    """One registered detector.

    Attributes:
        name: Registry key (snake_case).
        fn: ``fn(inp, params) -> bool``.
        params: The pydantic model of its parameters (defaults apply when a card sets none).
        doc: One line: what it credits.
    """

    name: str
    fn: Callable[[MoveInput, Any], bool]
    params: type[_Params]
    doc: str


#: Detector name -> :class:`Detector`.
DETECTORS: dict[str, Detector] = {}


def register(name: str, params: type[_Params] = _Params) -> Callable[[Callable[[MoveInput, Any], bool]],
                                                                          Callable[[MoveInput, Any], bool]]:
    """Decorator registering ``fn(inp, params) -> bool`` as detector ``name`` (its docstring's first line is its doc).

    Raises:
        ValueError: ``name`` is already registered or not snake_case.
    """
    if not re.fullmatch(r"[a-z][a-z0-9_]{0,62}", name):
        raise ValueError(f"detector name must be snake_case, got {name!r}")

    def deco(fn: Callable[[MoveInput, Any], bool]) -> Callable[[MoveInput, Any], bool]:
        if name in DETECTORS:
            raise ValueError(f"detector {name!r} is already registered")
        doc = " ".join((fn.__doc__ or "").strip().split("\n\n")[0].split())
        DETECTORS[name] = Detector(name, fn, params, doc)
        return fn

    return deco


# --------------------------------------------------------------------------------------------------------- helpers

def _norm(text: str) -> str:
    return " ".join(text.replace("’", "'").replace("‘", "'").split())


@lru_cache(maxsize=1)
def _stop_words() -> frozenset[str]:
    from sklearn.feature_extraction.text import ENGLISH_STOP_WORDS

    # contractions and fillers the 318-word list leaves in, which would count as shared "content"
    extra = {"i'm", "it's", "that's", "you're", "don't", "can't", "i've", "i'd", "i'll", "didn't", "wasn't", "isn't",
             "doesn't", "won't", "he's", "she's", "they're", "we're", "there's", "let's", "you've", "you'll", "really",
             "just", "like", "feel", "feeling", "felt", "know", "think", "things", "thing", "lot", "got", "get",
             "going", "make", "made", "time", "way", "good", "great", "sure", "hear", "sorry", "want", "day",
             "today", "recently", "yeah", "oh", "wow", "okay", "ok", "did", "does", "doing", "say", "said"}
    return frozenset(ENGLISH_STOP_WORDS) | frozenset(extra)


def _stem(w: str) -> str:
    """A crude stem: possessive and common suffixes off, then the first 5 letters (``scared``/``scary`` -> ``scar``,
    ``interview``/``interviews`` -> ``inter``). Good enough to notice a reply reusing a user's word."""
    w = w.removesuffix("'s")
    for suf in ("ing", "ed", "es", "s", "e", "y"):
        if len(w) > len(suf) + 3 and w.endswith(suf):
            w = w[: -len(suf)]
            break
    return w[:5]


def content_words(text: str) -> set[str]:
    """Stems (:func:`_stem`) of the words of ``text`` that are not English stop words and have 3+ letters."""
    stop = _stop_words()
    return {_stem(w) for w in words(text) if len(w) >= 3 and w not in stop and not w.isdigit()}


def shared_content_words(a: str, b: str) -> set[str]:
    """Content-word stems ``a`` and ``b`` share."""
    return content_words(a) & content_words(b)


def _rx(*patterns: str) -> re.Pattern[str]:
    return re.compile("|".join(f"(?:{p})" for p in patterns), re.IGNORECASE)


def _questions(text: str) -> list[str]:
    """The sentences of ``text`` that ask: end with '?' (the part of a sentence up to its '?' when one sits inside)."""
    out = []
    for s in split_sentences(_norm(text)):
        if "?" in s:
            for part in re.findall(r"[^?]*\?", s):
                if part.strip(" ?"):
                    out.append(part.strip())
    return out


#: Verbs of things a person can do (the head of a concrete step), base form.
ACTION_VERBS = (
    "call", "phone", "text", "message", "email", "write", "jot", "list", "make", "talk", "speak", "ask", "tell",
    "go", "take", "set", "schedule", "plan", "book", "reach", "contact", "visit", "join", "practice", "practise",
    "start", "begin", "spend", "find", "look", "check", "read", "journal", "walk", "apologi[sz]e", "send", "buy",
    "save", "put", "prepare", "sign", "bring", "share", "invite", "organi[sz]e", "clean", "rest", "sleep",
    "exercise", "meet", "cook", "pick", "choose", "decide", "give", "stop", "avoid", "breathe", "drink", "eat", "note",
    "record", "lock", "report", "block", "change", "update", "review", "research", "search", "sit", "reward",
    "celebrate", "seek", "use", "learn", "study", "pack", "move", "open", "close", "order", "return", "fix", "repair",
    "post", "download", "install", "arrange", "confront", "explain", "offer", "follow", "leave", "remove", "limit",
    "turn", "create", "draft", "sort", "clear", "replace", "ring", "hug", "pay",
)
#: Verbs that tell a person what to think or be rather than what to do ("remember that", "stay positive"): an
#: instruction or advice when imperative, never a concrete step.
SOFT_VERBS = ("try", "keep", "remember", "think", "consider", "focus", "let", "allow", "stay", "hold", "see", "treat",
              "forgive", "express", "accept", "get", "be", "don't", "do", "believe", "trust", "imagine", "help",
              "embrace", "cherish", "know", "understand", "enjoy", "appreciate", "continue", "reflect")
_VERB_ALT = "|".join(ACTION_VERBS)
_IMPERATIVE_ALT = "|".join((*ACTION_VERBS, *SOFT_VERBS))
#: Objects too vague to make a step concrete ("try to stay positive", "take care of yourself", "take your time").
VAGUE_OBJECTS = frozenset({
    "positive", "positivity", "calm", "strong", "yourself", "care", "easy", "it", "this", "that", "things", "time",
    "heart", "mind", "best", "faith", "hope", "hopeful", "patient", "grateful", "kind", "brave", "moment", "breath",
    "deep", "optimistic", "present", "focused", "motivated", "safe", "comfort", "peace", "self", "well", "good",
    "okay", "ok", "all", "everything", "something", "anything", "me", "us", "you", "your",
    "feelings", "feeling", "emotions", "step", "steps", "action", "actions", "way", "ways", "look", "bright", "side",
    "lesson", "lessons", "learn", "grow", "forward", "ahead", "on", "up", "out", "back", "away", "going",
})
#: A suggested step: an imperative sentence (after an optional opener such as "first", "maybe", "tonight"), or a
#: suggestion lead ("you could", "try to", "I suggest", "it might help to", "why not", "how about", "consider") before
#: the verb; within an imperative sentence, further verbs after "and" / "then" are further steps.
_OPENER = (r"(?:(?:so|and|then|first|firstly|next|now|just|maybe|perhaps|please|also|tonight|today|tomorrow|this week"
           r"|this weekend|for now|for example|for instance|to start|once you(?:'re| are) ready)\b,?\s+)*")
_SUGGEST = (r"\b(?:you (?:could|can|might|may|should|need to|might want to|may want to|could try to|could try"
            r"|can try to|can try)|try to|try and|i (?:suggest|recommend|encourage you to|'d suggest|would suggest"
            r"|'d recommend|would recommend)(?: you| that you)?|it (?:might|may|could|would|will) help to|why not"
            r"|how about|consider|a good (?:first )?step (?:is|would be) to"
            r"|one (?:small )?(?:step|thing) (?:is|would be|"
            r"you could do is) to)\s+")
_STEP_START_RE = re.compile(rf"^\W*{_OPENER}(?P<verb>(?:{_VERB_ALT}))\b(?P<rest>[^.!?;]*)", re.IGNORECASE)
_STEP_SUGGEST_RE = re.compile(rf"{_SUGGEST}(?P<verb>(?:{_VERB_ALT}))(?:ing)?\b(?P<rest>[^.!?;]*)", re.IGNORECASE)
_STEP_CHAIN_RE = re.compile(rf"\b(?:and|then|and then),?\s+(?P<verb>(?:{_VERB_ALT}))\b(?P<rest>[^.!?;]*)",
                            re.IGNORECASE)


#: What before a suggestion lead makes it the writer's own plan or a condition ("I'm going to try to", "if you can").
_NARRATED_LEAD = re.compile(r"\b(?:i|i'm|i am|i'll|we|we're|going|to|if|when|unless)\s*$", re.IGNORECASE)


#: Words skipped between a step's verb and its object ("call *your* sister", "take *a short* walk").
_FILLERS = frozenset({
    "a", "an", "the", "my", "our", "their", "his", "its", "some", "any", "these", "those", "to", "down", "in", "at",
    "for", "with", "about", "of", "or", "one", "more", "little", "bit", "few", "quick", "short", "small", "new", "just",
    "really", "again", "over", "into", "onto", "from", "by", "around", "through", "is", "be", "and", "then", "s",
    "too", "also", "very", "so", "list", "note", "minutes", "minute", "make", "make", "sure",
})


def _object(rest: str) -> str | None:
    """The first word after a step's verb, within its clause (cut at a comma, "and" or "then"), that is neither a
    filler (:data:`_FILLERS`) nor vague (:data:`VAGUE_OBJECTS`); None when there is none."""
    clause = re.split(r",|;|\b(?:and|then|but|or)\b", rest, maxsplit=1)[0]
    found = [w for w in words(clause)[:8] if w not in _FILLERS and w not in VAGUE_OBJECTS]
    return found[0] if found else None


def _concrete_steps(text: str) -> list[str]:
    """Suggested steps in ``text``, as "verb object" (lower-cased): see :data:`_STEP_START_RE` and
    :data:`_STEP_SUGGEST_RE`; a step needs a concrete object (:func:`_object`). Questions count only when they
    suggest ("Why not call her?", "Could you write to the school?"). Line breaks end sentences, so each item of a
    list is a step of its own; so does a colon, so a step it introduces starts a sentence ("Try this: call her
    tonight.")."""
    out = []
    for s in (c for line in text.replace("’", "'").splitlines() for x in split_sentences(line)
              for c in re.split(r":\s+", x)):
        if s.rstrip().endswith("?") and not re.search(r"\b(?:why not|how about|could you|can you)\b", s, re.I):
            continue
        m = _STEP_START_RE.match(s)
        found = []
        if m and not s.rstrip().endswith("?"):
            found.append(m)
            found += [c for c in _STEP_CHAIN_RE.finditer(s, m.end("verb"))]
        else:
            # "I'm going to try to make it better", "if you can call": the writer's own plan or a condition
            found += [f for f in _STEP_SUGGEST_RE.finditer(s)
                      if not _NARRATED_LEAD.search(s[:f.start()])]
        for f in found:
            obj = _object(f.group("rest"))
            if obj:
                out.append(f"{f.group('verb').lower()} {obj}")
    return out


#: Words that name a feeling (the user's, when a detector finds them said of "you").
FEELINGS = (
    "afraid", "scared", "frightened", "terrified", "fear", "fearful", "angry", "anger", "mad", "furious",
    "frustrat\\w*", "annoyed", "annoyance", "irritat\\w*", "sad", "sadness", "hurt", "lonely", "loneliness",
    "disappoint\\w*", "anxious", "anxiety", "worried", "worry", "nervous", "overwhelm\\w*", "embarrass\\w*",
    "ashamed", "shame", "guilt", "guilty", "proud", "pride", "happy", "happiness", "excit\\w*", "grateful", "gratitude",
    "thankful", "relieved", "relief", "hopeful", "jealous", "jealousy", "envy", "upset", "devastat\\w*",
    "heartbroken", "heartbreak\\w*", "stress\\w*", "betray\\w*", "confus\\w*", "helpless", "shock\\w*",
    "surpris\\w*", "joy", "joyful", "grief", "griev\\w*", "distress\\w*", "uneasy", "unsettl\\w*", "shaken",
    "startled", "insecure", "vulnerable", "thrilled", "delighted", "nostalgic", "sentimental", "bittersweet",
    "disgust\\w*", "appall\\w*", "resent\\w*", "bitter", "exhaust\\w*", "drained", "torn", "panic\\w*", "dread",
    "tense", "regret\\w*", "remorse", "humiliat\\w*", "bored", "impatient", "lost", "pain", "sorrow", "rage",
    "outrage\\w*", "livid", "terror", "horrified", "miserable", "crushed", "gutted", "elated", "ecstatic", "content",
    "glad", "pleased", "inspired", "motivated", "encouraged", "hopeless", "worthless", "alone",
)
#: Words that name the emotional weight of an event ("that sounds so hard").
WEIGHT = ("hard", "tough", "difficult", "painful", "heavy", "scary", "awful", "terrible", "horrible", "unfair",
          "rough", "frightening", "upsetting", "heartbreaking", "stressful", "exhausting", "infuriating",
          "terrifying", "devastating", "frustrating", "overwhelming", "lonely", "hurtful", "unsettling",
          "nerve-wracking",
          "exciting", "thrilling")
_FEEL = "(?:" + "|".join(FEELINGS) + ")"
_WEIGHTY = "(?:" + "|".join((*FEELINGS, *WEIGHT)) + ")"
_ADV = (r"(?:(?:so|really|very|quite|pretty|a bit|a little|completely|totally|deeply|still|understandably|probably"
        r"|naturally|incredibly|extremely|truly|feeling|kind of|sort of|both|all|and|,|such a|such|an?|absolutely"
        r"|just|also|more than a little|somewhat|rather|terribly|awfully|genuinely)\s*)*")
_FEELING_RE = _rx(
    rf"\byou(?:'re| are| were| must be| must have been| may be| might be| might have been| seem| seemed| sound"
    rf"| sounded| feel| felt| must feel| must have felt| may feel| might feel| probably feel| probably felt"
    rf"| could feel| would feel| might have felt| may have felt| could have felt| would have felt| must be feeling"
    rf"| are feeling|'re feeling| were feeling| might be feeling"
    rf"| have been feeling|'ve been feeling)\s+{_ADV}{_FEEL}\b",
    rf"\b(?:it|that|this|which)(?: all)? (?:sounds?|seems?|must be|must have been|must feel|must have felt|would be"
    rf"|would have been|would feel|would make anyone feel|would make me feel)\s+(?:like\s+)?{_ADV}{_WEIGHTY}\b",
    rf"\bsounds? like (?:you(?:'re| are| were| felt| feel)|it was|that was)\s+{_ADV}{_WEIGHTY}\b",
    rf"\b(?:seems|sounds) like you(?:'ve| have| had| were| are|'re)?\b[^.!?]{{0,40}}\b{_WEIGHTY}\b",
    rf"\byour (?:{_FEEL}|feelings? of \w+)\b",
    rf"\b(?:how|what) {_ADV}{_WEIGHTY} (?:that|this|it) (?:must|was|is|sounds?)\b",
    rf"\bi can (?:only )?(?:imagine|see|hear|understand|sense) (?:how|that|the)\s+{_ADV}{_WEIGHTY}\b",
    rf"\bi can (?:only )?(?:imagine|see|hear|understand|sense) (?:how|that) (?:you|it|that|this)(?:'s|'re| are| were"
    rf"| was| must be| must have been| felt| feel| must feel)\s+{_ADV}{_WEIGHTY}\b",
)
_HEARD_RE = _rx(r"\b(?:glad|sorry|happy|sad|so good) to (?:hear|know|see) (?:that |about )?(?:you|your)\b")
_REFLECT_FRAME_RE = _rx(
    r"\b(?:it )?sounds? like\b", r"^\W*so,? you\b", r"\byou(?:'re| are) saying\b", r"\bwhat i(?:'m| am)? hear",
    r"\bi hear (?:you|that)\b", r"\bit (?:seems|looks) like you\b", r"\bif i understand\b", r"\bdid i get that\b",
    r"\bam i right\b", r"\bso (?:what )?you(?:'re| are)\b", r"\byou(?:'ve| have) been\b", r"\byou (?:felt|feel)\b",
    r"\byou (?:mentioned|said|described|shared|told me)\b",
)


# ------------------------------------------------------------------------------------------------------ detectors

def _phrases(name: str, pattern: re.Pattern[str], doc: str) -> None:
    """Register detector ``name``: True when ``pattern`` matches the reply (curly quotes straightened, whitespace
    collapsed); ``doc`` is its one-line description."""
    def fn(inp: MoveInput, p: _Params) -> bool:
        return bool(pattern.search(_norm(inp.reply)))

    fn.__doc__ = doc
    register(name)(fn)



class WordsParams(_Params):
    """Parameters of detectors that compare with the user's message."""

    min_shared_words: int = Field(0, ge=0, le=10, description="content words of the user's message it must reuse")


@register("reflective_question", WordsParams)
def reflective_question(inp: MoveInput, p: WordsParams) -> bool:
    """A question to the user about their situation (not an offer of help), reusing ``min_shared_words`` of their
    words."""
    for q in _questions(inp.reply):
        if len(words(q)) < 3 or _SERVICE_Q.search(q) or re.search(r"\bnames?\b", q, re.I):
            continue
        if len(shared_content_words(q, inp.user)) >= p.min_shared_words:
            return True
    return False


_SERVICE_Q = _rx(r"\b(?:can|may|could|shall) i (?:help|do|assist|get)\b", r"\bis there anything (?:else )?i\b",
                 r"\bhow can i\b", r"\bwould you like (?:me|some|any) (?:to |help|advice|tips|suggestions)",
                 r"\bdo you want me to\b", r"\bhow (?:are|is) (?:you|everything)(?: doing)?\s*\?$",
                 r"\bwhat can i do\b", r"\banything else\b",
                 r"\b(?:i|we) (?:can|could|should) (?:expand|write|improve|rewrite|edit|make (?:it|this))\b")

_REFRAME_RE = _rx(
    r"\b(?:another|a different|a new) (?:way|angle|perspective|light)\b", r"\bwhat if\b", r"\bon the other hand\b",
    r"\bcould it be\b", r"\bis it possible (?:that|he|she|they|it)\b", r"\bperhaps (?:it|this|that|he|she|they)\b",
    r"\b(?:look|see|think of|view) (?:it|this|that|things) (?:as|from|differently|another)\b",
    r"\bmight (?:also )?(?:mean|say|show)\b", r"\b(?:instead of|rather than) (?:seeing|thinking|looking)\b",
    r"\bhave you considered\b", r"\bwhat would (?:it|that) mean\b",
    r"\bwhat (?:does|did) (?:this|that|it) (?:tell|teach|say|show)\b", r"\bwhat would you tell\b",
    r"\bhow might\b", r"\bwhat might\b", r"\bwhat do you think\b", r"\bmore to it than\b",
    r"\bnot (?:just|only|simply)\b[^.!?]{0,60}\bbut rather\b",
)
#: Turning the event into a lesson or a wider point ("a reminder of", "it's important to remember", "it's not just
#: about ..."): a reframe a listener must not make, though not the new angle a Socratic reframe offers.
_LESSON_RE = _rx(
    r"\breminder (?:of|that)\b", r"\bimportant to (?:remember|cherish|keep in mind|recogni[sz]e|understand|note)\b",
    r"\bnot only\b[^.!?]{0,80}\bbut(?: also)?\b", r"\bit(?:'s| is) not (?:just )?about\b",
    r"\bthere(?:'s| is) no perfect\b", r"\bsilver lining\b",
)


_phrases("reframe", _REFRAME_RE,
         """Offers another angle on the event ("what if", "could it be", "another way to look at it", "what might").""")


_VALIDATION_RE = _rx(
    r"\b(?:sorry|glad|proud|wonderful|great|amazing|beautiful|lovely|fantastic|awesome|happy|congratulat\w*|thank"
    r"|understand\w*|normal|natural|okay|valid|admir\w*|brave|strong|impressive|pleasure|honou?r|blessing"
    r"|i can (?:only )?imagine|must (?:be|have been)|sounds like|that's (?:so |really )?(?:tough|hard|rough))\b")
_OFFER_RE = _rx(r"\bsuggestions?\b", r"\bhelp you (?:find|plan|with|make|figure)\b", r"\boptions\b",
                r"\bhere is\b", r"\bhere's\b")


_phrases("lesson_reframe", _LESSON_RE,
         """Turns the event into a lesson or a wider point ("a reminder of", "it's important to remember that",
         "it's not just about...", "not only ... but also").""")


@register("pure_validation")
def pure_validation(inp: MoveInput, p: _Params) -> bool:
    """Only validates, sympathises or praises: validating words ("I'm so glad", "that's wonderful", "I'm sorry")
    with no question, no reframe, no suggestion and no offer anywhere in the reply."""
    text = _norm(inp.reply)
    return (bool(_VALIDATION_RE.search(text)) and not _questions(text) and not _REFRAME_RE.search(text)
            and not _concrete_steps(text) and not _OFFER_RE.search(text))


_CHECK_IN_Q = _rx(r"\bhow are you (?:feeling|doing|holding up)\b", r"^\W*how about\b",
                  r"\bwould you like to (?:talk|share)\b", r"\bdo you want to (?:talk|share)\b",
                  r"\bis it okay if i\b")


@register("analytic_question")
def analytic_question(inp: MoveInput, p: _Params) -> bool:
    """Asks the user to analyse or explain (any question that is not an offer of help or a gentle check-in)."""
    return any(len(words(q)) >= 3 and not _SERVICE_Q.search(q) and not _CHECK_IN_Q.search(q)
               for q in _questions(inp.reply))


class StepsParams(_Params):
    """Parameters of :func:`concrete_step`."""

    min_steps: int = Field(1, ge=1, le=10)
    max_steps: int = Field(3, ge=1, le=20)

    @model_validator(mode="after")
    def _order(self) -> "StepsParams":
        if self.min_steps > self.max_steps:
            raise ValueError("min_steps must not exceed max_steps")
        return self


@register("concrete_step", StepsParams)
def concrete_step(inp: MoveInput, p: StepsParams) -> bool:
    """Names ``min_steps``-``max_steps`` concrete steps: an action verb with a concrete object ("call your sister")."""
    return p.min_steps <= len(_concrete_steps(inp.reply)) <= p.max_steps


_phrases("feeling_label", _FEELING_RE,
         """Names the feeling the user has or had ("you must have felt so scared", "that sounds frustrating").""")


class ParaphraseParams(WordsParams):
    """Parameters of :func:`paraphrase`."""

    min_shared_words: int = Field(1, ge=1, le=10, description="user's content words a framed sentence must reuse")
    frameless_min_shared: int = Field(2, ge=1, le=10, description="user's content words a sentence without a "
                                      "reflecting frame must reuse")


@register("paraphrase", ParaphraseParams)
def paraphrase(inp: MoveInput, p: ParaphraseParams) -> bool:
    """Reflects the user's words back: a sentence that reuses ``frameless_min_shared`` of their content words, or
    ``min_shared_words`` inside a reflecting frame ("it sounds like", "you're saying", "you felt")."""
    for s in split_sentences(_norm(inp.reply)):
        shared = len(shared_content_words(s, inp.user))
        if shared >= p.frameless_min_shared or (_REFLECT_FRAME_RE.search(s) and shared >= p.min_shared_words):
            return True
        # "I'm glad to hear that you enjoyed the outdoors": a weaker frame, one more reused word
        if _HEARD_RE.search(s) and shared >= max(p.min_shared_words + 1, p.frameless_min_shared - 1):
            return True
    return False


_PRESENCE_RE = _rx(
    r"\bi(?:'m| am) (?:right |always |just |still )?here(?:\s*[,.!]|\s+(?:with|for) you|\s+to (?:support|listen|hold)"
    r"|\s+(?:if|whenever|when|and|no matter)|\s*$)", r"\bhere (?:for|with) you\b",
    r"\b(?:i'm|i am|we're|we are|be|stay|sit|stand|i'll be|i will be) (?:right )?(?:here )?with you\b",
    r"\byou(?:'re| are) not alone\b", r"\bnot alone in\b", r"\bby your side\b", r"\bi(?:'m| am) (?:listening|with)\b",
    r"\btake (?:all )?the time you need\b", r"\bwe(?:'re| are) here\b", r"\bhere to offer (?:my |some )?support\b",
    r"\bi(?:'m| am) not going anywhere\b", r"\bin this together\b", r"\bsit with (?:you|this|that|it)\b",
    r"\bright now, you\b", r"\bthis moment\b",
)
_NORMALISE_RE = _rx(
    r"\bit(?:'s| is) (?:completely |perfectly |totally |absolutely |so |very )?(?:okay|ok|alright|all right|normal"
    r"|natural|understandable|valid|human|fine)(?: to| that|\b)",
    r"\b(?:that|this|it)(?:'s| is) (?:a )?(?:completely |perfectly |totally |so |very )?(?:normal|natural"
    r"|understandable|valid|human)\b",
    r"\bmakes? (?:complete |total |perfect |so much )?sense\b", r"\banyone (?:would|could|in your)\b",
    r"\b(?:many|most|lots of|a lot of|so many) (?:people|of us|others)\b", r"\bonly natural\b",
    r"\byour feelings? (?:is|are) (?:completely |totally |so )?valid\b", r"\bno wonder\b",
    r"\bof course you (?:feel|felt|are|were)\b", r"\bit(?:'s| is) understandable\b", r"\bunderstandabl[ey]\b",
    r"\bthere(?:'s| is) nothing wrong with\b", r"\bevery(?:one|body) (?:feels|gets|has)\b",
    r"\byou(?:'re| are) allowed to\b", r"\bjust as (?:you|anyone) would\b",
)


_phrases("presence_language", _PRESENCE_RE,
         """Speaks of being present with the user ("I'm here with you", "you're not alone", "take the time you
         need").""")


_phrases("normalising", _NORMALISE_RE,
         """Says the feeling is normal or valid ("it's okay to feel", "that makes sense", "anyone would").""")


_STRENGTH = (r"(?:strong|strength|strengths|courage|courageous|brave|bravery|resilien\w*|determin\w*|perseveran\w*"
             r"|persisten\w*|dedicat\w*|commitment|integrity|compassion\w*|thoughtful\w*|self-aware\w*|maturity"
             r"|wisdom|capab\w*|talent\w*|skill\w*|hard work|effort|admir\w*|inspir\w*|impressive|kindness|kind"
             r"|generosity|generous|honest\w*|responsib\w*|caring|mindful\w*|selfless\w*|loyal\w*|patien\w*|grit"
             r"|loving|supportive|devot\w*|courageous|wise|smart|resourceful|hardworking|hard-working)")
#: A strength said of the user: "your courage", "you're so strong", "proud of you", "that took courage to share".
_STRENGTH_RE = _rx(
    rf"\byour (?:\w+ )?{_STRENGTH}\b",
    rf"\byou(?:'re| are| were| have been|'ve been| showed| show| have shown|'ve shown| displayed| have| had"
    rf"| clearly have| must be)\s+{_ADV}(?:(?:a|an|such|so much|a lot of|real|great|incredible|true|amazing)\s+)*"
    rf"{_STRENGTH}\b",
    r"\bproud of (?:you|yourself) for \w+ing\b", r"\b(?:well done|good for you|great job|way to go|kudos)\b",
    r"\bthat shows (?:your|how|you)\b", r"\byou (?:handled|managed|did) (?:it|that|this) (?:so |really )?\w+",
    r"\b(?:it|that|this) (?:took|takes|must have taken) (?:\w+ ){0,3}(?:courage|strength|guts|bravery|heart)"
    r"(?: for you)? to (?:share|admit|tell|talk|open|speak|say|reach|ask|stand|face|keep|go|do|be honest with)\b",
    r"\byou(?:'ve| have)? been (?:a|an|such a) (?:great|wonderful|amazing|good|true|fantastic|strong|loving|caring)"
    r" \w+", r"\byou(?:'re| are) able to\b", r"\byou(?:'re| are) (?:a|an|such a) (?:great|wonderful|amazing|good"
    r"|loving|caring|devoted|kind|thoughtful|strong|true|loyal|dedicated) \w+",
)


_phrases("strength_naming", _STRENGTH_RE,
         """Names a strength, courage or effort of the user's ("that took courage", "your determination", "proud of
         you").""")


_INVITE_RE = _rx(
    r"\btell me (?:more|about|what|how)\b", r"\bi(?:'d| would) love to (?:hear|know)\b", r"\bcan you (?:share|tell)\b",
    r"\bwould you (?:like to |)(?:share|tell)\b", r"\bwhat was (?:it|that) like\b", r"\bhow did (?:it|that|you)\b",
    r"\bwhat (?:made|helped|did|was|were|happened|part|do you|would you)\b", r"\bi(?:'m| am) curious\b",
    r"\bshare more\b", r"\bmore about\b", r"\bhow (?:do|are|were|have) you\b",
)


@register("invite_elaboration")
def invite_elaboration(inp: MoveInput, p: _Params) -> bool:
    """Invites the user to say more ("Tell me more about...", "What was it like?", an open question to them)."""
    text = _norm(inp.reply)
    if re.search(r"\btell me (?:more|about)\b|\bi(?:'d| would) love to hear\b|\bshare more\b", text, re.I):
        return True
    return any(_INVITE_RE.search(q) and not _SERVICE_Q.search(q) for q in _questions(text))


_ADVICE_RE = _rx(
    r"\byou (?:should|ought to|need to|must|have to|might want to|may want to|could try|can try|could always)\b",
    r"\btry (?:to|and|not to)\b", r"\bi (?:suggest|recommend|advise|encourage)\b", r"\bi(?:'d| would) (?:suggest"
    r"|recommend|advise)\b", r"\bmy advice\b", r"\bit (?:might|may|could|would|will) (?:help|be (?:helpful|a good"
    r" idea|good|best|wise))\b", r"(?:^|[.!?]\s+|\b(?:you|please|just|and)\s+)make sure\b", r"\bdon't forget to\b",
    r"\bwhy don't you\b", r"\bhow about (?:you |we )?\w+ing\b",
    r"\bconsider \w+ing\b", r"\bthe best (?:thing|way)\b", r"\bone (?:thing|way|option) (?:you|to)\b",
    r"\bhere(?:'s| is| are) (?:some|a few|what)\b", r"\b(?:a good|one) (?:step|idea|option|strategy) (?:is|would)\b",
    # an offer to solve the practical problem ("I'm here to help you find it", "I'd like to discuss a few options")
    r"\b(?:help|assist) you (?:to )?(?:find|plan|get|choose|pick|figure|fix|organi[sz]e|decide|improve|deal"
    r"|manage|handle|solve|prepare|look|search|sort)\b", r"\bassist you in \w+ing\b",
    r"\b(?:help|assist) you (?:with|in) (?!whatever|anything|everything|that\b|this\b|it\b)(?:a|an|the|some)\b",
    r"\b(?:discuss|explore|share|offer|give you) (?:a few|some|several) (?:options|suggestions|tips|ideas|ways)\b",
    r"\bsuggestions\b", r"\bit(?:'s| is) (?:also |so |very |really )?important (?:to|that you) (?:remember|cherish|keep"
    r"|focus|take|try|find|talk|reach|practi[cs]e|let|give|be|stay|look|set|make time)\b",
)


def _imperative(s: str) -> bool:
    """A sentence that opens with an action verb in the base form ("Call her.", "Take a walk", "Try writing")."""
    m = re.match(rf"\W*(?:(?:so|and|then|first|now|just|maybe|please|also),? )?(?:{_IMPERATIVE_ALT})\b"
                 r"(?!\s*(?:me|us)\b)(?! that\b)", s, re.IGNORECASE)
    return bool(m) and not s.rstrip().endswith("?")


@register("advice")
def advice(inp: MoveInput, p: _Params) -> bool:
    """Gives advice or a solution ("you should", "try to", "I suggest", "it might help to", an imperative step)."""
    text = _norm(inp.reply)
    return (bool(_ADVICE_RE.search(text)) or any(_imperative(s) for s in split_sentences(text))
            or bool(_concrete_steps(text)))


_INSTRUCT_RE = _rx(r"\byou (?:should|ought to|need to|must|have to)\b", r"\bmake sure\b", r"\bdon't forget to\b",
                   r"\bi (?:suggest|recommend|advise)\b", r"\bi(?:'d| would) (?:suggest|recommend|advise)\b",
                   r"\bmy advice\b")


@register("direct_instruction")
def direct_instruction(inp: MoveInput, p: _Params) -> bool:
    """Tells the user what to do instead of asking: an imperative sentence, "you should", "make sure", "I suggest"."""
    text = _norm(inp.reply)
    return bool(_INSTRUCT_RE.search(text)) or any(_imperative(s) for s in split_sentences(text))


_LECTURE_RE = _rx(
    r"\bit(?:'s| is) (?:so |very |really |always )?(?:important|essential|crucial|vital|key|necessary) (?:to|that"
    r"|for)\b", r"\byou (?:need to|must|have to) (?:understand|realize|realise|remember|accept|learn)\b",
    r"\b(?:always|never) (?:remember|forget)\b", r"\bremember(?:,)? that\b", r"\bthe (?:key|truth|lesson|point) is\b",
    r"\bin life\b", r"\beveryone (?:should|needs|must)\b", r"\blet (?:this|that|it) be a lesson\b",
    r"\byou (?:should|must) (?:always|never)\b", r"\bthe important thing is\b",
    r"\bit(?:'s| is) (?:your|our|everyone's) (?:responsibility|duty|job) to\b",
    r"\bit(?:'s| is) (?:all )?about (?:taking|being|making|learning|doing)\b",
)


_phrases("lecturing", _LECTURE_RE,
         """Lectures: general truths and musts ("it's important to", "remember that", "the key is", "in life").""")


class ListParams(_Params):
    """Parameters of :func:`long_list`."""

    max_items: int = Field(3, ge=1, le=20, description="more list items or steps than this is a long list")


@register("long_list", ListParams)
def long_list(inp: MoveInput, p: ListParams) -> bool:
    """More than ``max_items`` list items (bullets, numbers) or suggested steps."""
    items = len(re.findall(r"(?m)^\s*(?:[-*•]|\d+[.)])\s+\S", inp.reply))
    items = max(items, len(re.findall(r"(?:^|\s)\d+[.)]\s+[A-Za-z]", inp.reply)))
    return max(items, len(_concrete_steps(inp.reply))) > p.max_items


class LengthParams(_Params):
    """Parameters of :func:`long_reply`."""

    max_words: int = Field(60, ge=5, le=2000)


@register("long_reply", LengthParams)
def long_reply(inp: MoveInput, p: LengthParams) -> bool:
    """Longer than ``max_words`` words (a speech where a short reply was asked for)."""
    return len(words(inp.reply)) > p.max_words


_MINIMISE_RE = _rx(
    r"\bat least\b", r"\bcould (?:have been|be) worse\b", r"\bdon't worry\b", r"\bno big deal\b",
    r"\bnot (?:a|such a) big deal\b", r"\b(?:it'?s|that'?s) not (?:that|so) bad\b", r"\bbright side\b",
    r"\beverything happens for a reason\b", r"\bcheer up\b", r"\bget over\b", r"\bsilver lining\b",
    r"\bit(?:'ll| will) (?:all )?be (?:fine|okay|ok|alright)\b", r"\bdon't be (?:sad|upset|so)\b",
    r"\bit(?:'s| is| was) (?:only|just) a\b", r"\bnothing to (?:worry|be upset) about\b", r"\blook on the\b",
    r"\bblessing in disguise\b", r"\bmove on\b",
)


_phrases("minimising", _MINIMISE_RE,
         """Minimises the pain ("at least", "could be worse", "don't worry", "look on the bright side", "move on").""")


_NEGATIVE_EVENT_RE = _rx(
    r"\b(?:died|dead|death|passed away|pass away|killed|funeral|cancer|sick|illness|ill|hospital|injur\w*|hurt"
    r"|accident|crash\w*|lost|lose|losing|fired|laid off|broke up|breakup|divorce|cheat\w*|stolen|stole|robbed|rob"
    r"|broke|broken|failed|fail|failing|rejected|bullied|abus\w*|attacked|shot|fight|fought|argument|yell\w*"
    r"|scream\w*|scared|afraid|terrified|frighten\w*|sad|upset|angry|mad|furious|annoyed|irritat\w*|disgust\w*"
    r"|ashamed|embarrass\w*|guilty|lonely|alone|jealous|anxious|worried|stress\w*|depress\w*|cry|cried"
    r"|crying|miss|missing|awful|terrible|horrible|worst|bad|disappoint\w*|devastat\w*|heartbroken|betray\w*"
    r"|ruined|destroyed|damaged|flooded|fire|burned|evicted|debt|bills|unemployed|stuck|hate|poison\w*|unfortunate"
    r"|horrif\w*|tragic|tragedy)\b",
)
_CELEBRATE_RE = _rx(
    r"\bcongratulat\w*\b", r"\b(?:that|this|it)(?:'s| is| was| sounds?(?: like)?)(?: (?!not\b|n't\b)\w+){0,2} "
    r"(?:wonderful|great"
    r"|amazing|awesome|fantastic|exciting|fun|lovely|incredible|brilliant|terrific|delightful|a blessing)\b",
    r"\bhow (?:exciting|wonderful|fun|lovely|great|amazing)\b", r"\bi(?:'m| am) (?:so |really )?(?:happy|glad|thrilled"
    r"|excited) (?:for|that|to hear)\b", r"\bwhat (?:a|an) (?:great|wonderful|amazing|exciting|lovely|fantastic)\b",
    r"\b(?:yay|hooray|woohoo)\b", r"\blet's celebrate\b", r"\bworth celebrating\b",
    r"\b(?:a|such a|what a) blessing\b",
)


@register("celebrating_negative")
def celebrating_negative(inp: MoveInput, p: _Params) -> bool:
    """Cheers or congratulates when the user's message tells of a negative event ("That's wonderful!" after a loss)."""
    if not _NEGATIVE_EVENT_RE.search(_norm(inp.user)):
        return False
    return bool(_CELEBRATE_RE.search(_norm(inp.reply)))


# ----- meeting personas

_ATTRIBUTION_RE = re.compile(
    r"\b(?:(?!(?:I|You|We|They|He|She|It|This|That|There)\b)[A-Z][\w'-]*"
    r"|[Tt]he (?:chair|chairman|chairwoman|speaker|minister|professor|manager|designer|marketing"
    r"|team|group|presenter|moderator|[a-z]+ (?:manager|designer|expert)))(?: [A-Z][\w'-]*)?,? (?:then |also |later "
    r"|first |briefly )?(?:said|says|mentioned|noted|asked|suggested|proposed|explained|stated|argued|pointed out"
    r"|added|replied|reported|raised|agreed|disagreed|thought|claimed|responded|presented|described|emphasi[sz]ed"
    r"|highlighted|questioned|opened|introduced|wondered|confirmed|commented|summari[sz]ed|recommended|insisted"
    r"|warned|remarked|observed|answered|discussed|talked|spoke)\b"
    r"|\baccording to [A-Z]\w*")


_phrases("attribution", _ATTRIBUTION_RE,
         """Reports who said what ("Grad A said...", "the chair asked...", "according to Marketing").""")


_OPINION_RE = _rx(r"\bi (?:think|believe|feel|would|'d)\b", r"\bi'd\b", r"\bin my (?:opinion|view)\b",
                  r"\b(?:we|they|you|the team|the group) (?:should|ought to|need to|must)\b",
                  r"\bi (?:suggest|recommend|propose)\b", r"\bit would be (?:better|best|wise|good)\b",
                  r"\bmy (?:recommendation|suggestion|advice)\b", r"\b(?:should|must) (?:be|have)\b")


@register("opinion")
def opinion(inp: MoveInput, p: _Params) -> bool:
    """Gives the writer's own opinion or a recommendation ("I think", "we should", "I recommend"), in a sentence
    that does not report someone's words ("Grad A said we should cut it" is a minute, not an opinion)."""
    return any(_OPINION_RE.search(s) and not _ATTRIBUTION_RE.search(s) for s in split_sentences(_norm(inp.reply)))


_DECISION_RE = _rx(
    r"\bdecid\w*\b", r"\bdecision\w*\b", r"\bagree[ds]? (?:to|on|that|upon)\b", r"\bagreement\b",
    r"\bsettled (?:on|that)\b", r"\bconcluded\b", r"\b(?:will|would|'ll) go (?:with|ahead)\b", r"\bresolved to\b",
    r"\b(?:chose|chosen|opted|approved|adopted|accepted|rejected)\b", r"\bconsensus\b", r"\bfinali[sz]ed\b",
)


_phrases("decision_statement", _DECISION_RE,
         """States a decision ("the group decided", "agreed to", "Decision: ...", "approved").""")


_REOPEN_RE = _rx(r"\breconsider\w*\b", r"\brevisit\w*\b", r"\bre-?open\w*\b", r"\brethink\w*\b",
                 r"\bgo back on\b", r"\bperhaps (?:we|they) (?:should not|shouldn't)\b", r"\bon second thought\b",
                 r"\bundo (?:the|that|this) decision\b", r"\bstill (?:debat|question)\w*\b")


_phrases("reopening", _REOPEN_RE,
         """Re-opens a settled decision ("we should reconsider", "revisit the decision", "on second thought").""")


_OWNER_TASK_RE = re.compile(
    r"\b(?i:owner|assignee|responsible|who)\s*:\s*\S"
    r"|\b(?i:assigned to|responsible for|owned by|to be done by|handled by) (?:[A-Z]\w*|the \w+)"
    r"|\b(?:(?!(?:I|You|We|They|He|She|It|This|That|There|Nothing|Everyone|Someone|Somebody|Anyone)\b)[A-Z][\w'-]*"
    r"(?: [A-Z][\w'-]*)?|[Tt]he (?:\w+ )?(?:team|designer|manager|expert|chair|group|lead|secretary"
    r"|committee)) (?:will|is to|needs to|has to|should|is going to|must|agreed to|volunteered to|'ll|to) "
    r"(?!be\b)[a-z]\w+")


@register("owner_and_task")
def owner_and_task(inp: MoveInput, p: _Params) -> bool:
    """Names an owner and a task ("Grad B will send the data", "Owner: Marketing", "assigned to the designer")."""
    return bool(_OWNER_TASK_RE.search(_norm(inp.reply)))


_VAGUE_ITEM_RE = _rx(r"\bsome(?:one|body) (?:should|needs? to|will|could|must|has to|ought to)\b",
                     r"\bwe (?:should all|all need to)\b", r"\bany(?:one|body) (?:could|can|should)\b",
                     r"\bat some point\b", r"\bsomehow\b", r"\bsomeone\b")


_phrases("vague_item", _VAGUE_ITEM_RE,
         """An action item without an owner ("someone should...", "at some point", "we should all").""")


_RISK_RE = _rx(r"\brisks?\b", r"\bwhat if\b", r"\bconcerns?\b", r"\bproblems?\b", r"\bissues?\b", r"\bgaps?\b",
               r"\bmissing\b", r"\bwho (?:will|is|else|owns|decides|pays)\b", r"\bwhat about\b",
               r"\bhave (?:we|they|you) (?:considered|thought|checked|asked)\b", r"\bstakeholders?\b", r"\bcosts?\b",
               r"\bdepend\w*\b", r"\bfail\w*\b", r"\bhappens? if\b", r"\bassum\w*\b", r"\bwrong\b", r"\bdelay\w*\b",
               r"\bbudget\b", r"\bdeadline\b", r"\bhow will\b", r"\bwho\b", r"\bwhy\b", r"\benough\b", r"\bimpact\b")


@register("risk_question")
def risk_question(inp: MoveInput, p: _Params) -> bool:
    """Raises a risk, gap or missing stakeholder as a question ("What if the budget slips?", "Who owns the data?")."""
    return any(_RISK_RE.search(q) for q in _questions(inp.reply))


@register("self_answered_question")
def self_answered_question(inp: MoveInput, p: _Params) -> bool:
    """Asks a question and answers it itself in the next sentence ("Is it a risk? Yes, because...")."""
    sents = split_sentences(_norm(inp.reply))
    for a, b in zip(sents, sents[1:]):
        if a.rstrip().endswith("?") and re.match(r"\W*(?:well,|(?:yes|no|probably|definitely|the answer|not really"
                                                 r"|absolutely|of course)\b)", b, re.I):
            return True
    return False


_ATTACK_RE = _rx(r"\b(?:stupid|idiot\w*|incompetent|lazy|useless|clueless|dumb|moron\w*|fool\w*|pathetic"
                 r"|ignorant|careless|sloppy)\b", r"\bno idea what (?:he|she|they|you)(?:'s|'re| is| are)? doing\b")


_phrases("personal_attack", _ATTACK_RE,
         """Attacks a person rather than a point ("stupid", "incompetent", "no idea what they're doing").""")


# ------------------------------------------------------------------------------------------------- card schema

class MoveSpec(BaseModel):
    """One move of a card: a registered detector and its parameters.

    Raises (validation): unknown detector (the message lists the known ones) or parameters its detector refuses.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)
    detector: str
    params: dict[str, Any] = Field(default_factory=dict)

    @field_validator("detector")
    @classmethod
    def _known(cls, v: str) -> str:
        if v not in DETECTORS:
            raise ValueError(f"unknown detector {v!r}; use one of: {', '.join(sorted(DETECTORS))}")
        return v

    @model_validator(mode="after")
    def _params_ok(self) -> "MoveSpec":
        det = DETECTORS[self.detector]
        try:
            det.params.model_validate(self.params)
        except ValidationError as e:
            err = e.errors()[0]
            where = ".".join(str(x) for x in err["loc"])
            allowed = ", ".join(det.params.model_fields) or "none"
            raise ValueError(f"detector {self.detector!r}: parameter {where or '(all)'}: {err['msg']} "
                             f"(its parameters: {allowed})") from None
        return self

    def parsed_params(self) -> Any:
        """The parameters as the detector's pydantic model (defaults filled in)."""
        return DETECTORS[self.detector].params.model_validate(self.params)


class CardMoves(BaseModel):
    """A card's moves: ``required`` (any of them credits a reply; at least one) and ``forbidden`` (none may fire)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    required: list[MoveSpec] = Field(min_length=1)
    forbidden: list[MoveSpec] = Field(default_factory=list)


@dataclass(frozen=True)
class MoveVerdict:
    """What :func:`assess` found in one reply.

    Attributes:
        required: Names of the required detectors that fired.
        forbidden: Names of the forbidden detectors that fired.
    """

    required: tuple[str, ...]
    forbidden: tuple[str, ...]

    @property
    def required_present(self) -> bool:
        """At least one required move is present."""
        return bool(self.required)

    @property
    def forbidden_present(self) -> bool:
        """At least one forbidden move is present."""
        return bool(self.forbidden)

    @property
    def compliant(self) -> bool:
        """A required move is present and no forbidden one."""
        return self.required_present and not self.forbidden_present


def detect(spec: MoveSpec, reply: str, user: str = "") -> bool:
    """Run one move's detector on ``reply`` (answering ``user``)."""
    return bool(DETECTORS[spec.detector].fn(MoveInput(reply, user), spec.parsed_params()))


def assess(moves: CardMoves, reply: str, user: str = "") -> MoveVerdict:
    """Every move of ``moves`` on one reply.

    Args:
        moves: The speaking persona's :class:`CardMoves`.
        reply: Its reply text.
        user: The user's latest message before the reply ("" if none).

    Returns:
        A :class:`MoveVerdict` naming the detectors that fired.
    """
    return MoveVerdict(tuple(s.detector for s in moves.required if detect(s, reply, user)),
                       tuple(s.detector for s in moves.forbidden if detect(s, reply, user)))


def round_moves(cards: Sequence[Any]) -> CardMoves | None:
    """The moves a round of several personas is read for: every required move of the ``cards`` (the first card's
    parameters where two name the same detector), as one :class:`CardMoves` whose :func:`assess` verdict names the
    moves a reply shows, whoever spoke; None when no card has moves. Used by ``moves_per_round``
    (:mod:`mascot.eval.measures`) and the director's team reward (``phase2.group_reward.source: team``)."""
    specs: dict[str, MoveSpec] = {}
    for c in cards:
        for spec in (c.moves.required if getattr(c, "moves", None) is not None else ()):
            specs.setdefault(spec.detector, spec)
    return CardMoves(required=list(specs.values())) if specs else None


def detector_table() -> list[Mapping[str, Any]]:
    """``[{"name", "doc", "params": {name: default}}]`` of every registered detector, by name (its first docstring
    paragraph as one line)."""
    return [{"name": d.name, "doc": d.doc,
             "params": {k: f.default for k, f in d.params.model_fields.items()}}
            for d in sorted(DETECTORS.values(), key=lambda d: d.name)]


def opener(text: str, n: int = 4) -> str:
    """The first ``n`` words of ``text`` (lower-cased, :func:`mascot.core.guard.words`), joined by spaces."""
    return " ".join(words(text)[:n])
