"""A scripted engine: director and speaker outputs from callables, every request recorded (no model loaded)."""

from __future__ import annotations

import asyncio
from typing import AsyncIterator, Callable

from mascot.core.engine import BASE_ADAPTER, GenerationRequest, GenerationResult, StreamDelta


class ScriptedEngine:
    """An Engine whose director and speaker outputs come from callables; it records every request.

    ``director(prompt) -> text`` answers prompts of the director, ``speaker(prompt) -> text`` all others.
    Text streams out in 3-character deltas.
    """

    supports_structured_output = False
    max_context_tokens = 100_000

    def __init__(self, director: Callable[[str], str], speaker: Callable[[str], str]) -> None:
        self.director, self.speaker = director, speaker
        self.requests: list[GenerationRequest] = []

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        return None

    def render_chat(self, messages, add_generation_prompt=True, **_):
        """The messages as ``<|role|>content`` lines, then ``<|assistant|>`` when a generation prompt is asked for."""
        text = "".join(f"<|{m['role']}|>{m['content']}\n" for m in messages)
        return text + ("<|assistant|>" if add_generation_prompt else "")

    def count_tokens(self, text: str) -> int:
        return len(text.split())

    def adapters(self) -> list[str]:
        return []

    async def load_adapter(self, name: str, path: str) -> None:
        raise NotImplementedError

    async def stream(self, request: GenerationRequest) -> AsyncIterator:
        self.requests.append(request)
        is_director = "You are the director" in request.prompt
        text = (self.director if is_director else self.speaker)(request.prompt)
        for i in range(0, len(text), 3):
            await asyncio.sleep(0)
            yield StreamDelta(text[i:i + 3])
        yield GenerationResult(text=text, token_ids=tuple(range(len(text.split()))), finish_reason="stop",
                               prompt_tokens=self.count_tokens(request.prompt), adapter=request.adapter or BASE_ADAPTER)

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        result = None
        async for item in self.stream(request):
            result = item
        return result

