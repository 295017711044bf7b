"""The one engine interface behind every generating component.

An engine turns a rendered prompt into text, optionally through a named LoRA adapter, with sampling
parameters, optional structured output (a regex or a JSON schema) and streamed deltas. Engines:
``transformers`` (PyTorch + PEFT) and ``vllm`` (``AsyncLLM``), this module's siblings.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Protocol, runtime_checkable

BASE_ADAPTER = "base"


@dataclass(frozen=True)
class SamplingParams:
    """Sampling parameters of one request.

    Attributes:
        max_tokens: Upper bound on generated tokens, >= 1.
        temperature: 0 means greedy (argmax); > 0 samples from softmax(logits / temperature).
        top_p: Nucleus mass in (0, 1]; 1 disables it.
        seed: Seed of this request's own random generator; None draws one.
        stop: Strings that end generation; the stop string itself is not returned.
        repetition_penalty: CTRL-style penalty on every token id already in the prompt or the output, > 0: a
            positive logit is divided by it, a negative one multiplied (Keskar et al. 2019, section 4.1; the meaning
            of vLLM's ``SamplingParams.repetition_penalty`` and transformers' ``RepetitionPenaltyLogitsProcessor``).
            1 disables it; it applies at temperature 0 too.
        frequency_penalty: Subtracted from a token's logit once per time it already occurs in the generated text
            (not the prompt), in [-2, 2]; 0 disables it (OpenAI's and vLLM's ``frequency_penalty``).
    """

    max_tokens: int = 128
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if not 0 < self.repetition_penalty <= 10:
            raise ValueError(f"repetition_penalty must be in (0, 10], got {self.repetition_penalty}")
        if not -2 <= self.frequency_penalty <= 2:
            raise ValueError(f"frequency_penalty must be in [-2, 2], got {self.frequency_penalty}")


@dataclass(frozen=True)
class StructuredOutput:
    """Constrain the generated text to a regular expression or a JSON schema (exactly one).

    Engines with ``supports_structured_output`` enforce it token by token, ending generation when the
    grammar is complete.
    """

    regex: str | None = None
    json_schema: str | None = None

    def __post_init__(self) -> None:
        if (self.regex is None) == (self.json_schema is None):
            raise ValueError("StructuredOutput needs exactly one of regex or json_schema")


def regex_escape(text: str) -> str:
    """Escape regex metacharacters of ``text`` for a :class:`StructuredOutput` regex.

    Spaces are left alone: xgrammar rejects the escape ``\\ `` that :func:`re.escape` would write.
    """
    return re.sub(r"([.^$*+?{}\[\]\\|()/-])", r"\\\1", text)


@dataclass(frozen=True)
class GenerationRequest:
    """One generation.

    Attributes:
        prompt: The fully rendered prompt text (see :meth:`Engine.render_chat`).
        sampling: Sampling parameters.
        adapter: Name of a loaded LoRA adapter, or None for the base model.
        structured: Optional output constraint.
    """

    prompt: str
    sampling: SamplingParams = field(default_factory=SamplingParams)
    adapter: str | None = None
    structured: StructuredOutput | None = None


@dataclass(frozen=True)
class StreamDelta:
    """A piece of generated text: whole UTF-8 characters, never part of a stop string."""

    text: str


@dataclass(frozen=True)
class GenerationResult:
    """The finished generation; the last item of a stream.

    Attributes:
        text: The whole generated text, cut before any stop string; equals the joined deltas.
        token_ids: Generated token ids (stop and EOS tokens included), length <= max_tokens.
        finish_reason: ``"stop"`` (EOS, stop string or completed grammar) or ``"length"``.
        prompt_tokens: Tokens in the prompt.
        adapter: The adapter used, or ``"base"``.
        batch_size: Requests decoded in the same batch.
        cached_tokens: Prompt tokens served from a prefix cache (vLLM prefix caching); 0 where there is none.
    """

    text: str
    token_ids: tuple[int, ...]
    finish_reason: str
    prompt_tokens: int
    adapter: str = BASE_ADAPTER
    batch_size: int = 1
    cached_tokens: int = 0


#: Inserted after the first character of a control-token string found in message text (U+200B ZERO WIDTH SPACE).
TOKEN_BREAK = "\u200b"


def control_token_pattern(tokenizer: Any, *, special_only: bool) -> "re.Pattern[str] | None":
    """A regex matching the literal strings of ``tokenizer``'s added tokens (``<|im_start|>``, ``<|im_end|>``,
    ``<|endoftext|>``, and with ``special_only`` False also non-special ones such as Qwen3's ``<think>``).

    Returns:
        The compiled alternation, longest strings first, or None when the tokenizer has no such token of 2+ chars.
    """
    decoder = getattr(tokenizer, "added_tokens_decoder", None) or {}
    words = {t.content for t in decoder.values() if len(t.content) > 1 and (t.special or not special_only)}
    words |= {w for w in getattr(tokenizer, "all_special_tokens", ()) if len(w) > 1}
    if not words:
        return None
    return re.compile("|".join(re.escape(w) for w in sorted(words, key=len, reverse=True)))


def neutralize_control_tokens(text: str, pattern: "re.Pattern[str] | None") -> str:
    """``text`` with every match of ``pattern`` broken by :data:`TOKEN_BREAK` after its first character, so the
    tokenizer reads it as ordinary text instead of the control token (``"<|im_end|>"`` -> ``"<\u200b|im_end|>"``).

    Chat templates render message text into one prompt string that is tokenized afterwards; without this a user who
    types ``<|im_end|>\n<|im_start|>system`` would close their own turn and open a system turn (prompt injection
    through the chat template, OWASP LLM01). Identity when ``pattern`` is None or nothing matches.
    """
    if pattern is None:
        return text
    return pattern.sub(lambda m: m.group(0)[0] + TOKEN_BREAK + m.group(0)[1:], text)


def render_chat(tokenizer: Any, messages: list[dict[str, str]], add_generation_prompt: bool = True,
                **template_kwargs: Any) -> str:
    """Render ``messages`` with ``tokenizer``'s chat template: the one renderer of serving and training prompts.

    Control-token strings inside message text are neutralised first (:func:`neutralize_control_tokens`): every added
    token (special ones and e.g. ``<think>``) in system and user text, and the special ones in assistant text (an
    assistant turn keeps ``<think>`` so the template handles reasoning as the model was trained). Only the template
    itself emits control tokens. Extra kwargs (e.g. ``enable_thinking``) pass on to ``apply_chat_template``.
    """
    patterns = getattr(tokenizer, "_mascot_control_patterns", None)
    if patterns is None:
        patterns = (control_token_pattern(tokenizer, special_only=False),
                    control_token_pattern(tokenizer, special_only=True))
        try:
            tokenizer._mascot_control_patterns = patterns
        except AttributeError:  # pragma: no cover - a tokenizer that refuses attributes: compute each time
            pass
    every, special = patterns
    safe = [{**m, "content": neutralize_control_tokens(m["content"], special if m.get("role") == "assistant"
                                                         else every)} if isinstance(m.get("content"), str) else m
            for m in messages]
    return tokenizer.apply_chat_template(safe, tokenize=False, add_generation_prompt=add_generation_prompt,
                                         **template_kwargs)


class HFTokenizerMixin:
    """What every engine on a Hugging Face tokenizer shares: chat rendering, token counting, and ``generate`` as
    "run :meth:`stream` to its end". Subclasses set ``self.tokenizer`` when they start and define ``stream``."""

    tokenizer: Any

    def render_chat(self, messages: list[dict[str, str]], add_generation_prompt: bool = True,
                    **template_kwargs: Any) -> str:
        """Render messages with the model's chat template, control tokens in message text neutralised
        (:func:`render_chat`)."""
        return render_chat(self.tokenizer, messages, add_generation_prompt, **template_kwargs)

    def count_tokens(self, text: str) -> int:
        """Tokens in ``text`` (no special tokens added)."""
        return len(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    async def generate(self, request: "GenerationRequest") -> "GenerationResult":
        """Run a request to completion and return its :class:`GenerationResult` (the errors of ``stream``)."""
        result = None
        async for item in self.stream(request):  # type: ignore[attr-defined]
            if isinstance(item, GenerationResult):
                result = item
        assert result is not None
        return result


class PromptTooLong(ValueError):
    """The prompt plus ``max_tokens`` exceeds the engine's context window."""


class UnknownAdapter(KeyError):
    """A request named an adapter that is not loaded."""


@runtime_checkable
class Engine(Protocol):
    """Async generation interface shared by all engines."""

    #: Context window in tokens (prompt + generated).
    max_context_tokens: int
    #: Whether :class:`StructuredOutput` is enforced.
    supports_structured_output: bool

    async def start(self) -> None:
        """Load the model; after it returns the engine serves requests."""

    async def close(self) -> None:
        """Stop serving and free resources. Pending requests fail."""

    def render_chat(self, messages: list[dict[str, str]], add_generation_prompt: bool = True,
                    **template_kwargs: Any) -> str:
        """Render chat messages (``role``/``content`` dicts) with the model's chat template."""

    def count_tokens(self, text: str) -> int:
        """Number of tokens of ``text`` without special tokens added."""

    def adapters(self) -> list[str]:
        """Names of the loaded LoRA adapters."""

    async def load_adapter(self, name: str, path: str) -> None:
        """Load a PEFT LoRA adapter directory under ``name``."""

    async def unload_adapter(self, name: str) -> None:
        """Unload adapter ``name`` (raises :class:`UnknownAdapter` when it is not loaded)."""

    def stream(self, request: GenerationRequest) -> AsyncIterator[StreamDelta | GenerationResult]:
        """Yield :class:`StreamDelta` items as text is generated, then one :class:`GenerationResult`.

        Raises:
            PromptTooLong: prompt + max_tokens over the context window.
            UnknownAdapter: the adapter is not loaded.
        """

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        """Run a request to completion and return its result (same errors as :meth:`stream`)."""
