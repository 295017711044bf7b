"""Memory a finished stage freed goes back to the OS between stages (:mod:`mascot_training.common.memory`).

A thread allocates 300 MB in 100 KB blocks (glibc serves them from that thread's arena, below the mmap threshold),
touches every page, and frees all but every hundredth: the survivors pin the arena's top, so glibc's automatic trim
cannot shrink it and the freed pages stay resident. ``release_freed_memory`` must give most of them back.
"""

from __future__ import annotations

import re
import sys
import threading

import pytest

from mascot_training.common.memory import release_freed_memory, resident_bytes

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc malloc_trim is Linux-only")


def stage_in_a_thread() -> list[bytearray]:
    """Allocate 300 MB in a worker thread, touch every page, free all but every hundredth block; returns those."""
    keep: list[bytearray] = []

    def stage() -> None:
        blocks = [bytearray(100_000) for _ in range(3000)]
        for b in blocks:
            b[::4096] = b"x" * len(b[::4096])  # touch every page so it is resident
        keep.extend(blocks[::100])

    t = threading.Thread(target=stage)
    t.start()
    t.join()
    return keep


def test_pages_freed_in_a_worker_thread_are_given_back():
    keep = stage_in_a_thread()
    before = resident_bytes()
    freed = release_freed_memory()
    after = resident_bytes()
    assert before is not None and after is not None
    assert freed is not None and freed > 200e6, (before, after, freed)
    assert before - after > 200e6
    assert len(keep) == 30 and all(b[0] == ord("x") for b in keep)  # what is still referenced is untouched


def test_the_line_after_a_stage_says_what_came_back_and_what_is_resident():
    from mascot_training.common.memory import after_stage

    keep = stage_in_a_thread()  # held: the survivors pin the arena
    line = after_stage("group_rm")
    m = re.fullmatch(r"stage group_rm: gave back (\d+\.\d) GB of freed memory, resident (\d+\.\d) GB", line)
    assert m and float(m[1]) >= 0.2 and 0 < float(m[2]) * 1e9 <= resident_bytes() + 0.1e9, line
    assert re.fullmatch(r"stage x: resident \d+\.\d GB", after_stage("x"))  # nothing left to give back
    assert len(keep) == 30
