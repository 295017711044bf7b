"""A scripted OpenAI-compatible chat-completions server on 127.0.0.1 (a real HTTP server, in a thread).

It stands in for a GPT-4o-class judge: the answer is a deterministic function of the prompt, so tests can
compute expected report values by hand from the recorded calls. Planted markers in the judged text steer it:

- ``[[garbage]]``: always answers non-JSON (the item is dropped after the retries);
- ``[[range]]``: answers a score of 9 first, then a valid answer on the re-prompt;
- anything else: scores = 1 + (byte k of sha256(judged text)) % 5 for criterion k, where the judged text is the
  reply (agent rubric) or the block's turn texts (collective rubric); with ``faults=True`` about 1 in 8 items
  is garbage and 1 in 8 out of range first, chosen by the judged text's hash.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import signal
import re
import threading
import time

from aiohttp import web


def scripted_scores(key_text: str, keys: list[str]) -> dict[str, int]:
    """The scores the scripted judge gives for an item whose judged text is ``key_text`` (see :func:`key_text`)."""
    h = hashlib.sha256(key_text.encode("utf-8")).digest()
    return {k: 1 + h[i] % 5 for i, k in enumerate(keys)}


def scripted_fault(key_text: str) -> str:
    """With faults on: ``garbage`` (dropped), ``range`` (valid on retry) or ``ok``, from the judged text's hash."""
    b = hashlib.sha256(("fault" + key_text).encode("utf-8")).digest()[0] % 8
    return "garbage" if b == 0 else "range" if b == 1 else "ok"


def key_text(first_user: str) -> str:
    """What the scripted judge keys on: the reply text (agent rubric) or the block's turn texts joined by newlines."""
    if "Reply to judge, by " in first_user:
        body = first_user.split("Reply to judge, by ", 1)[1].split("\n", 1)[1]
        return body.rsplit("\n\nCriteria:\n", 1)[0]
    block = first_user.split("Block of turns to judge:\n", 1)[1].rsplit("\n\nCriteria:\n", 1)[0]
    return "\n".join(re.sub(r"^\[\d+\] [^:]+: ", "", line, count=1) for line in block.split("\n"))


AGENT_KEYS = ["emotional_expressiveness", "empathetic_support_quality", "persona_consistency", "response_relevance",
              "social_contribution"]
COLLECTIVE_KEYS = ["fidelity", "originality_specificity", "relevance_coherence", "engagement_contribution"]


class ScriptedOpenAIJudge:
    """Start with :meth:`start`; ``url`` is the base URL (``http://127.0.0.1:PORT/v1``); ``calls`` records requests."""

    def __init__(self, api_key: str | None = None, faults: bool = False) -> None:
        self.api_key, self.faults = api_key, faults
        self._kill: tuple[int, int] | None = None
        self.killed_key: str | None = None
        self.calls: list[dict] = []
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self.url = ""

    def answer(self, messages: list[dict]) -> str:
        first_user = messages[1]["content"]
        keys = AGENT_KEYS if "Reply to judge" in first_user else COLLECTIVE_KEYS
        retry = len(messages) > 2
        key = key_text(first_user)
        fault = scripted_fault(key) if self.faults else "ok"
        if "[[garbage]]" in key or fault == "garbage":
            return "I think it was fine."
        scores = scripted_scores(key, keys)
        if ("[[range]]" in key or fault == "range") and not retry:
            scores[keys[0]] = 9
        return json.dumps({**scores, "rationale": "scripted"})

    async def _handle(self, request: web.Request) -> web.Response:
        if self.api_key and request.headers.get("Authorization") != f"Bearer {self.api_key}":
            return web.json_response({"error": {"message": "bad key", "type": "invalid_request_error"}}, status=401)
        body = await request.json()
        with self._lock:
            self.calls.append(body)
            n = len(self.calls)
        if self._kill is not None and n == self._kill[0]:
            # SIGKILL the client while this call is in flight (before it is answered).
            self.killed_key = key_text(body["messages"][1]["content"])
            os.kill(self._kill[1], signal.SIGKILL)
            self._kill = None
            return web.json_response({"error": {"message": "client killed"}}, status=500)
        text = self.answer(body["messages"])
        return web.json_response({
            "id": f"chatcmpl-{len(self.calls)}", "object": "chat.completion", "created": int(time.time()),
            "model": body["model"],
            "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": text}}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}})

    def kill_on_call(self, n: int, pid: int) -> None:
        """SIGKILL process ``pid`` when call number ``n`` (1-based, over this server's life) arrives."""
        self._kill = (n, pid)

    def start(self) -> "ScriptedOpenAIJudge":
        ready = threading.Event()

        def run() -> None:
            self._loop = asyncio.new_event_loop()
            app = web.Application()
            app.router.add_post("/v1/chat/completions", self._handle)
            self._runner = web.AppRunner(app)
            self._loop.run_until_complete(self._runner.setup())
            site = web.TCPSite(self._runner, "127.0.0.1", 0)
            self._loop.run_until_complete(site.start())
            port = site._server.sockets[0].getsockname()[1]
            self.url = f"http://127.0.0.1:{port}/v1"
            ready.set()
            self._loop.run_forever()

        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()
        ready.wait(30)
        return self

    def stop(self) -> None:
        if self._loop is not None:
            fut = asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop)
            fut.result(10)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)

    def first_attempt_prompts(self) -> list[str]:
        """The first user message of every call that was not a re-prompt."""
        with self._lock:
            return [c["messages"][1]["content"] for c in self.calls if len(c["messages"]) == 2]
