"""Stage manifests and resumption.

A stage's outputs live in ``<out>/<stage>/``; its ``manifest.json`` is written last, atomically, and records
input digests, the data ids used, the stage's config, library versions, metrics and timings. A stage is done when
its manifest exists with the same config digest and input digests; otherwise it runs again. Stages build into
``<out>/<stage>.partial/`` (which may hold resumable progress) and rename it into place at the end, so a crash
never leaves a half-written artefact under the final name.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from contextlib import contextmanager
from importlib import metadata
from pathlib import Path
from typing import Any, Iterator

from mascot.core.files import atomic_write_text

MANIFEST = "manifest.json"
#: The file in ``<stage>.partial/`` holding the key of the run that made it (:func:`stage_dir`).
PARTIAL_KEY = ".stage_key"
_LIBS = ("torch", "transformers", "trl", "peft", "accelerate", "datasets", "mascot")


def digest_path(path: str | Path) -> str:
    """SHA-256 (hex) of a file, or of a directory's files (relative names and contents, sorted); '' if missing."""
    p = Path(path)
    if not p.exists():
        return ""
    h = hashlib.sha256()
    files = [p] if p.is_file() else sorted(f for f in p.rglob("*") if f.is_file() and f.name != MANIFEST)
    for f in files:
        h.update(str(f.relative_to(p) if p.is_dir() else f.name).encode())
        with f.open("rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()


def digest_obj(obj: Any) -> str:
    """SHA-256 (hex) of the canonical JSON of ``obj``."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()


def library_versions() -> dict[str, str]:
    """Installed versions of the training libraries."""
    out = {}
    for lib in _LIBS:
        try:
            out[lib] = metadata.version(lib)
        except metadata.PackageNotFoundError:
            pass
    return out


def read_manifest(stage_dir: str | Path) -> dict | None:
    """The stage's manifest, or None when the stage has not completed."""
    p = Path(stage_dir) / MANIFEST
    if not p.is_file():
        return None
    return json.loads(p.read_text(encoding="utf-8"))


def is_done(out: str | Path, stage: str, config: Any, inputs: dict[str, str]) -> bool:
    """True when ``<out>/<stage>`` completed with this config and these input digests."""
    m = read_manifest(Path(out) / stage)
    return bool(m) and m.get("config_digest") == digest_obj(config) and m.get("inputs") == inputs


@contextmanager
def stage_dir(out: str | Path, stage: str, config: Any, inputs: dict[str, str]) -> Iterator[tuple[Path, dict]]:
    """Build a stage in ``<out>/<stage>.partial`` and publish it as ``<out>/<stage>`` with its manifest.

    Yields ``(partial_dir, manifest)``; the stage fills ``manifest["metrics"]``, ``["data_ids"]`` and any extra
    keys. On success the manifest (with config, digests, versions, timings) is written and the directory renamed;
    on an exception the partial directory stays for resumption and nothing is published. The partial directory
    records its stage key (config and input digests, :data:`PARTIAL_KEY`): one left by a run with another key is
    cleared first, so a rerun with new settings or inputs never resumes rows made under the old ones (a partial
    directory without a key is resumed as before).
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    final, partial = out / stage, out / f"{stage}.partial"
    key = digest_obj([config, inputs])
    key_file = partial / PARTIAL_KEY
    if key_file.is_file() and key_file.read_text(encoding="utf-8").strip() != key:
        shutil.rmtree(partial)
    partial.mkdir(parents=True, exist_ok=True)
    atomic_write_text(key_file, key + "\n")
    manifest: dict = {"stage": stage, "config": json.loads(json.dumps(config, default=str)),
                      "config_digest": digest_obj(config), "inputs": inputs, "data_ids": [], "metrics": {},
                      "versions": library_versions()}
    t0 = time.time()
    yield partial, manifest
    stamp = "%Y-%m-%dT%H:%M:%SZ"
    manifest["timings"] = {"seconds": round(time.time() - t0, 3), "started": time.strftime(stamp, time.gmtime(t0)),
                           "finished": time.strftime(stamp, time.gmtime())}
    key_file.unlink(missing_ok=True)
    manifest["outputs"] = digest_path(partial)
    atomic_write_text(partial / MANIFEST, json.dumps(manifest, indent=2, default=str) + "\n")
    if final.exists():
        old = out / f".{stage}.old.{os.getpid()}"
        os.replace(final, old)
        os.replace(partial, final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(partial, final)
