"""Phase 1 (persona-aware behavioural alignment) run configuration.

One YAML file configures every stage of :data:`STAGES`; the sections shared with phase 2 (data split, LoRA,
judging, pairs, reward-model recipe, GRPO optimiser, publish target) are :mod:`mascot_training.common.config`'s.
Unknown keys are rejected and :func:`validate` checks everything that can be checked before heavy work and returns
all problems at once.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field

from mascot.core.config import GuardConfig

from mascot_training.common.config import (
    GrpoOptimConfig,
    JudgeStageConfig,
    PairsConfig,
    PersonaRmConfig,
    PublishTarget,
    RunConfig,
    _S,
    common_problems,
    generation_problems,
    read_config,
)

STAGES = ("sft", "sample", "judge", "pairs", "persona_rm", "persona_grpo", "publish")


class SftConfig(_S):
    """Optional SFT of the candidate policy on user dialogue data (off by default)."""

    enabled: bool = False
    #: JSONL of {"persona_id", "messages": [{"role", "content"}, ...]} (chat format; the last message is the
    #: assistant reply to learn). Empty with enabled: the stage builds a tiny set from the persona cards (smoke).
    data: Path | None = None
    epochs: float = Field(1.0, gt=0)
    max_steps: int = Field(-1, ge=-1)
    lr: float = Field(2e-4, gt=0)
    batch_size: int = Field(4, ge=1)


class SampleConfig(_S):
    """Candidate sampling: K per (context, persona) at T 1.0, top-p 0.95."""

    k: int = Field(8, ge=2, le=64)
    temperature: float = Field(1.0, gt=0.0, le=2.0)
    top_p: float = Field(0.95, gt=0.0, le=1.0)
    max_tokens: int = Field(128, ge=8, le=4096)
    seed: int = 0
    #: Groups sampled at once (their K candidates each): the engine batches them into one decode step. Each
    #: group's seed is fixed by its position, so a rerun samples the same groups (texts may differ in the last
    #: digits of batched arithmetic).
    concurrency: int = Field(1, ge=1, le=64)
    #: Sampling penalties of the candidates: the serving speaker's (``speaker`` section) defaults, so the judge and
    #: the reward model see the replies serving would produce (vLLM's ``repetition_penalty`` / ``frequency_penalty``).
    repetition_penalty: float = Field(1.0, gt=0.0, le=10.0)
    frequency_penalty: float = Field(0.3, ge=-2.0, le=2.0)


class FormatRewardConfig(_S):
    """R_format of the docs: -1 without one non-empty think block + answer, else a verbosity ramp."""

    lam: float = Field(0.5, ge=0.0)
    l_max: int = Field(80, ge=1)
    #: The policy has a thinking mode (Qwen3) and must open with a non-empty think block. False for a model
    #: without one (SmolLM2, the default): the completion is the answer; a think tag in it or an empty answer
    #: scores -1, otherwise only the verbosity ramp applies.
    think: bool = True


class GrpoConfig(GrpoOptimConfig):
    """GRPO of each persona's LoRA."""

    num_generations: int = Field(8, ge=2, le=64)
    max_completion_length: int = Field(512, ge=4)
    temperature: float = Field(1.0, gt=0.0)
    w_rm: float = 1.0
    w_format: float = 1.0
    format: FormatRewardConfig = FormatRewardConfig()
    #: Hold the prompts of the groups the pairs stage held out for the reward model (``pairs.heldout_fraction``)
    #: out of GRPO too, and score the policy on them before and after training (``heldout_reward_before`` /
    #: ``_after`` in the stage manifest). False trains on every group and measures nothing.
    heldout_eval: bool = True
    #: Completions sampled per held-out prompt for that measure (same seeds before and after).
    heldout_samples: int = Field(4, ge=1, le=64)
    #: Reward of a completion serving would refuse (the run's ``guard`` section: its first sentence echoes the
    #: prompt, loops, copies an earlier turn, is too short or unfinished). The other completions are scored on the
    #: text serving would deliver (cut back to its last passing sentence); ẑ is standardised and R_format >= -1, so
    #: -2 ranks a refusal below nearly every delivered reply. Guard off: completions are scored as generated.
    refused_reward: float = Field(-2.0, ge=-100.0, le=100.0)


class GateConfig(_S):
    """Evaluation gate before publish: refuse adapters whose replies collapsed in length or diversity, loop, or copy
    the persona's prompt or card."""

    prompts: int = Field(8, ge=1)
    max_tokens: int = Field(64, ge=4)
    min_mean_words: float = Field(2.0, ge=0.0)
    min_distinct_2: float = Field(0.2, ge=0.0, le=1.0)
    #: Most share of replies that loop (a word 4-gram three times, or a repeated sentence); the base model loops now
    #: and then at 48 tokens, so not 0.
    max_loop_rate: float = Field(0.25, ge=0.0, le=1.0)
    #: Most share of replies that copy 8 words in a row of the persona's prompt or card.
    max_echo_rate: float = Field(0.25, ge=0.0, le=1.0)


class PublishConfig(PublishTarget):
    """Publish persona adapters, after the gate that refuses collapsed replies."""

    gate: GateConfig = GateConfig()


class PersonaAlignmentConfig(RunConfig):
    """The whole phase 1 run.

    Raises:
        pydantic.ValidationError: unknown key or bad value (the field path is named).
    """

    run_id: str = Field("phase1", pattern=r"^[a-z0-9][a-z0-9-]{0,40}$")
    sft: SftConfig = SftConfig()
    sample: SampleConfig = SampleConfig()
    judge: JudgeStageConfig = JudgeStageConfig()
    pairs: PairsConfig = PairsConfig()
    persona_rm: PersonaRmConfig = PersonaRmConfig()
    persona_grpo: GrpoConfig = GrpoConfig()
    publish: PublishConfig = PublishConfig()
    #: Serving's reply checks (same keys and defaults as the serving config's ``guard`` section): the sampled
    #: candidates are the replies serving would deliver (refused ones are not judged) and GRPO scores completions on
    #: their delivered text (``persona_grpo.refused_reward`` for a refusal). ``enabled: false`` takes text as
    #: generated.
    guard: GuardConfig = GuardConfig()


def load(path: str | Path) -> PersonaAlignmentConfig:
    """Read and validate a phase 1 YAML run config (relative paths resolve against the current directory).

    Raises:
        ConfigError: missing file, bad YAML, unknown key, bad value, or any problem :func:`validate` finds.
    """
    return read_config(path, PersonaAlignmentConfig, validate)


def validate(cfg: PersonaAlignmentConfig) -> list[str]:
    """Every problem that would stop the run, as messages (empty when the config can run)."""
    out = []
    g = cfg.persona_grpo
    if g.batch_size % g.num_generations:
        out.append(f"persona_grpo.batch_size ({g.batch_size}) must be divisible by persona_grpo.num_generations "
                   f"({g.num_generations}): each optimiser step takes whole groups")
    out += common_problems(cfg)
    if cfg.sft.enabled and cfg.sft.data is not None and not cfg.sft.data.is_file():
        out.append(f"sft.data {cfg.sft.data} does not exist")
    out += generation_problems("persona_grpo", g.generation)
    return out
