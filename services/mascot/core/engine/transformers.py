"""PyTorch + PEFT engine: concurrent requests decoded together, LoRA adapters mixed in one batch.

Requests queue up; a worker thread takes every request waiting (up to ``max_batch_size``, after a
short ``batch_wait_ms`` window) and decodes them as one left-padded batch with a shared KV cache. Requests that
arrive while a batch decodes join it between steps (continuous batching: prefilled apart, their KV cache left-padded
and concatenated to the batch's), and finished requests leave it, so a short request never waits for a long one.
Each row keeps its own adapter (PEFT mixed-adapter batches, ``adapter_names=``), sampling
parameters, random generator, stop strings and grammar (xgrammar token bitmasks). Deltas go back
to each caller's event loop as they are produced. Batch sizes are recorded in
``mascot_engine_batch_size``.

Library docs: PEFT "Inference with different LoRA adapters in the same batch"; xgrammar
"Integration with HF transformers" (token bitmask API).
"""

from __future__ import annotations

import asyncio
import atexit
import functools
import logging
import queue
import random
import re
import threading
import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, AsyncIterator

from mascot.core.engine.base import (
    BASE_ADAPTER,
    HFTokenizerMixin,
    GenerationRequest,
    GenerationResult,
    PromptTooLong,
    StreamDelta,
    UnknownAdapter,
)

log = logging.getLogger(__name__)
_PEFT_BASE = "__base__"
#: The attention implementation the engine registers and uses (see :func:`gqa_sdpa_attention`).
GQA_SDPA = "mascot_gqa_sdpa"
#: Spare key/value columns a cache layer allocates past its width (one copy of the layer per this many steps).
KV_ROOM = 64


def gqa_sdpa_attention(module: Any, query: Any, key: Any, value: Any, attention_mask: Any, dropout: float = 0.0,
                       scaling: float | None = None, is_causal: bool | None = None, **kwargs: Any) -> tuple[Any, None]:
    """transformers' SDPA attention, except that grouped-query key/value heads go to
    ``torch.nn.functional.scaled_dot_product_attention`` as they are (``enable_gqa=True``) also when a padding mask is
    given, on CPU. transformers' ``sdpa`` copies them to one head per query head whenever a mask is present (its
    CUDA kernels need that); the engine always passes a mask (left padding, jump-forward holes), so on CPU that copy
    of the whole key/value cache in every layer and step was the largest cost of a decode step (SmolLM2: 9 query
    heads over 3 key/value heads; measured 21 ms against 5 ms per layer at 16 rows x 600 columns). The output is
    identical. Shapes: query ``[batch, heads, q, head_dim]``, key/value ``[batch, kv_heads, kv, head_dim]``;
    returns ``([batch, q, heads, head_dim], None)`` like every transformers attention function."""
    import torch
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    groups = getattr(module, "num_key_value_groups", 1)
    if attention_mask is None or groups == 1 or query.device.type != "cpu" or kwargs.get("position_bias") is not None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    out = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask,
                                                           dropout_p=dropout, scale=scaling, enable_gqa=True)
    return out.transpose(1, 2).contiguous(), None


@functools.cache
def _growing_layer() -> type:
    """The cache layer class of :func:`_kv_cache` (built on first use: transformers is imported lazily)."""
    from transformers.cache_utils import DynamicLayer

    class _GrowingLayer(DynamicLayer):
        """A ``DynamicLayer`` that appends new key/value columns into spare room of a buffer instead of concatenating
        the whole layer at every decode step (``torch.cat`` reallocates and copies every layer's keys and values per
        step: measured 120 ms of a 320 ms step at 8 rows x 600 columns on two cores). ``keys``/``values`` are views
        of the buffer's first columns; when they were replaced from outside (the engine's row selection and
        trimming), the next update starts a new buffer. Room: :data:`KV_ROOM` columns past the current width."""

        def update(self, key_states: Any, value_states: Any, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            k, v = self.keys, self.values
            n, add = (k.shape[-2] if k.dim() == 4 else 0), key_states.shape[-2]
            kb, vb = getattr(self, "_kbuf", None), getattr(self, "_vbuf", None)
            if (kb is None or n == 0 or kb.shape[0] != key_states.shape[0] or kb.shape[1] != key_states.shape[1]
                    or kb.shape[2] < n + add or k.data_ptr() != kb.data_ptr() or v.data_ptr() != vb.data_ptr()
                    or k.stride() != kb.stride() or v.stride() != vb.stride()):
                shape = (*key_states.shape[:2], n + add + KV_ROOM, key_states.shape[3])
                kb, vb = key_states.new_empty(shape), value_states.new_empty(shape)
                if n:
                    kb[:, :, :n] = k
                    vb[:, :, :n] = v
                self._kbuf, self._vbuf = kb, vb
            kb[:, :, n:n + add] = key_states
            vb[:, :, n:n + add] = value_states
            self.keys, self.values = kb[:, :, :n + add], vb[:, :, :n + add]
            return self.keys, self.values

    return _GrowingLayer


def _kv_cache(layers: list | None = None) -> Any:
    """A transformers ``DynamicCache`` whose layers append into spare room (see :func:`_growing_layer`), filled with
    ``layers`` = ``[(keys, values) per layer]`` (copied) when given."""
    from transformers import DynamicCache

    cls = _growing_layer()
    cache = DynamicCache()
    cache.layer_class_to_replicate = cls
    for keys, values in layers or []:
        layer = cls()
        layer.update(keys, values)
        cache.layers.append(layer)
    return cache


def _register_attention() -> None:
    """Register :func:`gqa_sdpa_attention` (with SDPA's mask builder) under :data:`GQA_SDPA`; idempotent."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(GQA_SDPA, gqa_sdpa_attention)
    AttentionMaskInterface.register(GQA_SDPA, sdpa_mask)


@dataclass
class _Job:
    request: GenerationRequest
    prompt_ids: list[int]
    loop: asyncio.AbstractEventLoop
    out: asyncio.Queue
    cancelled: bool = False
    # decode state, touched only by the worker thread
    ids: list[int] = field(default_factory=list)
    emitted: int = 0
    done: bool = False
    text: str = ""
    finish_reason: str = "length"
    cached_tokens: int = 0  # prompt tokens served from the prefix cache
    finished: bool = False  # reached its end (stop, EOS, grammar or max_tokens), not cancelled mid-way
    forced: list[int] = field(default_factory=list)  # grammar-forced ids after the last sampled one, not yet fed
    seen: Any = None  # bool [vocab]: ids in the prompt or output (repetition penalty)
    counts: Any = None  # float [vocab]: occurrences in the output (frequency penalty)

    def push(self, item: Any) -> None:
        try:
            self.loop.call_soon_threadsafe(self.out.put_nowait, item)
        except RuntimeError:  # the caller's loop is gone
            self.cancelled = True


class _PrefixCache:
    """Key/value tensors of finished requests (prompt + output), reused for a later prompt that starts with the same
    tokens under the same adapter: the next director decision extends the previous decision's prompt and answer,
    and a persona's next prompt extends its system text and the conversation, so most of a long prompt need not be
    prefilled again (the idea of vLLM's automatic prefix caching, per whole request instead of per block).

    Entries are least recently used first out once their tokens sum past ``max_tokens`` (0 disables the cache).
    A hit needs at least ``min_tokens`` shared tokens and leaves at least one prompt token to prefill (its logits
    start the decode). Only the worker thread touches it.
    """

    def __init__(self, max_tokens: int, min_tokens: int = 32) -> None:
        self.max_tokens, self.min_tokens = max_tokens, min_tokens
        self._entries: "OrderedDict[int, tuple[str, list[int], list]]" = OrderedDict()
        self._next = 0
        self.tokens = 0
        self.hits = 0
        self.hit_tokens = 0

    def lookup(self, adapter: str, ids: list[int]) -> tuple[int, list] | None:
        """``(m, [(keys, values) per layer, cropped to m tokens])`` for the longest cached prefix, or None."""
        if not self.max_tokens:
            return None
        best, best_m = None, 0
        for key, (a, cached, _) in self._entries.items():
            if a != adapter:
                continue
            m = _common_prefix(cached, ids)
            if m > best_m:
                best, best_m = key, m
        best_m = min(best_m, len(ids) - 1)
        if best is None or best_m < self.min_tokens:
            return None
        self._entries.move_to_end(best)
        layers = self._entries[best][2]
        self.hits += 1
        self.hit_tokens += best_m
        return best_m, [(k[:, :, :best_m, :], v[:, :, :best_m, :]) for k, v in layers]

    def store(self, adapter: str, ids: list[int], layers: list) -> None:
        """Add an entry (dropping any entry whose tokens are a prefix of ``ids``: this one covers it)."""
        if not self.max_tokens or len(ids) < self.min_tokens or len(ids) > self.max_tokens:
            return
        for key in [k for k, (a, c, _) in self._entries.items() if a == adapter and len(c) <= len(ids)
                    and ids[:len(c)] == c]:
            self.tokens -= len(self._entries.pop(key)[1])
        self._entries[self._next] = (adapter, ids, layers)
        self._next += 1
        self.tokens += len(ids)
        while self.tokens > self.max_tokens:
            self.tokens -= len(self._entries.popitem(last=False)[1][1])

    def drop(self, adapter: str) -> None:
        """Forget every entry of ``adapter`` (it was unloaded)."""
        for key in [k for k, (a, _, _) in self._entries.items() if a == adapter]:
            self.tokens -= len(self._entries.pop(key)[1])


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def resolve_device(device: str) -> str:
    """``auto`` -> ``cuda`` when torch sees a CUDA GPU, else ``cpu``; ``cpu``, ``cuda`` and ``cuda:N`` as given.

    Raises:
        ValueError: not one of those names, or a CUDA device torch does not see (no GPU, no CUDA build of torch, or
            ``N`` past the visible GPUs).
    """
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":
        return device
    m = re.fullmatch(r"cuda(?::(\d+))?", device)
    if not m:
        raise ValueError(f"engine device {device!r} is not auto, cpu, cuda or cuda:N")
    seen = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if int(m.group(1) or 0) >= seen:
        raise ValueError(f"engine device {device!r}: torch sees {seen} CUDA GPU(s) (torch {torch.__version__}); "
                         "use device auto or cpu, or run where the GPU is visible")
    return device


class GrammarCache:
    """Compiled xgrammar grammars of one tokenizer (``GrammarCompiler`` over ``TokenizerInfo.from_huggingface``; the
    ``stop_ids`` end a grammar), the least recently used dropped past ``max_size`` (directive regexes vary with the
    roster choice). Shared by the engine's constrained decoding and the director policy's grammar sampling in
    training.

    Args:
        tokenizer: A Hugging Face tokenizer.
        vocab_size: Columns of the model's logits.
        stop_ids: Token ids that end generation.
        max_size: Grammars kept.
    """

    def __init__(self, tokenizer: Any, vocab_size: int, stop_ids: list[int], max_size: int = 256) -> None:
        import xgrammar as xgr

        info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size, stop_token_ids=stop_ids)
        self.compiler = xgr.GrammarCompiler(info)
        self.max_size = max_size
        self._cache: "OrderedDict[tuple[str, str], Any]" = OrderedDict()

    def get(self, *, regex: str | None = None, json_schema: str | None = None) -> Any:
        """The compiled grammar of ``regex``, else of ``json_schema`` (vLLM's compact JSON).

        Raises:
            ValueError: an invalid regex or JSON schema.
        """
        key = ("regex", regex) if regex is not None else ("json", json_schema)
        if key not in self._cache:
            if key[0] == "regex":
                self._cache[key] = self.compiler.compile_regex(regex)
            else:
                self._cache[key] = self.compiler.compile_json_schema(json_schema, any_whitespace=False,
                                                                      separators=(",", ":"))
        self._cache.move_to_end(key)
        while len(self._cache) > self.max_size:
            self._cache.popitem(last=False)
        return self._cache[key]


class TransformersEngine(HFTokenizerMixin):
    """Engine on ``transformers`` + ``peft``; see the module docstring.

    Args:
        model: A local model directory or a Hugging Face hub id (resolved through the local HF cache when
            ``HF_HUB_OFFLINE=1``).
        dtype: ``float32``, ``bfloat16`` or ``float16``.
        max_model_len: Cap on prompt + generated tokens (the model's ``max_position_embeddings`` caps it too).
        max_batch_size: Most requests decoded together.
        batch_wait_ms: After the first request arrives, how long to wait for more before decoding.
        adapters: LoRA adapters to load at start, ``{name: directory}``.
        metrics: A :class:`mascot.core.metrics.Metrics`, or None.
        component: Label of ``mascot_engine_batch_size``.
        threads: torch intra-op threads (0 keeps the default).
        continuous_batching: Admit requests that arrive during a batch between its decode steps.
        prefix_cache_tokens: Budget of the prefix cache in tokens (0 disables it; see :class:`_PrefixCache`).
        device: ``auto`` (the first CUDA GPU when torch sees one, else the CPU), ``cpu``, ``cuda`` or ``cuda:N``: where
            the model, its KV cache and the decode batch live; the grammar bitmask is filled on the CPU and moved.
        jump_forward: Under a grammar, feed the text the grammar forces next (``Action: `` after an ``Agent:``
            line, the rest of a persona's name) in one forward step instead of one step per token (jump-forward
            decoding, as in SGLang; xgrammar ``GrammarMatcher.find_jump_forward_string``). The text obeys the same
            grammar; its token ids may differ from token-by-token decoding, whose outputs vLLM gives.
    """

    supports_structured_output = True

    def __init__(self, model: str, *, dtype: str = "float32", max_model_len: int = 2048,
                 max_batch_size: int = 16, batch_wait_ms: float = 2.0, adapters: dict[str, str] | None = None,
                 metrics: Any = None, component: str = "engine", threads: int = 0,
                 continuous_batching: bool = True, prefix_cache_tokens: int = 0, jump_forward: bool = True,
                 device: str = "auto") -> None:
        self.model_id = model
        #: Where the model runs, resolved at :meth:`start` (``cpu``, ``cuda``, ``cuda:N``).
        self.device = device
        self.dtype = dtype
        self._max_model_len = max_model_len
        self.max_context_tokens = max_model_len
        self.max_batch_size = max_batch_size
        self.batch_wait_s = batch_wait_ms / 1000.0
        self._initial_adapters = dict(adapters or {})
        self._metrics = metrics
        self._component = component
        self._threads = threads
        self._queue: queue.Queue[_Job | None] = queue.Queue()
        self._lock = threading.Lock()
        self._adapters: dict[str, str] = {}
        self._worker: threading.Thread | None = None
        self._grammars: GrammarCache | None = None
        self.model: Any = None
        self.tokenizer: Any = None
        #: Sizes of the last 1024 decode batches (at each start or admission), for inspection.
        self.batch_sizes: "deque[int]" = deque(maxlen=1024)
        #: Key/value columns of the running batch after its last decode step (its longest live row, left-padded).
        self.cache_width = 0
        #: Admit requests into a running batch between decode steps (False: a batch runs to its end first).
        self.continuous_batching = continuous_batching
        self._stop_seen = False
        self._admitted: list[_Job] = []
        #: Prefix cache (see :class:`_PrefixCache`); 0 tokens disables it.
        self.prefix_cache = _PrefixCache(prefix_cache_tokens)
        #: Feed grammar-forced text in one step (see the class docstring).
        self.jump_forward = jump_forward
        #: Decode forward passes run and tokens they fed (jump-forward feeds several tokens of a row in one pass).
        self.decode_steps = 0
        self.decode_tokens = 0

    # ---------------------------------------------------------------- lifecycle
    async def start(self) -> None:
        """Load tokenizer, model and initial adapters (in a thread), then start the batching worker.

        Raises:
            OSError: the model directory or hub id cannot be resolved.
            ValueError: ``device`` names a GPU that torch does not see, or is not a device name.
        """
        self.device = resolve_device(self.device)
        await asyncio.to_thread(self._load)
        self._worker = threading.Thread(target=self._run, name="mascot-engine", daemon=True)
        self._worker.start()
        # A process that exits without close() must still stop the worker before interpreter teardown: a daemon
        # thread inside torch at finalisation aborts the process ("terminate called without an active exception").
        atexit.register(self._stop_worker)

    def _cancel_running(self) -> None:
        """Mark the running batch's requests cancelled, so the worker leaves the batch at its next step instead of
        decoding every row to its end (at 16 rows on two slow cores that took longer than the join below waits, and
        a worker still inside torch at interpreter exit aborts the process)."""
        for j in list(self._admitted):
            if not j.done:
                j.cancelled = True
                j.push(RuntimeError("engine closed"))

    def _stop_worker(self) -> None:
        if self._worker is not None:
            self._cancel_running()
            self._queue.put(None)
            self._worker.join(30)
            self._worker = None

    def _load(self) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if self._threads:
            torch.set_num_threads(self._threads)
        self.device = resolve_device(self.device)  # start() resolved it already; a direct _load() too
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_id)
        self.model = AutoModelForCausalLM.from_pretrained(self.model_id, dtype=getattr(torch, self.dtype))
        if self.device != "cpu":
            self.model.to(self.device)
        if self.model.config._attn_implementation == "sdpa":
            _register_attention()
            self.model.set_attn_implementation(GQA_SDPA)
        self.model.eval()
        window = getattr(self.model.config, "max_position_embeddings", None) or self._max_model_len
        self.max_context_tokens = min(self._max_model_len, int(window))
        eos: set[int] = set()
        for src in (getattr(self.model.generation_config, "eos_token_id", None), self.tokenizer.eos_token_id):
            if isinstance(src, int):
                eos.add(src)
            elif src:
                eos.update(int(x) for x in src)
        self._eos = eos
        self._pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else min(eos)
        for name, path in self._initial_adapters.items():
            self._load_adapter_sync(name, path)

    async def close(self) -> None:
        """Stop the worker: the running batch ends at its next decode step (its requests are cancelled) and queued
        requests fail with RuntimeError."""
        if self._worker is not None:
            self._cancel_running()
            self._queue.put(None)
            await asyncio.to_thread(self._worker.join, 30)
            self._worker = None
        atexit.unregister(self._stop_worker)
        while not self._queue.empty():
            job = self._queue.get_nowait()
            if job is not None:
                job.push(RuntimeError("engine closed"))

    # ---------------------------------------------------------------- helpers
    def adapters(self) -> list[str]:
        """Names of the loaded adapters."""
        return sorted(self._adapters)

    async def load_adapter(self, name: str, path: str) -> None:
        """Load a PEFT LoRA adapter directory under ``name`` (waits for the running batch).

        Raises:
            ValueError: ``name`` is already loaded (versions get new names).
            OSError/ValueError from PEFT: not an adapter directory, or made for another base.
        """
        await asyncio.to_thread(self._load_adapter_sync, name, path)

    def _load_adapter_sync(self, name: str, path: str) -> None:
        from peft import PeftModel

        if name in self._adapters:
            raise ValueError(f"adapter {name!r} is already loaded; publish a new version under a new name")
        if not Path(path, "adapter_config.json").is_file():
            raise ValueError(f"{path} is not a PEFT adapter directory (no adapter_config.json)")
        with self._lock:
            if isinstance(self.model, PeftModel):
                self.model.load_adapter(path, adapter_name=name)
            else:
                self.model = PeftModel.from_pretrained(self.model, path, adapter_name=name)
            self.model.eval()
            self._adapters[name] = path

    async def unload_adapter(self, name: str) -> None:
        """Delete adapter ``name`` from the model (waits for the running batch).

        Raises:
            UnknownAdapter: ``name`` is not loaded.
        """
        if name not in self._adapters:
            raise UnknownAdapter(name)
        await asyncio.to_thread(self._unload_adapter_sync, name)

    def _unload_adapter_sync(self, name: str) -> None:
        with self._lock:
            if len(self._adapters) == 1:  # the last one: back to the plain base model (PEFT cannot run adapterless)
                self.model = self.model.unload()
            else:
                self.model.delete_adapter(name)
            del self._adapters[name]
            self.prefix_cache.drop(name)

    def _grammar(self, structured: Any) -> Any:
        if self._grammars is None:
            self._grammars = GrammarCache(self.tokenizer, self.model.config.vocab_size, sorted(self._eos))
        return self._grammars.get(regex=structured.regex, json_schema=structured.json_schema)

    # ---------------------------------------------------------------- public API
    async def stream(self, request: GenerationRequest) -> AsyncIterator[StreamDelta | GenerationResult]:
        """Stream deltas, then the result. See :meth:`mascot.core.engine.base.Engine.stream`.

        Raises:
            RuntimeError: the engine is not started.
            UnknownAdapter: ``request.adapter`` is not loaded.
            PromptTooLong: prompt tokens + ``max_tokens`` > ``max_context_tokens``.
            ValueError: an invalid regex or JSON schema.
        """
        if self._worker is None:
            raise RuntimeError("engine not started")
        if request.adapter not in (None, BASE_ADAPTER) and request.adapter not in self._adapters:
            raise UnknownAdapter(request.adapter)
        ids = self.tokenizer(request.prompt, add_special_tokens=False)["input_ids"]
        if not ids:
            raise ValueError("empty prompt")
        if len(ids) + request.sampling.max_tokens > self.max_context_tokens:
            raise PromptTooLong(f"prompt of {len(ids)} tokens + max_tokens {request.sampling.max_tokens} exceeds the "
                                f"context window of {self.max_context_tokens} tokens")
        if request.structured is not None:
            await asyncio.to_thread(self._grammar, request.structured)  # compile errors surface here
        job = _Job(request=request, prompt_ids=ids, loop=asyncio.get_running_loop(), out=asyncio.Queue())
        self._queue.put(job)
        try:
            while True:
                item = await job.out.get()
                if isinstance(item, BaseException):
                    raise item
                yield item
                if isinstance(item, GenerationResult):
                    return
        finally:
            job.cancelled = True


    # ---------------------------------------------------------------- worker
    def _run(self) -> None:
        while True:
            first = self._queue.get()
            if first is None:
                return
            batch = [first]
            deadline = time.monotonic() + self.batch_wait_s
            stop = False
            while len(batch) < self.max_batch_size:
                try:
                    nxt = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
                except queue.Empty:
                    break
                if nxt is None:
                    stop = True
                    break
                batch.append(nxt)
            batch = [j for j in batch if not j.cancelled]
            self._admitted = list(batch)
            if batch:
                try:
                    with self._lock:
                        self._decode(batch)
                except Exception as e:  # a failed batch fails its requests, never the worker
                    log.exception("engine batch failed")
                    for j in self._admitted:
                        if not j.done:
                            j.push(RuntimeError(f"generation failed: {type(e).__name__}"))
            if stop or self._stop_seen:
                return

    def _prefill(self, jobs: list[_Job]) -> dict:
        """Prefill ``jobs``: those with a cached prompt prefix one by one from that prefix, the others as one
        left-padded batch; the joined decode state (KV cache, mask, next positions, first logits)."""
        hits = [(j, self.prefix_cache.lookup(self._adapter_name(j), j.prompt_ids)) for j in jobs]
        cold = [j for j, h in hits if h is None]
        states = [self._prefill_from(j, h) for j, h in hits if h is not None]
        if cold:
            states.append(self._prefill_batch(cold))
        state = states[0]
        for other in states[1:]:
            state = self._merge(state, other)
        self._observe_prompt(jobs)
        return state

    @staticmethod
    def _adapter_name(j: _Job) -> str:
        return j.request.adapter or BASE_ADAPTER

    def _prefill_from(self, j: _Job, hit: tuple[int, list]) -> dict:
        """Prefill one job from ``hit`` = (m, per-layer (keys, values) of its first m prompt tokens)."""
        import torch

        m, layers = hit
        rest = j.prompt_ids[m:]
        cache = _kv_cache(layers)
        mask = torch.ones((1, len(j.prompt_ids)), dtype=torch.long, device=self.device)
        pos = torch.arange(m, len(j.prompt_ids), dtype=torch.long, device=self.device).unsqueeze(0)
        with torch.inference_mode():
            out = self.model(input_ids=torch.tensor([rest], dtype=torch.long, device=self.device), attention_mask=mask,
                             position_ids=pos, past_key_values=cache, use_cache=True, logits_to_keep=1,
                             **self._adapter_kw([j]))
        j.cached_tokens = m
        return {"rows": [j], "cache": cache, "mask": mask, "pos": pos[:, -1:] + 1,
                "logits": out.logits[:, -1, :].float(), "gens": [self._generator(j)], "matchers": [self._matcher(j)]}

    def _remember(self, state: dict, i: int) -> None:
        """Store row ``i``'s KV (prompt + output fed so far, padding dropped) in the prefix cache."""
        if not self.prefix_cache.max_tokens:
            return
        j = state["rows"][i]
        cols = state["mask"][i].nonzero().squeeze(-1)  # fed tokens (a jump-forward step leaves padding holes)
        ids = (j.prompt_ids + j.ids)[:cols.numel()]
        layers = [(layer.keys[i:i + 1, :, cols, :].contiguous(), layer.values[i:i + 1, :, cols, :].contiguous())
                  for layer in state["cache"].layers]
        self.prefix_cache.store(self._adapter_name(j), ids, layers)

    def _prefill_batch(self, jobs: list[_Job]) -> dict:
        """Prefill ``jobs`` as one left-padded batch: their KV cache, mask, next positions and first logits."""
        import torch

        n = len(jobs)
        width = max(len(j.prompt_ids) for j in jobs)
        input_ids = torch.full((n, width), self._pad, dtype=torch.long)
        mask = torch.zeros((n, width), dtype=torch.long)
        for i, j in enumerate(jobs):
            input_ids[i, width - len(j.prompt_ids):] = torch.tensor(j.prompt_ids)
            mask[i, width - len(j.prompt_ids):] = 1
        input_ids, mask = input_ids.to(self.device), mask.to(self.device)  # built on the CPU, moved once
        position_ids = (mask.cumsum(-1) - 1).clamp(min=0)
        cache = _kv_cache()
        out = self.model(input_ids=input_ids, attention_mask=mask, position_ids=position_ids, past_key_values=cache,
                         use_cache=True, logits_to_keep=1, **self._adapter_kw(jobs))
        return {"rows": list(jobs), "cache": cache, "mask": mask, "pos": position_ids[:, -1:] + 1,
                "logits": out.logits[:, -1, :].float(), "gens": [self._generator(j) for j in jobs],
                "matchers": [self._matcher(j) for j in jobs]}

    def _adapter_kw(self, rows: list[_Job]) -> dict:
        if not self._adapters:
            return {}
        return {"adapter_names": [_PEFT_BASE if j.request.adapter in (None, BASE_ADAPTER) else j.request.adapter
                                  for j in rows]}

    def _generator(self, j: _Job) -> Any:
        import torch

        g = torch.Generator(device=self.device)
        g.manual_seed(j.request.sampling.seed if j.request.sampling.seed is not None else random.getrandbits(63))
        return g

    def _matcher(self, j: _Job) -> Any:
        import xgrammar as xgr

        return xgr.GrammarMatcher(self._grammar(j.request.structured)) if j.request.structured is not None else None

    @staticmethod
    def _select(state: dict, keep: list[int]) -> dict:
        """The rows ``keep`` of a decode state (finished rows leave the batch)."""
        import torch

        idx = torch.tensor(keep, dtype=torch.long, device=state["mask"].device)
        state["cache"].batch_select_indices(idx)
        return TransformersEngine._trim({
            "rows": [state["rows"][i] for i in keep], "cache": state["cache"], "mask": state["mask"][idx],
            "pos": state["pos"][idx], "logits": state["logits"][idx], "gens": [state["gens"][i] for i in keep],
            "matchers": [state["matchers"][i] for i in keep]})

    @staticmethod
    def _trim(state: dict) -> dict:
        """Drop the leading cache columns that are padding for every row (left behind by rows that finished), so
        a batch that keeps admitting requests stays as wide as its longest live row instead of growing with every
        step since it started. Positions are explicit, so the remaining rows are unaffected."""
        import torch

        live = state["mask"].any(dim=0)
        lead = int(torch.argmax(live.to(torch.int8))) if bool(live.any()) else 0
        if lead:
            for layer in state["cache"].layers:
                layer.keys = layer.keys[:, :, lead:, :].contiguous()
                layer.values = layer.values[:, :, lead:, :].contiguous()
            state["mask"] = state["mask"][:, lead:]
        return state

    @staticmethod
    def _merge(a: dict, b: dict) -> dict:
        """One decode state from two: caches and masks left-padded to the same length, rows concatenated."""
        import torch
        import torch.nn.functional as F

        la, lb = a["mask"].shape[1], b["mask"].shape[1]
        width = max(la, lb)

        def pad(t: Any, extra: int, dim: int) -> Any:
            if not extra:
                return t
            shape = list(t.shape)
            shape[dim] = extra
            return torch.cat([torch.zeros(shape, dtype=t.dtype, device=t.device), t], dim=dim)

        layers = []
        for x, y in zip(a["cache"].layers, b["cache"].layers):
            layers.append((torch.cat([pad(x.keys, width - la, 2), pad(y.keys, width - lb, 2)]),
                           torch.cat([pad(x.values, width - la, 2), pad(y.values, width - lb, 2)])))
        mask = torch.cat([F.pad(a["mask"], (width - la, 0)), F.pad(b["mask"], (width - lb, 0))])
        return {"rows": a["rows"] + b["rows"], "cache": _kv_cache(layers), "mask": mask,
                "pos": torch.cat([a["pos"], b["pos"]]), "logits": torch.cat([a["logits"], b["logits"]]),
                "gens": a["gens"] + b["gens"], "matchers": a["matchers"] + b["matchers"]}

    def _admit(self, room: int) -> list[_Job]:
        """Requests that arrived while a batch is decoding (continuous batching), up to ``room``."""
        new: list[_Job] = []
        while len(new) < room and not self._stop_seen:
            try:
                nxt = self._queue.get_nowait()
            except queue.Empty:
                break
            if nxt is None:
                self._stop_seen = True
                break
            if not nxt.cancelled:
                new.append(nxt)
        return new

    def _observe_prompt(self, jobs: list[_Job]) -> None:
        if self._metrics is not None:
            cached = sum(j.cached_tokens for j in jobs)
            m = self._metrics.engine_prompt_tokens
            m.labels(component=self._component, source="cached").inc(cached)
            m.labels(component=self._component, source="computed").inc(sum(len(j.prompt_ids) for j in jobs) - cached)

    def _observe_batch(self, n: int) -> None:
        self.batch_sizes.append(n)
        if self._metrics is not None:
            self._metrics.engine_batch_size.labels(component=self._component).observe(n)

    def _decode(self, batch: list[_Job]) -> None:
        """Decode ``batch`` to the end, admitting requests that arrive meanwhile between steps (continuous
        batching: a new request is prefilled on its own and its KV cache joined to the running batch, so it does not
        wait for the longest running request); finished rows leave the batch."""
        import torch
        import xgrammar as xgr

        with torch.inference_mode():
            state = self._prefill(batch)
            self._observe_batch(len(batch))
            while True:
                rows, logits = state["rows"], state["logits"]
                n = len(rows)
                matchers = state["matchers"]
                if any(m is not None for m in matchers):
                    with torch.device("cpu"):  # xgrammar fills it on the CPU
                        bitmask = xgr.allocate_token_bitmask(n, self.model.config.vocab_size)
                    live = []
                    for i, m in enumerate(matchers):
                        if m is not None and not rows[i].done:
                            m.fill_next_token_bitmask(bitmask, i)
                            live.append(i)
                    if live:
                        xgr.apply_token_bitmask_inplace(logits, bitmask.to(logits.device), indices=live)
                feed: list[list[int]] = [[self._pad] for _ in rows]  # ids each row feeds next: sampled + forced
                for i, j in enumerate(rows):
                    if j.done:
                        continue
                    if j.cancelled:
                        j.done = True
                        continue
                    tok = self._choose(logits[i], j.request.sampling, state["gens"][i], j)
                    self._advance(j, tok, matchers[i], n)
                    feed[i] = [tok, *j.forced]
                    j.forced = []
                keep = [i for i, j in enumerate(rows) if not j.done]
                for i, j in enumerate(rows):
                    if j.finished:  # ended by its own stop (a caller that stops reading marks it cancelled too)
                        self._remember(state, i)
                new = self._admit(self.max_batch_size - len(keep)) if self.continuous_batching else []
                if not keep and not new:
                    return
                if keep:
                    if len(keep) < n:
                        state = self._select(state, keep)
                    state = self._step(state, [feed[i] for i in keep])
                if new:
                    self._admitted.extend(new)
                    fresh = self._prefill(new)
                    state = self._merge(state, fresh) if keep else fresh
                    self._observe_batch(len(state["rows"]))

    def _step(self, state: dict, feed: list[list[int]]) -> dict:
        """One decode forward pass: row ``r`` feeds the ids ``feed[r]`` (its sampled token, then any grammar-forced
        ones). Rows feeding fewer ids than the longest are left-padded inside the step (mask 0, so the padding
        columns are holes no later token attends to); positions are explicit, so every row stays exact."""
        import torch

        k = max(len(f) for f in feed)
        m = len(feed)
        ids = torch.full((m, k), self._pad, dtype=torch.long)
        step_mask = torch.zeros((m, k), dtype=torch.long)
        lengths = torch.tensor([len(f) for f in feed], dtype=torch.long).unsqueeze(1)
        for r, f in enumerate(feed):
            ids[r, k - len(f):] = torch.tensor(f, dtype=torch.long)
            step_mask[r, k - len(f):] = 1
        dev = state["mask"].device  # built on the CPU, moved once
        ids, step_mask, lengths = ids.to(dev), step_mask.to(dev), lengths.to(dev)
        pos = (state["pos"] + torch.arange(k, dtype=torch.long, device=dev).unsqueeze(0) - (k - lengths)).clamp(min=0)
        mask = torch.cat([state["mask"], step_mask], dim=1)
        out = self.model(input_ids=ids, attention_mask=mask, position_ids=pos, past_key_values=state["cache"],
                         use_cache=True, logits_to_keep=1, **self._adapter_kw(state["rows"]))
        self.cache_width = mask.shape[1]
        self.decode_steps += 1
        self.decode_tokens += int(lengths.sum())
        return {**state, "mask": mask, "pos": state["pos"] + lengths, "logits": out.logits[:, -1, :].float()}

    def _jump(self, j: _Job, matcher: Any) -> list[int]:
        """Ids of the text ``matcher`` forces next, accepted into it (all but the last token of that text, which
        may merge with what follows; none past ``max_tokens``). Counted for the penalties like sampled ids."""
        text = matcher.find_jump_forward_string()
        if not text:
            return []
        room = j.request.sampling.max_tokens - len(j.ids)
        out: list[int] = []
        for t in self.tokenizer(text, add_special_tokens=False)["input_ids"][:-1][:max(0, room)]:
            if not matcher.accept_token(t):
                break
            out.append(t)
            if j.seen is not None:
                j.seen[t] = True
                j.counts[t] += 1
        return out

    @staticmethod
    def _choose(logits: Any, sp: Any, gen: Any, job: _Job | None = None) -> int:
        import torch

        if job is not None and (sp.repetition_penalty != 1.0 or sp.frequency_penalty):
            if job.seen is None:  # per-request vocabulary tensors, updated with each chosen token
                job.seen = torch.zeros(logits.shape[0], dtype=torch.bool, device=logits.device)
                job.seen[torch.tensor(job.prompt_ids + job.ids, dtype=torch.long, device=logits.device)] = True
                job.counts = torch.zeros(logits.shape[0], dtype=logits.dtype, device=logits.device)
                for t in job.ids:
                    job.counts[t] += 1
            if sp.repetition_penalty != 1.0:  # vLLM's meaning: prompt and output ids, once each
                pen = torch.where(logits > 0, logits / sp.repetition_penalty, logits * sp.repetition_penalty)
                logits = torch.where(job.seen, pen, logits)
            if sp.frequency_penalty:  # vLLM's meaning: generated ids, per occurrence
                logits = logits - sp.frequency_penalty * job.counts
        if sp.temperature == 0:
            tok = int(torch.argmax(logits))
        else:
            probs = torch.softmax(logits / sp.temperature, dim=-1)
            if sp.top_p < 1.0:
                sorted_p, idx = torch.sort(probs, descending=True)
                keep = sorted_p.cumsum(-1) - sorted_p < sp.top_p
                keep[0] = True
                filtered = torch.zeros_like(probs)
                filtered[idx[keep]] = sorted_p[keep]
                probs = filtered / filtered.sum()
            tok = int(torch.multinomial(probs, 1, generator=gen))
        if job is not None and job.seen is not None:
            job.seen[tok] = True
            job.counts[tok] += 1
        return tok

    def _advance(self, j: _Job, tok: int, matcher: Any, n: int) -> None:
        j.ids.append(tok)
        grammar_done = False
        if matcher is not None:
            if not matcher.accept_token(tok):
                self._finish(j, "stop", n)  # cannot happen under the mask; end rather than emit garbage
                return
            grammar_done = matcher.is_terminated()
            if self.jump_forward and not grammar_done and tok not in self._eos:
                j.forced = self._jump(j, matcher)
                j.ids.extend(j.forced)
        if tok in self._eos:
            self._finish(j, "stop", n)
            return
        text = self.tokenizer.decode(j.ids, skip_special_tokens=True)
        stops = j.request.sampling.stop
        for s in stops:
            k = text.find(s, max(0, j.emitted - len(s)))
            if k != -1:
                j.text = text[:k]
                self._finish(j, "stop", n)
                return
        j.text = text
        if grammar_done:
            self._finish(j, "stop", n)
            return
        safe = len(text)
        while safe > j.emitted and text[safe - 1] == "\ufffd":  # an incomplete multi-byte character
            safe -= 1
        for s in stops:  # hold back a tail that could be the start of a stop string
            for m in range(min(len(s) - 1, safe - j.emitted), 0, -1):
                if text[safe - m:safe] == s[:m]:
                    safe -= m
                    break
        if safe > j.emitted:
            j.push(StreamDelta(text[j.emitted:safe]))
            j.emitted = safe
        if len(j.ids) >= j.request.sampling.max_tokens:
            self._finish(j, "length", n)

    def _finish(self, j: _Job, reason: str, n: int) -> None:
        text = j.text.rstrip("\ufffd")
        if len(text) > j.emitted:
            j.push(StreamDelta(text[j.emitted:]))
            j.emitted = len(text)
        j.done = True
        j.finished = True
        j.finish_reason = reason
        j.push(GenerationResult(text=text, token_ids=tuple(j.ids), finish_reason=reason,
                                prompt_tokens=len(j.prompt_ids), adapter=j.request.adapter or BASE_ADAPTER,
                                batch_size=n, cached_tokens=j.cached_tokens))
