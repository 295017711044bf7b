"""Phase 1 (persona-aware behavioural alignment) run configuration.

One YAML file configures every stage of :data:`STAGES`; the sections shared with phase 2 (data split, LoRA,
judging, pairs, reward-model recipe, GRPO optimiser, publish target) are :mod:`mascot_training.common.config`'s.
Unknown keys are rejected and :func:`validate` checks everything that can be checked before heavy work and returns
all problems at once.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, model_validator

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

STAGES = ("sft_data", "sft", "sample", "judge", "pairs", "persona_rm", "persona_grpo", "publish")


class SftDataConfig(_S):
    """The SFT base policy's data (stage ``sft_data``, :mod:`mascot_training.persona.sft_data`): candidates sampled
    under a teacher prompt and the plain serving prompt, kept when they do the card's moves."""

    enabled: bool = False
    #: Training situations sampled: the first N of the training split (None: the same ``data.limit`` as the
    #: ``sample`` stage). SFT wants more situations than GRPO's groups, and costs less per situation.
    limit: int | None = Field(None, ge=1)
    #: Candidates per context under the teacher prompt (serving prompt + move hint + two examples).
    k_teacher: int = Field(3, ge=0, le=32)
    #: Candidates per context under the plain serving prompt (all of them for a persona without a teacher hint).
    k_plain: int = Field(1, ge=0, le=32)
    #: Replies kept per context (the best eligible ones, distinct openers).
    keep: int = Field(1, ge=1, le=8)
    #: Share of the situations where every persona also answers as the second agent, after another persona's reply.
    mid_dialogue_share: float = Field(0.5, ge=0.0, le=1.0)
    #: Share of the contexts under the fallback directive; the others get an Action and Tone of the director's
    #: vocabulary.
    fallback_share: float = Field(0.3, ge=0.0, le=1.0)
    #: Keep only candidates that do their card's moves (a required move, no forbidden one). False keeps any
    #: delivered candidate within the card's length (smoke runs on the tiny random model, which never makes a move).
    require_moves: bool = True
    #: Most share of a persona's kept replies one four-word opener may take.
    max_opener_share: float = Field(0.15, gt=0.0, le=1.0)
    #: Decoding of the candidates: near serving's (0.6 / 0.9, frequency penalty 0.3) but a little hotter, so a pool
    #: holds different replies.
    temperature: float = Field(0.8, gt=0.0, le=2.0)
    top_p: float = Field(0.95, gt=0.0, le=1.0)
    max_tokens: int = Field(48, ge=8, le=4096)
    repetition_penalty: float = Field(1.0, gt=0.0, le=10.0)
    frequency_penalty: float = Field(0.3, ge=-2.0, le=2.0)
    #: Contexts sampled at once (their candidates batch together in the engine).
    concurrency: int = Field(4, ge=1, le=64)
    seed: int = 0
    #: Teacher hints file (``personas: {id: {hint, examples: [{user, reply}]}}``); None = the bundled one.
    hints: Path | None = None

    @model_validator(mode="after")
    def _some(self) -> "SftDataConfig":
        if self.k_teacher + self.k_plain < 1:
            raise ValueError("k_teacher + k_plain must be at least 1")
        return self


class SftConfig(_S):
    """SFT of the candidate policy: one LoRA on the base model (off by default), or one per persona."""

    enabled: bool = False
    #: One LoRA per persona, each trained on that persona's rows only (GRPO then starts each persona from its own,
    #: and publish serves each). False: one shared LoRA for every persona, which leaves the personas to the card in
    #: the prompt (a 135M model's personas converged under it: docs/training.md).
    per_persona: bool = False
    #: JSONL of {"persona_id", "messages": [{"role", "content"}, ...]} (chat format; the last message is the
    #: assistant reply to learn). Unset: the rows of the ``sft_data`` stage when it is enabled, else a tiny set built
    #: from the persona cards (smoke).
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
    #: Take L_max from the speaking card's ``max_answer_words`` (60 for the Listener, 80 for the others) instead of
    #: ``l_max``.
    l_max_from_card: bool = False


class MoveRewardConfig(_S):
    """R_move: ``+required`` when a reply shows one of its card's required moves, ``-forbidden`` when it shows a
    forbidden one (:func:`mascot_training.common.rewards.move_reward`)."""

    required: float = Field(1.0, ge=0.0, le=10.0)
    forbidden: float = Field(1.0, ge=0.0, le=10.0)


class CollapseStopConfig(_S):
    """Stop a persona's GRPO when one opener takes over its completions (template collapse); off by default."""

    enabled: bool = False
    #: Delivered completions looked at (the most recent ones).
    window: int = Field(64, ge=8, le=4096)
    #: Share of the window one four-word opener may reach before training stops.
    max_opener_share: float = Field(0.5, gt=0.0, le=1.0)


class GrpoConfig(GrpoOptimConfig):
    """GRPO of each persona's LoRA."""

    #: False skips GRPO: the publish stage then gates and publishes the SFT adapter (``sft``) as every persona's
    #: adapter (the SFT policy alone, e.g. to measure what SFT does before GRPO).
    enabled: bool = True
    num_generations: int = Field(8, ge=2, le=64)
    max_completion_length: int = Field(512, ge=4)
    temperature: float = Field(1.0, gt=0.0)
    #: Nucleus sampling and repetition penalty of the rollouts (TRL ``top_p``, ``repetition_penalty``; set them near
    #: serving's ``speaker`` section so the policy is trained on the replies serving samples).
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    repetition_penalty: float = Field(1.0, gt=0.0, le=10.0)
    w_rm: float = 1.0
    w_format: float = 1.0
    format: FormatRewardConfig = FormatRewardConfig()
    #: Weight of R_move (the card's moves); 0 leaves it out (the paper's reward).
    w_move: float = Field(0.0, ge=0.0, le=10.0)
    move: MoveRewardConfig = MoveRewardConfig()
    #: Subtracted from a completion that used the whole token budget (``max_completion_length``) without ending: its
    #: unfinished tail is cut before serving shows it, and the tail is where a small model puts its question.
    budget_penalty: float = Field(0.0, ge=0.0, le=10.0)
    collapse_stop: CollapseStopConfig = CollapseStopConfig()
    #: Prompt mix of the rollouts: the share under the fallback directive (the rest carry an Action and Tone of the
    #: director's vocabulary, :data:`mascot_training.persona.sft_data.ACTIONS` / ``TONES``), and the share of the
    #: situations where the persona answers after another persona's reply (a sampled candidate of the sample stage).
    #: 1.0 and 0.0 give the first-reply, fallback-only prompts of earlier versions.
    fallback_share: float = Field(1.0, ge=0.0, le=1.0)
    mid_dialogue_share: float = Field(0.0, ge=0.0, le=1.0)
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


class PersonaPairsConfig(PairsConfig):
    """Phase 1's pairs: within-persona pairs from the judge's scores, plus cross-persona pairs."""

    #: Cross-persona pairs per (context, persona P) group: P's best reply (its card's moves first, then the judge's
    #: mean) chosen over another persona's reply to the same context, both scored with P's card, so the reward model
    #: sees the persona signal the within-persona pairs cannot carry. 0 = within-persona pairs only.
    cross_per_group: int = Field(0, ge=0, le=16)


class PhaseOneRmConfig(PersonaRmConfig):
    """The persona reward model, with the bar it must clear to be used by GRPO."""

    #: Use the reward model in GRPO only when the lower end of its held-out pairwise accuracy's 95% Wilson interval
    #: is above 0.5 (better than chance); otherwise GRPO runs on the rule-based reward alone (R_format, R_move and
    #: the budget penalty) and both manifests say so. False always uses it.
    require_better_than_chance: bool = False


class PersonaAlignmentConfig(RunConfig):
    """The whole phase 1 run.

    Raises:
        pydantic.ValidationError: unknown key or bad value (the field path is named).
    """

    run_id: str = Field("phase1", pattern=r"^[a-z0-9][a-z0-9-]{0,40}$")
    sft_data: SftDataConfig = SftDataConfig()
    sft: SftConfig = SftConfig()
    sample: SampleConfig = SampleConfig()
    judge: JudgeStageConfig = JudgeStageConfig()
    pairs: PersonaPairsConfig = PersonaPairsConfig()
    persona_rm: PhaseOneRmConfig = PhaseOneRmConfig()
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
    if cfg.sft_data.enabled and cfg.sft_data.hints is not None and not cfg.sft_data.hints.is_file():
        out.append(f"sft_data.hints {cfg.sft_data.hints} does not exist")
    if cfg.sft_data.enabled and not cfg.sft.enabled:
        out.append("sft_data.enabled needs sft.enabled: the data it builds is only read by the sft stage")
    out += generation_problems("persona_grpo", g.generation)
    if not g.enabled and not cfg.sft.enabled:
        out.append("persona_grpo.enabled: false publishes the SFT adapter, so it needs sft.enabled")
    return out
