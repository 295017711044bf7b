"""Judge model backends: the local engine, or any OpenAI-compatible chat endpoint.

Both take chat messages and return the judge's raw answer text at temperature 0, asking for JSON that
matches the rubric's schema (xgrammar locally; ``response_format`` on an OpenAI-compatible server).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from pathlib import Path
from typing import Protocol

from mascot.core.engine import Engine, GenerationRequest, PromptTooLong, SamplingParams, StructuredOutput
from mascot.core.errors import FailedPrecondition, InvalidArgument, Unavailable

log = logging.getLogger(__name__)


class JudgeBackend(Protocol):
    """Something that answers judge prompts."""

    #: Model name reported in responses and used in cache keys.
    model: str

    async def complete(self, messages: list[dict], schema: dict, seed: int = 0) -> str:
        """Return the raw answer text for chat ``messages`` (temperature 0), asking for JSON matching ``schema``."""


class LocalJudgeBackend:
    """The judge on the local engine (the embedded default; a LoRA adapter may specialise it).

    Args:
        engine: A started engine.
        model: Name reported for this judge (e.g. the model directory's name).
        adapter: Optional loaded adapter name; None for the base model.
        max_tokens: Upper bound on the answer's tokens.
    """

    def __init__(self, engine: Engine, model: str, adapter: str | None = None, max_tokens: int = 256) -> None:
        self.engine, self.model, self.adapter, self.max_tokens = engine, model, adapter or None, max_tokens

    async def complete(self, messages: list[dict], schema: dict, seed: int = 0) -> str:
        """Greedy generation; JSON-schema constrained when the engine supports it.

        Raises:
            InvalidArgument: the prompt does not fit the engine's context window.
        """
        structured = (StructuredOutput(json_schema=json.dumps(schema)) if self.engine.supports_structured_output
                      else None)
        prompt = self.engine.render_chat(messages)
        try:
            res = await self.engine.generate(GenerationRequest(
                prompt=prompt, sampling=SamplingParams(max_tokens=self.max_tokens, temperature=0.0, seed=seed),
                adapter=self.adapter, structured=structured))
        except PromptTooLong as e:
            raise InvalidArgument(f"the judge prompt exceeds the judge model's context window ({e}); shorten the "
                                  "history or the block, or raise engine.max_model_len") from None
        return res.text


def read_api_key(env_var: str, key_file: str | Path | None) -> str | None:
    """The API key from the file (a mounted secret) if given, else from the environment variable; None if neither.

    Raises:
        FileNotFoundError: ``key_file`` is set but missing.
    """
    if key_file:
        p = Path(key_file)
        if not p.is_file():
            raise FileNotFoundError(f"judge api_key_file {p} does not exist")
        return p.read_text(encoding="utf-8").strip() or None
    return os.environ.get(env_var) or None


class OpenAIJudgeBackend:
    """A judge behind any OpenAI-compatible ``/v1/chat/completions`` endpoint (GPT-4o, vLLM, KServe).

    Uses the official ``openai`` client (its own retries cover connection errors, 429 and 5xx).

    Args:
        model: Model name sent to the endpoint.
        endpoint: Base URL, e.g. ``https://api.openai.com/v1`` or ``http://127.0.0.1:8000/v1``.
        api_key: The key; None sends a placeholder (local servers without auth).
        response_format: ``json_schema`` (strict schema), ``json_object`` or ``none``.
        max_tokens: Upper bound on the answer's tokens.
        timeout_s: Per-request timeout in seconds.
        max_concurrency: Requests in flight at once.
    """

    def __init__(self, model: str, endpoint: str, api_key: str | None = None, response_format: str = "json_schema",
                 max_tokens: int = 256, timeout_s: float = 120.0, max_concurrency: int = 8) -> None:
        from openai import AsyncOpenAI

        self.model, self.endpoint, self.response_format, self.max_tokens = model, endpoint, response_format, max_tokens
        self._client = AsyncOpenAI(base_url=endpoint, api_key=api_key or "EMPTY", timeout=timeout_s, max_retries=2)
        self._sem = asyncio.Semaphore(max_concurrency)

    async def complete(self, messages: list[dict], schema: dict, seed: int = 0) -> str:
        """One chat completion at temperature 0.

        Raises:
            Unavailable: the endpoint is unreachable, timed out, rate-limited or failed (5xx) after the client's
                retries.
            FailedPrecondition: the endpoint rejected the key, the model name or the request format.
        """
        import openai

        kwargs: dict = {}
        if self.response_format == "json_schema":
            kwargs["response_format"] = {"type": "json_schema",
                                         "json_schema": {"name": "judgement", "schema": schema, "strict": True}}
        elif self.response_format == "json_object":
            kwargs["response_format"] = {"type": "json_object"}
        async with self._sem:
            try:
                resp = await self._client.chat.completions.create(
                    model=self.model, messages=messages, temperature=0, max_tokens=self.max_tokens, seed=seed,
                    **kwargs)
            except (openai.APIConnectionError, openai.RateLimitError, openai.InternalServerError) as e:
                raise Unavailable(f"judge endpoint {self.endpoint} is unavailable ({type(e).__name__}); "
                                  "retry later") from None
            except openai.AuthenticationError:
                raise FailedPrecondition(f"judge endpoint {self.endpoint} rejected the API key; set the key's "
                                         "environment variable or api_key_file") from None
            except openai.APIStatusError as e:
                raise FailedPrecondition(f"judge endpoint {self.endpoint} refused the request (HTTP {e.status_code});"
                                         f" check judge model {self.model!r} and response_format") from None
        if not resp.choices:
            return ""
        return resp.choices[0].message.content or ""

    async def close(self) -> None:
        """Close the HTTP client."""
        await self._client.close()
