"""Reply checks: what a delivered reply may never be (an echo of its prompt, a loop, a copy of an earlier turn, a
fragment), and the sentence gate that releases streamed text only after it passed them.

A small real model drifts into a handful of failure modes: it copies its system prompt or the director's instruction
("You are The Anchor only. Expertise: ..."), repeats one phrase until ``max_tokens`` ("The Beacon\\n\\nThe Beacon"),
repeats an earlier turn nearly word for word, or stops mid-sentence at ``max_tokens``. The speaker runs every reply
through a :class:`SentenceGate`: text is held until a sentence is complete, the sentence is checked, and only then
released to the client. A failing first sentence rejects the attempt (nothing of it was sent: the speaker generates
again with another seed and a stronger repetition penalty); a failing later sentence cuts the reply back to the last
released sentence, so the reply still ends on a sentence end. The checks are plain functions of text, used the same
way by the speaker, the simulated user and the evaluation baselines.

Definitions (all on lower-cased text):

- words: runs of letters, digits and apostrophes;
- echo: a sentence (or an n-gram spanning it and the text before it) shares a word n-gram (``echo_ngram``, 8)
  with a source text (system prompt, persona card, directive), or, shorter than that, is contained whole (6+ words)
  in one; or it opens with a prompt label (``Action:``, ``Tone:``, ``Agent:``, ``Director``, a speaker tag);
- loop: a word n-gram (``loop_ngram``, 4) occurs ``loop_count`` (3) or more times in the reply, a word 8-gram
  twice, a word 3-gram three times (a refrain), three sentences open with the same two words (one frame repeated),
  three quarters of the text is one short phrase said again ("You're not alone, you're not alone."), or a sentence
  repeats (or opens with the whole of) an earlier sentence of the same reply;
- near-duplicate: character 5-gram Jaccard similarity (|A ∩ B| / |A ∪ B| over sets of 5-character substrings of
  whitespace-normalised text) of at least ``duplicate_jaccard`` (0.6) between a sentence of 5+ words and a sentence
  of an earlier turn, or between the whole reply and an earlier turn;
- meta: a sentence about the text or the task instead of to the person (:data:`META_PATTERNS`): an offer of a
  rewritten version, a critique of the person's writing, the prompt's words ("Your task now is", "Your style:"),
  talk of "the user", an AI disclaimer, a letter opener ("Dear John,", "To: …"), or a stage direction standing
  alone ("(pauses nervously)");
- feeling: a sentence of a persona's reply whose feeling does not fit the user's message it answers: it celebrates
  or minimises bad news, offers condolences when nobody died, or sympathy for good news
  (:func:`mascot.core.feeling.feeling_mismatch`; ``feeling`` off skips it).
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Iterable, Sequence

from mascot.core.feeling import feeling_mismatch

_WORD_RE = re.compile(r"[a-z0-9](?:[a-z0-9']*[a-z0-9])?")  # apostrophes inside a word only: 'I'm -> i'm
#: A sentence ends at . ! ? or an ellipsis (optionally followed by closing quotes/brackets or emoji), then
#: whitespace; or at a line break.
_SENT_END_RE = re.compile(r"(?:[.!?…]+[\"')\]]*|\n)(?=\s)")
_LABEL_RE = re.compile(r"^\s*[\*#\-\s]*(action|tone|agent|director|directive|instruction|system|user|assistant)"
                       r"\b\s*[:'’]", re.IGNORECASE)

#: Reasons a reply or sentence is rejected (the ``reason`` label of ``mascot_reply_rejections_total``).
REASONS = ("empty", "short", "echo", "loop", "duplicate", "meta", "feeling", "unfinished", "supporter",
           "directive_name", "directive_voice", "directive_addressee", "directive_person", "directive_copy",
           "directive_invalid")

#: Sentences about the text or the task rather than to the person, as SmolLM2-135M writes them in a supporter's place
#: (read in phase 1 candidates): "Here's a rewritten version of your message:", "Your English is too informal",
#: "Possible duplicates:", "Your task now is to …", "Your style: Engaging", "The user gave a great example.", "As an
#: AI language model", "(pauses nervously)", a stage direction inside a sentence ("*smiles*"); in phase 2 rollouts
#: "Here's an alternative:" and letter openers ("To: Bright Idea", "Dear John,"). Matched on the sentence with curly
#: apostrophes made straight.
META_PATTERNS = tuple(re.compile(p, re.IGNORECASE) for p in (
    r"^\W*here(?:'s| is| are)\b[^.!?]{0,40}?\b(?:version|rephras\w*|rewrit\w*|revision|draft|edits?|response|reply"
    r"|suggested|example of|alternative)\b",
    r"\b(?:rewritten|revised|rephrased|edited|corrected|improved) (?:version|text|message|sentence)\b",
    r"\byour (?:message|text|english|writing|sentence|grammar|wording)\b[^.!?]{0,30}?\b(?:informal|imperfections?"
    r"|errors?|mistakes?|typos?|grammatical|rewrit\w*|edit\w*|correct\w*)",
    r"^\W*possible duplicates?\b", r"^\W*(?:to|from|subject|re)\s*:", r"^\W*dear\s+[a-z]+\b(?!!)",
    r"\byour (?:task|next sentence|instructions?)\b",
    r"\byour (?:style|tone|role|goal|expertise|persona)\s*:",
    r"\bthe user(?:'s)?\b(?! (?:manual|interface|guide|name)s?\b)",
    r"\bas an ai\b", r"\b(?:ai|large) language model\b",
    r"^\W*\([^()]{1,60}\)\W*$",
    # a stage direction inside a sentence: "I'm so sorry (sighs) that happened.", "*smiles warmly* That's great."
    r"[(*]\s*(?:\w+ly )?(?:pause[sd]?|sighs?|smiles?|laughs?|nods?|chuckles?|giggles?|hugs?|cries|winks?|grins?"
    r"|shrugs?|sobs?|leans? in|takes? a deep breath)\b[^()*]{0,40}[)*]",
    # a letter's placeholders and sign-offs, talk of how the text should be delivered or rephrased (phase 2
    # rollouts: "Sincerely, [User Name]", "Here is how it should be delivered.", "The language is a little unclear")
    r"\[(?:user|your|the person'?s|recipient'?s|their|first|full)?\s*name\]",
    r"^\W*(?:sincerely|best regards|kind regards|warm regards|yours truly)\b",
    r"\bhow (?:it|this|that|the (?:message|text)) should be (?:delivered|written|phrased|worded|said)\b",
    r"\b(?:the )?(?:language|wording|phrasing) is (?:a little |a bit |very |too )?(?:unclear|awkward|informal)\b",
))


def is_meta(sentence: str) -> bool:
    """True when ``sentence`` is about the text or the task rather than to the person (:data:`META_PATTERNS`)."""
    text = sentence.replace("’", "'")
    return any(p.search(text) for p in META_PATTERNS)


def words(text: str) -> list[str]:
    """Lower-cased word tokens (letters and digits, with apostrophes inside a word: "'I'm" gives "i'm")."""
    return _WORD_RE.findall(text.lower().replace("’", "'"))


def ngrams(tokens: Sequence[str], n: int) -> set[tuple[str, ...]]:
    """The set of ``n``-grams of ``tokens`` (empty when shorter than ``n``)."""
    return {tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1)}


def char_ngrams(text: str, n: int = 5) -> set[str]:
    """Character ``n``-grams of lower-cased, whitespace-normalised ``text`` (the text itself when shorter)."""
    t = " ".join(text.lower().split())
    return {t[i:i + n] for i in range(len(t) - n + 1)} if len(t) >= n else ({t} if t else set())


def jaccard(a: set, b: set) -> float:
    """|a ∩ b| / |a ∪ b| in [0, 1]; 0 when both are empty."""
    return len(a & b) / len(a | b) if a or b else 0.0


def split_sentences(text: str) -> list[str]:
    """Sentences of ``text`` (stripped, non-empty), split after . ! ? … or a line break."""
    out, start = [], 0
    for m in _SENT_END_RE.finditer(text + " "):
        s = text[start:m.end()].strip()
        if s:
            out.append(s)
        start = m.end()
    tail = text[start:].strip()
    if tail:
        out.append(tail)
    return out


def shares_ngram(text: str, sources: Iterable[str], n: int) -> bool:
    """True when ``text`` and any source share a word ``n``-gram."""
    grams = ngrams(words(text), n)
    return bool(grams) and any(grams & ngrams(words(s), n) for s in sources)


def is_echo(sentence: str, sources: Sequence[str], n: int = 8, tags: Sequence[str] = (),
            source_grams: set | None = None) -> bool:
    """An echo of the prompt: a shared word ``n``-gram with a source, a 4+-word sentence contained whole in a source,
    or a line opening with a prompt label or a speaker tag (``"The Anchor:"``). ``source_grams``: the sources'
    word ``n``-grams when the caller has them already (:meth:`ReplyContext.source_grams`)."""
    if _LABEL_RE.match(sentence):
        return True
    low = sentence.strip().lower()
    if any(low.startswith(t.lower() + ":") for t in tags if t):
        return True
    if source_grams is not None:
        if ngrams(words(sentence), n) & source_grams:
            return True
    elif shares_ngram(sentence, sources, n):
        return True
    w = words(sentence)
    if 6 <= len(w) < n:
        joined = " ".join(w)
        return any(joined in " ".join(words(s)) for s in sources)
    return False


def loop_count(text: str, n: int = 4) -> int:
    """How often the most frequent word ``n``-gram of ``text`` occurs (0 for text shorter than ``n`` words)."""
    w = words(text)
    c = Counter(tuple(w[i:i + n]) for i in range(len(w) - n + 1))
    return max(c.values(), default=0)


#: A sentence that opens with the whole of an earlier sentence of the same text, this many words or more, repeats it
#: ("I'm so glad to hear that. I'm so glad to hear that your journey …").
RESTART_MIN_WORDS = 5


def _repeats_within(text: str) -> bool:
    keys = [" ".join(words(s)) for s in split_sentences(text)]
    keys = [k for k in keys if k]
    lines = [" ".join(words(ln)) for ln in text.splitlines() if ln.strip()]
    lines = [k for k in lines if k]
    if len(set(keys)) < len(keys) or len(set(lines)) < len(lines):
        return True
    return any(later.startswith(k + " ") for i, k in enumerate(keys) if len(k.split()) >= RESTART_MIN_WORDS
               for later in keys[i + 1:])


#: A word n-gram this long twice in one text is a loop: a sentence said again, also when the copy is glued to the
#: first without a space ("... your family too.I'm so glad ..."), where no sentence split separates them.
REPEAT_NGRAM = 8


#: A short phrase of this many words said :data:`REFRAIN_COUNT` times is a refrain, a loop too ("You're not alone,
#: you're not alone. You're not alone.").
REFRAIN_NGRAM, REFRAIN_COUNT = 3, 3
#: This many sentences opening with the same :data:`FRAME_WORDS` words are one sentence frame repeated ("I'm so sorry
#: for your pain. I'm so proud of you. I'm so glad of you").
FRAME_WORDS, FRAME_COUNT = 2, 3


def _mostly_one_phrase(text: str) -> bool:
    """A phrase of 2-5 words said twice or more makes up three quarters or more of ``text`` (4+ words): "You're not
    alone, you're not alone." """
    w = words(text)
    if len(w) < 4:
        return False
    for n in range(2, 6):
        c = Counter(tuple(w[i:i + n]) for i in range(len(w) - n + 1))
        top = max(c.values(), default=0)
        if top >= 2 and top * n >= 0.75 * len(w):
            return True
    return False


def _repeats_frame(text: str) -> bool:
    """:data:`FRAME_COUNT` or more sentences of ``text`` open with the same :data:`FRAME_WORDS` words."""
    openers = Counter(tuple(w[:FRAME_WORDS]) for w in (words(s) for s in split_sentences(text))
                      if len(w) > FRAME_WORDS)
    return max(openers.values(), default=0) >= FRAME_COUNT


def is_loop(text: str, n: int = 4, count: int = 3) -> bool:
    """A loop: a word ``n``-gram ``count``+ times in ``text``, a word :data:`REPEAT_NGRAM`-gram twice, a refrain (a
    word :data:`REFRAIN_NGRAM`-gram :data:`REFRAIN_COUNT`+ times), a sentence or line of it repeated, a sentence that
    opens with a whole earlier sentence (:data:`RESTART_MIN_WORDS`+ words), :data:`FRAME_COUNT`+ sentences on one
    frame (the same first :data:`FRAME_WORDS` words), or text made (three quarters or more) of one short phrase said
    again."""
    return (loop_count(text, n) >= count or loop_count(text, REPEAT_NGRAM) >= 2
            or loop_count(text, REFRAIN_NGRAM) >= REFRAIN_COUNT or _repeats_within(text) or _repeats_frame(text)
            or _mostly_one_phrase(text))


def max_similarity(text: str, earlier: Iterable[str]) -> float:
    """Highest character 5-gram Jaccard similarity between ``text`` and any of ``earlier`` (0 when none)."""
    a = char_ngrams(text)
    return max((jaccard(a, char_ngrams(e)) for e in earlier if e.strip()), default=0.0)


@dataclass(frozen=True)
class GuardSettings:
    """Thresholds of the reply checks (the ``guard`` config section; see the module docstring)."""

    enabled: bool = True
    echo_ngram: int = 8
    loop_ngram: int = 4
    loop_count: int = 3
    duplicate_jaccard: float = 0.6
    duplicate_min_words: int = 5
    min_words: int = 3
    feeling: bool = True


@dataclass
class ReplyContext:
    """What a reply is checked against.

    Attributes:
        sources: Prompt texts it must not echo (system prompt, persona card, directive action and tone).
        earlier: Texts of earlier turns it must not copy.
        tags: Speaker names whose ``Name:`` at a sentence start is a leaked tag.
        answers: The user's message the reply answers (persona replies; "" skips the ``feeling`` check).
    """

    sources: list[str] = field(default_factory=list)
    earlier: list[str] = field(default_factory=list)
    tags: list[str] = field(default_factory=list)
    answers: str = ""
    _earlier_sentences: list[set] | None = field(default=None, repr=False)
    _source_grams: dict = field(default_factory=dict, repr=False)

    def source_grams(self, n: int) -> set:
        """Word ``n``-grams of all the sources together (computed once per ``n``)."""
        if n not in self._source_grams:
            self._source_grams[n] = set().union(*(ngrams(words(x), n) for x in self.sources))
        return self._source_grams[n]

    def earlier_sentence_grams(self) -> list[set]:
        """Character 5-gram sets of every earlier turn's sentences (computed once)."""
        if self._earlier_sentences is None:
            self._earlier_sentences = [char_ngrams(s) for t in self.earlier for s in split_sentences(t)
                                       if len(words(s)) >= 3]
        return self._earlier_sentences


def check_sentence(sentence: str, released: str, ctx: ReplyContext, s: GuardSettings) -> str | None:
    """The reason ``sentence`` may not follow ``released`` (the reply's text so far), or None when it may.

    Reasons: ``echo``, ``meta``, ``feeling``, ``loop``, ``duplicate`` (see the module docstring).
    """
    grams = ctx.source_grams(s.echo_ngram)
    if is_echo(sentence, ctx.sources, s.echo_ngram, ctx.tags, grams):
        return "echo"
    if is_meta(sentence):
        return "meta"
    if s.feeling and ctx.answers and feeling_mismatch(sentence, ctx.answers):
        return "feeling"
    if released:  # an n-gram that spans the boundary with the text so far is an echo too
        bridge = words(released)[-(s.echo_ngram - 1):] + words(sentence)
        if ngrams(bridge, s.echo_ngram) & grams:
            return "echo"
    candidate = (released + " " + sentence).strip()
    if is_loop(candidate, s.loop_ngram, s.loop_count):
        return "loop"
    if len(words(sentence)) >= s.duplicate_min_words:
        g = char_ngrams(sentence)
        if any(jaccard(g, e) >= s.duplicate_jaccard for e in ctx.earlier_sentence_grams()):
            return "duplicate"
    # the reply so far against whole earlier turns, at any length: a short reply ("That's a great story.") that
    # repeats a short earlier turn is a copy too (only a sentence on its own is exempt below duplicate_min_words)
    if ctx.earlier and words(candidate) and max_similarity(candidate, ctx.earlier) >= s.duplicate_jaccard:
        return "duplicate"
    return None


def check_reply(text: str, ctx: ReplyContext, s: GuardSettings) -> str | None:
    """The first reason a whole reply fails (``empty``, ``echo``, ``meta``, ``feeling``, ``loop``, ``duplicate``), or
    None. Used for
    replies generated in full (screened conversations, evaluation baselines)."""
    if len(words(text)) == 0:
        return "empty"
    released = ""
    for sent in split_sentences(text):
        r = check_sentence(sent, released, ctx, s)
        if r:
            return r
        released = (released + " " + sent).strip()
    return None


#: Phrases of a supporter, not of the person being supported: letters, comfort, advice, assistant talk. A simulated
#: user's sentence matching one is refused (``supporter``).
SUPPORTER_PATTERNS = tuple(re.compile(p, re.IGNORECASE) for p in (
    r"^\W*dear\b", r"hope (this|my) (message|letter|email) finds you", r"\b(best|kind|warm) regards\b",
    r"\bsincerely\b", r"\byours truly\b", r"\[(name|your name)\]",
    r"\bi'?m (so |very |really )?sorry (to hear|that you|for your|you're|you are)",
    r"\bit sounds like you\b",
    r"\b(it'?s|that'?s) (completely |totally )?(understandable|normal|okay|ok) (that you|to feel)",
    r"\byou'?re not alone\b", r"\bi'?m (always )?here (for you|to (help|support|listen))",
    r"\bremember (that )?you\b", r"\bas an ai\b", r"\bhow (can|may) i (help|assist)",
    r"\bthank you for (sharing|opening up|reaching out)", r"\byou should\b",
    r"\byou (could|might|can) (try|consider)\b",
    r"\bfeel free to\b", r"\bi (understand|hear) (how|that) you\b", r"\byour feelings are (valid|normal)\b",
    # praise of the helpers, seen from SmolLM2-135M as the simulated user: "I'm so proud of you for being kind",
    # "It's wonderful to know that you're doing something positive"
    r"\bproud of you\b",
    r"\b(it'?s|that'?s) (so |really |just )?(wonderful|great|amazing|inspiring|lovely) (to see|to know|to hear)"
    r"( that)? you\b",
    # advice to the helpers about "their" life, seen in phase 2 rollouts: "I think the best way to address this is
    # to have a conversation with your husband" (the helpers have no husband, boss or children)
    r"\byour (husband|wife|partner|boyfriend|girlfriend|spouse|boss|manager|mom|mother|dad|father|parents|son|"
    r"daughter|kids?|children|brother|sister|family|coworkers?|colleagues?)\b",
    r"\bi( would|'d)? (suggest|recommend|advise|encourage) (that )?you\b",
    r"\b(might|may|could|will|would) help you\b",
    # consoling the helpers (phase 2 rollouts): "Take a deep breath and remind yourself …", "Please find some relief."
    r"\b(remind|take care of|be kind to|be gentle with|be proud of|forgive) yourself\b", r"^\W*take a deep breath\b",
    r"\bplease find (some )?(relief|peace|comfort)\b",
))


def supporter_reason(sentence: str, released: str = "") -> str | None:
    """``supporter`` when a simulated user's sentence speaks as a helper (:data:`SUPPORTER_PATTERNS`), else None."""
    text = sentence.replace("’", "'")
    return "supporter" if any(p.search(text) for p in SUPPORTER_PATTERNS) else None


class SentenceGate:
    """Release streamed visible text sentence by sentence, each after it passed :func:`check_sentence`.

    Feed visible deltas with :meth:`feed` (it returns the text to send now); call :meth:`finish` with the engine's
    finish reason. After a failing sentence :attr:`stopped` is True (stop generating): when something was released
    the reply is cut there (:attr:`cut_reason`), else the attempt is rejected (:attr:`rejected_reason`). The joined
    returns of ``feed``/``finish`` always equal :attr:`released`.

    Args:
        ctx: What the reply is checked against.
        settings: Thresholds; with ``enabled`` False the text passes through unchecked and uncut (only a reply with
            no visible text is refused, as ``empty``).
        extra_check: Optional ``(sentence, released) -> reason | None`` run after the built-in checks (the simulated
            user's ``supporter`` check).
    """

    def __init__(self, ctx: ReplyContext, settings: GuardSettings, extra_check=None) -> None:
        self.ctx, self.s, self.extra = ctx, settings, extra_check
        self.released = ""
        self._keys: set[str] = set()
        self.held = ""
        self.pending = ""
        self.stopped = False
        self.cut_reason: str | None = None
        self.rejected_reason: str | None = None
        self.rejected_text = ""

    def _check(self, sentence: str) -> str | None:
        if not self.s.enabled:
            return None
        key = " ".join(words(sentence))
        if key and key in self._keys:
            return "loop"  # a sentence or line of this reply again
        self._keys.add(key)
        r = check_sentence(sentence, (self.released + " " + self.held).strip(), self.ctx, self.s)
        if r is None and self.extra is not None:
            r = self.extra(sentence, self.released)
        return r

    def _offer(self, sentence: str) -> str:
        reason = self._check(sentence)
        if reason is not None:
            self.stopped = True
            if self.released:
                self.cut_reason = reason
            else:
                self.rejected_reason = reason
                self.rejected_text = (self.held + " " + sentence).strip()
                self.held = ""
            return ""
        if self.released:
            self.released += " " + sentence
            return " " + sentence
        self.held = (self.held + " " + sentence).strip()
        if len(words(self.held)) < self.s.min_words:
            return ""  # the first words are held until the reply is long enough to be worth sending
        self.released, self.held = self.held, ""
        return self.released

    def feed(self, delta: str) -> str:
        """Consume visible text; return what may be sent now ('' while a sentence is incomplete or after a stop)."""
        if self.stopped:
            return ""
        if not self.s.enabled:  # checks off: the visible text passes through as it comes
            self.released += delta
            return delta
        self.pending += delta
        out = ""
        while not self.stopped:
            m = _SENT_END_RE.search(self.pending)
            if m is None or m.end() >= len(self.pending):
                break  # the terminator must be followed by whitespace we have seen
            sentence, self.pending = self.pending[:m.end()].strip(), self.pending[m.end():].lstrip(" \t")
            if sentence:
                out += self._offer(sentence)
        return out

    def finish(self, finish_reason: str) -> str:
        """The end of generation: the unfinished tail is offered as a last sentence after an end of sequence
        (``stop``) and dropped after ``length`` (it would end mid-sentence); held first words that never reached
        ``min_words`` reject the attempt (``short``). Returns the text to send now."""
        if self.stopped:
            return ""
        if not self.s.enabled:
            if not self.released.strip():
                self.rejected_reason = "empty"
            return ""
        tail, self.pending = self.pending.strip(), ""
        out = ""
        if tail:
            if finish_reason == "length" and not re.search(r"[.!?…][\"')\]]*$", tail):
                if self.released:
                    self.cut_reason = "unfinished"
                elif not self.held:
                    self.rejected_reason, self.rejected_text = "unfinished", tail
                    return ""
            else:
                out = self._offer(tail)
                if self.stopped:
                    return out
        if not self.released:
            if self.held and (not self.s.enabled or len(words(self.held)) >= 1 and not self.s.min_words):
                self.released, self.held = self.held, ""
                return out + self.released
            if self.rejected_reason is None:
                self.rejected_reason = "short" if self.held else "empty"
                self.rejected_text = self.held
            self.held = ""
        return out

    @property
    def accepted(self) -> bool:
        """True when a reply was released (it may have been cut back: :attr:`cut_reason`)."""
        return bool(self.released.strip())


def cut_back(text: str, ctx: ReplyContext, settings: GuardSettings,
             finish_reason: str = "stop") -> tuple[str, str]:
    """Pass a whole generated reply through the sentence gate, as the speaker streams one: ``(delivered, reason)``,
    the longest passing prefix of whole sentences and why the rest was cut ("" when nothing was), or ``("",
    reason)`` when the first sentence fails. ``finish_reason`` is how generation ended (``"stop"`` or
    ``"length"``, as :meth:`SentenceGate.finish` reads it: after ``"length"`` an unfinished last sentence is
    dropped, reason ``unfinished``). Used where text is generated in full (evaluation baselines)."""
    gate = SentenceGate(ctx, settings)
    gate.feed(text)
    gate.finish(finish_reason)
    return gate.released, gate.cut_reason or gate.rejected_reason or ""
