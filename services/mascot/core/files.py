"""Atomic file writes: a crashed writer leaves the old file or none, never a half-written one."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import BinaryIO, Callable, Iterable, Iterator


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


def iter_jsonl_records(path: str | Path, need: tuple[str, ...], why: str) -> Iterator[tuple[int, dict]]:
    """Yield ``(line number, record)`` for each non-blank JSONL line of ``path`` that holds every key in ``need``.

    Raises:
        FileNotFoundError: no such file.
        ValueError: a line is not a JSON object, or lacks a key (``"FILE:LINE: record lacks K needed by WHY"``).
    """
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{n}: not valid JSON ({e.msg})") from None
            if not isinstance(rec, dict):
                raise ValueError(f"{path}:{n}: not a JSON object")
            missing = [k for k in need if k not in rec]
            if missing:
                raise ValueError(f"{path}:{n}: record lacks {', '.join(missing)} needed by {why}")
            yield n, rec


def atomic_write_text(path: str | Path, text: str, mode: int = 0o644) -> Path:
    """:func:`atomic_write` of UTF-8 ``text`` (newlines written as given)."""
    data = text.encode("utf-8")
    return atomic_write(path, lambda fh: fh.write(data), mode)


def jsonl_text(records: Iterable[dict], default: Callable[[object], object] | None = None) -> str:
    """One JSON object per line (UTF-8 kept as is, not ``\\u`` escaped), each line ending in a newline.
    ``default`` converts values JSON cannot hold (as in :func:`json.dumps`); without it they raise TypeError."""
    return "".join(json.dumps(r, ensure_ascii=False, default=default) + "\n" for r in records)


def write_jsonl(path: str | Path, records: Iterable[dict], mode: int = 0o644,
                default: Callable[[object], object] | None = None) -> Path:
    """:func:`atomic_write_text` of :func:`jsonl_text`: readers see the old file or the whole new one, never a
    part. Returns ``path``."""
    return atomic_write_text(path, jsonl_text(records, default), mode)


def append_jsonl(path: str | Path, obj: dict) -> None:
    """Append one JSON line and fsync it: resumable progress that survives a SIGKILL once this returns."""
    with Path(path).open("a", encoding="utf-8") as f:
        f.write(json.dumps(obj, ensure_ascii=False) + "\n")
        f.flush()
        os.fsync(f.fileno())


def read_jsonl(path: str | Path) -> list[dict]:
    """Complete JSON lines of ``path``; [] when missing. A torn last line (a kill mid-write) is cut off the file,
    so appends resume on a line boundary."""
    path = Path(path)
    if not path.is_file():
        return []
    raw = path.read_bytes()
    good = raw[: raw.rfind(b"\n") + 1]
    if len(good) != len(raw):
        with path.open("r+b") as f:
            f.truncate(len(good))
    return [json.loads(x) for x in good.decode("utf-8").splitlines() if x.strip()]
