"""Give the memory a finished stage freed back to the operating system.

A stage that trains a model (a reward model, a GRPO policy) frees gigabytes of activations and optimiser state when
it ends, but glibc's allocator keeps freed pages in the arena of the thread that allocated them, and the stages of a
pipeline run in different threads (the reward model's stage inside the engine's event-loop thread, GRPO in the main
thread). The next stage then cannot reuse them and the process's resident memory grows stage by stage. glibc's
``malloc_trim`` returns the free pages of every arena (``man 3 malloc_trim``); elsewhere this is a garbage collection
only.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc


def resident_bytes() -> int | None:
    """The process's resident set size in bytes (``/proc/self/statm``), or None where that file does not exist."""
    import os

    try:
        with open("/proc/self/statm", encoding="ascii") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def release_freed_memory() -> int | None:
    """Collect garbage and return free heap pages of all threads' arenas to the OS (glibc ``malloc_trim(0)``).

    Returns:
        Bytes of resident memory given back (resident before minus after; may be 0), or None when the C library is
        not glibc or the resident size cannot be read. Never raises.
    """
    before = resident_bytes()
    gc.collect()
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    trim(0)
    after = resident_bytes()
    if before is None or after is None:
        return None
    return max(0, before - after)


def after_stage(stage: str) -> str:
    """:func:`release_freed_memory` after ``stage`` and the line a pipeline prints about it, ``stage <stage>: gave back
    <n> GB of freed memory, resident <m> GB`` (``resident 3.4 GB`` alone when nothing came back;
    ``resident size unknown`` off Linux)."""
    freed = release_freed_memory()
    now = resident_bytes()
    if now is None:
        return f"stage {stage}: resident size unknown"
    gave = f"gave back {freed / 1e9:.1f} GB of freed memory, " if freed and freed >= 0.05e9 else ""
    return f"stage {stage}: {gave}resident {now / 1e9:.1f} GB"
