"""Atomic file writes: a crashed writer leaves the old file or none, never a half-written one (DESIGN.md section 3)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import BinaryIO, Callable


def atomic_write(path: str | Path, write: Callable[[BinaryIO], None], mode: int = 0o644) -> Path:
    """Call ``write(fh)`` on a temporary file in ``path``'s folder, fsync it, set ``mode``, then rename it to ``path``.

    Args:
        path: Destination; its folder must exist.
        write: Writes the content to a binary file object.
        mode: Permission bits of the result (``mkstemp`` would leave 0600).

    Returns:
        ``path`` as a Path.

    Raises:
        OSError: the folder is missing or not writable; the temporary file is removed.
    """
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def atomic_write_text(path: str | Path, text: str, mode: int = 0o644) -> Path:
    """:func:`atomic_write` of UTF-8 ``text`` (newlines written as given)."""
    data = text.encode("utf-8")
    return atomic_write(path, lambda fh: fh.write(data), mode)
