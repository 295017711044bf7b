"""The metrics judge (``judge.judges[].kind: metrics``): the rubric's criteria scored 1-5 from measured signals.

A CPU stand-in for an LLM judge, for machines where no judge model with signal runs (the 135M default model scores
everything alike). It is deterministic, needs no model but the bundled all-MiniLM-L6-v2 sentence encoder
(:class:`~mascot.core.embedding.SentenceEncoder`), and answers through the same :class:`~mascot.judge.judging.Judge`
(cache, metrics, report fields) as the model judges. It is never the default judge: what it measures is narrower
than what the rubric asks, and two of the agent criteria have no signal of their own (below).

Signals (cosines of L2-normalised MiniLM embeddings):

- **margin**: cosine of the reply to its persona's identity text (:func:`~mascot.core.embedding.identity_text`)
  minus the best cosine to another active persona's: the zero-shot persona identifiability of the quality measures.
  With fewer than two personas in the roster there is nothing to tell the persona from: no signal, the middle
  score 3.
- **relevance**: cosine of the reply to the latest user message before it (to the seed context when the history
  has no user message; no signal, the middle score, when there is neither).
- **overlap**: the highest cosine of the reply to an earlier agent turn (no signal, the middle score, when there is
  none: a first reply has nothing to repeat, and a constant 5 would only pad every score alike).
- **form**: 5 minus one point for each of: fewer than :data:`MIN_WORDS` words, more than the persona's
  ``max_answer_words``, a speaker label (a roster persona's name or id, or a chat role such as ``User``, followed by a
  colon) opening the reply, leaked prompt text (a line opening with a directive or prompt field such as ``Tone:``),
  list or markdown markup, no closing punctuation, a card echo (below).

Copies are not credited (measured on a small default model trained on this judge, whose replies learned to repeat
the user's message and their persona card): a reply that repeats :data:`ECHO_WORDS` consecutive words of the latest
user message, or whose cosine to it reaches :data:`ECHO_COSINE`, scores relevance 1 (a copy answers nothing); a reply
that repeats :data:`ECHO_WORDS` consecutive words of a roster card's identity text has the form fault ``card echo``
and its persona score is capped at 3 (the margin then measures the card's wording, not the persona's voice).

- **moves**: the card's moves (:mod:`mascot.core.moves`): a required move without a forbidden one, or not
  (:func:`persona_moves_score`).
- **novelty**: the share of the reply's content words that no earlier turn (the user's included) holds
  (:func:`novelty_share`): a reply that only restates what was said contributes little, a first reply included.

Agent rubric: ``persona_consistency`` <- moves and margin (the margin alone for a card without moves; the margin
alone is at chance on the default model's replies, the moves are what the card asks), ``response_relevance`` <-
relevance, ``social_contribution`` <- the lower of the overlap and novelty scores (less overlap and more novelty
are better), ``emotional_expressiveness`` <- form, ``empathetic_support_quality`` <- the mean of the
relevance and form scores (rounded half up). The last two carry no measurement of emotion or support: they keep
the rubric's keys and reward well-formed, on-topic replies.

Collective rubric (over the block's agent turns): ``fidelity`` <- the mean persona score (moves and margin),
``originality_specificity`` <- the mean overlap score (each turn against every earlier turn, the block's included),
``relevance_coherence`` <- the mean relevance score, ``engagement_contribution`` <- the mean form score (rounded half
up).

The thresholds (:data:`MARGIN_STEPS`, :data:`RELEVANCE_STEPS`, :data:`OVERLAP_STEPS`) were set on MiniLM's cosine
scale: unrelated English sentences sit near 0.0-0.2, paraphrases above 0.7.
"""

from __future__ import annotations

import asyncio
import re
from typing import Any, Sequence

from mascot.core.embedding import SentenceEncoder, identity_text
from mascot.core.errors import InvalidArgument
from mascot.core.guard import shares_ngram, words
from mascot.core.moves import assess, content_words
from mascot.judge import rubric as rb

#: Score 5, 4, 3, 2 from these lower bounds of the margin; below the last, 1.
MARGIN_STEPS = (0.10, 0.05, 0.0, -0.05)
#: Score 5, 4, 3, 2 from these lower bounds of the relevance cosine; below the last, 1.
RELEVANCE_STEPS = (0.50, 0.40, 0.30, 0.20)
#: Score 5, 4, 3, 2 up to these upper bounds of the overlap cosine; above the last, 1.
OVERLAP_STEPS = (0.50, 0.60, 0.70, 0.85)
#: Score 5, 4, 3, 2 from these lower bounds of the novelty (share of the reply's content words found in no earlier
#: turn); below the last, 1.
NOVELTY_STEPS = (0.70, 0.50, 0.30, 0.15)
#: Fewer words than this cost a form point.
MIN_WORDS = 5
#: Part of the cache key of every verdict: raise it when a threshold or a signal changes, so cached verdicts of
#: the old mapping are not reused.
VERSION = "metrics-4"
#: A run of this many consecutive words shared with a text (case and punctuation ignored) is a copy of it.
ECHO_WORDS = 6
#: A reply this close to the user's message (MiniLM cosine) repeats it rather than answering it.
ECHO_COSINE = 0.9
#: Fields of the director's directive and the speaker prompt that, opening a line of a reply, are leaked prompt text.
PROMPT_FIELDS = ("tone", "action", "directive", "task", "instruction", "instructions", "persona")
#: Openings of a line that address the model the way the prompt does (``Your task now:``), then a colon.
PROMPT_OPENINGS = ("your task", "your role", "your reply", "your answer", "your response")
#: Chat roles that, followed by a colon, start a reply with a speaker label (besides the roster's names and ids).
ROLE_LABELS = ("user", "assistant", "system", "director", "speaker", "agent", "ai", "bot")
_LEAD = re.compile(r"^\s*([^:\n]{1,40}):\s")
_MARKUP = re.compile(r"(^|\n)\s*([-*•]|\d+[.)]|#+)\s|\*\*|__|`")
_LINE_LEAD = re.compile(r"(?m)^\s*([^:\n]{1,40}):")


def step_score(value: float, steps: Sequence[float], higher_is_better: bool = True) -> int:
    """Map a measured value to 1-5 with four thresholds: ``steps`` are the bounds of scores 5, 4, 3 and 2 (lower
    bounds when higher is better, upper bounds otherwise); anything past the last bound scores 1."""
    for score, bound in zip((5, 4, 3, 2), steps):
        if (value >= bound) if higher_is_better else (value <= bound):
            return score
    return 1


def speaker_label(reply: str, names: Sequence[str] = ()) -> bool:
    """Whether ``reply`` opens with a speaker label: one of ``names`` (persona names or ids) or a chat role of
    :data:`ROLE_LABELS`, then a colon (case-insensitive). Ordinary openings such as "Here's one idea:" are not."""
    m = _LEAD.match(reply)
    if m is None:
        return False
    lead = " ".join(m.group(1).split()).strip("*_ ").lower()
    return lead in ROLE_LABELS or lead in {" ".join(n.split()).lower() for n in names if n.strip()}


def prompt_leak(reply: str) -> bool:
    """Whether a line of ``reply`` opens with a field of the director's directive or the speaker prompt
    (:data:`PROMPT_FIELDS`, e.g. ``Tone:``) or addresses the model as the prompt does (:data:`PROMPT_OPENINGS`,
    e.g. ``Your task now:``), then a colon (case-insensitive)."""
    leads = (" ".join(m.group(1).split()).strip("*_ ").lower() for m in _LINE_LEAD.finditer(reply))
    return any(lead in PROMPT_FIELDS or lead.startswith(PROMPT_OPENINGS) for lead in leads)


def form_score(reply: str, max_words: int, names: Sequence[str] = (),
               cards: Sequence[str] = ()) -> tuple[int, list[str]]:
    """5 minus one per form fault of ``reply`` (see the module docstring; ``names``: the roster's persona names
    and ids, for the speaker-label rule; ``cards``: the roster's identity texts, for the card-echo rule); returns the
    score (1 at least) and the faults."""
    n = len(words(reply))
    finished = reply.rstrip().endswith((".", "!", "?", '"', "'", ")"))
    faults = [name for name, bad in (
        ("short", n < MIN_WORDS), ("long", n > max_words), ("speaker label", speaker_label(reply, names)),
        ("prompt leak", prompt_leak(reply)), ("markup", bool(_MARKUP.search(reply))), ("unfinished", not finished),
        ("card echo", shares_ngram(reply, cards, ECHO_WORDS)),
    ) if bad]
    return max(1, 5 - len(faults)), faults


def persona_moves_score(card: Any, reply: str, user: str, margin_score: int) -> tuple[int, str] | None:
    """The persona criterion from the card's moves (:func:`mascot.core.moves.assess`) and the margin's score:
    4 for a reply with a required move and no forbidden one, 2 for one with neither or with both, 1 for a forbidden
    move alone; one more (at most 5) when the margin scores 4 or 5. Returns ``(score, verdict)`` (verdict
    ``compliant``, ``required+forbidden``, ``no move`` or ``forbidden``), or None for a card without moves (the
    margin's score is then the criterion)."""
    if getattr(card, "moves", None) is None:
        return None
    v = assess(card.moves, reply, user)
    if v.compliant:
        base, verdict = 4, "compliant"
    elif v.required_present:
        base, verdict = 2, "required+forbidden"
    elif v.forbidden_present:
        base, verdict = 1, "forbidden"
    else:
        base, verdict = 2, "no move"
    return min(5, base + (margin_score >= 4)), verdict


def novelty_share(reply: str, earlier: Sequence[str]) -> float | None:
    """Share of the reply's content words (:func:`mascot.core.moves.content_words`, stemmed, stop words out) that no
    earlier turn (the user's included) holds, in [0, 1]; None when the reply has no content word."""
    mine = content_words(reply)
    if not mine:
        return None
    seen = set().union(*(content_words(t) for t in earlier)) if earlier else set()
    return len(mine - seen) / len(mine)


def _half_up(x: float) -> int:
    return int(x + 0.5)


class MetricsJudgeBackend:
    """Scores :class:`~mascot.judge.judging.JudgeItem` s from measured signals (module docstring).

    Args:
        encoder: A :class:`~mascot.core.embedding.SentenceEncoder` (loaded on first use when None).
    """

    #: The judge scores structured items, not prompts (:class:`~mascot.judge.judging.Judge` reads this).
    scores_items = True
    model = "metrics:all-MiniLM-L6-v2"
    version = VERSION

    def __init__(self, encoder: SentenceEncoder | None = None) -> None:
        self._encoder = encoder

    @property
    def encoder(self) -> SentenceEncoder:
        """The sentence encoder (loaded on first use)."""
        if self._encoder is None:
            self._encoder = SentenceEncoder(device="cpu")
        return self._encoder

    async def complete(self, messages: list[dict], schema: dict, seed: int = 0) -> str:
        """Not available: the metrics judge reads the parts of an item, not a rendered prompt.

        Raises:
            TypeError: always.
        """
        raise TypeError("the metrics judge scores JudgeItems (card, history, reply or block), not prompts")

    async def score(self, rubric: str, item: Any) -> tuple[dict[str, int], str]:
        """Scores 1-5 for every criterion of ``rubric`` and a rationale listing the measured values.

        Raises:
            InvalidArgument: ``item`` lacks what the rubric needs (a card and reply, or a block of agent turns), or
                the block has turns of personas outside the item's roster.
        """
        if rubric == rb.AGENT and (item.card is None or not item.reply.strip()):
            raise InvalidArgument("the metrics judge needs the item's persona card and reply (agent rubric)")
        if rubric == rb.COLLECTIVE:
            ids = {c.id for c in item.cards}
            agents = [t for t in item.block if t.role == "agent" and t.text.strip()]
            if not agents:
                raise InvalidArgument("the metrics judge needs the item's block of agent turns (collective rubric)")
            outside = sorted({t.persona_id for t in agents if t.persona_id not in ids})
            if outside:
                raise InvalidArgument(f"the block has agent turns of personas outside the roster "
                                      f"({', '.join(outside)}); add them to roster_persona_ids")
        return await asyncio.to_thread(self._score, rubric, item)

    def cache_parts(self, item: Any) -> list[str]:
        """What the verdict depends on besides the prompt: the mapping's :data:`VERSION` and the roster's identity
        texts (the margin reads every roster card; a model judge's prompt holds only what it reads)."""
        return [self.version, *sorted(identity_text(c) for c in item.cards)]

    # ------------------------------------------------------------------ signals
    def _signals(self, card: Any, reply: str, cards: Sequence[Any], before: Sequence[Any],
                 context: Sequence[tuple[str, str]], emb: dict[str, Any]) -> dict[str, Any]:
        """Margin, relevance and overlap of one reply (``before``: the turns before it), with their scores."""
        def vec(text: str) -> Any:
            return emb[text]

        r = vec(reply)
        own = float(r @ vec(identity_text(card)))
        others = [float(r @ vec(identity_text(c))) for c in cards if c.id != card.id]
        margin = own - max(others) if others else None  # one persona: nothing to tell it from
        user = next((t.text for t in reversed(before) if t.role == "user" and t.text.strip()), "")
        anchor = user or " ".join(text for _, text in context)
        relevance = float(r @ vec(anchor)) if anchor.strip() else None
        echo = relevance is not None and (relevance >= ECHO_COSINE or shares_ngram(reply, [anchor], ECHO_WORDS))
        earlier = [t.text for t in before if t.role == "agent" and t.text.strip()]
        overlap = max((float(r @ vec(t)) for t in earlier), default=None)
        if any(t.strip() == reply.strip() for t in earlier):
            overlap = 1.0
        names = [n for c in cards for n in (c.id, c.name)]
        form, faults = form_score(reply, card.max_answer_words, names, [identity_text(c) for c in cards])
        if echo:
            faults = [*faults, "echo of the user"]
        margin_score = 3 if margin is None else step_score(margin, MARGIN_STEPS)
        moves = persona_moves_score(card, reply, user, margin_score)
        persona_score = margin_score if moves is None else moves[0]
        if "card echo" in faults:
            margin_score = min(margin_score, 3)
            persona_score = min(persona_score, 3)
        novelty = novelty_share(reply, [t.text for t in before if t.text.strip()])
        overlap_score = 3 if overlap is None else step_score(overlap, OVERLAP_STEPS, higher_is_better=False)
        novelty_score = 3 if novelty is None else step_score(novelty, NOVELTY_STEPS)
        return {"margin": margin, "own": own, "best_other": max(others) if others else None,
                "relevance": relevance, "overlap": overlap, "form": form, "faults": faults,
                "margin_score": margin_score, "persona_score": persona_score,
                "moves": None if moves is None else moves[1], "novelty": novelty,
                "relevance_score": 3 if relevance is None else 1 if echo else step_score(relevance, RELEVANCE_STEPS),
                "overlap_score": overlap_score, "contribution_score": min(overlap_score, novelty_score)}

    def _embed_all(self, texts: Sequence[str]) -> dict[str, Any]:
        unique = list(dict.fromkeys(t for t in texts if t.strip()))
        vectors = self.encoder.embed(unique)
        return dict(zip(unique, vectors))

    def _score(self, rubric: str, item: Any) -> tuple[dict[str, int], str]:
        cards = list(item.cards) or ([item.card] if item.card is not None else [])
        history = list(item.history)
        if rubric == rb.AGENT:
            emb = self._embed_all([item.reply, *(identity_text(c) for c in cards), *(t.text for t in history),
                                   " ".join(text for _, text in item.context)])
            s = self._signals(item.card, item.reply, cards, history, item.context, emb)
            scores = {"emotional_expressiveness": s["form"],
                      "empathetic_support_quality": _half_up((s["relevance_score"] + s["form"]) / 2),
                      "persona_consistency": s["persona_score"], "response_relevance": s["relevance_score"],
                      "social_contribution": s["contribution_score"]}
            return scores, _rationale([s])
        by_id = {c.id: c for c in cards}
        block = list(item.block)
        emb = self._embed_all([*(t.text for t in history + block), *(identity_text(c) for c in cards),
                               " ".join(text for _, text in item.context)])
        measured = []
        for i, t in enumerate(block):
            if t.role != "agent" or not t.text.strip() or t.persona_id not in by_id:
                continue
            measured.append(self._signals(by_id[t.persona_id], t.text, cards, history + block[:i], item.context, emb))

        def mean(key: str) -> int:
            return _half_up(sum(m[key] for m in measured) / len(measured))

        scores = {"fidelity": mean("persona_score"), "originality_specificity": mean("overlap_score"),
                  "relevance_coherence": mean("relevance_score"), "engagement_contribution": mean("form")}
        return scores, _rationale(measured)


def _rationale(measured: Sequence[dict[str, Any]]) -> str:
    """The measured values behind the scores, for people reading a judgement (at most 300 characters)."""
    def avg(key: str) -> str:
        vals = [m[key] for m in measured if m[key] is not None]
        return f"{sum(vals) / len(vals):.2f}" if vals else "n/a"

    faults = sorted({f for m in measured for f in m["faults"]})
    moves = sorted({m["moves"] for m in measured if m.get("moves")})
    text = (f"metrics over {len(measured)} turn(s): moves {', '.join(moves) or 'n/a'}, persona margin "
            f"{avg('margin')}, relevance {avg('relevance')}, overlap with earlier turns {avg('overlap')}, novelty "
            f"{avg('novelty')}, faults: {', '.join(faults) or 'none'}")
    return text[:300]
