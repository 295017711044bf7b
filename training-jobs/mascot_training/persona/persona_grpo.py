"""Stage ``persona_grpo``: GRPO of one LoRA per persona.

Each persona gets a fresh LoRA (``cfg.lora``) on the base model, trained with TRL 1.16 ``GRPOTrainer`` against the
composite reward r = w_rm·ẑ + w_fmt·R_format (:func:`mascot_training.common.rewards.composite_reward`), where ẑ is
the standardised persona reward model score of :func:`mascot.core.formatting.reward_text` (card + context + history +
visible answer), exactly the input the reward service scores at serving time.

Prompt dataset rows (``prompts[persona_id]``; build them with :func:`prompt_row`)::

    {"prompt": [{"role": "system" | "user" | "assistant", "content": str}, ...],   # build_persona_messages(...)
     "persona_id": str,                                                           # the speaking persona
     "history": [{"role": "user" | "agent", "text": str, "persona_id": str}],     # visible turns, oldest first
     "context": [[speaker, content], ...],                                        # seed context ([] for ED)
     "group_id": str,                                                             # optional; manifest data id
     "action": str, "tone": str}                                                  # optional; the directive

TRL passes every column but ``prompt`` to the reward function as a keyword list (one entry per completion).

A sample whose RM score is None, NaN/inf or timed out gets reward None and is counted in
``mascot_reward_failures_total{reason="none"|"nan"|"timeout"}``. TRL 1.16 (``grpo_trainer.py``,
``_calculate_rewards`` / ``_generate_and_score_completions``) turns None into NaN, leaves rows whose every reward
is NaN out of the group mean and std (nanmean / nanstd), then sets NaN advantages to 0 (``nan_to_num``): such a
completion carries no policy-gradient signal, though its tokens still count in the loss normaliser. A group with
one or zero scored completions gets advantage 0 everywhere. :func:`~mascot_training.common.grpo.finite_guard` still
fails the run loudly on a non-finite loss or weight.
"""

from __future__ import annotations

import collections
import json
import logging
import math
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Sequence

from mascot.core import formatting
from mascot.core.dialogue import FALLBACK_ACTION, HistoryTurn, history_from_dicts
from mascot.core.files import atomic_write_text
from mascot.core.guard import GuardSettings
from mascot.core.moves import opener
from mascot.core.personas import PersonaCard, PersonaCatalog
from mascot.speaker.prompts import build_persona_messages
from mascot.speaker.reply import served_persona_text
from mascot_training.common import manifest as mf
from mascot_training.common.config import LoraConfig
from mascot_training.common.grpo import call_with_timeout, check_generation, finite_guard, trl_generation_args
from mascot_training.common.lora import peft_lora, save_adapter
from mascot_training.common.progress import fmt_value, report, trainer_progress, write_curves
from mascot_training.common.rewards import composite_reward, format_reward, move_reward, split_think
from mascot_training.persona.config import GrpoConfig, PersonaAlignmentConfig

log = logging.getLogger(__name__)
STAGE = "persona_grpo"
#: Written into ``<partial>/<persona_id>/`` after its adapter is saved: ``{"key", "metrics"}``; ``key`` digests the
#: GRPO and LoRA config, base model, RM and that persona's rows, so a changed input retrains the persona.
DONE_MARKER = "mascot_grpo_done.json"
RmFn = Callable[[Sequence[str]], Sequence[float | None]]


def prompt_row(card: PersonaCard, history: Sequence[HistoryTurn], context: Sequence[tuple[str, str]],
               names: dict[str, str], group_id: str = "", action: str = "", tone: str = "") -> dict:
    """One prompt-dataset row: the serving speaker prompt under the directive ``action`` / ``tone`` (empty: the
    fallback directive and the card's default tone)."""
    action, tone = action or FALLBACK_ACTION, tone or card.default_tone
    msgs = build_persona_messages(card, history, context, action, tone, {**names, card.id: card.name})
    return {"prompt": msgs, "persona_id": card.id,
            "history": [{"role": t.role, "text": t.text, "persona_id": t.persona_id} for t in history],
            "context": [[s, c] for s, c in context], "group_id": group_id, "action": action, "tone": tone}


def completion_text(completion: str | list[dict]) -> str:
    """The generated text of a TRL completion (plain string, or conversational ``[{"role", "content"}]``)."""
    if isinstance(completion, str):
        return completion
    return "".join(m.get("content") or "" for m in completion)


def make_reward_func(scorer, catalog: PersonaCatalog, cfg: GrpoConfig, metrics=None,
                     rm_fn: RmFn | None = None, guard: GuardSettings | None = None
                     ) -> Callable[..., list[float | None]]:
    """A TRL reward function ``(prompts, completions, **kwargs) -> list[float | None]`` computing the composite reward.

    With ``guard`` (serving's reply checks, enabled) each completion is first turned into the text serving would
    deliver (:func:`mascot.speaker.reply.served_persona_text`; a completion of ``cfg.max_completion_length`` tokens,
    per TRL's ``completion_ids``, ended at the budget, so its unfinished last sentence is dropped): that text is what
    the reward model and R_format score, and a completion serving would refuse gets ``cfg.refused_reward``.

    Args:
        scorer: A :class:`mascot.reward.scorer.RewardScorer` (inputs fitted to its window, EOS appended, ẑ
            standardised with its μ, σ), or None.
        catalog: Persona cards by id (``persona_id`` column) and display names for speaker tags.
        cfg: Weights ``w_rm``, ``w_format``, the format reward's λ and L_max, and ``reward_timeout_s``.
        metrics: A :class:`mascot.core.metrics.Metrics`; failures go to ``reward_failures.labels(reason)``.
        rm_fn: Maps RM input texts to standardised scores ẑ (None allowed); replaces the scorer's model (tests,
            a remote RM). With neither ``scorer`` nor ``rm_fn`` the RM term is dropped (format reward only).
        guard: Thresholds of the reply checks; None (or disabled) scores completions as generated.

    Returns:
        The function; its ``failures`` attribute counts masked samples by reason ("none", "nan", "timeout"), its
        ``refusals`` attribute the completions refused by reason.
    """
    names = {c.id: c.name for c in catalog.cards.values()}
    checks = guard if guard is not None and guard.enabled else None
    refusals: collections.Counter = collections.Counter()
    if rm_fn is None and scorer is not None:
        def rm_fn(texts: Sequence[str]) -> list[float]:
            return [scorer.standardize(r) for r in scorer.score_texts(texts)]
    failures: collections.Counter = collections.Counter()
    stats: dict[str, list] = {"move": [], "cut": []}
    state: dict = {}
    collapse = cfg.collapse_stop if cfg.collapse_stop.enabled else None
    recent: collections.deque = collections.deque(maxlen=collapse.window if collapse else 1)

    def fail(reason: str) -> None:
        failures[reason] += 1
        if metrics is not None:
            metrics.reward_failures.labels(reason).inc()

    def served(prompt: list | str, t: str, pid: str, hist: list, ids: Sequence[int] | None, action: str,
               tone: str) -> str | None:
        """The delivered text of completion ``t`` (None: refused), or ``t`` itself without checks."""
        if checks is None:
            return t
        card = catalog.get(pid)
        system = prompt[0]["content"] if isinstance(prompt, list) and prompt and prompt[0]["role"] == "system" else ""
        finish = "length" if ids is not None and len(ids) >= cfg.max_completion_length else "stop"
        if cfg.format.think:  # the thinking text is never shown; only the answer is checked
            think, answer = split_think(t)
            prefix, t = f"<think>{think}</think>" if think is not None else "", answer
        else:
            prefix = ""
        text, why = served_persona_text(card, names, system, history_from_dicts(hist or []), t, finish, checks,
                                        action or FALLBACK_ACTION, tone or card.default_tone)
        if not text:
            refusals[why] += 1
            return None
        return prefix + text

    def persona_reward(prompts: list, completions: list, persona_id: list[str], history: list, context: list,
                       completion_ids: list | None = None, action: list | None = None, tone: list | None = None,
                       **_: object) -> list[float | None]:
        n = len(completions)
        ids = completion_ids if completion_ids is not None else [None] * n
        actions, tones = action or [""] * n, tone or [""] * n
        raw = [completion_text(c) for c in completions]
        shown = [served(p, t, pid, h, i, a, tn)
                 for p, t, pid, h, i, a, tn in zip(prompts, raw, persona_id, history, ids, actions, tones)]
        keep = [k for k, t in enumerate(shown) if t is not None]
        out: list[float | None] = [cfg.refused_reward] * len(shown)
        texts = [shown[k] for k in keep]
        cards = [catalog.get(persona_id[k]) for k in keep]
        answers = [split_think(t)[1].strip() if cfg.format.think else t.strip() for t in texts]
        # a think tag from a model without a thinking mode stays a format error though serving hides it
        r_fmt = [-1.0 if not cfg.format.think and ("<think>" in raw[k] or "</think>" in raw[k]) else
                 format_reward(t, l_max=c.max_answer_words if cfg.format.l_max_from_card else cfg.format.l_max,
                               lam=cfg.format.lam, think=cfg.format.think)
                 for k, t, c in zip(keep, texts, cards)]
        # R_move and the budget penalty are rule-based like R_format: added to the composite reward
        users = [next((h["text"] for h in reversed(history[k] or []) if h["role"] == "user"), "") for k in keep]
        r_move = [move_reward(c.moves, a, u, cfg.move.required, cfg.move.forbidden) if cfg.w_move else 0.0
                  for c, a, u in zip(cards, answers, users)]
        cut = [ids[k] is not None and len(ids[k]) >= cfg.max_completion_length for k in keep]
        extra = [cfg.w_move * m - (cfg.budget_penalty if c else 0.0) for m, c in zip(r_move, cut)]
        stats["move"].append(sum(r_move) / len(r_move) if r_move else None)
        stats["cut"].append(sum(cut) / n if n else None)
        for a in answers:
            recent.append(opener(a))
        if collapse is not None and len(recent) >= collapse.window and not state.get("collapse"):
            top, count = collections.Counter(recent).most_common(1)[0]
            if count / len(recent) >= collapse.max_opener_share:
                state["collapse"] = {"opener": top, "share": round(count / len(recent), 3)}
        if rm_fn is None:
            for k, f, e in zip(keep, r_fmt, extra):
                out[k] = cfg.w_format * f + e
            return out
        if not keep:
            return out
        inputs = []
        for k, t in zip(keep, texts):
            card = catalog.get(persona_id[k])
            turns = history_from_dicts(history[k] or [])
            pairs = [(s, c) for s, c in context[k] or []]
            answer = split_think(t)[1].strip()
            if scorer is not None:
                inputs.append(scorer.build_inputs(card, turns, [answer], pairs, names)[0][0])
            else:
                inputs.append(formatting.reward_text(card, turns, answer, context=pairs, names=names)[0])
        z = call_with_timeout(rm_fn, inputs, cfg.reward_timeout_s)
        if z is None:
            log.warning("reward model did not answer within %.1f s; %d samples masked", cfg.reward_timeout_s,
                        len(texts))
            for k in keep:
                fail("timeout")
                out[k] = None
            return out
        if len(z) != len(texts):
            raise ValueError(f"reward model returned {len(z)} scores for {len(texts)} completions")
        for k, zi, fi, e in zip(keep, z, r_fmt, extra):
            if zi is None:
                fail("none")
                out[k] = None
            elif not math.isfinite(float(zi)):
                fail("nan")
                out[k] = None
            else:
                out[k] = composite_reward(float(zi), fi, cfg.w_rm, cfg.w_format) + e
        return out

    persona_reward.failures = failures  # type: ignore[attr-defined]
    persona_reward.stats = stats  # type: ignore[attr-defined]
    persona_reward.state = state  # type: ignore[attr-defined]
    persona_reward.refusals = refusals  # type: ignore[attr-defined]
    persona_reward.checks = checks is not None  # type: ignore[attr-defined]
    return persona_reward


def grpo_args(g: GrpoConfig, output_dir: str | Path, max_model_len: int | None = None):
    """TRL 1.16 ``GRPOConfig`` for ``g`` (CPU flags unless CUDA is present; no checkpoints; log every step), with the
    generation backend of ``g.generation`` (:func:`mascot_training.common.grpo.trl_generation_args`; vLLM's window
    ``max_model_len`` tokens).

    Raises:
        ConfigError: ``g.generation`` asks for vLLM on a machine without a CUDA GPU.
    """
    import torch
    from trl import GRPOConfig

    check_generation("persona_grpo", g.generation)
    return GRPOConfig(output_dir=str(output_dir), num_generations=g.num_generations,
                      per_device_train_batch_size=g.batch_size, learning_rate=g.lr,
                      max_completion_length=g.max_completion_length, num_train_epochs=g.epochs, max_steps=g.max_steps,
                      beta=g.beta, loss_type=g.loss_type, scale_rewards=g.scale_rewards, temperature=g.temperature,
                      top_p=g.top_p, repetition_penalty=g.repetition_penalty,
                      seed=g.seed, bf16=False, gradient_checkpointing=g.gradient_checkpointing,
                      use_cpu=not torch.cuda.is_available(),
                      report_to=[], save_strategy="no", logging_steps=1, disable_tqdm=True,
                      **trl_generation_args(g.generation, max_model_len))


def sample_completions(model, tok, rows: Sequence[dict], g: GrpoConfig, samples: int, seed: int,
                       with_ids: bool = False) -> list[list[str]] | tuple[list[list[str]], list[list[list[int]]]]:
    """``samples`` completions per row (``rows[i]["prompt"]``: chat messages), drawn as GRPO draws them with
    transformers generation (TRL 1.16 defaults: temperature ``g.temperature``, top-p 1, no top-k, at most
    ``g.max_completion_length`` new tokens); row i is seeded with ``seed + i``, so the same weights give the same
    texts. Returns one list of ``samples`` decoded texts per row (special tokens dropped); ``with_ids`` also the
    completions' token ids as TRL hands them to a reward function (through the end-of-sequence token, no
    padding)."""
    import torch

    was_training = model.training
    model.eval()
    out: list[list[str]] = []
    ids_out: list[list[list[int]]] = []
    eos = tok.eos_token_id
    try:  # the global RNG is restored afterwards: measuring must not change what training samples next
        with torch.random.fork_rng(devices=[]):
            for i, row in enumerate(rows):
                text = tok.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=False)
                enc = tok(text, return_tensors="pt", add_special_tokens=False).to(model.device)
                torch.manual_seed(seed + i)
                with torch.inference_mode():
                    gen = model.generate(**enc, do_sample=True, temperature=g.temperature, top_p=g.top_p, top_k=0,
                                     repetition_penalty=g.repetition_penalty,
                                         max_new_tokens=g.max_completion_length, num_return_sequences=samples,
                                         pad_token_id=tok.pad_token_id if tok.pad_token_id is not None
                                         else tok.eos_token_id)
                n = enc["input_ids"].shape[1]
                out.append([tok.decode(seq[n:], skip_special_tokens=True) for seq in gen])
                row_ids = []
                for seq in gen:
                    t = seq[n:].tolist()
                    row_ids.append(t[:t.index(eos) + 1] if eos in t else t)
                ids_out.append(row_ids)
    finally:
        model.train(was_training)
    return (out, ids_out) if with_ids else out


def heldout_reward(model, tok, rows: Sequence[dict], reward_func: Callable, g: GrpoConfig, samples: int,
                   seed: int) -> dict | None:
    """The composite reward of the policy on held-out prompt rows: :func:`sample_completions` scored by
    ``reward_func`` (the training reward, refused completions included at their reward). Returns ``{"reward": mean
    over the scored completions, "format": mean R_format of the raw completions, "scored": n, "completions": n,
    "refused": n}`` (rounded to 4 places; ``reward`` None when none was scored; ``refused`` counts the completions
    the reply checks refused, None when ``reward_func`` has no checks), or None without rows."""
    if not rows:
        return None
    texts, ids = sample_completions(model, tok, rows, g, samples, seed, with_ids=True)
    flat = [(row, t, i) for row, ts, iis in zip(rows, texts, ids) for t, i in zip(ts, iis)]
    counter = getattr(reward_func, "refusals", None) if getattr(reward_func, "checks", False) else None
    before = sum(counter.values()) if counter is not None else 0
    rewards = reward_func(prompts=[r["prompt"] for r, _, _ in flat], completions=[t for _, t, _ in flat],
                          persona_id=[r["persona_id"] for r, _, _ in flat],
                          history=[r["history"] for r, _, _ in flat], context=[r["context"] for r, _, _ in flat],
                          completion_ids=[i for _, _, i in flat])
    scored = [float(x) for x in rewards if x is not None]
    fmt = [format_reward(t, l_max=g.format.l_max, lam=g.format.lam, think=g.format.think) for _, t, _ in flat]
    return {"reward": round(sum(scored) / len(scored), 4) if scored else None,
            "format": round(sum(fmt) / len(fmt), 4), "scored": len(scored), "completions": len(flat),
            "refused": sum(counter.values()) - before if counter is not None else None}


def split_heldout(rows: Sequence[dict], heldout_fraction: float) -> tuple[list[dict], list[dict]]:
    """``(train, heldout)`` rows: a row is held out when its ``group_id`` is in the pairs stage's held-out split
    (the same hash, so the reward model never trained on pairs of a held-out group either)."""
    from mascot_training.common.data import in_heldout_split

    train, held = [], []
    for r in rows:
        (held if r.get("group_id") and in_heldout_split(r["group_id"], heldout_fraction) else train).append(r)
    return train, held


def heldout_summary(per_persona: dict[str, dict]) -> dict:
    """Stage-level ``heldout_reward_before`` / ``_after``: the mean held-out composite reward over the personas
    measured both times (each persona's mean weighs the same), with ``heldout_personas`` naming them; values None
    when no persona was measured. ``heldout_refused_before`` / ``_after``: completions of those personas the reply
    checks refused, over ``heldout_completions`` (None without checks)."""
    both = {p: m for p, m in per_persona.items()
            if (m.get("heldout_before") or {}).get("reward") is not None
            and (m.get("heldout_after") or {}).get("reward") is not None}

    def mean(key: str) -> float | None:
        return round(sum(m[key]["reward"] for m in both.values()) / len(both), 4) if both else None

    def refused(key: str) -> int | None:
        counts = [m[key].get("refused") for m in both.values()]
        return sum(counts) if counts and all(c is not None for c in counts) else None

    return {"heldout_reward_before": mean("heldout_before"), "heldout_reward_after": mean("heldout_after"),
            "heldout_personas": sorted(both), "heldout_refused_before": refused("heldout_before"),
            "heldout_refused_after": refused("heldout_after"),
            "heldout_completions": sum(m["heldout_after"].get("completions", 0) for m in both.values())}


def train_persona(base_model: str, rows: list[dict], reward_func: Callable, g: GrpoConfig, lora: LoraConfig,
                  work_dir: Path, callbacks: Sequence = (), init_adapter: str | None = None,
                  max_model_len: int | None = None, heldout: Sequence[dict] = (),
                  heldout_func: Callable | None = None) -> tuple[object, dict]:
    """GRPO of a LoRA on ``base_model`` over ``rows`` (module docstring format). Returns ``(trainer, metrics)``.

    The LoRA is fresh, or continues ``init_adapter`` (the SFT adapter: π_SFT) when given. ``max_model_len`` is the
    vLLM engine's window in tokens when ``g.generation.backend`` is ``vllm`` (None: the model's own).

    ``metrics``: ``steps``, ``reward_first`` / ``reward_last`` (mean composite reward of the first / last logged
    step with a finite value; None if none), ``seconds``; with ``heldout`` rows also ``heldout_before`` /
    ``heldout_after`` (:func:`heldout_reward` of the policy before the first step and after the last, scored by
    ``heldout_func``, default ``reward_func``, with ``g.heldout_samples`` completions per row and the same seeds).
    """
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, PrinterCallback, set_seed
    from trl import GRPOTrainer

    args = grpo_args(g, work_dir, max_model_len)  # refuses vLLM without CUDA before any model is loaded
    set_seed(g.seed)  # the LoRA A init happens before Trainer seeds
    t0 = time.perf_counter()
    tok = AutoTokenizer.from_pretrained(base_model)
    model = AutoModelForCausalLM.from_pretrained(base_model, dtype=torch.float32)
    peft_config = peft_lora(lora)
    if init_adapter:
        from peft import PeftModel

        model, peft_config = PeftModel.from_pretrained(model, init_adapter, is_trainable=True), None
    trainer = GRPOTrainer(model=model, reward_funcs=[reward_func], args=args,
                          train_dataset=Dataset.from_list(rows), processing_class=tok, peft_config=peft_config,
                          callbacks=[finite_guard(), collapse_stop(reward_func), *callbacks])
    if callbacks:  # a progress callback reports each step; the printer's dict per step would repeat it
        trainer.remove_callback(PrinterCallback)

    def measure() -> dict | None:
        policy = trainer.accelerator.unwrap_model(trainer.model)
        return heldout_reward(policy, tok, heldout, heldout_func or reward_func, g, g.heldout_samples, g.seed)

    before = measure()
    trainer.train()
    after = measure()
    rewards = [e["reward"] for e in trainer.state.log_history
               if isinstance(e.get("reward"), (int, float)) and math.isfinite(e["reward"])]  # NaN logs as None
    m = {"steps": trainer.state.global_step, "reward_first": rewards[0] if rewards else None,
         "reward_last": rewards[-1] if rewards else None}
    stats = getattr(reward_func, "stats", None)
    if stats:  # mean R_move of the delivered completions and share cut at the token budget, first and last step
        for key in ("move", "cut"):
            vals = [v for v in stats[key] if v is not None]
            m[f"{key}_first"] = round(vals[0], 4) if vals else None
            m[f"{key}_last"] = round(vals[-1], 4) if vals else None
    m["stopped_on_collapse"] = (getattr(reward_func, "state", None) or {}).get("collapse")
    if heldout:
        m.update(heldout_prompts=len(heldout), heldout_before=before, heldout_after=after)
    m["seconds"] = round(time.perf_counter() - t0, 3)
    return trainer, m


def collapse_stop(reward_func: Callable) -> Any:
    """A ``transformers.TrainerCallback`` ending training after the step where ``reward_func`` (made by
    :func:`make_reward_func`) found one opener taking over the recent completions (``state["collapse"]``)."""
    from transformers import TrainerCallback

    class _CollapseStop(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            found = (getattr(reward_func, "state", None) or {}).get("collapse")
            if found:
                log.warning("template collapse at step %d: %d%% of recent completions open with %r; stopping",
                            state.global_step, round(100 * found["share"]), found["opener"])
                control.should_training_stop = True
            return control

    return _CollapseStop()


def release_trainer(trainer) -> None:
    """Free what a finished GRPO trainer holds before the next persona's loads: the weight-sync connection to a vLLM
    server (``vllm_mode: server``), the colocated vLLM engine (``colocate``; its engine core process ends with it),
    the model and optimiser, and the CUDA cache. A no-op beyond ``gc`` on CPU with transformers generation.

    Without it, phase 1 on a GPU holds every earlier persona's engine (its share of GPU memory) and model while the
    next one loads, and vLLM's free-memory check fails from the second persona on."""
    import contextlib
    import gc

    import torch

    gen = getattr(trainer, "vllm_generation", None)
    if gen is not None:
        client = getattr(gen, "vllm_client", None)
        if client is not None:
            with contextlib.suppress(Exception):  # the server may be gone already; nothing else to release there
                client.close_communicator()
        llm = getattr(gen, "llm", None)
        if llm is not None:
            engine = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
            with contextlib.suppress(Exception):
                if engine is not None and hasattr(engine, "shutdown"):
                    engine.shutdown()
            gen.llm = None
        trainer.vllm_generation = None
    trainer.model = trainer.model_wrapped = trainer.optimizer = None
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def run(cfg: PersonaAlignmentConfig, out: Path, *, base_model: str, rm_dir: str | None, personas: list[str],
        prompts: dict[str, list[dict]], metrics=None, init_adapter: str | dict[str, str] | None = None) -> dict:
    """Run the ``persona_grpo`` stage: one GRPO LoRA per persona under ``OUT/persona_grpo/<persona_id>/``.

    Args:
        cfg: The run config (``persona_grpo`` and ``lora`` sections).
        out: Run output directory.
        base_model: Policy base model (directory or hub id).
        rm_dir: Reward model directory (``mascot_reward.json`` holds μ, σ); None drops the RM term.
        personas: Persona ids to train, in order.
        prompts: ``{persona_id: rows}`` in the module docstring's format.
        metrics: Optional :class:`mascot.core.metrics.Metrics` for ``mascot_reward_failures_total``.
        init_adapter: The SFT adapter every persona's LoRA starts from, or ``{persona: adapter}`` when each persona
            has its own (``sft.per_persona``); None starts from a fresh LoRA.

    Returns:
        The stage manifest (``metrics[persona_id]``: steps, reward_first, reward_last, reward_failures, seconds,
        and with ``persona_grpo.heldout_eval`` heldout_prompts, heldout_before, heldout_after; at the top level
        :func:`heldout_summary`).

    Raises:
        ValueError: a persona without prompt rows, or without an adapter in a per-persona ``init_adapter``.
        RuntimeError: a non-finite loss/weight, or a non-LoRA adapter.
    """
    from mascot.reward.scorer import RewardScorer

    g = cfg.persona_grpo
    # The generation backend changes how completions are sampled, not what is trained: a run resumed on another
    # backend keeps the personas already trained (gradient checkpointing is never dumped, config.py).
    train_cfg = g.model_dump(mode="json", exclude={"generation"}) | {"lora": cfg.lora.model_dump(mode="json")}
    if g.heldout_eval:  # which prompts are held out depends on the pairs stage's split
        train_cfg["heldout_fraction"] = cfg.pairs.heldout_fraction
    if cfg.guard.enabled:  # the reward scores the text serving would deliver
        train_cfg["guard"] = cfg.guard.model_dump(mode="json")
    guard = cfg.guard.settings()
    config = train_cfg | {"personas": list(personas)}
    inputs = {"base_model": mf.digest_path(base_model) or f"hub:{base_model}",
              "rm": mf.digest_path(rm_dir) if rm_dir else "", "prompts": mf.digest_obj(prompts),
              "init_adapter": (mf.digest_obj({p: mf.digest_path(d) for p, d in sorted(init_adapter.items())})
                               if isinstance(init_adapter, dict) else mf.digest_path(init_adapter))
              if init_adapter else ""}
    if mf.is_done(out, STAGE, config, inputs):
        log.info("stage %s is done; skipping", STAGE)
        return mf.read_manifest(Path(out) / STAGE)
    missing = [p for p in personas if not prompts.get(p)]
    if missing:
        raise ValueError(f"no prompt rows for persona(s) {missing}")
    if isinstance(init_adapter, dict) and set(personas) - set(init_adapter):
        raise ValueError(f"no SFT adapter for persona(s) {sorted(set(personas) - set(init_adapter))}")
    split = {p: split_heldout(prompts[p], cfg.pairs.heldout_fraction) if g.heldout_eval else (prompts[p], [])
             for p in personas}
    empty = [p for p in personas if not split[p][0]]
    if empty:
        raise ValueError(f"every prompt of persona(s) {empty} is held out (persona_grpo.heldout_eval): sample more "
                         "situations (data.limit) or lower pairs.heldout_fraction")
    catalog = PersonaCatalog.load()
    scorer = RewardScorer(rm_dir) if rm_dir else None
    with mf.stage_dir(out, STAGE, config, inputs) as (partial, man):
        # which terms the reward had: the reward model's, or the rule-based ones alone (no RM, or one below its bar)
        man["reward_terms"] = {"rm": bool(rm_dir) and g.w_rm != 0, "format": g.w_format != 0,
                               "move": g.w_move != 0, "budget_penalty": g.budget_penalty != 0}
        for pid in personas:
            init = init_adapter.get(pid) if isinstance(init_adapter, dict) else init_adapter
            pdir = partial / pid
            marker = pdir / DONE_MARKER
            key = mf.digest_obj([train_cfg, inputs["base_model"], inputs["rm"], mf.digest_path(init) if init else "",
                                 prompts[pid]])
            done = json.loads(marker.read_text(encoding="utf-8")) if marker.is_file() else {}
            if done.get("key") == key:
                man["metrics"][pid] = done["metrics"]
                log.info("persona %s already trained in %s; skipping", pid, pdir)
                continue
            shutil.rmtree(pdir, ignore_errors=True)
            reward = make_reward_func(scorer, catalog, g, metrics, guard=guard)
            train_rows, held_rows = split[pid]
            with tempfile.TemporaryDirectory(prefix=f"mascot-grpo-{pid}-") as work:
                trainer, m = train_persona(base_model, train_rows, reward, g, cfg.lora, Path(work),
                                           callbacks=[trainer_progress(f"persona_grpo {pid}")],
                                           init_adapter=init, max_model_len=cfg.max_model_len,
                                           heldout=held_rows,
                                           heldout_func=make_reward_func(scorer, catalog, g, guard=guard))
                write_curves(trainer.state.log_history, partial / f"curves_{pid}.png", f"persona_grpo {pid}")
                save_adapter(trainer, pdir)
                release_trainer(trainer)  # the next persona's model (and vLLM engine) must not meet this one's
                del trainer
            m["reward_failures"] = dict(reward.failures)
            m["refused"] = dict(sorted(reward.refusals.items()))  # training completions the reply checks refused
            atomic_write_text(marker, json.dumps({"key": key, "metrics": m}) + "\n")
            man["metrics"][pid] = m
            f = fmt_value
            line = f"persona_grpo {pid}: {m['steps']} steps, reward {f(m['reward_first'])} -> {f(m['reward_last'])}"
            if m.get("heldout_before"):
                hb, ha = m["heldout_before"], m["heldout_after"]
                line += (f"; held-out reward {f(hb['reward'])} -> {f(ha['reward'])} "
                         f"({m['heldout_prompts']} prompts x {g.heldout_samples} samples)")
                if hb.get("refused") is not None:
                    line += f"; refused {hb['refused']}/{hb['completions']} -> {ha['refused']}/{ha['completions']}"
            report(line)
        man.update(heldout_summary(man["metrics"]))
        man["data_ids"] = sorted({r.get("group_id", "") for p in personas for r in prompts[p]} - {""})
    return mf.read_manifest(Path(out) / STAGE)
