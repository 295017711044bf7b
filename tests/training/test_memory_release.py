"""Memory a finished stage freed goes back to the OS between stages (:mod:`mascot_training.common.memory`).

A thread allocates 300 MB in 100 KB blocks (glibc serves them from an arena, below its mmap threshold) and frees all
but every hundredth: the survivors pin the arena's top, so glibc's automatic trim cannot shrink it and the freed
pages stay resident. ``release_freed_memory`` must give most of them back.
"""

from __future__ import annotations

import os
import platform
import re
import threading

import pytest

from mascot_training.common import memory
from mascot_training.common.memory import after_stage, release_freed_memory, resident_bytes

GLIBC = platform.libc_ver()[0] == "glibc" and not os.environ.get("LD_PRELOAD") \
    and "MALLOC_MMAP_THRESHOLD_" not in os.environ
needs_glibc = pytest.mark.skipif(not GLIBC, reason="glibc malloc_trim with its default allocator and mmap threshold")


def stage_in_a_thread() -> list[bytearray]:
    """Allocate 300 MB in a worker thread (bytearray zero-fills, so every page is resident) and free all but every
    hundredth block; returns those."""
    keep: list[bytearray] = []

    def stage() -> None:
        blocks = [bytearray(100_000) for _ in range(3000)]
        keep.extend(blocks[::100])

    t = threading.Thread(target=stage)
    t.start()
    t.join()
    return keep


@needs_glibc
def test_pages_freed_in_a_worker_thread_are_given_back():
    keep = stage_in_a_thread()
    before = resident_bytes()
    freed = release_freed_memory()
    after = resident_bytes()
    assert before is not None and after is not None
    assert freed is not None and freed > 200e6, (before, after, freed)
    assert before - after > 200e6
    assert len(keep) == 30 and all(len(b) == 100_000 for b in keep)  # what is still referenced is untouched


@needs_glibc
def test_the_line_after_a_stage_says_what_came_back_and_what_is_resident():
    keep = stage_in_a_thread()  # held: the survivors pin the arena
    before = resident_bytes()
    line = after_stage("group_rm")
    m = re.fullmatch(r"stage group_rm: gave back (\d+\.\d) GB of freed memory, resident (\d+\.\d) GB", line)
    assert m and float(m[1]) >= 0.2, line
    assert float(m[2]) * 1e9 <= before - 0.15e9, (line, before)  # the resident size after, not before
    assert re.fullmatch(r"stage x: resident \d+\.\d GB", after_stage("x"))  # nothing left to give back
    assert len(keep) == 30


def test_without_malloc_trim_or_proc_it_says_so_and_does_not_raise(monkeypatch):
    monkeypatch.setattr(memory, "_malloc_trim", lambda: None)
    assert release_freed_memory() is None
    assert re.fullmatch(r"stage x: resident \d+\.\d GB", after_stage("x"))
    monkeypatch.setattr(memory, "resident_bytes", lambda: None)
    assert after_stage("x") == "stage x: resident size unknown"
