"""Does a reply's feeling fit the user's? The ``feeling`` reply check (:mod:`mascot.core.guard`, docs/dialogue.md).

A supporter must not cheer bad news, minimise it, or offer condolences for good news or for a loss that is not a
death. Two signals, both cheap enough for every streamed sentence:

- the valence of the message the reply answers: VADER's compound score (Hutto & Gilbert 2014, "VADER: A Parsimonious
  Rule-based Model for Sentiment Analysis of Social Media Text", ICWSM; the ``vaderSentiment`` package: a lexicon of
  about 7,500 rated words with rules for negation, intensifiers and "but"), in [-1, 1], plus a bereavement pattern
  (a death, a funeral, a person or pet lost), which VADER's lexicon under-rates;
- what a reply sentence does, by phrase patterns: celebrates (congratulations, "that's wonderful", "so happy for
  you"), minimises ("not a big deal", "look on the bright side", "at least you"), offers condolences for a death
  ("sorry for your loss") or sympathy ("I'm so sorry to hear that", "that must have been hard").

A sentence is a mismatch when it celebrates or minimises after a negative message (compound <= :data:`NEGATIVE_AT`,
or bad news and distress that VADER misreads, :data:`BAD_NEWS`) or a bereavement, offers condolences for a death
when the message names none, or offers sympathy after a clearly positive message (compound >= :data:`POSITIVE_AT`,
or news such as a new job or a graduation that VADER does not score, and no negative cue). Anything else passes: the
check only refuses what is plainly wrong, and leaves tone to the model and the persona.
"""

from __future__ import annotations

import functools
import re

#: VADER compound at or below which the user's message is negative.
NEGATIVE_AT = -0.3
#: VADER compound at or above which the user's message is positive (and sympathy is out of place).
POSITIVE_AT = 0.5

_KIN = (r"(mom|mum|mother|dad|father|parent|grand(ma|pa|mother|father|parent)|nan|nana|brother|sister|sibling|son|"
        r"daughter|child|kid|baby|husband|wife|partner|spouse|fianc[eé]e?|boyfriend|girlfriend|friend|uncle|aunt|"
        r"cousin|nephew|niece|dog|cat|pet|puppy|kitten|horse|bird|rabbit|hamster)s?")
BEREAVEMENT = re.compile(
    r"\b(died|dies|dying|dead|death|deceased|passed away|passing|passed on|funeral|burial|buried|memorial|"
    r"miscarr\w*|stillborn|terminal|killed|put (him|her|them|it) down|put to sleep|euthani[sz]\w*|"
    rf"lost (my|our|his|her|their) {_KIN}|{_KIN} (was|got) (killed|hit)|r\.?i\.?p\b)", re.IGNORECASE)

CELEBRATE = re.compile(
    r"\b(congratulations|congrats|congratulate|hooray|yay|woo-?hoo|how (wonderful|exciting|amazing|fantastic|great|"
    r"lovely|awesome|fun)|what (a )?(great|wonderful|fantastic|good|amazing|exciting) (news|thing)|"
    r"(that'?s|that is|this is|it'?s|it is) (so |really |absolutely |just )?(wonderful|amazing|fantastic|awesome|"
    r"exciting|great news|good news|brilliant|fabulous|terrific)\b|"
    r"(i'?m|i am) (so |really |very )?(happy|glad|thrilled|excited|delighted) (for you|to hear (that|this|it)\b)|"
    r"good for you|well done|you must be (so )?(proud|thrilled|excited|happy)|"
    # "It sounds like you have great news." (the demo, after "this guy started following us ... so scary!")
    r"(sounds like|you have|you'?ve got|you got|hear|such) (some |such |the )?(great|good|wonderful|amazing|"
    r"exciting|fantastic|happy) news|"
    r"(that|this|it) sounds (so |really |absolutely |just )?(fun|exciting|amazing|wonderful|fantastic|awesome|"
    r"lovely)\b|"
    # a second blind reader's marks on the 32-situation run with the check on: a story of loss or fear called great
    r"(that'?s|that is|what) (such )?a (great|wonderful|lovely|fun|fantastic) (story|way to (end|wrap up|finish))|"
    r"(a|such a) great way to (end|wrap up|finish) (the|this|that) story)", re.IGNORECASE)

MINIMISE = re.compile(
    r"\b((it'?s|that'?s|it is|that is) not (a|that|such a) big deal|no big deal|could (have been|be) (a lot )?worse|"
    r"look on the bright side|at least (you|it|they)\b|everything happens for a reason|cheer up|get over it|"
    r"don'?t (be|feel) (so )?(sad|upset|down)|it'?s (only|just) a|"
    r"(this|that|it) (could|can) be a (great|wonderful|real) opportunity)", re.IGNORECASE)

CONDOLE_DEATH = re.compile(r"\b(sorry for (your|the|their) loss|(my|our|deepest|sincere) condolences|rest in peace|"
                           r"may (he|she|they) rest)", re.IGNORECASE)

SYMPATHY = re.compile(
    r"\b((i'?m|i am) (so |very |really |truly )?sorry (to hear|that (this|that|it|you)|about|for what)|"
    r"that must (have been|be) (so |really |very )?(hard|painful|devastating|difficult|awful|terrible|heartbreaking|"
    r"upsetting)|my heart goes out)", re.IGNORECASE)

#: Bad news and distress VADER misreads ("I can't stop crying" scores +0.53 to it: the negation flips "stop").
BAD_NEWS = re.compile(r"\b(cry|cries|crying|cried|in tears|heartbroken|devastated|broke up|break-?up|divorc\w*|"
                      r"(left|dumped|cheated on) me|(got|was|were|been|get|gets) (fired|laid off|dumped|rejected)|"
                      r"lost (my|his|her|their|our|a) job|bummer|disappoint\w*|ripped off|broke down|broken down|"
                      r"diagnos\w+|in (the )?hospital|surgery|accident|crash(ed)?|failed|hopeless|can'?t cope|"
                      r"panic attack|depress\w+)\b", re.IGNORECASE)

#: Good news VADER's lexicon does not score ("I got the job I wanted!" is 0.0 to it).
GOOD_NEWS = re.compile(r"\b(got (the|a|my|that) (job|promotion|offer|raise|part|place|scholarship)|(got|was|been) "
                       r"promoted|passed (my|the|all)|graduat\w+|got engaged|got married|(we|i) won\b|"
                       r"got (in|into|accepted)|(was|been|got) accepted|new baby|had a baby|it'?s a (boy|girl))",
                       re.IGNORECASE)

#: Words that make a positive-scoring message not plainly good news ("I'm happy but also scared").
NEGATIVE_CUE = re.compile(r"\b(but|though|although|scared|afraid|worried|anxious|nervous|sad|miss|hurt|alone|"
                          r"lonely|stress\w*|tired|sick|ill|lost|lose|fail\w*|fired|broke|sorry)\b", re.IGNORECASE)


@functools.lru_cache(maxsize=1)
def _analyzer():
    from vaderSentiment.vaderSentiment import SentimentIntensityAnalyzer

    return SentimentIntensityAnalyzer()


@functools.lru_cache(maxsize=4096)
def valence(text: str) -> float:
    """VADER's compound score of ``text``, in [-1, 1] (0 for empty text)."""
    return float(_analyzer().polarity_scores(text)["compound"]) if text.strip() else 0.0


@functools.lru_cache(maxsize=4096)
def _reading(user_text: str) -> tuple[bool, bool, bool]:
    """(negative, bereavement, plainly positive) of the user's message."""
    bereaved = bool(BEREAVEMENT.search(user_text))
    v = valence(user_text)
    negative = bereaved or v <= NEGATIVE_AT or bool(BAD_NEWS.search(user_text))
    positive = (not negative and (v >= POSITIVE_AT or bool(GOOD_NEWS.search(user_text)))
                and not NEGATIVE_CUE.search(user_text))
    return negative, bereaved, positive


def feeling_mismatch(sentence: str, user_text: str) -> str | None:
    """Why ``sentence`` (of a reply) does not fit the feeling of ``user_text`` (the message it answers), or None.

    Returns:
        ``celebrates bad news``, ``minimises bad news``, ``condolences without a death`` or ``sympathy for good
        news``; None when it fits or ``user_text`` is empty.
    """
    if not user_text.strip() or not sentence.strip():
        return None
    negative, bereaved, positive = _reading(user_text)
    if negative and CELEBRATE.search(sentence):
        return "celebrates bad news"
    if negative and MINIMISE.search(sentence):
        return "minimises bad news"
    if not bereaved and CONDOLE_DEATH.search(sentence):
        return "condolences without a death"
    if positive and SYMPATHY.search(sentence):
        return "sympathy for good news"
    return None
