"""The metric catalog: every name, label set and bucket, defined once.

Build one :class:`Metrics` per process (or per test) on a ``CollectorRegistry`` and pass it through
constructors; nothing of ours is registered in prometheus_client's default registry. Labels stay bounded: never a
conversation, user or request id. Series a library keeps in the default registry (vLLM's ``vllm:*``) are read from
there at scrape time by :class:`DefaultRegistrySeries` (:meth:`Metrics.export_default_series`).
"""

from __future__ import annotations

from typing import Iterable, Iterator, Mapping

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.metrics_core import Metric

from mascot.api.conversation.v1 import conversation_pb2 as cpb
from mascot.api.dialogue.v1 import dialogue_pb2 as dpb
from mascot.api.training.v1 import training_pb2 as tpb
from mascot.core.enums import enum_names

#: Label values of ``mascot_safety_unread_total``: the most spoken languages the safety gate does not read
#: (:mod:`mascot.gateway.languages`), and ``other`` (a bounded label set, every series created at zero at start).
UNREAD_LABELS = ("ar", "bn", "fa", "he", "hi", "id", "ja", "ko", "nl", "pl", "ro", "ru", "sv", "th", "tr", "uk",
                 "ur", "vi", "zh", "other")

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
BATCH_BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 128, 256)
SCORE_BUCKETS = (1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5.0)
#: How a round's stream ended (``mascot_rounds_total{reason}``): the end reasons RoundCompleted carries, ``failed``
#: (an error status before RoundCompleted, a client that stopped reading included) and ``cancelled`` (the client
#: cancelled it or its deadline passed). A round a newer message closes later (``interrupted`` in the API) was
#: counted when its stream ended; a replay of a stored round is not counted again.
ROUND_OUTCOMES = ("completed", "empty_replies", "safety", "failed", "cancelled")
#: Conversation modes (the proto ``Mode`` names).
MODES = enum_names(cpb.Mode)
#: ``mascot_director_decisions_total{source}``: how the director reached its directive (the ``DirectiveSource``
#: names but ``safety``: a safety turn is the gateway's, never a director decision).
DIRECTIVE_SOURCES = tuple(s for s in enum_names(dpb.DirectiveSource) if s != "safety")
#: ``mascot_adapter_load_failures_total{reason}``: ``fetch`` (the version's files could not be read from the store),
#: ``digest`` (they do not match the registry's digest), ``engine`` (the engine refused them: corrupt or incompatible
#: weights). The log line says which error.
ADAPTER_LOAD_FAILURES = ("fetch", "digest", "engine")
#: ``mascot_reward_failures_total{reason}``: a text over the reward model's window (``too_long``), and in training a
#: reward call that timed out, returned nothing or NaN, or a rollout that filled the window (``window_full``).
REWARD_FAILURES = ("too_long", "timeout", "none", "nan", "window_full")
#: ``mascot_training_runs_total{phase, result}``.
TRAINING_PHASES = enum_names(tpb.TrainingPhase, sep="-")
TRAINING_RESULTS = ("succeeded", "failed", "cancelled")
#: Status codes every RPC's ``mascot_rpc_requests_total`` series starts with at zero: OK and the codes the alerts and
#: the dashboard read (server errors, and RESOURCE_EXHAUSTED for capacity).
RPC_DECLARED_CODES = ("OK", "UNKNOWN", "INTERNAL", "UNAVAILABLE", "DEADLINE_EXCEEDED", "DATA_LOSS", "UNIMPLEMENTED",
                      "RESOURCE_EXHAUSTED")


class DefaultRegistrySeries:
    """A collector that re-exports the metric families of another registry (prometheus_client's default one unless
    ``source`` is given) whose names start with ``prefix``, read at every scrape.

    vLLM registers its series (``vllm:num_requests_waiting``, ``vllm:kv_cache_usage_perc``, ...) in the default
    registry; registered on a :class:`Metrics` registry, this puts them on the same ``/metrics`` as the ``mascot_*``
    series, with their own names, labels and values.

    Args:
        prefix: Family-name prefix to export, e.g. ``"vllm:"``; not empty.
        source: The registry to read; default prometheus_client's ``REGISTRY``.

    Raises:
        ValueError: an empty ``prefix``.
    """

    def __init__(self, prefix: str, source: CollectorRegistry | None = None) -> None:
        if not prefix:
            raise ValueError("prefix must not be empty")
        self.prefix = prefix
        self.source = source if source is not None else REGISTRY

    def collect(self) -> Iterator[Metric]:
        """The source's families whose name starts with the prefix, as they are now."""
        for family in self.source.collect():
            if family.name.startswith(self.prefix):
                yield family

    def describe(self) -> list[Metric]:
        """Nothing: the families come and go with the library's objects, so the registry does not reserve their
        names (our own are ``mascot_*`` and never collide with a foreign prefix)."""
        return []


class Metrics:
    """All MASCOT metrics on one registry.

    Args:
        registry: Where to register; a fresh ``CollectorRegistry`` per test keeps tests independent.
    """

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self._exported_prefixes: set[str] = set()
        r = self.registry
        self.rpc_requests = Counter(
            "mascot_rpc_requests_total", "RPCs handled, by final status code.",
            ["component", "rpc", "code"], registry=r)
        self.rpc_duration = Histogram(
            "mascot_rpc_duration_seconds", "RPC wall time in seconds, to the last message sent.",
            ["component", "rpc", "code"], buckets=LATENCY_BUCKETS, registry=r)
        self.rpc_in_flight = Gauge(
            "mascot_rpc_in_flight", "RPCs being handled now (a unary call until it answers, a server stream until it "
            "ends), by component and method: the load signal the chart's load autoscaling reads.",
            ["component", "rpc"], registry=r)
        self.round_duration = Histogram(
            "mascot_round_duration_seconds", "Wall time of one round (user message to last agent turn).",
            ["mode"], buckets=LATENCY_BUCKETS, registry=r)
        self.turn_duration = Histogram(
            "mascot_turn_duration_seconds", "Wall time of one agent turn, director call included.",
            ["persona", "adapter_version"], buckets=LATENCY_BUCKETS, registry=r)
        self.turn_first_token = Histogram(
            "mascot_turn_first_token_seconds", "Time from the speaker call to its first visible delta.",
            ["persona", "adapter_version"], buckets=LATENCY_BUCKETS, registry=r)
        self.generated_tokens = Counter(
            "mascot_generated_tokens_total", "Tokens of delivered text: a director's accepted directive, a reply as "
            "sent (attempts the reply checks refused, and text they cut, are in mascot_discarded_tokens_total).",
            ["component", "persona", "adapter_version"], registry=r)
        self.discarded_tokens = Counter(
            "mascot_discarded_tokens_total", "Tokens generated and never delivered: reply attempts refused by the "
            "reply checks, text cut after a failing sentence, directives re-asked.",
            ["component", "persona"], registry=r)
        self.rounds = Counter(
            "mascot_rounds_total", "Rounds (SendMessage and RunSelfPlay streams) by how their stream ended: "
            "completed, empty_replies (no acceptable reply), safety, failed (an error status, a client that stopped "
            "reading included), cancelled (by the client or its deadline).", ["mode", "reason"], registry=r)
        for mode in MODES:  # every outcome exists from the start, so increase() sees the first one
            for reason in ROUND_OUTCOMES:
                self.rounds.labels(mode, reason)
        self.director_decisions = Counter(
            "mascot_director_decisions_total", "Directives returned, by chosen persona and source.",
            ["persona", "source"], registry=r)
        self.reply_rejections = Counter(
            "mascot_reply_rejections_total",
            "Replies and directives refused by the reply checks, by who produced them (a persona id, user or "
            "director), the check (empty, short, echo, loop, duplicate, unfinished, supporter, directive_name, "
            "directive_voice, directive_addressee, directive_person, directive_copy, directive_invalid) and what "
            "followed (regenerate, exclude, cut, "
            "reprompt).",
            ["component", "persona", "reason", "action"], registry=r)
        self.safety_events = Counter(
            "mascot_safety_events_total", "Safety gate actions.", ["category"], registry=r)
        self.safety_detections = Counter(
            "mascot_safety_detections_total",
            "User messages the safety gate flagged, by tier (crisis: the safety template replaced the round; "
            "check_in: a check-in turn came first and the round went on).", ["tier"], registry=r)
        self.safety_turns = Counter(
            "mascot_safety_turns_total", "Safety turns delivered, by tier (crisis template or check-in question).",
            ["tier"], registry=r)
        self.safety_unread = Counter(
            "mascot_safety_unread_total",
            "User messages in a language the safety gate does not read (identified with probability >= 0.8; "
            "docs/safety.md lists the languages read).", ["language"], registry=r)
        for tier in ("crisis", "check_in"):
            self.safety_detections.labels(tier)
            self.safety_turns.labels(tier)
        for language in UNREAD_LABELS:
            self.safety_unread.labels(language)
        self.conversations_active = Gauge(
            "mascot_conversations_active", "Conversations with a round in progress.", ["mode"], registry=r)
        self.engine_batch_size = Histogram(
            "mascot_engine_batch_size", "Requests decoded together in one engine batch.",
            ["component"], buckets=BATCH_BUCKETS, registry=r)
        self.engine_prompt_tokens = Counter(
            "mascot_engine_prompt_tokens_total", "Prompt tokens of engine requests, by whether the transformers "
            "engine's prefix cache served them (cached) or they were prefilled (computed).",
            ["component", "source"], registry=r)
        self.judge_scores = Histogram(
            "mascot_judge_scores", "Judge scores (1-5).", ["criterion"], buckets=SCORE_BUCKETS, registry=r)
        self.judge_unparseable = Counter(
            "mascot_judge_unparseable_total", "Judge answers that could not be parsed.", ["judge"], registry=r)
        self.reward_scores = Histogram(
            "mascot_reward_scores", "Reward-model scores (standardised).", ["model"],
            buckets=(-3, -2, -1, -0.5, 0, 0.5, 1, 2, 3), registry=r)
        self.reward_failures = Counter(
            "mascot_reward_failures_total", "Reward computations that failed.", ["reason"], registry=r)
        self.adapter_info = Gauge(
            "mascot_adapter_info", "1 for each adapter version known to a model service.",
            ["persona", "adapter_version", "state"], registry=r)
        self.adapter_load_seconds = Histogram(
            "mascot_adapter_load_seconds", "Time to load one LoRA adapter into the engine.", ["persona"],
            buckets=LATENCY_BUCKETS, registry=r)
        self.adapter_load_failures = Counter(
            "mascot_adapter_load_failures_total", "Adapter loads that failed.", ["reason"], registry=r)
        self.training_runs = Counter(
            "mascot_training_runs_total", "Training runs finished.", ["phase", "result"], registry=r)
        for reason in ADAPTER_LOAD_FAILURES:
            self.adapter_load_failures.labels(reason)
        for reason in REWARD_FAILURES:
            self.reward_failures.labels(reason)
        for phase in TRAINING_PHASES:
            for result in TRAINING_RESULTS:
                self.training_runs.labels(phase, result)

    def export_default_series(self, prefix: str) -> bool:
        """Export the families of prometheus_client's default registry named ``prefix...`` (vLLM's ``vllm:``) on
        this registry, through one :class:`DefaultRegistrySeries` per prefix (a second call with the same prefix
        changes nothing).

        Returns:
            True when it was added now; False when already exported, or when this registry is the default one (it
            holds those families itself).

        Raises:
            ValueError: an empty ``prefix``.
        """
        if not prefix:
            raise ValueError("prefix must not be empty")
        if self.registry is REGISTRY or prefix in self._exported_prefixes:
            return False
        self.registry.register(DefaultRegistrySeries(prefix))
        self._exported_prefixes.add(prefix)
        return True

    def declare(self, *, personas: Iterable[str] = (), safety_categories: Iterable[str] = (),
                rpcs: Mapping[str, Iterable[str]] | None = None, judges: Iterable[str] = (),
                judge_criteria: Iterable[str] = (), reward_models: Iterable[str] = ()) -> None:
        """Create the label sets that depend on what this process serves, at zero.

        A counter series that first appears at 1 is invisible to ``increase()`` and ``rate()`` (they need two
        samples), so an alert on a rare event (the first director fallback, the first adapter that fails to load)
        would never fire. The fixed label sets (round outcomes, adapter-load and reward failure reasons, training
        phases and results) are created by the constructor; this adds the ones known only at start-up.

        Args:
            personas: Persona ids the director may choose (``mascot_director_decisions_total`` for every
                :data:`DIRECTIVE_SOURCES`).
            safety_categories: Categories of the safety gate (``mascot_safety_events_total``).
            rpcs: ``{component: rpc names}`` served by this process (``mascot_rpc_requests_total`` for every
                :data:`RPC_DECLARED_CODES`, and ``mascot_rpc_in_flight`` at 0, so an idle pod reports its load).
            judges: Configured judge names (``mascot_judge_unparseable_total``).
            judge_criteria: Rubric criteria (``mascot_judge_scores``, an empty histogram per criterion).
            reward_models: Names of the served reward models (``mascot_reward_scores``, an empty histogram each).
        """
        for persona in personas:
            for source in DIRECTIVE_SOURCES:
                self.director_decisions.labels(persona, source)
        for category in safety_categories:
            self.safety_events.labels(category)
        for judge in judges:
            self.judge_unparseable.labels(judge)
        for criterion in dict.fromkeys(judge_criteria):
            self.judge_scores.labels(criterion)
        for model in reward_models:
            self.reward_scores.labels(model)
        for component, names in (rpcs or {}).items():
            for rpc in names:
                self.rpc_in_flight.labels(component, rpc)
                for code in RPC_DECLARED_CODES:
                    self.rpc_requests.labels(component, rpc, code)
