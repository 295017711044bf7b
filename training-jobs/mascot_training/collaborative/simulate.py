"""Prefix–suffix rollouts of the director with frozen speakers and a frozen simulated user.

A *prefix* is the user's opening plus k agent turns by the serving system; a *rollout* continues it with N agent
turns (suffix), each a director directive and the named frozen speaker's reply; after every agent turn the frozen
user speaks with probability p (a seeded Bernoulli draw; user turns do not count toward N).

The director's side of a rollout is one token sequence (TRL's multi-turn layout): ``prompt_ids`` is the rendered
director chat of the first decision, and ``completion_ids`` holds each generated directive (``env_mask`` 1) and,
between directives, the tokens of the turns since (the agent's reply, a user turn; ``env_mask`` 0). The text of
``prompt_ids + completion_ids`` equals the serving director prompt of every later decision
(:func:`mascot.director.prompts.build_messages` renders the director's earlier answers as its assistant turns), so
what is trained is what is served; :meth:`RolloutRunner.extend` checks this and raises when a chat template breaks
it. Only the director's tokens carry loss: speaker and user text enters as ``env_mask`` 0.

The reward rules are pure functions in :mod:`mascot_training.common.rewards`
(:func:`~mascot_training.common.rewards.i_div`, :func:`~mascot_training.common.rewards.rollout_reward`,
:func:`~mascot_training.common.rewards.judge_group_reward`); :func:`detect_role_flip` guards the user simulator;
:class:`RolloutRunner` drives rollouts in lockstep so directives of all rollouts are generated as one batch and
speaker/user replies go to the engine together.
"""

from __future__ import annotations

import asyncio
import hashlib
import random
import re
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Sequence

from mascot.core.dialogue import HistoryTurn, directive_message, history_from_dicts, history_to_dicts
from mascot.core.engine.base import render_chat
from mascot.core.guard import SUPPORTER_PATTERNS
from mascot.core.personas import PersonaCard
from mascot.director.directive import DirectiveError, ParsedDirective, check_cap, parse_directive
from mascot.director.prompts import build_messages
from mascot.speaker.reply import ReplyOutcome, persona_reply, user_reply

# ----------------------------------------------------------------------------------------------- role flips


#: Phrases of a supporter addressing the person in trouble: a simulated user writing them has flipped role.
_SUPPORTER_PATTERNS = [
    r"\bit sounds like you(?:'re| are| feel|'ve| have)?\b",
    r"\bi(?:'m| am) (?:here|always here) (?:for|with) you\b",
    r"\byou(?:'re| are) not alone\b",
    r"\bhow (?:are|do) you feel(?:ing)?\b",
    r"\bhave you (?:tried|considered|thought about)\b",
    r"\bas (?:an? |your )?(?:ai|assistant|companion|supporter|language model)\b",
    r"\bi hear you\b",
    r"\bthat must (?:be|have been|feel) (?:so |really |very )?(?:hard|difficult|tough|painful|frustrating)\b",
    r"\bwhat (?:can|could) (?:i|we) do to help you\b",
]
_SUPPORTER_RE = re.compile("|".join(_SUPPORTER_PATTERNS), re.IGNORECASE)


def detect_role_flip(text: str, roster: Sequence[PersonaCard]) -> str:
    """Why a simulated-user turn answers as a supporter instead of as the user ("" when it does not).

    Checks, in order: the text opens with a speaker tag of an agent, the director or an assistant (``Anchor:``,
    ``The Anchor:``, ``Director:``, ``Assistant:``); it uses a supporter phrase addressed to the person
    (:data:`_SUPPORTER_PATTERNS`, e.g. "it sounds like you", "you're not alone", "have you tried", or one of the
    phrases serving refuses in a simulated user's sentence, :data:`mascot.core.guard.SUPPORTER_PATTERNS`, e.g. "I'm
    here to support", "sorry to hear that").
    """
    head = text.lstrip().split("\n", 1)[0]
    tags = {"director", "assistant", "agent", "supporter", "companion"}
    for c in roster:
        n = c.name.lower()
        tags |= {n, n[4:] if n.startswith("the ") else n, c.id.replace("_", " ")}
    m = re.match(r"^\s*\**([A-Za-z][A-Za-z _]{0,40})\**\s*:", head)
    if m and m.group(1).strip().lower() in tags:
        return f"speaker tag '{m.group(1).strip()}:'"
    s = _SUPPORTER_RE.search(text) or next(
        (m for m in (p.search(text.replace("’", "'")) for p in SUPPORTER_PATTERNS) if m), None)
    if s:
        return f"supporter phrase '{s.group(0)}'"
    return ""


# ----------------------------------------------------------------------------------------------- data


@dataclass
class Prefix:
    """The start of a rollout: the user's opening and k agent turns (user turns in between allowed).

    ``situation`` and ``emotion`` go only to the user simulator.
    """

    prefix_id: str
    situation_id: str
    situation: str
    emotion: str
    k: int
    history: list[HistoryTurn]
    context: list[tuple[str, str]] = field(default_factory=list)

    def to_dict(self) -> dict:
        """JSON-ready form (``from_dict`` inverts it)."""
        return {"prefix_id": self.prefix_id, "situation_id": self.situation_id, "situation": self.situation,
                "emotion": self.emotion, "k": self.k, "history": history_to_dicts(self.history),
                "context": [list(c) for c in self.context]}

    @classmethod
    def from_dict(cls, d: dict) -> "Prefix":
        """From :meth:`to_dict` output."""
        return cls(d["prefix_id"], d["situation_id"], d["situation"], d["emotion"], int(d["k"]),
                   history_from_dicts(d["history"]), [tuple(c) for c in d.get("context", [])])


@dataclass
class Rollout:
    """One suffix continuation of a prefix, and the director's token sequence for it.

    Attributes:
        prefix: The prefix continued.
        index: Position within its group of G rollouts.
        seed: Seed of its speaker/user sampling and Bernoulli draws.
        history: Prefix history plus suffix turns; agent turns carry their directive text.
        prompt_ids: Tokens of the first director prompt.
        completion_ids: Directive tokens and, between them, the tokens of the turns since.
        env_mask: 1 for director tokens, 0 for speaker/user/template tokens (same length as ``completion_ids``).
        directives: The raw text of every directive generated, in order.
        invalid: The parse or cap error that ended the rollout ("" when none).
        dropped: Why the episode was dropped (simulated user flipped role, a speaker reply refused by the reply
            checks; "" when kept).
        window_full: The director sequence reached the model window before N agent turns; the rollout stopped there.
    """

    prefix: Prefix
    index: int
    seed: int
    history: list[HistoryTurn] = field(default_factory=list)
    prompt_ids: list[int] = field(default_factory=list)
    completion_ids: list[int] = field(default_factory=list)
    env_mask: list[int] = field(default_factory=list)
    directives: list[str] = field(default_factory=list)
    invalid: str = ""
    dropped: str = ""
    finished: bool = False
    window_full: bool = False

    def __post_init__(self) -> None:
        if not self.history:
            self.history = list(self.prefix.history)

    @property
    def done(self) -> bool:
        """No further decision is made."""
        return self.finished or bool(self.invalid or self.dropped)

    @property
    def block(self) -> list[HistoryTurn]:
        """The suffix's turns (agent and user), oldest first."""
        return self.history[len(self.prefix.history):]

    @property
    def personas(self) -> list[str]:
        """Persona ids of the suffix's agent turns."""
        return [t.persona_id for t in self.block if t.role == "agent"]

    def record(self) -> dict:
        """JSON-ready summary (block, directives, outcome)."""
        return {"prefix_id": self.prefix.prefix_id, "index": self.index, "seed": self.seed,
                "block": history_to_dicts(self.block), "directives": list(self.directives),
                "personas": self.personas, "invalid": self.invalid, "dropped": self.dropped,
                "window_full": self.window_full}


def rollout_seed(*parts: object) -> int:
    """A stable 31-bit seed from any parts (SHA-256 of their repr)."""
    return int.from_bytes(hashlib.sha256(repr(parts).encode()).digest()[:4], "big") >> 1


# ----------------------------------------------------------------------------------------------- the director


@dataclass
class DirectorOutput:
    """One decision: ``text`` (as the director's chat shows it later: the generated tokens decoded without their
    stop token, or the serving rule's message), the parsed directive or the error, and the generated tokens
    (policy only; the last is a stop token when ``stopped``) with, under a grammar, which of them were choices."""

    text: str
    directive: ParsedDirective | None
    error: str = ""
    token_ids: list[int] = field(default_factory=list)
    stopped: bool = False
    #: Per generated token, 1 when the sampler had a choice and 0 when a grammar forced it (None = every token was
    #: free); the rollout's ``env_mask`` takes it, so a forced token carries no loss.
    choices: list[int] | None = None


class PolicyDirector:
    """Samples directives from a causal LM (the director policy under training), continuing token sequences.

    Args:
        model: A ``transformers`` causal LM (a PEFT model with the director LoRA), on CPU or GPU.
        tokenizer: Its tokenizer (pad token required).
        max_tokens: Most tokens per directive.
        temperature: Sampling temperature (> 0).
        top_p: Nucleus mass.
    """

    def __init__(self, model: Any, tokenizer: Any, *, max_tokens: int, temperature: float, top_p: float) -> None:
        self.model, self.tokenizer = model, tokenizer
        self.max_tokens, self.temperature, self.top_p = max_tokens, temperature, top_p
        stops = {tokenizer.eos_token_id}
        gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
        stops |= set(gen_eos if isinstance(gen_eos, (list, tuple)) else [gen_eos] if gen_eos is not None else [])
        self.stop_ids = sorted(i for i in stops if i is not None)
        if tokenizer.pad_token_id is None:
            raise ValueError("the director tokenizer has no pad token; set one before training")

    def generate(self, sequences: Sequence[Sequence[int]], seed: int) -> list[list[int]]:
        """Sample one directive per sequence (left-padded batch); each result ends at its first stop token.

        Returns:
            Generated token ids per sequence (a stop token last unless ``max_tokens`` was reached).
        """
        return [ids for ids, _ in self.sample(sequences, seed)]

    def sample(self, sequences: Sequence[Sequence[int]], seed: int,
               regexes: Sequence[str | None] | None = None) -> list[tuple[list[int], list[int] | None]]:
        """Sample one directive per sequence (left-padded batch), under ``regexes[i]`` when given (xgrammar token
        masks, as the serving engine decodes a constrained directive; None = free); each result ends at its first
        stop token.

        Returns:
            ``(ids, choices)`` per sequence: the generated token ids (a stop token last unless ``max_tokens`` was
            reached) and, under a grammar, 1 per token the grammar left a choice for and 0 per forced token (None
            for a free sequence).
        """
        import torch
        from transformers import LogitsProcessorList, TemperatureLogitsWarper, TopPLogitsWarper

        pad = self.tokenizer.pad_token_id
        width = max(len(s) for s in sequences)
        ids = torch.full((len(sequences), width), pad, dtype=torch.long)
        att = torch.zeros_like(ids)
        for i, s in enumerate(sequences):
            ids[i, width - len(s):] = torch.tensor(list(s), dtype=torch.long)
            att[i, width - len(s):] = 1
        device = next(self.model.parameters()).device
        grammar = None
        kw: dict[str, Any] = {"temperature": self.temperature, "top_p": self.top_p}
        if regexes is not None and any(r is not None for r in regexes):
            grammar = GrammarLogitsProcessor([None if r is None else self._compiled(r) for r in regexes], width,
                                             self._vocab_size())
            # the mask first, then temperature and nucleus over the allowed tokens only (a nucleus taken before the
            # mask could leave no allowed token)
            kw = {"temperature": 1.0, "top_p": 1.0, "logits_processor": LogitsProcessorList(
                [grammar, TemperatureLogitsWarper(self.temperature), TopPLogitsWarper(self.top_p)])}
        was_training = self.model.training
        self.model.eval()
        try:
            torch.manual_seed(seed)
            with torch.no_grad():
                out = self.model.generate(input_ids=ids.to(device), attention_mask=att.to(device), do_sample=True,
                                          top_k=0, max_new_tokens=self.max_tokens, eos_token_id=self.stop_ids,
                                          pad_token_id=pad, **kw)
        finally:
            self.model.train(was_training)
        res = []
        for i, row in enumerate(out[:, width:].tolist()):
            cut = next((j + 1 for j, t in enumerate(row) if t in self.stop_ids), len(row))
            free = grammar is None or regexes[i] is None
            res.append((row[:cut], None if free else grammar.choices[i][:cut]))
        return res

    def _vocab_size(self) -> int:
        return int(self.model.get_output_embeddings().weight.shape[0])

    def _compiled(self, regex: str) -> Any:
        """The xgrammar grammar of ``regex`` (:class:`~mascot.core.engine.transformers.GrammarCache`, as the serving
        engine compiles it; the stop tokens end it)."""
        from mascot.core.engine.transformers import GrammarCache

        if getattr(self, "_grammars", None) is None:
            self._grammars = GrammarCache(self.tokenizer, self._vocab_size(), self.stop_ids)
        return self._grammars.get(regex=regex)


class GrammarLogitsProcessor:
    """A ``transformers`` logits processor that masks each row to the tokens its grammar allows next (xgrammar
    ``GrammarMatcher``, as the serving engine's constrained decoding) and records, per step and row, whether more
    than one token was allowed.

    Args:
        grammars: A compiled xgrammar grammar per batch row (None = the row is free).
        prompt_width: Columns of the (left-padded) prompt: later columns are generated tokens the matchers accept.
        vocab_size: Columns of the logits.
    """

    def __init__(self, grammars: Sequence[Any], prompt_width: int, vocab_size: int) -> None:
        import xgrammar as xgr

        self.matchers = [None if g is None else xgr.GrammarMatcher(g) for g in grammars]
        self.width, self.vocab_size = prompt_width, vocab_size
        #: Per row, per generated token: 1 = a choice among several allowed tokens, 0 = forced.
        self.choices: list[list[int]] = [[] for _ in grammars]

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        """Accept each row's last token and mask ``scores`` (batch × vocab) to what the grammar allows next."""
        import torch
        import xgrammar as xgr

        if input_ids.shape[1] > self.width:
            for m, tok in zip(self.matchers, input_ids[:, -1].tolist()):
                if m is not None and not m.is_terminated():
                    m.accept_token(tok)
        live = [i for i, m in enumerate(self.matchers) if m is not None and not m.is_terminated()]
        if live:
            bitmask = xgr.allocate_token_bitmask(len(self.matchers), self.vocab_size)
            for i in live:
                self.matchers[i].fill_next_token_bitmask(bitmask, i)
            xgr.apply_token_bitmask_inplace(scores, bitmask.to(scores.device), indices=live)
        allowed = torch.isfinite(scores).sum(-1).tolist()
        for i, n in enumerate(allowed):
            self.choices[i].append(1 if n > 1 else 0)
        return scores


# ----------------------------------------------------------------------------------------------- the runner


#: The phrase of a ``Rollout.dropped`` reason that marks a speaker refused by the reply checks (the rollouts stage
#: counts those drops apart from role flips).
REFUSED = "refused by the reply checks"


@dataclass
class RolloutSettings:
    """What a :class:`RolloutRunner` needs from the run config (``phase2``, ``speakers``, ``user``, ``director``)."""

    suffix_agent_turns: int
    user_speak_prob: float
    max_consecutive_turns: int
    speaker_max_tokens: int = 96
    speaker_temperature: float = 0.7
    speaker_top_p: float = 0.95
    user_max_tokens: int = 64
    user_temperature: float = 0.8
    user_top_p: float = 0.95
    personality: str = ""
    #: Most tokens of a director sequence (the model window); a rollout that would pass it with one more directive
    #: of ``director_max_tokens`` stops early (``window_full``) rather than train on a prompt serving would trim.
    max_sequence_tokens: int = 1 << 30
    director_max_tokens: int = 64
    #: Sampling penalties of the frozen speakers and user (serving's ``speaker`` section: the user simulator decodes
    #: with the speakers' settings there too).
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    #: Reply checks on the frozen speakers and user (:class:`mascot.core.guard.GuardSettings`, serving's ``guard``
    #: section); None = off, the replies are taken as generated. On, a reply is what serving would show: a failing
    #: first sentence is regenerated (``retry``), a later one cuts the reply, an unfinished tail after the token
    #: budget is dropped; a speaker reply refused on every attempt drops the episode, a refused user reply is silence.
    guard: Any = None
    #: Regeneration of a refused reply (:class:`mascot.speaker.reply.RetryPolicy`); None = serving's defaults.
    retry: Any = None
    #: The serving director's rules (:class:`mascot.core.config.DirectorConfig`) for the policy's decisions: each
    #: directive is sampled under serving's grammar and must pass serving's checks (rest, cap, content), as a served
    #: first attempt. None = sampled free and only parsed and capped.
    director_rules: Any = None


DecideFn = Callable[[list[Rollout], int], Awaitable[list[DirectorOutput]]]


class RolloutRunner:
    """Runs rollouts in lockstep: one batch of directives, then every speaker reply, then every user draw.

    Args:
        engine: An engine with the persona adapters loaded (speakers and user simulator; frozen).
        tokenizer: The director's tokenizer (renders the director chat; builds token sequences).
        roster: Active personas.
        settings: :class:`RolloutSettings`.
        adapters: ``{persona_id: engine adapter name}``; a persona without one speaks with the base model.
    """

    def __init__(self, engine: Any, tokenizer: Any, roster: Sequence[PersonaCard], settings: RolloutSettings,
                 adapters: dict[str, str] | None = None) -> None:
        self.engine, self.tokenizer, self.roster, self.s = engine, tokenizer, list(roster), settings
        self.adapters = dict(adapters or {})
        self.cards = {c.id: c for c in roster}
        self.dropped_role_flips = 0
        #: Episodes dropped because a speaker's reply was refused on every attempt (reply checks on).
        self.dropped_refused = 0
        #: Generations per delivered speaker reply: attempts summed, replies delivered.
        self.speaker_attempts = self.speaker_replies = 0

    # -- director chat ---------------------------------------------------------------------------------------
    def director_text(self, r: Rollout) -> str:
        """The serving director prompt of ``r``'s next decision, rendered (generation prompt included)."""
        msgs = build_messages(self.roster, r.history, r.prefix.context, self.s.max_consecutive_turns)
        return render_chat(self.tokenizer, msgs)  # the serving renderer (control tokens neutralised)

    def _encode(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def _decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def start(self, r: Rollout) -> None:
        """Set ``r.prompt_ids`` to the first decision's prompt."""
        r.prompt_ids = self._encode(self.director_text(r))

    def extend(self, r: Rollout) -> None:
        """Append the tokens between the last directive and the next decision's generation prompt (env_mask 0).

        Raises:
            RuntimeError: the serving prompt of the next decision does not extend the sequence so far (a chat
                template that rewrites earlier assistant turns, e.g. one that strips thinking text).
        """
        target = self.director_text(r)
        current = self._decode(r.prompt_ids + r.completion_ids)
        if not target.startswith(current):
            raise RuntimeError("the director's chat template renders earlier directives differently from the text "
                               "generated (it is not prefix-stable); use a template that keeps assistant turns "
                               "verbatim, e.g. render Qwen3 with thinking off, so rollouts train what is served")
        extra = self._encode(target[len(current):])
        r.completion_ids += extra
        r.env_mask += [0] * len(extra)

    # -- turns -----------------------------------------------------------------------------------------------
    async def _collect(self, gen: Any) -> ReplyOutcome:
        out = None
        async for item in gen:
            if isinstance(item, ReplyOutcome):
                out = item
        assert out is not None
        return out

    async def speak(self, r: Rollout, d: ParsedDirective, directive_text: str, step: int) -> None:
        """The named frozen speaker answers the directive; the turn (with its directive text) joins the history."""
        card = self.cards[d.persona_id]
        out = await self._collect(persona_reply(
            self.engine, card, self.roster, r.history, r.prefix.context, d.action, d.tone,
            max_tokens=self.s.speaker_max_tokens, temperature=self.s.speaker_temperature, top_p=self.s.speaker_top_p,
            seed=rollout_seed(r.seed, step, "speaker"), adapter=self.adapters.get(card.id), **self._checks()))
        if out.rejected or not out.text.strip():
            # serving would ask the director for another persona: what follows is not this directive's consequence
            reasons = ", ".join(sorted({x["reason"] for x in out.rejections})) or "empty"
            r.dropped = f"{card.name}'s reply was {REFUSED} on every attempt ({reasons})"
            self.dropped_refused += 1
            return
        self.speaker_attempts += out.attempts
        self.speaker_replies += 1
        r.history.append(HistoryTurn("agent", out.text, card.id, directive_text))

    async def maybe_user(self, r: Rollout, step: int) -> None:
        """With probability p (seeded per rollout and step) the frozen user speaks; a role flip drops the episode."""
        if r.dropped or random.Random(rollout_seed(r.seed, step, "bernoulli")).random() >= self.s.user_speak_prob:
            return
        out = await self._collect(user_reply(
            self.engine, r.prefix.situation, r.prefix.emotion, self._personality(), self.roster, r.history,
            r.prefix.context, max_tokens=self.s.user_max_tokens, temperature=self.s.user_temperature,
            top_p=self.s.user_top_p, seed=rollout_seed(r.seed, step, "user"), **self._checks()))
        if not out.text.strip():
            return
        why = detect_role_flip(out.text, self.roster)
        if why:
            r.dropped = f"simulated user flipped role: {why}"
            self.dropped_role_flips += 1
            return
        r.history.append(HistoryTurn("user", out.text))

    def _checks(self) -> dict:
        from mascot.core.guard import GuardSettings
        from mascot.speaker.reply import RetryPolicy

        g = self.s.guard if self.s.guard is not None else GuardSettings(enabled=False)
        policy = self.s.retry if self.s.retry is not None else RetryPolicy()
        if not g.enabled:
            policy = RetryPolicy(max_attempts=1)
        return {"guard": g, "policy": policy, "repetition_penalty": self.s.repetition_penalty,
                "frequency_penalty": self.s.frequency_penalty}

    def _personality(self) -> str:
        from mascot.core.personas.personality import personality_text

        return personality_text(mbti=self.s.personality) if self.s.personality else ""

    # -- the loop --------------------------------------------------------------------------------------------
    async def run(self, rollouts: list[Rollout], decide: DecideFn, turns: int | None = None,
                  sequences: bool = True) -> list[Rollout]:
        """Advance every rollout by ``turns`` agent turns (default N = ``suffix_agent_turns``), in lockstep.

        Args:
            rollouts: Fresh rollouts (history = their prefix's).
            decide: ``await decide(active_rollouts, step) -> [DirectorOutput]`` (one per active rollout).
            turns: Agent turns to add.
            sequences: Keep the director token sequences (policy rollouts); False for serving-director rollouts.

        Returns:
            ``rollouts``, each finished, invalid or dropped.
        """
        n_turns = self.s.suffix_agent_turns if turns is None else turns
        if sequences:
            for r in rollouts:
                self.start(r)
        for step in range(n_turns):
            if sequences:
                for r in rollouts:
                    if not r.done and (len(r.prompt_ids) + len(r.completion_ids) + self.s.director_max_tokens
                                       > self.s.max_sequence_tokens):
                        r.finished = r.window_full = True
            active = [r for r in rollouts if not r.done]
            if not active:
                break
            outs = await decide(active, step)
            speaking = []
            for r, o in zip(active, outs):
                r.directives.append(o.text)
                if sequences:
                    r.completion_ids += o.token_ids
                    r.env_mask += o.choices if o.choices is not None else [1] * len(o.token_ids)
                d = o.directive
                if d is not None:
                    try:
                        check_cap(d.persona_id, r.history, self.s.max_consecutive_turns)
                    except DirectiveError as e:
                        d, o.error = None, str(e)
                if d is None:
                    r.invalid = o.error or "invalid directive"
                    continue
                speaking.append((r, d, o))
            await asyncio.gather(*(self.speak(r, d, o.text, step) for r, d, o in speaking))
            await asyncio.gather(*(self.maybe_user(r, step) for r, _, _ in speaking))
            for r, _, _ in speaking:
                if step + 1 == n_turns:
                    r.finished = True
                elif sequences and not r.done:
                    self.extend(r)
        for r in rollouts:
            r.finished = True
        return rollouts

    def parse_generated(self, ids: Sequence[int], stop_ids: Sequence[int]) -> DirectorOutput:
        """A generated directive: ``text`` is its decoded tokens without the final stop token (what the director's
        chat shows later), parsed against the roster (``directive`` None and ``error`` set when invalid)."""
        stopped = bool(ids) and ids[-1] in stop_ids
        text = self._decode(ids[:-1] if stopped else ids)
        try:
            return DirectorOutput(text, parse_directive(text, self.roster), "", list(ids), stopped)
        except DirectiveError as e:
            return DirectorOutput(text, None, str(e), list(ids), stopped)

    # -- directors -------------------------------------------------------------------------------------------
    def policy_decisions(self, director: PolicyDirector, active: Sequence[Rollout], seed: int,
                         agents: Sequence[Any] | None = None) -> list[DirectorOutput]:
        """One decision of ``director`` per rollout, continuing its director sequence. With
        ``settings.director_rules`` each is sampled under serving's grammar for that turn
        (:func:`mascot.director.decide.decision_regex`: the personas it may pick, fresh verbs, their tone words)
        and checked as serving checks a first attempt (:func:`mascot.director.decide.check_decision`); a directive
        breaking a rule is invalid (serving would retry it). Without rules it is sampled free, parsed and capped
        later by :meth:`run`.

        ``agents``: one persona card per rollout whose ``Agent:`` the grammar fixes (the persona-balanced warm
        start's draws); it must be choosable there, and the checks are serving's all the same.

        Raises:
            ValueError: ``agents`` without serving's rules, or not one per rollout.
        """
        from mascot.director.decide import check_decision, choosable_personas, decision_regex

        rules = self.s.director_rules
        seqs = [r.prompt_ids + r.completion_ids for r in active]
        if rules is None or not rules.constrained:
            if agents is not None:
                raise ValueError("fixing the Agent of a decision needs serving's grammar: set director.sampling: "
                                 "serving")
            return [self.parse_generated(g, director.stop_ids) for g in director.generate(seqs, seed)]
        if agents is not None and len(agents) != len(active):
            raise ValueError(f"{len(agents)} agents for {len(active)} rollouts")
        picks = [choosable_personas(self.roster, r.history, rules) for r in active]
        regexes = [decision_regex(self.roster, choosable if agents is None else [agents[i]], r.history, rules)
                   for i, (r, (_, choosable)) in enumerate(zip(active, picks))]
        outs = []
        for r, (recent, choosable), (ids, choices) in zip(active, picks, director.sample(seqs, seed, regexes)):
            o = self.parse_generated(ids, director.stop_ids)
            o.choices = choices
            if o.directive is not None:
                try:
                    check_decision(o.directive, self.roster, recent, choosable, r.history, rules,
                                   [c.name for c in self.roster], r.prefix.context)
                except DirectiveError as e:
                    o.directive, o.error = None, str(e)
            outs.append(o)
        return outs

    def policy_decider(self, director: PolicyDirector, seed: int) -> DecideFn:
        """A :data:`DecideFn` sampling from ``director`` (:meth:`policy_decisions`: under serving's rules when the
        settings carry them, else free)."""

        async def decide(active: list[Rollout], step: int) -> list[DirectorOutput]:
            return self.policy_decisions(director, active, rollout_seed(seed, step))

        return decide

    def serving_decider(self, director_cfg: Any, adapter: str | None = None) -> DecideFn:
        """A :data:`DecideFn` calling the serving director (:func:`mascot.director.decide.decide`: constrained
        when the engine supports it, retries, fallback) on the engine: prefixes and group-RM blocks."""
        from mascot.director.decide import decide as serve_decide

        async def decide(active: list[Rollout], step: int) -> list[DirectorOutput]:
            decisions = await asyncio.gather(*(serve_decide(
                self.engine, self.roster, r.history, r.prefix.context, director_cfg, adapter=adapter,
                seed=rollout_seed(r.seed, step, "director")) for r in active))
            outs = []
            for dec in decisions:
                d = dec.directive
                text = directive_message(self.cards[d.persona_id].name, d.action, d.tone, dec.source, dec.raw)
                outs.append(DirectorOutput(text, d))
            return outs

        return decide
