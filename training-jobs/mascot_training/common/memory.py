"""Give the memory a finished stage freed back to the operating system.

A stage that trains a model (a reward model, a GRPO policy) frees gigabytes of activations and optimiser state when
it ends, but glibc's allocator keeps freed pages in the arena they came from, and the stages of a pipeline run in
different threads (phase 2's group reward model inside the engine's event-loop thread, GRPO in the main thread). The
next stage then cannot reuse them and the process's resident memory grows stage by stage. glibc's ``malloc_trim``
returns the free pages of every arena (``man 3 malloc_trim``); with another C library or allocator this is a garbage
collection only.
"""

from __future__ import annotations

import ctypes
import functools
import gc
import os
from typing import Any


def resident_bytes() -> int | None:
    """The process's resident set size in bytes (``/proc/self/statm``), or None where that file does not exist."""
    try:
        with open("/proc/self/statm", encoding="ascii") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


@functools.cache
def _malloc_trim() -> Any:
    """glibc's ``malloc_trim`` from the running process, or None (no glibc: musl, macOS, Windows)."""
    try:
        fn = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError, TypeError):
        return None
    fn.argtypes, fn.restype = [ctypes.c_size_t], ctypes.c_int
    return fn


def release_freed_memory() -> int | None:
    """Collect garbage and return free heap pages of all threads' arenas to the OS (glibc ``malloc_trim(0)``).

    Returns:
        Bytes of resident memory given back (resident before minus after; 0 when nothing came back, as with a
        preloaded allocator such as jemalloc), or None when the process has no ``malloc_trim`` or its resident size
        cannot be read. Never raises.
    """
    before = resident_bytes()
    gc.collect()
    trim = _malloc_trim()
    if trim is None:
        return None
    trim(0)
    after = resident_bytes()
    if before is None or after is None:
        return None
    return max(0, before - after)


def after_stage(stage: str) -> str:
    """Release freed memory after ``stage`` (:func:`release_freed_memory`) and return the line to print.

    The line reads ``stage <stage>: gave back <n> GB of freed memory, resident <m> GB``, or ``stage <stage>: resident
    <m> GB`` when less than 0.05 GB came back, or ``stage <stage>: resident size unknown`` without ``/proc``.
    """
    freed = release_freed_memory()
    now = resident_bytes()
    if now is None:
        return f"stage {stage}: resident size unknown"
    gave = f"gave back {freed / 1e9:.1f} GB of freed memory, " if freed is not None and freed >= 0.05e9 else ""
    return f"stage {stage}: {gave}resident {now / 1e9:.1f} GB"
