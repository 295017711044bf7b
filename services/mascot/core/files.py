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


#: Deepest nesting of arrays and objects :func:`iter_jsonl_records` reads in one record (a record inside is 1).
MAX_JSON_DEPTH = 64


def json_depth_over(value: object, limit: int) -> bool:
    """True when arrays and objects nest more than ``limit`` levels deep in ``value`` (a top-level object or array is
    level 1). Iterative: any depth is measured without recursion."""
    stack = [(value, 1)]
    while stack:
        v, depth = stack.pop()
        children = v.values() if isinstance(v, dict) else v if isinstance(v, list) else None
        if children is None:
            continue
        if depth > limit:
            return True
        stack.extend((c, depth + 1) for c in children)
    return False


def iter_jsonl_records(path: str | Path, need: tuple[str, ...], why: str) -> Iterator[tuple[int, dict]]:
    """Yield ``(line number, record)`` for each non-blank JSONL line of ``path`` that holds every key in ``need``.

    Raises:
        FileNotFoundError: no such file.
        ValueError: a line is not UTF-8 or not JSON, nests arrays and objects more than :data:`MAX_JSON_DEPTH`
            levels deep, is not a JSON object, or lacks a key (``"FILE:LINE: record lacks K needed by WHY"``); the
            message starts with ``FILE:LINE:`` (1-based), never a RecursionError.
    """
    too_deep = f"arrays and objects nested more than {MAX_JSON_DEPTH} levels deep"
    with open(path, "rb") as f:
        for n, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise ValueError(f"{path}:{n}: not UTF-8 text ({e.reason} at byte {e.start} of the line)") from None
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{n}: not valid JSON ({e.msg})") from None
            except RecursionError:  # the decoder recurses once per level
                raise ValueError(f"{path}:{n}: {too_deep}") from None
            except ValueError:  # an integer of more digits than Python converts (4300)
                raise ValueError(f"{path}:{n}: not valid JSON (a number too long to read)") from None
            if json_depth_over(rec, MAX_JSON_DEPTH):
                raise ValueError(f"{path}:{n}: {too_deep}")
            if not isinstance(rec, dict):
                raise ValueError(f"{path}:{n}: not a JSON object (a record is {{...}}), got {json_type(rec)}")
            missing = [k for k in need if k not in rec]
            if missing:
                raise ValueError(f"{path}:{n}: record lacks {', '.join(missing)} needed by {why}")
            yield n, rec


def json_type(value: object) -> str:
    """The JSON name of ``value``'s type, with its article: "an object", "an array", "a string", "a number",
    "a boolean" or "null"."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    return {dict: "an object", list: "an array", str: "a string"}.get(type(value), type(value).__name__)


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
