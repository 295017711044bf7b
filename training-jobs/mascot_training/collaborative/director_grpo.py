"""Stage ``director_grpo``: GRPO of the director's LoRA on prefix–suffix rollouts.

TRL 1.16 ``GRPOTrainer`` with a ``rollout_func``: the dataset's ``prompt`` column holds prefix ids (TRL repeats each
row G = ``phase2.num_generations`` times); the rollout function runs one rollout per row with the director being
trained (:class:`~mascot_training.collaborative.simulate.PolicyDirector` on ``trainer.model``, sampled under
serving's grammar and rules with ``director.sampling: serving``, else free), the frozen persona adapters and the
frozen user simulator on an engine living in a background event loop, and returns each rollout's director token
sequence: ``prompt_ids``, ``completion_ids`` and ``env_mask`` (1 on director tokens the sampler chose, 0 on tokens a
grammar forced and on speaker, user and template tokens; TRL multiplies it into the loss mask). The reward function
computes R = R_group + η·I_div (:func:`~mascot_training.common.rewards.rollout_reward`); TRL normalises it within the
G rollouts of a prefix (``scale_rewards="group"``) and applies the advantage to every director token of the
rollout.

R_group: ``rm`` = ẑ of the group RM (``OUT/group_rm/model``) on
:func:`mascot.core.formatting.group_reward_model_text`; ``judge`` = (s − 1)/4 of the judge's mean collective score;
``team`` = the measured collective criteria of the block (:func:`team_group_reward`: complementary card moves,
relevance to the user, no redundancy). I_div follows ``phase2.diversity`` (by default +1 when the suffix brings in a
persona the prefix did not hear, else −1).
A dropped episode (role flip, or a speaker reply refused on every attempt), a failed or timed-out group reward gets
reward None: TRL turns it into advantage 0 and it is counted (``mascot_reward_failures_total{reason}``).
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
import math
import os
import shutil
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable, Sequence

from mascot.core.files import atomic_write_text
from mascot_training.collaborative.config import CollaborativeConfig, Phase2Config
from mascot_training.collaborative.simulate import (
    DecideFn,
    PolicyDirector,
    Prefix,
    Rollout,
    RolloutRunner,
    rollout_seed,
)
from mascot_training.common import manifest as mf
from mascot_training.common.progress import fmt_value, report, trainer_progress, write_curves
from mascot_training.common.rewards import i_div, rollout_reward, usage_balance

log = logging.getLogger(__name__)
STAGE = "director_grpo"
ADAPTER_SUBDIR = "adapter"
#: ``group_reward_fn([(prefix, block), ...]) -> [R_group | None, ...]``.
GroupRewardFn = Callable[[Sequence[tuple[Prefix, list]]], Sequence[float | None]]
#: ``decider_factory(trainer, step_seed) -> DecideFn``: how directives are produced (default: the policy).
DeciderFactory = Callable[[Any, int], DecideFn]


class LoopThread:
    """An asyncio event loop in a daemon thread: the engine lives here while TRL drives training synchronously."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True, name="rollout-loop")
        self.thread.start()

    def call(self, coro: Any, timeout: float | None = None) -> Any:
        """Run ``coro`` on the loop and wait for its result (re-raises its exception; TimeoutError after
        ``timeout`` seconds)."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        """Stop the loop and join its thread."""
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)


# --------------------------------------------------------------------------------------------- group reward


def rm_group_reward(scorer: Any, cards: list) -> GroupRewardFn:
    """R_group = ẑ of a group reward model (:class:`mascot.reward.scorer.RewardScorer`, μ and σ from its metadata);
    None for a block that does not fit the reward model's window even without the prefix (masked and counted)."""

    def fn(items: Sequence[tuple[Prefix, list]]) -> list[float | None]:
        texts: list[str | None] = []
        for prefix, block in items:
            try:
                texts.append(scorer.build_group_inputs(cards, prefix.history, [block], prefix.context)[0][0])
            except ValueError:
                texts.append(None)
        raw = iter(scorer.score_texts([t for t in texts if t is not None]))
        return [None if t is None else scorer.standardize(next(raw)) for t in texts]

    return fn


def judge_group_reward_fn(judges: list, cards: list, loop: LoopThread, timeout_s: float) -> GroupRewardFn:
    """R_group = (s − 1)/4 of the judges' mean collective score (None when every answer was unparseable)."""
    from mascot_training.collaborative.group_rm import judge_blocks
    from mascot_training.common.rewards import judge_group_reward

    def fn(items: Sequence[tuple[Prefix, list]]) -> list[float | None]:
        means, _ = loop.call(judge_blocks(judges, cards, list(items)), timeout=timeout_s)
        return [judge_group_reward(m) if m is not None else None for m in means]

    return fn


def team_group_reward(cards: list, embed: Callable[[Sequence[str]], Any], *, w_moves: float = 1.0,
                      w_relevance: float = 0.5, w_redundancy: float = 0.5,
                      redundancy_floor: float = 0.5) -> GroupRewardFn:
    """R_group = the team reward of each block (:func:`mascot_training.common.rewards.team_reward` of
    :func:`~mascot_training.common.rewards.team_terms`: the share of agent turns adding a card move of the roster,
    their relevance to the user, one minus their redundancy above ``redundancy_floor``; weighted mean in [0, 1]); None
    for a block whose weighted terms have no value (masked and counted). The texts of a batch are embedded in one
    ``embed`` call.

    Args:
        cards: The roster's persona cards (their required moves are read, :func:`mascot.core.moves.round_moves`).
        embed: ``embed(texts) -> [len(texts), d]`` L2-normalised sentence embeddings (the bundled MiniLM:
            :meth:`mascot.core.embedding.SentenceEncoder.embed`).
        w_moves, w_relevance, w_redundancy, redundancy_floor: ``phase2.group_reward.team``'s settings.

    Raises:
        ValueError: a weight outside [0, 1] or a floor outside [0, 1) (when called).
    """
    import numpy as np

    from mascot.core.moves import round_moves
    from mascot_training.common.rewards import team_reward, team_terms, team_texts

    moves = round_moves(cards)

    def fn(items: Sequence[tuple[Prefix, list]]) -> list[float | None]:
        texts = list(dict.fromkeys(t for prefix, block in items for t in team_texts(prefix.history, block)))
        vectors = dict(zip(texts, np.asarray(embed(texts)))) if texts else {}

        def lookup(ts: Sequence[str]) -> Any:
            return np.stack([vectors[t] for t in ts])

        return [team_reward(team_terms(prefix.history, block, moves, lookup), w_moves, w_relevance, w_redundancy,
                            redundancy_floor) for prefix, block in items]

    return fn


# --------------------------------------------------------------------------------------------- TRL hooks


class RolloutStats:
    """What the rollouts of a run looked like: R_group and I_div of scored rollouts, outcomes, choices."""

    def __init__(self) -> None:
        self.r_group: list[float] = []
        self.i_div: list[int] = []
        #: The usage-balance term B of each scored rollout (0.0 when ``phase2.balance`` is 0).
        self.balance: list[float] = []
        self.rewards: list[float] = []
        self.outcomes: collections.Counter = collections.Counter()
        self.failures: collections.Counter = collections.Counter()
        #: Every scored rollout: its record (prefix, block, directives, outcome) with ``step``, ``reward`` (None =
        #: masked) and ``r_group``, in the order scored.
        self.records: list[dict] = []

    def summary(self) -> dict:
        """Means and counts for the manifest (None for a mean over nothing)."""
        def mean(xs: list) -> float | None:
            return round(statistics.fmean(xs), 6) if xs else None
        return {"group_reward_mean": mean(self.r_group), "i_div_mean": mean(self.i_div),
                "balance_mean": mean(self.balance), "reward_mean": mean(self.rewards), "rollouts": dict(self.outcomes),
                "reward_failures": dict(self.failures)}


class VllmDirector:
    """Samples directives on TRL's colocated vLLM engine (``trainer.vllm_generation.llm``, the policy's weights as
    TRL last synced them), with :class:`~mascot_training.collaborative.simulate.PolicyDirector`'s interface and
    sampling: one directive per sequence, temperature / top-p, no top-k, ending at the first stop token.

    Args:
        llm: A ``vllm.LLM``: in training TRL's colocated engine (CUDA only); any engine of the policy's base.
        stop_ids: Token ids that end a directive (the policy's EOS ids, as :class:`PolicyDirector` finds them).
        max_tokens: Most tokens per directive.
        temperature: Sampling temperature (> 0).
        top_p: Nucleus mass.
    """

    def __init__(self, llm: Any, stop_ids: Sequence[int], *, max_tokens: int, temperature: float,
                 top_p: float) -> None:
        self.llm, self.stop_ids = llm, sorted(stop_ids)
        self.max_tokens, self.temperature, self.top_p = max_tokens, temperature, top_p

    def generate(self, sequences: Sequence[Sequence[int]], seed: int) -> list[list[int]]:
        """One sampled directive per sequence (request ``i`` seeded with ``rollout_seed(seed, i)``).

        Returns:
            Generated token ids per sequence (a stop token last unless ``max_tokens`` was reached).
        """
        from vllm import SamplingParams

        params = [SamplingParams(n=1, temperature=self.temperature, top_p=self.top_p, max_tokens=self.max_tokens,
                                 stop_token_ids=list(self.stop_ids), seed=rollout_seed(seed, i))
                  for i in range(len(sequences))]
        outs = self.llm.generate([{"prompt_token_ids": list(s)} for s in sequences], sampling_params=params,
                                 use_tqdm=False)
        res = []
        for o in outs:
            c = o.outputs[0]
            ids = list(c.token_ids)
            cut = next((j + 1 for j, t in enumerate(ids) if t in self.stop_ids), None)
            if cut is not None:
                ids = ids[:cut]
            elif c.finish_reason == "stop" and isinstance(c.stop_reason, int):
                ids.append(c.stop_reason)  # a build that leaves the stop token out of token_ids
            res.append(ids)
        return res


def policy_decider_factory(runner: RolloutRunner, cfg: CollaborativeConfig, vllm: bool = True) -> DeciderFactory:
    """The default :data:`DeciderFactory`: directives sampled from the director being trained (``trainer.model``,
    or TRL's colocated vLLM copy of it when the trainer uses vLLM and ``vllm`` is True; TRL syncs that copy only
    inside its own generation step, so measurements outside it pass False), with ``cfg.director``'s sampling."""
    d = cfg.director

    def factory(trainer: Any, seed: int) -> DecideFn:
        model = trainer.accelerator.unwrap_model(trainer.model)
        director = PolicyDirector(model, runner.tokenizer, max_tokens=d.max_tokens,
                                  temperature=d.decoding.temperature, top_p=d.decoding.top_p)
        if vllm and getattr(trainer, "use_vllm", False):  # TRL synced the policy's weights into vLLM before this
            director = VllmDirector(trainer.vllm_generation.llm, director.stop_ids, max_tokens=d.max_tokens,
                                    temperature=d.decoding.temperature, top_p=d.decoding.top_p)
        return runner.policy_decider(director, seed)

    return factory


def make_rollout_func(runner: RolloutRunner, loop: LoopThread, prefixes: dict[str, Prefix], cfg: CollaborativeConfig,
                      decider_factory: DeciderFactory | None = None) -> Callable:
    """TRL ``rollout_func(prompts, trainer) -> {"prompt_ids", "completion_ids", "logprobs", "env_mask", "rollout"}``.

    ``prompts`` are prefix ids (each repeated G times by TRL's sampler); one rollout per entry, seeded by the
    run seed, the global step and the entry's position. ``logprobs`` is None (no importance-sampling correction:
    generation and training use the same weights, or, with ``director_grpo.generation.backend: vllm``, vLLM's copy
    of them, which TRL syncs before every rollout batch; :class:`VllmDirector` samples the directives there).
    """
    factory = decider_factory or policy_decider_factory(runner, cfg)

    def rollout_func(prompts: list, trainer: Any) -> dict:
        step = trainer.state.global_step
        seed = rollout_seed(cfg.director_grpo.seed, step)
        rollouts = []
        for i, p in enumerate(prompts):
            pid = p if isinstance(p, str) else str(p)
            if pid not in prefixes:
                raise KeyError(f"prompt {pid!r} is not a prefix id of this run")
            rollouts.append(Rollout(prefixes[pid], i % cfg.phase2.num_generations, rollout_seed(seed, i)))
        loop.call(runner.run(rollouts, factory(trainer, seed)))
        for r in rollouts:  # a prefix already too long for one directive: one masked token, reward None
            if not r.completion_ids:
                r.completion_ids, r.env_mask = [runner.tokenizer.eos_token_id], [0]
        return {"prompt_ids": [r.prompt_ids for r in rollouts], "completion_ids": [r.completion_ids for r in rollouts],
                "logprobs": None, "env_mask": [r.env_mask for r in rollouts],
                "rollout": [r.record() for r in rollouts]}

    return rollout_func


def make_reward_func(prefixes: dict[str, Prefix], group_reward_fn: GroupRewardFn, p2: Phase2Config,
                     timeout_s: float, stats: RolloutStats, metrics: Any = None,
                     roster: Sequence[str] = ()) -> Callable:
    """TRL reward function ``(prompts, completions, rollout, **kw) -> [R | None]``.

    Invalid rollouts get ``phase2.invalid_reward``; dropped ones None; the rest R_group + η·I_div (+ β·B with
    ``phase2.balance`` β > 0), with R_group from ``group_reward_fn`` in one call for the batch and I_div of
    ``phase2.diversity`` (the prefix's agent turns are what was heard before the suffix). B
    (:func:`~mascot_training.common.rewards.usage_balance`) reads the personas of the last ``phase2.balance_window``
    agent turns of earlier batches' valid rollouts (one state per reward function; every rollout of a batch is
    scored against the same counts, then the batch's turns are added). A None, non-finite or timed-out R_group masks
    the rollout (None) and is counted in ``stats.failures`` and ``metrics.reward_failures``.

    Args:
        roster: Persona ids of the roster (K of B); needed when ``phase2.balance`` > 0.

    Raises:
        ValueError: ``group_reward_fn`` returned a different number of values than it was given; ``phase2.balance``
            > 0 without a ``roster``.
    """
    from mascot.core.dialogue import history_from_dicts
    from mascot_training.common.grpo import call_with_timeout

    def fail(reason: str, n: int = 1) -> None:
        stats.failures[reason] += n
        if metrics is not None:
            metrics.reward_failures.labels(reason).inc(n)

    if p2.balance > 0 and not roster:
        raise ValueError("phase2.balance needs the roster's persona ids")
    recent: collections.deque = collections.deque(maxlen=p2.balance_window)

    def director_reward(prompts: list, completions: list, rollout: list[dict], **kw: object) -> list[float | None]:
        scored = [i for i, r in enumerate(rollout) if not r["invalid"] and not r["dropped"] and r["personas"]]
        counts = collections.Counter(recent)
        items = [(prefixes[rollout[i]["prefix_id"]], history_from_dicts(rollout[i]["block"])) for i in scored]
        groups: dict[int, float | None] = {}
        if items:
            values = call_with_timeout(group_reward_fn, items, timeout_s)
            if values is None:
                log.warning("group reward did not answer within %.1f s; %d rollouts masked", timeout_s, len(items))
                fail("timeout", len(items))
                values = [None] * len(items)
            elif len(values) != len(items):
                raise ValueError(f"group reward returned {len(values)} values for {len(items)} rollouts")
            for i, v in zip(scored, values):
                if v is None:
                    fail("none")
                elif not math.isfinite(float(v)):
                    fail("nan")
                    v = None
                groups[i] = None if v is None else float(v)
        out: list[float | None] = []
        step = getattr(kw.get("trainer_state"), "global_step", None)
        for i, r in enumerate(rollout):
            kind = "dropped" if r["dropped"] else "invalid" if r["invalid"] else \
                "window_full" if r.get("window_full") else "complete"
            stats.outcomes[kind] += 1
            rg = groups.get(i)
            if kind == "window_full" and not r["personas"]:
                fail("window_full")
                out.append(None)
                continue
            heard = [t.persona_id for t in prefixes[r["prefix_id"]].history if t.role == "agent"]
            balance = usage_balance(r["personas"], counts, roster) if p2.balance > 0 else 0.0
            reward = rollout_reward(invalid=bool(r["invalid"]), dropped=bool(r["dropped"]), r_group=rg,
                                    personas=r["personas"], eta=p2.eta, min_distinct=p2.min_distinct,
                                    invalid_reward=p2.invalid_reward, diversity=p2.diversity, heard=heard,
                                    beta=p2.balance, balance=balance)
            if kind in ("complete", "window_full") and rg is not None:
                stats.r_group.append(rg)
                stats.i_div.append(i_div(r["personas"], p2.min_distinct, mode=p2.diversity, heard=heard))
                stats.balance.append(balance)
            if reward is not None:
                stats.rewards.append(reward)
            out.append(reward)
            stats.records.append({"step": step, **r, "outcome": kind,
                                  "r_group": rg, "reward": reward})
        recent.extend(p for i in groups for p in rollout[i]["personas"])  # this batch's valid turns, for the next
        return out

    return director_reward


# --------------------------------------------------------------------------------------------- measurement


def persona_distribution(runner: RolloutRunner, director: PolicyDirector, prefixes: Sequence[Prefix], samples: int,
                         seed: int) -> dict[str, float]:
    """Shares of the director's first decision over ``prefixes`` × ``samples`` draws, sampled as in training (one
    attempt; :meth:`RolloutRunner.policy_decisions`: under serving's grammar and checks when the runner's settings
    carry the serving director's rules, else free and capped): ``{persona_id: share, ..., "invalid": share}``; shares
    sum to 1 (persona ids in roster order, then invalid)."""
    from mascot.director.directive import DirectiveError, check_cap

    firsts = []
    for p in prefixes:
        r = Rollout(p, 0, 0)
        runner.start(r)
        firsts += [r] * samples
    counts: collections.Counter = collections.Counter()
    for k in range(0, len(firsts), 16):
        batch = firsts[k:k + 16]
        outs = runner.policy_decisions(director, batch, rollout_seed(seed, "distribution", k))
        for o, r in zip(outs, batch):
            d = o.directive
            try:
                if d is not None:
                    check_cap(d.persona_id, r.history, runner.s.max_consecutive_turns)
            except DirectiveError:
                d = None
            counts[d.persona_id if d is not None else "invalid"] += 1
    total = sum(counts.values()) or 1
    return {k: round(counts[k] / total, 4) for k in [c.id for c in runner.roster] + ["invalid"]}


def heldout_reward(trainer: Any, runner: RolloutRunner, loop: LoopThread, prefixes: Sequence[Prefix],
                   group_reward_fn: GroupRewardFn, cfg: CollaborativeConfig, samples: int,
                   decider_factory: DeciderFactory | None = None) -> dict | None:
    """The rollout reward of the director as it is now on ``prefixes``: ``samples`` rollouts per prefix, seeded by
    the run seed, the prefix id and the sample index (the same seeds each time it is called), scored by the training
    reward (:func:`make_reward_func`: R = R_group + η·I_div, ``phase2.invalid_reward`` for an invalid directive).

    Returns ``{"reward", "group_reward", "i_div"}`` (means over the rollouts with a value; None over none),
    ``"rollouts"`` (outcome counts: complete, invalid, dropped, window_full) and ``"scored"``; None without prefixes.
    """
    if not prefixes:
        return None
    seed = cfg.director_grpo.seed
    rollouts = [Rollout(p, k, rollout_seed(seed, "heldout", p.prefix_id, k)) for p in prefixes
                for k in range(samples)]
    # the trainer's own weights, not a vLLM copy TRL has not synced yet
    factory = decider_factory or policy_decider_factory(runner, cfg, vllm=False)
    decide = factory(trainer, rollout_seed(seed, "heldout"))
    loop.call(runner.run(rollouts, decide))
    stats = RolloutStats()
    score = make_reward_func({p.prefix_id: p for p in prefixes}, group_reward_fn, cfg.phase2,
                             cfg.director_grpo.reward_timeout_s, stats, roster=[c.id for c in runner.roster])
    score(prompts=[r.prefix.prefix_id for r in rollouts], completions=[""] * len(rollouts),
          rollout=[r.record() for r in rollouts])
    s = stats.summary()
    return {"reward": s["reward_mean"], "group_reward": s["group_reward_mean"], "i_div": s["i_div_mean"],
            "rollouts": s["rollouts"], "scored": len(stats.rewards)}


def split_heldout(prefixes: dict[str, Prefix], heldout_fraction: float) -> tuple[dict[str, Prefix], list[Prefix]]:
    """``(train, heldout)``: a prefix is held out when the group reward model holds it out
    (:func:`mascot_training.common.data.in_heldout_split` of its id)."""
    from mascot_training.common.data import in_heldout_split

    held = [p for pid, p in prefixes.items() if in_heldout_split(pid, heldout_fraction)]
    return {pid: p for pid, p in prefixes.items() if not in_heldout_split(pid, heldout_fraction)}, held


def grpo_args(cfg: CollaborativeConfig, output_dir: str | Path) -> Any:
    """TRL 1.16 ``GRPOConfig`` of the director (no checkpoints; logs every step; CPU flags unless CUDA), with the
    generation backend of ``director_grpo.generation`` (vLLM's window ``max_model_len``; no importance-sampling
    correction, since the rollouts return no sampling log-probabilities).

    Raises:
        ConfigError: ``director_grpo.generation`` asks for vLLM on a machine without a CUDA GPU.
    """
    import torch
    from trl import GRPOConfig

    from mascot_training.common.grpo import check_generation, trl_generation_args

    g = cfg.director_grpo
    check_generation("director_grpo", g.generation)
    return GRPOConfig(output_dir=str(output_dir), num_generations=cfg.phase2.num_generations,
                      per_device_train_batch_size=g.batch_size, learning_rate=g.lr,
                      max_completion_length=cfg.max_model_len, num_train_epochs=g.epochs, max_steps=g.max_steps,
                      beta=g.beta, loss_type=g.loss_type, scale_rewards=g.scale_rewards,
                      temperature=cfg.director.decoding.temperature, top_p=cfg.director.decoding.top_p,
                      seed=g.seed, bf16=False,
                      gradient_checkpointing=g.gradient_checkpointing,
                      use_cpu=not torch.cuda.is_available(), report_to=[], save_strategy="no", logging_steps=1,
                      disable_tqdm=True,
                      **trl_generation_args(g.generation, cfg.max_model_len, importance_sampling=False))


def build_trainer(base_model: str, prefixes: dict[str, Prefix], runner: RolloutRunner, loop: LoopThread,
                  group_reward_fn: GroupRewardFn, cfg: CollaborativeConfig, work_dir: Path, stats: RolloutStats,
                  *, init_adapter: str | None = None, decider_factory: DeciderFactory | None = None,
                  metrics: Any = None, callbacks: Sequence = ()) -> Any:
    """The ``GRPOTrainer`` of the director: a fresh LoRA (``cfg.lora``) or ``init_adapter`` continued."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, set_seed
    from trl import GRPOTrainer

    from mascot_training.common.grpo import finite_guard
    from mascot_training.common.lora import peft_lora

    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func is marked experimental in TRL 1.16
    args = grpo_args(cfg, work_dir)  # refuses vLLM without CUDA before any model is loaded
    set_seed(cfg.director_grpo.seed)
    model = AutoModelForCausalLM.from_pretrained(base_model, dtype=torch.float32)
    peft_config = peft_lora(cfg.lora)
    if init_adapter:
        from peft import PeftModel

        model, peft_config = PeftModel.from_pretrained(model, init_adapter, is_trainable=True), None
    rows = [{"prompt": pid} for pid in prefixes]
    trainer = GRPOTrainer(model=model, processing_class=runner.tokenizer, args=args,
                          train_dataset=Dataset.from_list(rows), peft_config=peft_config,
                          reward_funcs=[make_reward_func(prefixes, group_reward_fn, cfg.phase2,
                                                         cfg.director_grpo.reward_timeout_s, stats, metrics,
                                                         [c.id for c in runner.roster])],
                          rollout_func=make_rollout_func(runner, loop, prefixes, cfg, decider_factory),
                          callbacks=[finite_guard(), *callbacks])
    if callbacks:  # a progress callback reports each step; the printer's dict per step would repeat it
        from transformers import PrinterCallback

        trainer.remove_callback(PrinterCallback)
    return trainer


def train_director(base_model: str, prefixes: dict[str, Prefix], runner: RolloutRunner, loop: LoopThread,
                   group_reward_fn: GroupRewardFn, cfg: CollaborativeConfig, work_dir: Path, *,
                   init_adapter: str | None = None, metrics: Any = None,
                   heldout: Sequence[Prefix] = ()) -> tuple[Any, dict]:
    """Train the director on ``prefixes``; returns ``(trainer, metrics)``.

    ``metrics``: ``steps``, ``reward_first`` / ``reward_last`` (mean R of the first / last logged step),
    ``group_reward_mean``, ``i_div_mean`` (over completed rollouts with a group reward), ``rollouts`` (complete /
    invalid / dropped counts), ``reward_failures``, ``persona_distribution_before`` / ``_after`` (first-decision
    shares over the training and ``heldout`` prefixes, :func:`persona_distribution`), ``valid_rate_before`` /
    ``_after``, ``seconds``; with ``heldout`` prefixes (never trained on) also ``heldout_prefixes`` and
    ``heldout_before`` / ``heldout_after`` (:func:`heldout_reward` before the first step and after the last, with
    ``director_grpo.heldout_samples`` rollouts per prefix and the same seeds).
    """
    t0 = time.perf_counter()
    stats = RolloutStats()
    trainer = build_trainer(base_model, prefixes, runner, loop, group_reward_fn, cfg, work_dir, stats,
                            init_adapter=init_adapter, metrics=metrics, callbacks=[trainer_progress("director_grpo")])
    d, g = cfg.director, cfg.director_grpo
    plist = [*prefixes.values(), *heldout]

    def dist() -> dict:
        director = PolicyDirector(trainer.accelerator.unwrap_model(trainer.model), runner.tokenizer,
                                  max_tokens=d.max_tokens, temperature=d.decoding.temperature,
                                  top_p=d.decoding.top_p)
        return persona_distribution(runner, director, plist, g.distribution_samples, g.seed)

    measured_flips = measured_refused = 0

    def measure() -> dict | None:
        nonlocal measured_flips, measured_refused
        before_flips, before_refused = runner.dropped_role_flips, runner.dropped_refused
        got = heldout_reward(trainer, runner, loop, heldout, group_reward_fn, cfg, g.heldout_samples)
        measured_flips += runner.dropped_role_flips - before_flips  # counted in its rollout outcomes instead
        measured_refused += runner.dropped_refused - before_refused
        return got

    before, held_before = dist(), measure()
    trainer.train()
    after, held_after = dist(), measure()
    rewards = [e["reward"] for e in trainer.state.log_history
               if isinstance(e.get("reward"), (int, float)) and math.isfinite(e["reward"])]
    m = {"steps": trainer.state.global_step, "reward_first": rewards[0] if rewards else None,
         "reward_last": rewards[-1] if rewards else None, **stats.summary(),
         "dropped_role_flip": runner.dropped_role_flips - measured_flips,
         "dropped_refused": runner.dropped_refused - measured_refused,
         "speaker_attempts_per_reply": round(runner.speaker_attempts / runner.speaker_replies, 3)
         if runner.speaker_replies else None,
         "persona_distribution_before": before, "persona_distribution_after": after,
         "valid_rate_before": round(1 - before["invalid"], 4), "valid_rate_after": round(1 - after["invalid"], 4)}
    if heldout:
        m.update(heldout_prefixes=len(heldout), heldout_before=held_before, heldout_after=held_after)
    m["seconds"] = round(time.perf_counter() - t0, 3)
    trainer.rollout_records = stats.records  # the stage writes them beside the adapter
    return trainer, m


def cached_warm_start(part: Path, key: str, build: Callable[[Path], dict]) -> dict:
    """The warm-start adapter in ``part/warm_start``, trained by ``build(dir)`` unless a killed earlier attempt left
    one there for the same ``key`` (a digest of its rows and settings; kept with its figures in
    ``part/warm_start.json``). An adapter without figures, or left by other rows or settings, is removed and trained
    again: a resumed stage never starts GRPO from a warm start it did not ask for. Returns ``build``'s figures."""
    adapter, meta = part / "warm_start", part / "warm_start.json"
    if (adapter / "adapter_config.json").is_file() and meta.is_file():
        try:
            saved = json.loads(meta.read_text(encoding="utf-8"))
        except ValueError:
            saved = {}
        if isinstance(saved, dict) and saved.get("key") == key:
            return saved["figures"]
    shutil.rmtree(adapter, ignore_errors=True)
    meta.unlink(missing_ok=True)
    figures = build(adapter)
    atomic_write_text(meta, json.dumps({"key": key, "figures": figures}) + "\n")
    return figures


def base_persona_rows(base_model: str, runner: RolloutRunner, prefixes: Sequence[Prefix],
                      cfg: CollaborativeConfig) -> tuple[list[dict], dict]:
    """The persona-balanced warm start's rows (:func:`~mascot_training.collaborative.director_warm_start.persona_rows`)
    drawn from the base model at ``director.decoding`` (float32), without their ``persona_id`` key, and the draw's
    figures under ``"drawn"`` (the model is freed before the warm start loads its own copy)."""
    import gc

    import torch
    from transformers import AutoModelForCausalLM

    from mascot_training.collaborative.director_warm_start import persona_rows

    d = cfg.director
    model = AutoModelForCausalLM.from_pretrained(base_model, dtype=torch.float32)
    try:
        director = PolicyDirector(model, runner.tokenizer, max_tokens=d.max_tokens,
                                  temperature=d.decoding.temperature, top_p=d.decoding.top_p)
        rows, figures = persona_rows(runner, director, prefixes, d.warm_start_tries,
                                     rollout_seed(cfg.director_grpo.seed, "warm-start"))
    finally:
        del model
        gc.collect()
    report(f"director warm start: {figures['rows']} rows of {figures['decisions']} decisions "
           f"({figures['draws']} draws), per persona {figures['per_persona']}")
    return [{k: v for k, v in r.items() if k != "persona_id"} for r in rows], {"drawn": figures}


def run(cfg: CollaborativeConfig, out: Path, *, base_model: str, runner: RolloutRunner, loop: LoopThread,
        group_reward_fn: GroupRewardFn, inputs: dict[str, str], metrics: Any = None) -> dict:
    """Run the stage: train and save the director LoRA to ``OUT/director_grpo/adapter`` (every scored rollout in
    ``OUT/director_grpo/rollouts.jsonl``, :attr:`RolloutStats.records`); returns the manifest
    (``metrics`` as :func:`train_director`; ``group_reward_mean``, ``i_div_mean``, ``persona_distribution_before``,
    ``persona_distribution_after`` also at the top level, and ``heldout_reward_before`` / ``_after``, None without
    held-out prefixes). With ``director_grpo.heldout_eval`` the prefixes the group reward model held out are left
    out of the warm start and of GRPO and only measured (:func:`split_heldout`, :func:`heldout_reward`).

    Raises:
        ValueError: the rollouts stage has not run. RuntimeError: a non-finite loss or weight, or a non-LoRA adapter.
    """
    from mascot.core.files import read_jsonl, write_jsonl
    from mascot_training.common.lora import save_adapter

    out = Path(out)
    src = out / "rollouts" / "prefixes.jsonl"
    if not src.is_file():
        raise ValueError(f"{src} is missing: run the rollouts stage first")
    # The generation backend changes how directives are sampled, not what is trained (kept out of the stage key).
    conf = {"director_grpo": cfg.director_grpo.model_dump(mode="json", exclude={"generation"}),
            "director": cfg.director.model_dump(mode="json"),
            "phase2": cfg.phase2.model_dump(mode="json", exclude={"rollout_concurrency"}),
            "lora": cfg.lora.model_dump(mode="json"),
            "speakers": cfg.speakers.model_dump(mode="json", exclude={"store", "adapters"}),
            "user": cfg.user.model_dump(mode="json"), "guard": cfg.guard.model_dump(mode="json")}
    inputs = {**inputs, "prefixes": mf.digest_path(src)}
    if mf.is_done(out, STAGE, conf, inputs):
        return mf.read_manifest(out / STAGE)
    prefixes = {d["prefix_id"]: Prefix.from_dict(d) for d in read_jsonl(src)}
    train, held = (split_heldout(prefixes, cfg.phase2.group_reward.pairs.heldout_fraction)
                   if cfg.director_grpo.heldout_eval else (prefixes, []))
    if not train:
        raise ValueError(f"every one of the {len(prefixes)} prefixes is held out (director_grpo.heldout_eval): raise "
                         "phase2.prefixes or lower phase2.group_reward.pairs.heldout_fraction")
    with mf.stage_dir(out, STAGE, conf, inputs) as (part, man):
        shutil.rmtree(part / ADAPTER_SUBDIR, ignore_errors=True)
        init = cfg.director.init_adapter or None
        warm = None
        if cfg.director.warm_start_steps and not init:
            from mascot_training.collaborative.director_warm_start import warm_start, warm_start_rows

            if cfg.director.warm_start_source == "personas":
                # keyed on what the draws read, so a resumed stage finds its warm start without drawing again
                source: Any = {"prefixes": [p.to_dict() for p in train.values()],
                               "director": cfg.director.model_dump(mode="json")}

                def build(d: Path) -> dict:
                    rows, drawn = base_persona_rows(base_model, runner, list(train.values()), cfg)
                    return {**warm_start(base_model, rows, cfg, d, grouped=True), **drawn}
            else:
                source = warm_start_rows(train, read_jsonl(out / "rollouts" / "blocks.jsonl"), runner.roster,
                                         cfg.director.max_consecutive_turns)

                def build(d: Path) -> dict:
                    return warm_start(base_model, source, cfg, d)
            key = mf.digest_obj({"rows": source, "base_model": base_model, "lora": cfg.lora.model_dump(mode="json"),
                                 "steps": cfg.director.warm_start_steps, "lr": cfg.director.warm_start_lr,
                                 "max_model_len": cfg.max_model_len, "seed": cfg.director_grpo.seed,
                                 "grouped": cfg.director.warm_start_source == "personas"})
            warm = cached_warm_start(part, key, build)
            init = str(part / "warm_start")
        with tempfile.TemporaryDirectory(prefix="mascot-director-grpo-") as work:
            trainer, m = train_director(base_model, train, runner, loop, group_reward_fn, cfg, Path(work),
                                        init_adapter=init, metrics=metrics, heldout=held)
            save_adapter(trainer, part / ADAPTER_SUBDIR)
            write_curves(trainer.state.log_history, part / "curves.png", "director_grpo")
            write_jsonl(part / "rollouts.jsonl", trainer.rollout_records)
        if warm is not None:
            m["warm_start"] = warm
        atomic_write_text(part / "metrics.json", json.dumps(m, indent=2) + "\n")
        man["metrics"] = m
        man["data_ids"] = sorted({p.situation_id for p in prefixes.values()})
        for k in ("group_reward_mean", "i_div_mean", "persona_distribution_before", "persona_distribution_after"):
            man[k] = m[k]
        man["heldout_reward_before"] = (m.get("heldout_before") or {}).get("reward")
        man["heldout_reward_after"] = (m.get("heldout_after") or {}).get("reward")
        f = fmt_value
        line = f"director_grpo: {m['steps']} steps, reward {f(m['reward_first'])} -> {f(m['reward_last'])}"
        if held:
            line += (f"; held-out reward {f(man['heldout_reward_before'])} -> {f(man['heldout_reward_after'])} "
                     f"({len(held)} prefixes x {cfg.director_grpo.heldout_samples} rollouts)")
        report(line)
        report(f"director_grpo: first decisions {m['persona_distribution_before']} -> "
               f"{m['persona_distribution_after']}")
    return mf.read_manifest(out / STAGE)
