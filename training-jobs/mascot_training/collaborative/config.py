"""Phase 2 (collaborative dialogue optimisation) run configuration.

One YAML file configures the chain ``speakers → rollouts → group_rm → director_grpo → publish``. The section
``phase2`` carries the algorithm's named defaults (``phase2.num_generations``, ``phase2.suffix_agent_turns``,
``phase2.eta``, ``phase2.diversity``, ``phase2.min_distinct``, ``phase2.invalid_reward``,
``phase2.group_reward.source``); the other sections reuse the shapes both phases share
(:mod:`mascot_training.common.config`: data split, LoRA, judge, pairs, reward-model recipe, GRPO optimiser, publish
target).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from mascot.core.adapters.store import AdapterStore, backend_errors, open_store
from mascot.core.config import DirectorDecoding, GuardConfig
from mascot_training.common.config import (
    GrpoOptimConfig,
    JudgeStageConfig,
    PairsConfig,
    PersonaRmConfig,
    PublishTarget,
    RunConfig,
    _S,
    active_personas,
    common_problems,
    generation_problems,
    read_config,
)

STAGES = ("speakers", "rollouts", "group_rm", "director_grpo", "publish")


class SpeakersConfig(_S):
    """The frozen speakers: phase 1 persona adapters, or minimal tiny ones made in a quick step."""

    #: A phase 1 adapter store (``DIR/adapters`` of ``mascot train persona-alignment``) as a local path,
    #: ``file:///abs/path``, ``pvc://<claim>/<path>`` or ``s3://<bucket>/<prefix>``: the latest live version of each
    #: active persona is used (stable, else the highest version not retired). Empty with no ``adapters``: the
    #: ``speakers`` stage makes minimal LoRAs.
    store: str = ""
    #: Explicit ``{persona_id: adapter directory}``; wins over ``store`` for the personas it names.
    adapters: dict[str, Path] = Field(default_factory=dict)
    #: An active persona with no adapter while others have one (e.g. phase 1's publish gate refused it): ``error``
    #: stops the run; ``base`` lets it speak with the base model, as serving does for a persona without a stable
    #: version (the speakers manifest records its source as ``base``).
    missing: Literal["error", "base"] = "error"
    max_tokens: int = Field(96, ge=4, le=4096)
    temperature: float = Field(0.7, ge=0.0, le=2.0)
    top_p: float = Field(0.95, gt=0.0, le=1.0)
    #: Serving's speaker penalties (the ``speaker`` section's defaults), applied to the simulated user too as serving
    #: does: a CTRL-style penalty on tokens already in the prompt or reply (1 = off) and one per earlier occurrence
    #: in the reply (vLLM's ``repetition_penalty`` / ``frequency_penalty``).
    repetition_penalty: float = Field(1.0, gt=0.0, le=10.0)
    frequency_penalty: float = Field(0.3, ge=-2.0, le=2.0)


class UserSimConfig(_S):
    """The frozen simulated user: the base model without adapters."""

    #: MBTI type (four letters) given to the user simulator; empty = none.
    personality: str = ""
    max_tokens: int = Field(64, ge=4, le=1024)
    temperature: float = Field(0.8, ge=0.0, le=2.0)
    top_p: float = Field(0.95, gt=0.0, le=1.0)


class TeamRewardConfig(_S):
    """Weights of the team reward (``group_reward.source: team``; :func:`mascot_training.common.rewards.team_reward`):
    R_team = (w_m·C + w_u·U + w_r·(1 − D')) / (w_m + w_u + w_r) ∈ [0, 1], C the share of the block's agent turns
    that add a card move no earlier turn of the block showed, U their relevance to the user's latest message, D' the
    redundancy between them above ``redundancy_floor`` (MiniLM cosines). Complementary moves weigh most: they are
    what the paper's collective criteria ask of a team and what ``moves_per_round`` measures; the two cosines are
    bounded proxies."""

    #: w_m: complementary contributions (distinct card moves, :func:`mascot.core.moves.round_moves`).
    w_moves: float = Field(1.0, ge=0.0, le=1.0)
    #: w_u: relevance to the user (cosine of each turn to the latest user message; an echo of it counts 0).
    w_relevance: float = Field(0.5, ge=0.0, le=1.0)
    #: w_r: no redundancy between the block's turns: 1 − D', D' = clip((D − d₀)/(1 − d₀), 0, 1) of their mean
    #: pairwise cosine D.
    w_redundancy: float = Field(0.5, ge=0.0, le=1.0)
    #: d₀: the mean pairwise cosine up to which turns count as not redundant (turns answering one message share its
    #: topic; the metrics judge's best overlap score reaches the same cosine).
    redundancy_floor: float = Field(0.5, ge=0.0, lt=1.0)

    @model_validator(mode="after")
    def _some_weight(self) -> "TeamRewardConfig":
        if self.w_moves + self.w_relevance + self.w_redundancy <= 0:
            raise ValueError("at least one team reward weight must be above 0")
        return self


class GroupRewardConfig(_S):
    """R_group: a group reward model (phase 1 recipe on judge-scored blocks), the judge directly, or the team reward
    (card moves and MiniLM cosines of the block, no model trained: ``team``)."""

    #: ``rm``: ẑ of the group reward model (the paper's); ``judge``: (s − 1)/4 of the judge's mean collective score;
    #: ``team``: :class:`TeamRewardConfig`'s measured collective criteria (our addition; docs/method.md). ``judge``
    #: and ``team`` need no blocks and no ``group_rm`` training.
    source: Literal["rm", "judge", "team"] = "rm"
    #: Block continuations per prefix scored by the judge for the group RM.
    k: int = Field(8, ge=2, le=64)
    judge: JudgeStageConfig = JudgeStageConfig()
    pairs: PairsConfig = PairsConfig()
    rm: PersonaRmConfig = PersonaRmConfig()
    team: TeamRewardConfig = TeamRewardConfig()


class Phase2Config(_S):
    """The algorithm of the docs, each default a setting."""

    #: G: suffixes per prefix (range 4-8; 4 in the CPU profile).
    num_generations: int = Field(8, ge=2, le=64)
    #: N: agent turns per suffix (user turns do not count).
    suffix_agent_turns: int = Field(4, ge=1, le=32)
    #: Agent turns of the prefix after the user's opening, drawn uniformly per prefix.
    prefix_agent_turns: list[int] = Field(default_factory=lambda: [0, 1, 2, 3], min_length=1)
    #: Prefixes built per training situation.
    prefixes_per_situation: int = Field(1, ge=1, le=64)
    #: p: probability that the simulated user speaks after an agent turn (seeded Bernoulli draw).
    user_speak_prob: float = Field(0.5, ge=0.0, le=1.0)
    #: η: weight of the diversity indicator I_div.
    eta: float = Field(0.5, ge=0.0)
    #: How the diversity indicator I_div reads a rollout (:func:`mascot_training.common.rewards.i_div`):
    #: ``new_persona`` (our deviation, docs/method.md) = +1 when the suffix gives a turn to a persona not heard in the
    #: prefix, else -1; ``distinct`` (the paper's) = +1 when at least ``min_distinct`` distinct personas spoke in the
    #: suffix, else -1. Under the rest rule (serving's ``rest_turns`` = 2) ``distinct`` is +1 for every valid suffix of
    #: 3 agent turns or fewer, and ``new_persona`` can be -1 only after a prefix of 3 or more agent turns.
    diversity: Literal["new_persona", "distinct"] = "new_persona"
    #: ``distinct`` only: I_div = +1 when at least this many distinct personas spoke among the suffix's agent turns.
    min_distinct: int = Field(2, ge=1)
    #: β: weight of the usage-balance term B (:func:`mascot_training.common.rewards.usage_balance`; our addition,
    #: docs/method.md): the suffix's personas scored by how far below their 1/K share of the agent turns they are
    #: among the last ``balance_window`` agent turns of the GRPO stage's rollouts. 0 = the paper's reward.
    balance: float = Field(0.0, ge=0.0)
    #: Agent turns of the stage's latest valid rollouts that B counts (in training order; a resumed stage starts empty).
    balance_window: int = Field(64, ge=1, le=100_000)
    #: R of a rollout ended by an invalid directive.
    invalid_reward: float = -2.0
    group_reward: GroupRewardConfig = GroupRewardConfig()
    #: Prefixes the ``rollouts`` stage runs at once (their turns share the engine's batches; on a CPU one prefix's
    #: four blocks leave most of a decode step idle). A speed setting: results do not depend on it beyond the
    #: engine's batching, and a resumed stage may use another value.
    rollout_concurrency: int = Field(4, ge=1, le=64)
    seed: int = 0

    @model_validator(mode="after")
    def _prefix_turns(self) -> "Phase2Config":
        if any(k < 0 or k > 32 for k in self.prefix_agent_turns):
            raise ValueError("prefix_agent_turns entries must be in 0..32")
        return self


class DirectorPolicyConfig(_S):
    """The director policy being trained: sampling of directives during rollouts and its starting point."""

    #: A director LoRA to continue (e.g. the stable director from the store); empty = a fresh LoRA on the base.
    init_adapter: str = ""
    #: Tokens per directive (a directive cut here is usually invalid and ends the rollout).
    max_tokens: int = Field(64, ge=8, le=2048)
    #: Temperature and top-p of every directive of the run: the policy's in GRPO and in the measures (first-decision
    #: shares, held-out reward) and the serving director's (prefixes, group-reward blocks). The serving config's
    #: ``director.decoding`` (same keys, same defaults): the director is trained and measured as it is served.
    #: GRPO needs samples, so the temperature must be above 0.
    decoding: DirectorDecoding = DirectorDecoding()
    #: The serving cap: a directive giving a persona more turns in a row is invalid.
    max_consecutive_turns: int = Field(2, ge=1, le=16)
    #: How the policy's directives are sampled in GRPO and measured: ``serving`` = under serving's grammar for the
    #: turn (the personas it may pick, an Action opening with a fresh verb, the persona's tone words) and refused when
    #: serving's checks would refuse a first attempt (rest, cap, content), as the served director decides, with the
    #: loss on the tokens the grammar left a choice for; ``free`` = unconstrained, only parsed and capped (a small
    #: model then mostly learns the format). ``serving`` needs the transformers generation backend.
    sampling: Literal["serving", "free"] = "serving"
    #: Optional warm start of a fresh director LoRA before GRPO (our addition; 0 = off): SFT steps on the serving
    #: director's decisions recorded by the rollouts stage (behaviour cloning of the constrained director), so an
    #: untrained small director writes valid directives unconstrained often enough for GRPO to have a signal.
    warm_start_steps: int = Field(0, ge=0, le=100000)
    warm_start_lr: float = Field(5e-3, gt=0)
    #: The warm start's rows: ``serving`` = the serving director's recorded decisions (behaviour cloning);
    #: ``personas`` = per training prefix, one valid directive for every persona the decision may pick, sampled by
    #: the base model under serving's grammar with the persona fixed (needs ``sampling: serving``): every persona
    #: gets the same weight, so GRPO's rollouts sample each of them (:mod:`.director_warm_start`).
    warm_start_source: Literal["serving", "personas"] = "serving"
    #: Draws per (prefix, persona) for ``personas``: a draw serving's checks refuse is drawn again.
    warm_start_tries: int = Field(4, ge=1, le=64)

    @model_validator(mode="after")
    def _persona_warm_start(self) -> "DirectorPolicyConfig":
        if self.warm_start_steps and self.warm_start_source == "personas" and self.sampling != "serving":
            raise ValueError("director.warm_start_source: personas samples under serving's grammar: set "
                             "director.sampling: serving")
        return self


class DirectorGrpoConfig(GrpoOptimConfig):
    """Optimiser side of the director's GRPO. ``batch_size`` counts
    rollouts and must be divisible by phase2.num_generations; the group reward may take ``reward_timeout_s``."""

    reward_timeout_s: float = Field(120.0, gt=0)
    #: Directive samples per prefix for persona_distribution_before / _after.
    distribution_samples: int = Field(4, ge=1, le=64)
    #: Hold the prefixes the group reward model holds out (``phase2.group_reward.pairs.heldout_fraction``) out of
    #: GRPO too, and measure the rollout reward R on them before and after training (``heldout_reward_before`` /
    #: ``_after`` in the stage manifest). False trains on every prefix and measures nothing.
    heldout_eval: bool = True
    #: Rollouts per held-out prefix for that measure (same seeds before and after).
    heldout_samples: int = Field(2, ge=1, le=64)


class DirectorGateConfig(_S):
    """Gate before publishing the director: refuse one whose directives became invalid more often."""

    #: Largest allowed drop of the valid-directive rate (after training vs before, same prefixes and samples).
    max_valid_rate_drop: float = Field(0.1, ge=0.0, le=1.0)


class DirectorPublishConfig(PublishTarget):
    """Publish the director adapter as ``staged`` at ``<store>/director/v<N>``."""

    gate: DirectorGateConfig = DirectorGateConfig()


class CollaborativeConfig(RunConfig):
    """The whole phase 2 run (``model`` is the base of director, speakers and user simulator).

    Raises:
        pydantic.ValidationError: unknown key or bad value (the field path is named).
    """

    run_id: str = Field("phase2", pattern=r"^[a-z0-9][a-z0-9-]{0,40}$")
    #: Model window in tokens; the director chat alone is several hundred tokens.
    max_model_len: int = Field(2048, ge=512)
    speakers: SpeakersConfig = SpeakersConfig()
    user: UserSimConfig = UserSimConfig()
    #: Serving's reply checks (same keys and defaults as the serving config's ``guard`` section) on the frozen
    #: speakers and simulated user of every rollout, so the director learns from the text serving would show:
    #: regenerated first sentences, cut loops and copies, no unfinished tail. ``enabled: false`` takes replies as
    #: generated.
    guard: GuardConfig = GuardConfig()
    phase2: Phase2Config = Phase2Config()
    director: DirectorPolicyConfig = DirectorPolicyConfig()
    director_grpo: DirectorGrpoConfig = DirectorGrpoConfig()
    publish: DirectorPublishConfig = DirectorPublishConfig()


def load(path: str | Path) -> CollaborativeConfig:
    """Read and validate a phase 2 YAML run config.

    Raises:
        mascot_training.common.config.ConfigError: every problem found, in one message.
    """
    return read_config(path, CollaborativeConfig, validate)


def validate(cfg: CollaborativeConfig) -> list[str]:
    """Every problem that would stop the run, as messages (empty when the config can run)."""
    from mascot.core.personas.personality import personality_text

    out = []
    p2, g = cfg.phase2, cfg.director_grpo
    if g.batch_size % p2.num_generations:
        out.append(f"director_grpo.batch_size ({g.batch_size}) must be divisible by phase2.num_generations "
                   f"({p2.num_generations}): each optimiser step takes whole groups of rollouts")
    out += common_problems(cfg)
    if p2.group_reward.judge.target:
        out.append("phase2.group_reward.judge.target is not supported: the group_rm stage and the judge reward judge "
                   "in-process (the JudgeService code on the run's engine or an openai judge spec); remove target")
    if not [p for p in cfg.personas if p not in _known()]:
        n = len(active_personas(cfg))
        if p2.diversity == "distinct" and p2.min_distinct > n:
            out.append(f"phase2.min_distinct ({p2.min_distinct}) exceeds the {n} active persona(s): I_div could "
                       "never be +1")
    for pid, d in cfg.speakers.adapters.items():
        if pid not in _known():
            out.append(f"speakers.adapters: unknown persona id {pid!r}")
        elif not (Path(d) / "adapter_config.json").is_file():
            out.append(f"speakers.adapters.{pid}: {d} has no adapter_config.json (not a PEFT adapter directory)")
    store, store_problem = _speakers_store(cfg.speakers.store)
    if store_problem:
        out.append(store_problem)
    elif (store is not None or cfg.speakers.adapters) and not [p for p in cfg.personas if p not in _known()]:
        missing = []
        for pid in active_personas(cfg):
            if pid in cfg.speakers.adapters:
                continue
            try:
                hit = store.latest_live(pid) if store is not None else None
            except (RuntimeError, *backend_errors()) as e:
                out.append(f"speakers.store {cfg.speakers.store}: cannot read the adapter registry ({e})")
                break
            if hit is None:
                missing.append(pid)
        if missing and cfg.speakers.missing == "error":
            out.append(f"no phase 1 adapter for persona(s) {missing} in speakers.store/speakers.adapters: add them, "
                       "set personas to those the store holds, or set speakers.missing: base to let them speak "
                       "with the base model as serving does (the quick stand-ins are made only when no adapters "
                       "are given at all)")
    if cfg.director.decoding.temperature <= 0:
        out.append("director.decoding.temperature is 0 (greedy): GRPO compares several sampled rollouts of one "
                   "prefix, and greedy ones would not differ; use a temperature above 0 (the serving default is "
                   f"{DirectorDecoding().temperature}) and serve the director at the same decoding")
    if cfg.director.init_adapter and not (Path(cfg.director.init_adapter) / "adapter_config.json").is_file():
        out.append(f"director.init_adapter {cfg.director.init_adapter} has no adapter_config.json")
    try:
        personality_text(mbti=cfg.user.personality)
    except ValueError as e:
        out.append(f"user.personality: {e}")
    gen = g.generation
    if gen.backend == "vllm" and (gen.vllm_mode != "colocate" or gen.vllm_tensor_parallel_size != 1):
        out.append("director_grpo.generation: the director's rollouts support vllm only with vllm_mode colocate and "
                   "vllm_tensor_parallel_size 1 (each training process samples its own rollouts, whose number of "
                   "directives depends on the dialogue, so no process may wait on another's generation call); got "
                   f"vllm_mode {gen.vllm_mode}, vllm_tensor_parallel_size {gen.vllm_tensor_parallel_size}")
    if gen.backend == "vllm" and cfg.director.sampling == "serving":
        out.append("director.sampling: serving samples each directive under serving's grammar with the trainer's "
                   "own weights and records which tokens were forced; the vllm generation backend samples free. Set "
                   "director.sampling: free with director_grpo.generation.backend: vllm, or use the transformers "
                   "backend")
    out += generation_problems("director_grpo", gen)
    return out


def _speakers_store(uri: str) -> tuple[AdapterStore | None, str]:
    """``(store, "")`` for a readable adapter store at ``uri`` (``(None, "")`` when ``uri`` is empty), else
    ``(None, problem)``: an unsupported URI, an unreadable store, or one without a registry (not an adapter store)."""
    if not uri:
        return None, ""
    try:
        store = open_store(uri)
        registry = store.read_registry()
    except (ValueError, RuntimeError, *backend_errors()) as e:
        return None, f"speakers.store {uri}: cannot read the adapter registry ({e})"
    if not registry.get("revision") and not registry.get("adapters"):  # no registry.json: nothing was published
        return None, f"speakers.store {uri} has no registry.json (not an adapter store)"
    return store, ""


def _known() -> set[str]:
    from mascot.core.personas import PersonaCatalog

    return set(PersonaCatalog.load().cards)
