"""Judge one item with retries, the drop rule and the cache.

An item is a :class:`JudgeItem`: the rendered first-attempt prompt (what model judges read) and the parts it was
built from (what the metrics judge measures). For a model judge, an answer that does not parse (or has a score out of
range) is re-prompted with the reason, up to ``max_retries`` times; after that the item is dropped: its verdict has
status ``unparseable`` and is counted. A backend that scores items itself (``scores_items``, the metrics judge)
answers once. Verdicts (both kinds) are cached by content hash of the prompt (plus, for a backend that scores items,
what its ``cache_parts`` names), so repeating an item never calls the backend.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from mascot.core.errors import InvalidArgument
from mascot.judge import rubric as rb
from mascot.judge.backends import JudgeBackend
from mascot.judge.cache import CachedJudgement, JudgeCache, content_hash
from mascot.judge.parse import JudgementError, parse_judgement

OK, UNPARSEABLE = "ok", "unparseable"


@dataclass(frozen=True)
class JudgeItem:
    """One thing to judge.

    Attributes:
        messages: The first-attempt chat prompt (fitted to a local judge model's window), read by model judges and
            hashed for the cache.
        history: The conversation before the reply or block, oldest first.
        context: Seed context ``(speaker, text)`` shown before the history.
        cards: The active personas (the roster); for the agent rubric they include :attr:`card`.
        card: The persona whose reply is judged (agent rubric), else None.
        reply: The judged reply (agent rubric).
        block: The judged block of turns (collective rubric).
    """

    messages: list[dict]
    history: Sequence[Any] = ()
    context: Sequence[tuple[str, str]] = ()
    cards: Sequence[Any] = ()
    card: Any = None
    reply: str = ""
    block: Sequence[Any] = ()


def agent_item(backend: Any, card: Any, roster: Sequence[Any], history: Sequence[Any], reply: str,
               context: Sequence[tuple[str, str]] = (), names: Mapping[str, str] | None = None) -> JudgeItem:
    """A :class:`JudgeItem` for the agent rubric: ``card``'s ``reply`` after ``history`` (``roster``: the active
    personas, ``card`` among them or added). Raises InvalidArgument when the prompt cannot fit a local judge."""
    messages = fit_prompt(backend, lambda h, cx: rb.agent_messages(card, h, reply, cx, names), list(history),
                          list(context))
    cards = [*roster, *([card] if all(c.id != card.id for c in roster) else [])]
    return JudgeItem(messages, tuple(history), tuple(context), tuple(cards), card=card, reply=reply)


def collective_item(backend: Any, roster: Sequence[Any], history: Sequence[Any], block: Sequence[Any],
                    context: Sequence[tuple[str, str]] = ()) -> JudgeItem:
    """A :class:`JudgeItem` for the collective rubric: ``block`` after ``history`` with the personas ``roster``.
    Raises InvalidArgument when the prompt cannot fit a local judge."""
    messages = fit_prompt(backend, lambda h, cx: rb.collective_messages(roster, h, block, cx), list(history),
                          list(context))
    return JudgeItem(messages, tuple(history), tuple(context), tuple(roster), block=tuple(block))


@dataclass(frozen=True)
class Verdict:
    """The outcome for one item.

    Attributes:
        status: ``"ok"`` or ``"unparseable"``.
        scores: Criterion key to int 1-5 (empty unless ok).
        rationale: The judge's rationale (empty unless ok).
        error: Why the last attempt was rejected (unparseable only).
        attempts: Model calls made now (0 when cached).
        cached: Answered from the cache.
        content_hash: The cache key.
    """

    status: str
    scores: dict[str, int] = field(default_factory=dict)
    rationale: str = ""
    error: str = ""
    attempts: int = 0
    cached: bool = False
    content_hash: str = ""

    @property
    def mean(self) -> float:
        """Unweighted mean of the scores (1-5), 0.0 unless ok."""
        return sum(self.scores.values()) / len(self.scores) if self.scores else 0.0


class Judge:
    """A named judge: a backend plus the retry/drop rule and the cache.

    Args:
        name: The judge's name (requests select it; part of the cache key).
        backend: Where answers come from.
        max_retries: Re-prompts after an invalid answer.
        cache: Optional persistent cache.
        metrics: Optional :class:`~mascot.core.metrics.Metrics` (judge scores and unparseable counters).
    """

    def __init__(self, name: str, backend: JudgeBackend, max_retries: int = 2, cache: JudgeCache | None = None,
                 metrics: Any = None) -> None:
        self.name, self.backend, self.max_retries, self.cache, self.metrics = name, backend, max_retries, cache, metrics
        self.version = rb.rubric_version()

    @property
    def model(self) -> str:
        """The backend's model name."""
        return self.backend.model

    async def judge(self, rubric: str, item: "JudgeItem | list[dict]") -> Verdict:
        """Score one item on ``rubric`` (``"agent"``/``"collective"``): a :class:`JudgeItem`, or for a model judge
        just its first-attempt prompt.

        Raises:
            ServiceError: from the backend (endpoint unavailable, key rejected, prompt too long).
            InvalidArgument: an item a judge that scores items cannot score (see its ``score``).
            TypeError: a bare prompt given to a judge that scores items.
        """
        scores_items = getattr(self.backend, "scores_items", False)
        if not isinstance(item, JudgeItem):
            if scores_items:
                raise TypeError(f"judge {self.name!r} scores JudgeItems (card, history, reply or block), not bare "
                                "prompts; build items with agent_item or collective_item")
            item = JudgeItem(list(item))
        messages = item.messages
        identity = self.model + (f"@{self.backend.endpoint}" if getattr(self.backend, "endpoint", "") else "")
        key = content_hash(self.name, identity, self.version, messages,
                           self.backend.cache_parts(item) if scores_items else ())
        if self.cache is not None:
            hit = await asyncio.to_thread(self.cache.get, key)
            if hit is not None:
                return Verdict(hit.status, hit.scores, hit.rationale, hit.error, 0, True, key)
        if scores_items:  # measured, deterministic: one answer, no re-prompts
            scores, rationale = await self.backend.score(rubric, item)
            verdict = Verdict(OK, scores, rationale, "", 1, False, key)
        else:
            verdict = await self._ask(rubric, messages, key)
        if self.metrics is not None:
            if verdict.status == OK:
                for k, s in verdict.scores.items():
                    self.metrics.judge_scores.labels(k).observe(s)
            else:
                self.metrics.judge_unparseable.labels(self.name).inc()
        if self.cache is not None:
            await asyncio.to_thread(self.cache.put, key, self.name, self.model, CachedJudgement(
                verdict.status, verdict.scores, verdict.rationale, verdict.error, verdict.attempts))
        return verdict

    async def _ask(self, rubric: str, messages: list[dict], key: str) -> Verdict:
        """A model judge's verdict: ask, re-prompt an unparseable answer with the reason, drop after the retries."""
        schema = rb.json_schema(rubric)
        msgs, error = messages, ""
        verdict = None
        for attempt in range(1, self.max_retries + 2):
            text = await self.backend.complete(msgs, schema, seed=attempt - 1)
            try:
                parsed = parse_judgement(text, rubric)
            except JudgementError as e:
                error = str(e)
                msgs = rb.retry_messages(messages, text, error, rubric)
                if attempt <= self.max_retries and not _fits(self.backend, msgs):
                    # the re-prompt (first prompt + the bad answer + the reason) would overflow the local window:
                    # the item is unparseable, the run goes on
                    error += "; not re-prompted: the re-prompt does not fit the judge model's context window"
                    verdict = Verdict(UNPARSEABLE, {}, "", error, attempt, False, key)
                    break
                continue
            verdict = Verdict(OK, parsed.scores, parsed.rationale, "", attempt, False, key)
            break
        if verdict is None:
            verdict = Verdict(UNPARSEABLE, {}, "", error, self.max_retries + 1, False, key)
        return verdict

    async def judge_many(self, rubric: str, items: "Sequence[JudgeItem | list[dict]]") -> list[Verdict]:
        """Score several items concurrently (the local engine batches them); results in input order."""
        return list(await asyncio.gather(*(self.judge(rubric, m) for m in items)))


def _fits(backend: Any, messages: list[dict]) -> bool:
    """Whether ``messages`` plus the answer bound fit a local backend's engine window (remote backends: True)."""
    eng = getattr(backend, "engine", None)
    if eng is None:
        return True
    return eng.count_tokens(eng.render_chat(messages)) + backend.max_tokens <= eng.max_context_tokens


def fit_prompt(backend: Any, build: Any, history: list, context: list) -> list[dict]:
    """``build(history, context)`` trimmed oldest first (context, then history) to the local engine's window.

    Backends without an ``engine`` attribute (remote endpoints) get the untrimmed prompt.

    Raises:
        InvalidArgument: the prompt does not fit even without context and history.
    """
    from mascot.core.context import fit_history

    eng = getattr(backend, "engine", None)
    if eng is None:
        return build(history, context)
    try:
        return fit_history(build, history, context, eng.render_chat, eng.count_tokens,
                           eng.max_context_tokens - backend.max_tokens, protect_last_user=False)
    except ValueError:
        raise InvalidArgument("the judge prompt does not fit the judge model's context window even without "
                              "context and history; shorten the candidate or raise engine.max_model_len") from None


def build_judges(cfg: Any, engine: Any, model_name: str, metrics: Any = None) -> dict[str, Judge]:
    """Judges from a :class:`~mascot.core.config.JudgeConfig`, sharing one cache.

    Args:
        cfg: The judge config section.
        engine: The local engine (needed when any judge is ``local``), or None.
        model_name: Name reported for local judges.
        metrics: Optional metrics.

    A metrics judge loads the MiniLM encoder here (one for all metrics judges), so a missing encoder package
    fails at start rather than at the first request.

    Raises:
        ValueError: a local judge without an engine, an openai judge without endpoint or model, or two judges
            with one name.
    """
    from mascot.judge.backends import LocalJudgeBackend, OpenAIJudgeBackend, read_api_key
    from mascot.judge.cache import JudgeCache

    cache = JudgeCache(cfg.cache_url) if cfg.cache_url else None
    judges: dict[str, Judge] = {}
    encoder = None
    for spec in cfg.judges:
        if spec.name in judges:
            raise ValueError(f"two judges are named {spec.name!r}; judge names must be unique")
        if spec.kind == "metrics":
            from mascot.judge.metrics import MetricsJudgeBackend

            backend = MetricsJudgeBackend(encoder)  # one encoder for every metrics judge
            encoder = backend.encoder
        elif spec.kind == "local":
            if engine is None:
                raise ValueError(f"judge {spec.name!r} is local but no engine runs in this process")
            backend = LocalJudgeBackend(engine, model_name + (f"+{spec.adapter}" if spec.adapter else ""),
                                        spec.adapter or None, spec.max_tokens)
        else:
            if not spec.endpoint or not spec.model:
                raise ValueError(f"judge {spec.name!r} is openai: set both endpoint and model")
            backend = OpenAIJudgeBackend(spec.model, spec.endpoint, read_api_key(spec.api_key_env, spec.api_key_file),
                                         spec.response_format, spec.max_tokens, spec.timeout_s, spec.max_concurrency)
        judges[spec.name] = Judge(spec.name, backend, cfg.max_retries, cache, metrics)
    if metrics is not None:
        from mascot.judge.rubric import CRITERIA

        metrics.declare(judges=list(judges), judge_criteria=[k for c in CRITERIA.values() for k in c])
    return judges
