"""The one engine interface behind every generating component (DESIGN.md section 1).

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
    """

    max_tokens: int = 128
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")


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


class HFTokenizerMixin:
    """What every engine on a Hugging Face tokenizer shares: chat rendering, token counting, and ``generate`` as
    "run :meth:`stream` to its end". Subclasses set ``self.tokenizer`` when they start and define ``stream``."""

    tokenizer: Any

    def render_chat(self, messages: list[dict[str, str]], add_generation_prompt: bool = True,
                    **template_kwargs: Any) -> str:
        """Render messages with the tokenizer's chat template (extra kwargs such as ``enable_thinking`` pass on)."""
        return self.tokenizer.apply_chat_template(messages, tokenize=False,
                                                  add_generation_prompt=add_generation_prompt, **template_kwargs)

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
