"""Run configuration shapes both training phases share, and the one config-file reader.

Phase 1 (:mod:`mascot_training.persona.config`) and phase 2 (:mod:`mascot_training.collaborative.config`) build
their run configs from these sections (run id, base model, data split, LoRA, judging, pairs, reward-model recipe,
GRPO optimiser and generation backend, publish target). Unknown keys are rejected, and :func:`read_config` runs a
phase's ``validate`` so every problem that can be found before heavy work (divisibility of the GRPO batch, persona
ids, input files) is reported at once, and a Job fails in seconds with a message a person can act on.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator


class _S(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class DataConfig(_S):
    """Training situations; only ids whose hash falls in the train split are used (docs/data.md, "Splits")."""

    situations: Path = Path("../shared/data/empathetic_dialogues/test_situations.jsonl")
    limit: int | None = Field(None, ge=1)
    #: Fraction of ids (by SHA-256 of salt + id) that may be used for training; the rest stay for evaluation. 1.0
    #: uses every record: for a file that holds only training situations (`mascot data split`'s train.jsonl).
    train_fraction: float = Field(0.5, gt=0.0, le=1.0)
    salt: str = "mascot-phase1"


class LoraConfig(_S):
    """LoRA of the speaker policies."""

    r: int = Field(16, ge=1, le=256)
    alpha: int = Field(32, ge=1, le=1024)
    dropout: float = Field(0.1, ge=0.0, lt=1.0)
    target_modules: list[str] = Field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"], min_length=1)


class JudgeStageConfig(_S):
    """Judging of candidates: specs as in ``judge.judges`` of the service config.

    With ``target`` set, the judges are the ones configured on that JudgeService, picked by the ``name`` of each
    spec (the rest of a spec is the service's business); each call has a deadline of ``call_timeout_s`` and
    UNAVAILABLE / DEADLINE_EXCEEDED are retried with backoff for ``retry_budget_s`` before the stage fails (a
    rerun resumes: groups already judged are kept).

    Raises:
        pydantic.ValidationError: ``target`` is not ``HOST:PORT``, a judge spec is not a
            :class:`~mascot.core.config.JudgeSpec`, or two judges share a name.
    """

    judges: list[dict] = Field(default_factory=lambda: [{"name": "local"}], min_length=1)
    max_retries: int = Field(2, ge=0, le=10)
    #: gRPC address (HOST:PORT) of a running JudgeService; empty judges in-process.
    target: str = ""
    #: Deadline of each JudgeCandidates call to ``target``, in seconds.
    call_timeout_s: float = Field(120.0, gt=0, le=3600)
    #: Seconds one call to ``target`` is retried (UNAVAILABLE, DEADLINE_EXCEEDED) before the stage fails.
    retry_budget_s: float = Field(300.0, ge=0, le=86400)

    @field_validator("judges")
    @classmethod
    def _judges(cls, v: list[dict]) -> list[dict]:
        from mascot.core.config import JudgeSpec

        names = []
        for i, spec in enumerate(v):
            try:
                names.append(JudgeSpec(**spec).name)
            except (ValidationError, TypeError) as e:
                why = "; ".join(f"{'.'.join(str(x) for x in err['loc'])}: {err['msg']}" for err in e.errors()) \
                    if isinstance(e, ValidationError) else str(e)
                raise ValueError(f"judges[{i}] is not a judge spec ({why})") from None
        if len(set(names)) != len(names):
            raise ValueError(f"judge names must be unique, got {', '.join(names)}")
        return v  # kept as written: the stage's config digest is unchanged

    @field_validator("target")
    @classmethod
    def _target(cls, v: str) -> str:
        from mascot.core.retry import target_problem

        v = v.strip()
        problem = target_problem(v) if v else None
        if problem:
            raise ValueError(f"{problem}; the address of a running JudgeService, or empty to judge in-process")
        return v


class PairsConfig(_S):
    """Pair building: margin delta 0.5, at most 4 per group, largest margin first."""

    delta: float = Field(0.5, ge=0.0, le=4.0)
    max_per_group: int = Field(4, ge=1, le=64)
    #: Fraction of groups (by hash) held out to measure the reward model and its mu, sigma.
    heldout_fraction: float = Field(0.2, gt=0.0, lt=1.0)


class PersonaRmConfig(_S):
    """Reward model: Bradley-Terry with TRL RewardTrainer."""

    #: Base of the reward model (a causal-LM or classifier directory / hub id); empty = the policy's base model.
    base_model: str = ""
    epochs: float = Field(1.0, gt=0)
    lr: float = Field(1e-4, gt=0)
    batch_size: int = Field(8, ge=1)
    #: Pairs per forward/backward pass; ``batch_size`` is reached by gradient accumulation (the same update,
    #: about micro_batch_size/batch_size of the activation memory). 0 = ``batch_size`` (no accumulation).
    micro_batch_size: int = Field(0, ge=0)
    max_length: int = Field(1024, ge=32)
    #: Recompute each layer's activations in the backward pass instead of keeping them from the forward pass
    #: (transformers gradient checkpointing): a fraction of the activation memory for about one more forward pass.
    #: Left out of every dump, so of every stage key: it changes a step's memory, not the model.
    gradient_checkpointing: bool = Field(False, exclude=True)

    @model_validator(mode="after")
    def _micro_divides(self) -> "PersonaRmConfig":
        m = self.micro_batch_size
        if m and (m > self.batch_size or self.batch_size % m):
            raise ValueError(f"micro_batch_size {m} must divide batch_size {self.batch_size}")
        return self


class GenerationConfig(_S):
    """How GRPO generates its completions: TRL's ``transformers`` generate in the training process (default), or TRL's
    vLLM integration (``use_vllm``), colocated in the training processes or on a separate ``trl vllm-serve`` server.

    ``vllm`` needs a CUDA GPU (checked when the config is loaded: TRL syncs the trained weights into vLLM after each
    step, which the CPU build of vLLM does not support, and server mode moves them over NCCL).
    """

    #: ``transformers`` (``model.generate`` in the training process) or ``vllm`` (TRL ``use_vllm``).
    backend: Literal["transformers", "vllm"] = "transformers"
    #: ``colocate``: a vLLM engine inside each training process (shares its GPU); ``server``: a ``trl vllm-serve``
    #: server on GPUs of its own, reached at ``vllm_server_base_url`` or ``vllm_server_host``:``vllm_server_port``.
    vllm_mode: Literal["colocate", "server"] = "colocate"
    #: Host of the vLLM server (server mode); ignored when ``vllm_server_base_url`` is set.
    vllm_server_host: str = "0.0.0.0"
    #: Port of the vLLM server (server mode; 1-65535).
    vllm_server_port: int = Field(8000, ge=1, le=65535)
    #: Base URL of the vLLM server (``http://host:port``, server mode); empty = host and port above.
    vllm_server_base_url: str = Field("", pattern=r"^(https?://[^\s/]+(/\S*)?)?$")
    #: Seconds to wait for the vLLM server to answer at start (server mode).
    vllm_server_timeout_s: float = Field(240.0, gt=0, le=3600)
    #: Share of each GPU's memory the colocated vLLM engine may take (colocate mode; 0-1, the rest trains).
    vllm_gpu_memory_utilization: float = Field(0.3, gt=0.0, le=1.0)
    #: GPUs one colocated vLLM engine spans (colocate mode); must divide the number of training processes.
    vllm_tensor_parallel_size: int = Field(1, ge=1, le=64)


class GrpoOptimConfig(_S):
    """Optimiser settings shared by the persona and director GRPO stages (TRL 1.16 ``GRPOConfig`` semantics)."""

    #: Generation backend of the GRPO rollouts (``transformers`` or ``vllm``).
    generation: GenerationConfig = GenerationConfig()

    #: Samples per optimiser step (per-device batch); must be divisible by the group size.
    batch_size: int = Field(16, ge=2)
    lr: float = Field(1e-5, gt=0)
    epochs: float = Field(1.0, gt=0)
    #: Optimiser steps; -1 runs ``epochs`` instead (0 is not allowed).
    max_steps: int = Field(-1, ge=-1)
    beta: float = Field(0.0, ge=0.0)
    loss_type: Literal["grpo", "bnpo", "dr_grpo", "dapo"] = "dapo"
    scale_rewards: Literal["group", "batch", "none"] = "group"
    #: Seconds a reward computation may take before the sample is masked (reward None) and counted.
    reward_timeout_s: float = Field(60.0, gt=0)
    #: Recompute each layer's activations in the loss's backward pass instead of keeping them (transformers gradient
    #: checkpointing; TRL turns it off while generating, and the director's sampler generates in eval mode with its
    #: cache): a fraction of the activation memory of a step for about one more forward pass. Left out of every dump,
    #: so of every stage key: it changes a step's memory, not what is trained.
    gradient_checkpointing: bool = Field(False, exclude=True)
    seed: int = 0


class PublishTarget(_S):
    """Where a run publishes its adapters as ``staged``."""

    #: Address (host:port) of the control plane's AdapterService (``control.port``, the chart's ``<release>-control``
    #: Service; the name ``gateway`` is kept from when the gateway hosted it), which must be able to read the run
    #: directory (a shared volume); the token (role operator or above) comes from ``token_file``, else
    #: MASCOT_ADMIN_TOKEN. Empty writes straight into ``store``.
    gateway: str = ""
    #: A mounted file holding the admin token used with ``gateway``; empty = the variable MASCOT_ADMIN_TOKEN.
    token_file: str = ""
    #: Store root (any local path); empty = ``<out>/adapters``.
    store: str = ""


class RunConfig(_S):
    """What every training run names: its id, base model, mode, personas, window, data split and LoRA shape."""

    run_id: str = Field("run", pattern=r"^[a-z0-9][a-z0-9-]{0,40}$")
    #: Base model: empty = the default real model (SmolLM2-135M-Instruct), ``tiny`` = the tiny random Qwen3 built at
    #: tiny_dir, else a directory or hub id.
    model: str = ""
    tiny_dir: Path = Path(".cache/tiny-qwen3")
    mode: Literal["support", "meeting"] = "support"
    #: Active persona ids; empty = every persona of the mode.
    personas: list[str] = Field(default_factory=list)
    max_model_len: int = Field(2048, ge=128)
    data: DataConfig = DataConfig()
    lora: LoraConfig = LoraConfig()


class ConfigError(ValueError):
    """The configuration cannot run; the message lists every problem found."""


def read_config(path: str | Path, cls: type, check: Any) -> Any:
    """Read YAML at ``path`` into ``cls`` and run ``check(cfg) -> list[str]``; every problem in one ConfigError.

    Raises:
        ConfigError: missing file, bad YAML or encoding, not a mapping, unknown key, bad value, or problems found.
    """
    from mascot.core.config import ConfigFileError, check_config_file

    p = Path(path)
    try:  # the one config-file check of every MASCOT config (missing, directory, YAML, UTF-8, mapping)
        check_config_file(p, "run_id, model, data, ...")
    except (FileNotFoundError, ConfigFileError) as e:
        raise ConfigError(str(e)) from None
    raw = yaml.safe_load(p.read_text(encoding="utf-8")) or {}
    try:
        cfg = cls(**raw)
    except ValidationError as e:
        lines = [f"{'.'.join(str(x) for x in err['loc'])}: {err['msg']}" for err in e.errors()]
        raise ConfigError(f"{p}: " + "; ".join(lines)) from None
    problems = check(cfg)
    if problems:
        raise ConfigError(f"{p}: " + "; ".join(problems))
    return cfg


def generation_problems(section: str, gen: GenerationConfig, cuda_available: bool | None = None) -> list[str]:
    """Problems of ``<section>.generation`` on this machine (empty when it can run).

    Args:
        section: The config section holding ``gen`` (``persona_grpo`` or ``director_grpo``), for the messages.
        gen: The generation settings.
        cuda_available: Whether a CUDA GPU is usable; None asks ``torch.cuda.is_available()``.

    Returns:
        One message when ``backend`` is ``vllm`` without a CUDA GPU: TRL's vLLM generation loads the trained weights
        into vLLM after every optimiser step (colocate: into vLLM's model runner, which the CPU build of vLLM cannot
        reload; server: over NCCL), so it runs on CUDA GPUs only.
    """
    if gen.backend != "vllm":
        return []
    if cuda_available is None:
        import torch

        cuda_available = torch.cuda.is_available()
    if cuda_available:
        return []
    return [f"{section}.generation.backend is vllm but this machine has no CUDA GPU: TRL's vLLM generation "
            f"({gen.vllm_mode} mode) copies the trained weights into vLLM after every step, which needs CUDA (the "
            "CPU build of vLLM cannot reload weights; server mode sends them over NCCL); use "
            f"{section}.generation.backend: transformers on this machine"]


def common_problems(cfg: Any) -> list[str]:
    """Checks shared by the phase 1 and phase 2 configs: persona ids, situations file and split, model, LoRA rank."""
    from mascot.core.personas import PersonaCatalog

    out = []
    catalog = PersonaCatalog.load()
    unknown = [p for p in cfg.personas if p not in catalog.cards]
    if unknown:
        out.append(f"unknown persona id(s) {unknown}; known: {sorted(catalog.cards)}")
    if len(set(cfg.personas)) != len(cfg.personas):
        out.append(f"personas lists an id twice: {cfg.personas}")
    in_mode = {c.id for c in catalog.in_set(cfg.mode)}
    other = [p for p in cfg.personas if p in catalog.cards and p not in in_mode]
    if other:
        out.append(f"persona(s) {other} are not in the {cfg.mode} set; {cfg.mode} personas: {sorted(in_mode)}")
    if not cfg.data.situations.is_file():
        out.append(f"data.situations {cfg.data.situations} does not exist (a relative path is read from the current "
                   "directory; `mascot data split FILE --out runs/splits` writes the split files the CPU recipes read)")
    looks_like_path = cfg.model.startswith(("/", "./", "../", "~")) or Path(cfg.model).exists()
    if cfg.model and cfg.model != "tiny" and (looks_like_path or cfg.model.count("/") != 1) \
            and not Path(cfg.model).expanduser().is_dir():
        out.append(f"model {cfg.model} is neither a model directory, a hub id (org/name) nor 'tiny'")
    if cfg.data.situations.is_file() and not unknown:
        from mascot_training.common.data import training_situations

        try:
            training_situations(cfg)
        except (ValueError, OSError) as e:
            out.append(str(e))
    for section in ("persona_grpo", "director_grpo", "sft"):
        if getattr(getattr(cfg, section, None), "max_steps", -1) == 0:
            out.append(f"{section}.max_steps is 0: use -1 to train by epochs, or a positive number of steps")
    if cfg.lora.r > 64:
        out.append("lora.r above 64 exceeds the serving limit (max_lora_rank 64)")
    import os

    if cfg.publish.gateway and not cfg.publish.token_file and not os.environ.get("MASCOT_ADMIN_TOKEN", "").strip():
        out.append("publish.gateway is set but neither publish.token_file nor MASCOT_ADMIN_TOKEN holds a token: the "
                   "control plane's AdapterService needs an admin token (mount it as a file)")
    elif cfg.publish.token_file and not os.path.isfile(cfg.publish.token_file):
        out.append(f"publish.token_file {cfg.publish.token_file} is not a readable file")
    return out


def active_personas(cfg: Any) -> list[str]:
    """The persona ids this run trains (config order, or the mode's shipped set)."""
    from mascot.core.personas import PersonaCatalog

    return list(cfg.personas) or [c.id for c in PersonaCatalog.load().in_set(cfg.mode)]
