"""Dialogue-quality measures that need no LLM judge: persona identifiability, relevance, redundancy and defect rates.

Every measure gives one value per dialogue (``None`` where it is undefined, e.g. no agent reply), so systems run on
the same situations and seeds can be compared pair by pair (:mod:`mascot.eval.stats`). Embeddings are the sentence
embeddings of all-MiniLM-L6-v2 (:class:`mascot.eval.automatic.EmbeddingRedundancy`, L2-normalised, so a dot product
is a cosine similarity).

Measures (``better``: which direction is good):

* ``move_compliance`` (higher): share of the dialogue's persona replies that show a required move of their card and
  no forbidden one (:mod:`mascot.core.moves`; replies whose card has no ``moves`` are left out);
  ``forbidden_move_rate`` (lower): share that show a forbidden move. Per persona, the classifier-based
  distinguishability and the opener diversity are system-level figures (:func:`mascot.eval.assemble.persona_moves`).
* ``identifiability`` (higher; a training-signal diagnostic, not independent of the metrics judge, whose persona
  criterion is the same margin): share of the dialogue's agent replies whose nearest persona card, by cosine between
  the reply's embedding and each roster card's :func:`identity_text`, is the card of the persona that spoke. Zero-shot:
  nothing is trained on replies. Chance is 1/N for N roster personas.
* ``identity_margin`` (higher): mean over replies of cos(reply, own card) − max over the other cards of
  cos(reply, card). Positive: the reply is closer to its own persona than to any other.
* ``relevance_user`` (higher): mean cosine between each agent reply and the latest user message before it.
* ``relevance_situation`` (higher): mean cosine between each agent reply and the situation text the simulated user
  was given.
* ``self_bleu`` (lower) and ``embedding_redundancy`` (lower): :mod:`mascot.eval.automatic`; ``distinct_2`` (higher).
* ``echo_rate``, ``loop_rate``, ``near_duplicate_rate``, ``empty_rate`` (lower): share of the dialogue's agent turns
  flagged by the fixed detectors of :mod:`mascot.eval.defects`.
* ``moves_per_round`` (higher): the distinct card moves of a round, mean over the dialogue's rounds. A round is the
  agent turns between two user messages; a reply's moves are the required moves of every roster card
  (:mod:`mascot.core.moves`, one detector each) that fire on it, whoever spoke, so a round where one persona validates,
  another asks and a third suggests a step counts 3, and one where three personas validate counts 1.
* ``round_redundancy`` (lower): mean pairwise MiniLM cosine between the agent turns of one round, mean over the
  dialogue's rounds of two or more turns (``embedding_redundancy`` pairs turns across the whole dialogue).
* ``early_end`` (lower): 1 when the dialogue delivered fewer agent turns than were asked for, else 0.
* ``reply_words``: mean words per agent reply, empty ones included (no direction; a length difference explains many
  others).

Safety-gate turns (the gate's fixed reply, not a persona's) count in the defect rates but not in identifiability,
relevance, Self-BLEU, redundancy, distinct-2 or reply length. Replies by a speaker outside the roster (the single
supporter of ``multiagentesc``) have no identifiability. ``early_end`` counts replies with at least one word.

Who speaks and in what tone are system-level figures (:func:`team_figures`): each persona's share of the agent turns
and their entropy in bits, the share of the most common Tone among the directives, and the share of fallback
directives, pooled over the system's dialogues, with intervals from resampling dialogues.

Identifiability depends on who speaks: a system whose director (or fixed order) gives the turns to the personas whose
cards attract most replies scores higher without sounding more distinct. :func:`identification_summary` therefore also
gives the chance agreement from the actual speaker and nearest-card shares, Cohen's kappa and the balanced accuracy
(the mean of the per-persona accuracies).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from mascot.core.guard import words
# the identity text, nearest-card identification and margin are shared with the metrics judge
from mascot.core.embedding import identify, identity_text, margin, mean_pairwise_cosine
# the moves a round is read for are shared with the director's team reward (training)
from mascot.core.moves import round_moves

if TYPE_CHECKING:  # pragma: no cover - imports for annotations only
    import numpy as np

    from mascot.core.personas import PersonaCard

#: Measure name -> ``"higher"`` / ``"lower"`` is better, or ``""`` (no direction).
MEASURES: dict[str, str] = {
    "identifiability": "higher", "identity_margin": "higher", "relevance_user": "higher",
    "relevance_situation": "higher", "self_bleu": "lower", "embedding_redundancy": "lower", "distinct_2": "higher",
    "echo_rate": "lower", "loop_rate": "lower", "near_duplicate_rate": "lower", "empty_rate": "lower",
    "early_end": "lower", "reply_words": "", "move_compliance": "higher", "forbidden_move_rate": "lower",
    "moves_per_round": "higher", "round_redundancy": "lower",
}
#: One-line definitions, copied into ``report.json`` so a reader of the file alone knows what each number is.
DEFINITIONS: dict[str, str] = {
    "identifiability": "share of agent replies whose nearest persona card (MiniLM cosine) is the speaker's own",
    "identity_margin": "cos(reply, own card) minus the best cos(reply, other card), mean over replies",
    "relevance_user": "cos(reply, latest user message before it), mean over replies",
    "relevance_situation": "cos(reply, the situation text), mean over replies",
    "self_bleu": "sentence BLEU-4 of each agent turn against the others, mean, 0-1",
    "embedding_redundancy": "mean pairwise MiniLM cosine of the agent turns",
    "distinct_2": "unique word bigrams / all word bigrams of the agent turns",
    "echo_rate": "share of agent turns sharing a word 8-gram with the persona's prompt, card or directive",
    "loop_rate": "share of agent turns with a word 4-gram 3+ times or a repeated sentence",
    "near_duplicate_rate": "share of agent turns with character 5-gram Jaccard >= 0.8 to an earlier turn",
    "empty_rate": "share of agent turns without a word",
    "early_end": "1 when fewer agent turns were delivered than asked for",
    "reply_words": "mean words per agent reply",
    "move_compliance": "share of persona replies with a required card move and no forbidden one (mascot.core.moves)",
    "forbidden_move_rate": "share of persona replies with a forbidden card move",
    "moves_per_round": "distinct card moves (required moves of any roster card) in the agent turns of a round, mean "
                       "over rounds",
    "round_redundancy": "mean pairwise MiniLM cosine of the agent turns of one round, mean over rounds of 2+ turns",
}
class MeasureContext:
    """What the measures of one run share: the roster's card embeddings, the detectors' echo sources and an
    embedding cache (a text is embedded once per run).

    Args:
        cards: The roster's persona cards (identifiability is over these; N = ``len(cards)``).
        embed: ``embed(texts) -> [len(texts), d]`` L2-normalised embeddings (e.g.
            :meth:`mascot.eval.automatic.EmbeddingRedundancy.embed`).
        echo_sources: ``{persona_id: [texts]}`` a reply must not copy 8 words of
            (:func:`mascot.eval.defects.echo_sources`).

    Raises:
        ValueError: no cards, or two cards with the same id.
    """

    def __init__(self, cards: Sequence[PersonaCard], embed: Callable[[Sequence[str]], np.ndarray],
                 echo_sources: Mapping[str, Sequence[str]] | None = None) -> None:
        if not cards:
            raise ValueError("the measures need at least one roster persona card")
        self.card_ids = [c.id for c in cards]
        self.cards = {c.id: c for c in cards}
        if len(set(self.card_ids)) != len(self.card_ids):
            raise ValueError(f"persona ids must be unique, got {self.card_ids}")
        self._embed = embed
        self._cache: dict[str, Any] = {}
        self.card_emb = self.embed([identity_text(c) for c in cards])
        self.echo_sources = {k: list(v) for k, v in (echo_sources or {}).items()}
        self.round_moves = round_moves(cards)

    @property
    def chance(self) -> float:
        """Identifiability by chance: 1/N."""
        return 1.0 / len(self.card_ids)

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """``[len(texts), d]`` embeddings, each distinct text computed once per context."""
        import numpy as np

        todo = list(dict.fromkeys(t for t in texts if t not in self._cache))
        if todo:
            for t, e in zip(todo, self._embed(todo)):
                self._cache[t] = np.asarray(e, dtype=np.float64)
        if not texts:
            return np.zeros((0, self.card_emb.shape[1]))
        return np.stack([self._cache[t] for t in texts])


def rounds(turns: Sequence[Mapping[str, Any]]) -> list[tuple[str, list[Mapping[str, Any]]]]:
    """The rounds of a transcript: ``(latest user message, agent turns)`` per maximal run of agent turns (the agent
    turns between two user messages; "" before the first user message). Runs without an agent turn are left out."""
    out: list[tuple[str, list[Mapping[str, Any]]]] = []
    user, run = "", []
    for t in turns:
        if t["role"] == "agent":
            run.append(t)
            continue
        if run:
            out.append((user, run))
        user, run = t["text"], []
    if run:
        out.append((user, run))
    return out


def round_figures(turns: Sequence[Mapping[str, Any]], mctx: MeasureContext) -> tuple[float | None, float | None]:
    """``(moves_per_round, round_redundancy)`` of one transcript (definitions: :data:`DEFINITIONS`): persona replies
    only (safety-gate turns and empty replies left out); None where no round qualifies (no reply, no card with
    moves, or no round of two replies)."""
    from mascot.core.moves import assess

    moves, redundancy = [], []
    for user, run in rounds(turns):
        texts = [t["text"] for t in run if words(t["text"]) and not t.get("safety")]
        if not texts:
            continue
        if mctx.round_moves is not None:
            moves.append(len({m for text in texts for m in assess(mctx.round_moves, text, user).required}))
        if len(texts) >= 2:
            redundancy.append(mean_pairwise_cosine(mctx.embed(texts)))
    return (sum(moves) / len(moves) if moves else None,
            sum(redundancy) / len(redundancy) if redundancy else None)


def dialogue_measures(dialogue: Mapping[str, Any], mctx: MeasureContext, agent_turns: int) -> dict[str, Any]:
    """Every measure of one dialogue.

    Args:
        dialogue: A ``dialogues.jsonl`` record: ``turns`` (dicts with ``role``, ``persona_id``, ``text``, optional
            ``safety`` and ``directive``) and ``situation``.
        mctx: The run's :class:`MeasureContext`.
        agent_turns: Agent turns the dialogue was asked for (``early_end`` compares against it).

    Returns:
        ``{"values": {measure: float | None}, "identified": [(speaker, predicted, margin)], "moves": [(speaker,
        compliant, forbidden_present, text)]}``: one value per measure of :data:`MEASURES`, one entry per reply that
        has an identifiability (for the confusion matrix and the per-persona figures), and one per persona-authored
        reply whose card has moves (for the per-persona move figures, the classifier and the openers).
    """
    from mascot.core.diversity import distinct_n
    from mascot.eval.automatic import self_bleu
    from mascot.eval.defects import is_echo, is_loop, is_near_duplicate

    turns = list(dialogue["turns"])
    agent = [t for t in turns if t["role"] == "agent"]
    # The safety gate's fixed reply is nobody's wording: left out of the text measures (it stays in the defect rates).
    texts = [t["text"] for t in agent if t["text"].strip() and not t.get("safety")]
    earlier: list[str] = []
    latest_user = ""
    flags: Counter = Counter()
    scored: list[tuple[dict, str]] = []  # (turn, latest user message) of persona-authored, non-empty replies
    for t in turns:
        text = t["text"]
        if t["role"] != "agent":
            if text.strip():
                latest_user = text
            earlier.append(text)
            continue
        d = t.get("directive") or {}
        sources = [*mctx.echo_sources.get(t.get("persona_id") or "", []), d.get("action", ""), d.get("tone", "")]
        flags["echo"] += bool(not t.get("safety") and is_echo(text, sources))
        flags["loop"] += is_loop(text)
        flags["near_duplicate"] += is_near_duplicate(text, earlier)
        flags["empty"] += not words(text)
        if words(text) and not t.get("safety"):
            scored.append((t, latest_user))
        earlier.append(text)

    persona = [t for t in agent if not t.get("safety")]
    from mascot.core.moves import assess

    moves: list[tuple[str, bool, bool, str]] = []
    for t, user in scored:
        card = mctx.cards.get(t.get("persona_id") or "")
        if card is not None and card.moves is not None:
            v = assess(card.moves, t["text"], user)
            moves.append((card.id, v.compliant, v.forbidden_present, t["text"]))

    def rate(key: str) -> float | None:
        return flags[key] / len(agent) if agent else None

    values: dict[str, Any] = {
        "self_bleu": self_bleu(texts), "distinct_2": distinct_n(texts, 2),
        "embedding_redundancy": None, "echo_rate": rate("echo"), "loop_rate": rate("loop"),
        "near_duplicate_rate": rate("near_duplicate"), "empty_rate": rate("empty"),
        "early_end": 1.0 if sum(1 for t in agent if words(t["text"])) < agent_turns else 0.0,
        "reply_words": (sum(len(words(t["text"])) for t in persona) / len(persona)) if persona else None,
        "identifiability": None, "identity_margin": None, "relevance_user": None, "relevance_situation": None,
        "move_compliance": sum(m[1] for m in moves) / len(moves) if moves else None,
        "forbidden_move_rate": sum(m[2] for m in moves) / len(moves) if moves else None,
    }
    if len(texts) >= 2:
        values["embedding_redundancy"] = mean_pairwise_cosine(mctx.embed(texts))
    values["moves_per_round"], values["round_redundancy"] = round_figures(turns, mctx)
    identified: list[tuple[str, str, float]] = []
    if scored:
        import numpy as np

        reply_emb = mctx.embed([t["text"] for t, _ in scored])
        answered = [k for k, (_, u) in enumerate(scored) if u]  # replies with a user message before them
        situation = str(dialogue.get("situation") or "")
        if answered:
            user_emb = mctx.embed([scored[k][1] for k in answered])
            values["relevance_user"] = float(np.mean(np.sum(reply_emb[answered] * user_emb, axis=1)))
        if situation.strip():
            values["relevance_situation"] = float(np.mean(reply_emb @ mctx.embed([situation])[0]))
        nearest, cos = identify(reply_emb, mctx.card_emb)
        for k, (t, _) in enumerate(scored):
            pid = t.get("persona_id") or ""
            if pid in mctx.card_ids:
                own = mctx.card_ids.index(pid)
                identified.append((pid, mctx.card_ids[nearest[k]], margin(cos[k], own)))
        if identified:
            values["identifiability"] = sum(1 for s, p, _ in identified if s == p) / len(identified)
            values["identity_margin"] = sum(m for _, _, m in identified) / len(identified)
    return {"values": values, "identified": identified, "moves": moves}


def identification_summary(identified: Sequence[tuple[str, str, float]], card_ids: Sequence[str]) -> dict[str, Any]:
    """Accuracy, per-persona figures and the confusion matrix over a system's identified replies.

    Args:
        identified: ``(speaker, predicted, margin)`` per reply (all dialogues of one system).
        card_ids: The roster ids, in matrix order.

    Returns:
        ``{"n", "accuracy", "chance", "chance_given_shares", "kappa", "balanced_accuracy", "margin",
        "per_persona": {id: {"n", "accuracy", "margin"}}, "confusion": {"labels": ids, "matrix": [[count]]}}``;
        rows are the speaker, columns the nearest card. ``accuracy`` is pooled over replies (the report's main table
        averages per-dialogue shares instead); ``chance`` is 1/N, ``chance_given_shares`` the agreement expected from
        the speaker and nearest-card shares alone, ``kappa`` Cohen's kappa against it, ``balanced_accuracy`` the mean
        over the personas that spoke. Values are ``None`` without replies (kappa also when chance is 1).
    """
    ids = list(card_ids)
    index = {p: i for i, p in enumerate(ids)}
    matrix = [[0] * len(ids) for _ in ids]
    per: dict[str, list[tuple[bool, float]]] = defaultdict(list)
    for s, p, m in identified:
        matrix[index[s]][index[p]] += 1
        per[s].append((s == p, m))

    def acc(xs: Sequence[tuple[bool, float]]) -> tuple[float | None, float | None]:
        if not xs:
            return None, None
        return round(sum(1 for ok, _ in xs if ok) / len(xs), 6), round(sum(m for _, m in xs) / len(xs), 6)

    total = [x for pid in ids for x in per[pid]]
    a, m = acc(total)
    n = len(total)
    # Chance agreement given who spoke and which cards the replies fell nearest to (Cohen 1960: p_e = sum over
    # personas of row share x column share); kappa = (p_o - p_e) / (1 - p_e).
    p_e = sum(sum(matrix[i]) * sum(r[i] for r in matrix) for i in range(len(ids))) / (n * n) if n else None
    kappa = None
    if n and p_e is not None and p_e < 1.0:
        kappa = round((sum(1 for ok, _ in total if ok) / n - p_e) / (1.0 - p_e), 6)
    spoken = [acc(per[pid])[0] for pid in ids if per[pid]]
    return {"n": n, "accuracy": a, "chance": round(1.0 / len(ids), 6) if ids else None,
            "chance_given_shares": None if p_e is None else round(p_e, 6), "kappa": kappa,
            "balanced_accuracy": round(sum(spoken) / len(spoken), 6) if spoken else None, "margin": m,
            "per_persona": {pid: dict(zip(("accuracy", "margin"), acc(per[pid])), n=len(per[pid])) for pid in ids},
            "confusion": {"labels": ids, "matrix": matrix}}


def _tone_key(tone: str) -> str:
    return " ".join(tone.lower().replace(",", " , ").split()).replace(" ,", ",").rstrip(".")


def team_figures(dialogues: Sequence[Mapping[str, Any]], card_ids: Sequence[str], seed: int = 0) -> dict[str, Any]:
    """Who speaks and in what tone over one system's dialogues: pooled figures, each with a 95% percentile-bootstrap
    interval over dialogues (:func:`mascot.eval.stats.bootstrap_pooled`).

    Agent turns are those with a persona and no safety-gate reply; directives are theirs (the Tone compared lower-cased,
    spaces normalised).

    Args:
        dialogues: The system's transcripts: ``turns`` with ``role``, ``persona_id``, optional ``safety`` and
            ``directive`` (``tone``, ``source``).
        card_ids: Roster ids: a share for each (0 when it never spoke; other speakers are added after them), and the
            entropy's maximum, log2 N.
        seed: Bootstrap seed.

    Returns:
        ``{"agent_turns", "persona_shares": {id: {"n", "share", "lo", "hi"}}, "persona_entropy_bits": {"value", "lo",
        "hi", "max"}, "directives", "tone_top": {"tone", "n", "share", "lo", "hi", "distinct"}, "fallback_share": {"n",
        "share", "lo", "hi"}}``: shares in [0, 1], entropy in [0, log2 N] bits (the shares of the N roster personas;
        log2 N when every one has the same share), ``tone_top.share`` the share of the most common Tone (resampled, the
        most common Tone of each resample), ``fallback_share`` that of fallback directives. Values are None without
        turns (or directives); ``lo``/``hi`` None with fewer than two dialogues.
    """
    import math

    import numpy as np
    from scipy.stats import entropy

    from mascot.eval.stats import bootstrap_pooled

    turns = [[t for t in d["turns"] if t["role"] == "agent" and t.get("persona_id") and not t.get("safety")]
             for d in dialogues]
    speakers = list(dict.fromkeys([*card_ids, *(t["persona_id"] for ts in turns for t in ts)]))
    spoke = np.array([[sum(t["persona_id"] == p for t in ts) for p in speakers] for ts in turns], dtype=float)
    spoke = spoke.reshape(len(turns), len(speakers))
    directives = [[t["directive"] for t in ts if (t.get("directive") or {}).get("tone")] for ts in turns]
    written: dict[str, Counter] = defaultdict(Counter)
    for ds in directives:
        for d in ds:
            written[_tone_key(d["tone"])][d["tone"].strip()] += 1
    tones = sorted(written, key=lambda k: (-sum(written[k].values()), k))
    toned = np.array([[sum(_tone_key(d["tone"]) == k for d in ds) for k in tones] for ds in directives], dtype=float)
    toned = toned.reshape(len(directives), len(tones))
    fell = [sum(d.get("source") == "fallback" for d in ds) for ds in directives]
    sources = np.array([[f, len(ds) - f] for f, ds in zip(fell, directives)], dtype=float)
    sources = sources.reshape(len(directives), 2)
    n_turns, n_dir = int(spoke.sum()), int(toned.sum())
    r = round

    def share(rows: Any, k: int, n: int) -> dict[str, Any]:
        lo, hi = bootstrap_pooled(rows, lambda s: s[..., k] / s.sum(-1), seed) if n else (None, None)
        return {"n": int(rows[:, k].sum()), "share": r(float(rows[:, k].sum()) / n, 6) if n else None, "lo": lo,
                "hi": hi}

    if n_turns:
        value = float(entropy(spoke[:, :len(card_ids)].sum(0), base=2)) if spoke[:, :len(card_ids)].sum() else 0.0
        lo, hi = bootstrap_pooled(spoke[:, :len(card_ids)], lambda s: entropy(s, base=2, axis=-1), seed)
        ent = {"value": r(value, 6), "lo": lo, "hi": hi}
    else:
        ent = {"value": None, "lo": None, "hi": None}
    top = {"tone": None, "n": 0, "share": None, "lo": None, "hi": None, "distinct": len(tones)}
    if n_dir:
        lo, hi = bootstrap_pooled(toned, lambda s: s.max(-1) / s.sum(-1), seed)
        n_top = int(toned[:, 0].sum())
        top.update(tone=written[tones[0]].most_common(1)[0][0], n=n_top, share=r(n_top / n_dir, 6), lo=lo, hi=hi)
    return {"agent_turns": n_turns,
            "persona_shares": {p: share(spoke, k, n_turns) for k, p in enumerate(speakers)},
            "persona_entropy_bits": {**ent, "max": r(math.log2(len(card_ids)), 6) if card_ids else None},
            "directives": n_dir, "tone_top": top, "fallback_share": share(sources, 0, n_dir)}
