"""The adapter store and its registry file (DESIGN.md section 5), on a local directory or mounted volume.

Store layout::

    <store>/registry.json                 the index (written atomically, compare-and-swap on "revision")
    <store>/<persona_id>/v<N>/            PEFT files (adapter_config.json, adapter_model.safetensors) + manifest.json

``registry.json``::

    {"revision": int,
     "adapters": {persona_id: {"versions": {"<N>": {"state": "staged"|"canary"|"stable"|"retired",
                                                   "name": "<persona_id>--v<N>", "digest": sha256, "created": iso}},
                               "stable": null | N, "canary": null | N, "canary_weight": 0,
                               "previous_stable": [N, ...]}}}

``manifest.json`` of a version: ``name``, ``persona_id``, ``version``, ``digest`` (SHA-256 of
``adapter_model.safetensors``), ``base_model``, ``rank``, ``run_id``, ``data_ids``, ``eval_metrics``, ``created``.

Publish is atomic (:func:`publish_adapter`): check the adapter (base model, rank within the serving limit, LoRA
tensors only), copy it to ``<persona>/v<N>.tmp-*``, verify the copy's digest, write its manifest, rename it to
``v<N>`` and register it as ``staged`` with a compare-and-swap on the registry revision. Any failure removes what
was written and leaves the registry as it was, so the serving adapter is untouched. Writers serialise on
``<store>/registry.lock``; :func:`update_registry` applies a state transition the same way. AdapterService (hosted
by the gateway) is the writer in a deployment; a training Job without a gateway address writes its own run store.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import time
import uuid
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Iterator

from mascot.core.files import atomic_write_text
from mascot.core.personas import ID_RE  # one rule for persona ids (snake_case)

REGISTRY = "registry.json"
LOCK = "registry.lock"
ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")
#: Serving limit of vLLM ``max_lora_rank``.
MAX_RANK = 64
_VERSION_RE = re.compile(r"^v([1-9][0-9]*)$")


class PublishError(ValueError):
    """The adapter cannot be published; the message says what to change. Nothing was written."""


class RegistryConflict(RuntimeError):
    """The registry changed under us (or stayed locked) on every attempt; nothing was written."""


# ----------------------------------------------------------------------------------------------------- gate


def file_digest(path: str | Path) -> str:
    """SHA-256 (hex) of one file."""
    h = hashlib.sha256()
    with Path(path).open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _same_model(a: str, b: str) -> bool:
    if a == b:
        return True
    pa, pb = Path(a), Path(b)
    return pa.exists() and pb.exists() and pa.resolve() == pb.resolve()


def check_adapter(adapter_dir: str | Path, *, base_model: str, max_rank: int = MAX_RANK) -> dict:
    """Check an adapter against the serving limits before anything is written.

    Returns:
        The parsed ``adapter_config.json``.

    Raises:
        PublishError: missing files, another base model, rank above ``max_rank``, or full-weight modules
            (``modules_to_save`` or a tensor that is not a LoRA matrix).
    """
    from safetensors import safe_open

    d = Path(adapter_dir)
    for f in ADAPTER_FILES:
        if not (d / f).is_file():
            raise PublishError(f"adapter {d} has no {f}: pass a PEFT adapter directory (save_pretrained output)")
    try:
        conf = json.loads((d / "adapter_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise PublishError(f"{d / 'adapter_config.json'} is not valid JSON ({e})") from None
    got = conf.get("base_model_name_or_path") or ""
    if not _same_model(str(got), str(base_model)):
        raise PublishError(f"adapter {d} was trained on base model {got!r}, but the serving base model is "
                           f"{str(base_model)!r}: retrain it on the serving base model")
    rank = conf.get("r")
    if not isinstance(rank, int) or rank < 1:
        raise PublishError(f"{d / 'adapter_config.json'} has no valid LoRA rank 'r' (got {rank!r})")
    pattern = conf.get("rank_pattern") or {}
    top = max([rank, *[v for v in pattern.values() if isinstance(v, int)]])
    if top > max_rank:
        raise PublishError(f"adapter {d} has LoRA rank {top}, above the serving limit max_lora_rank {max_rank}: "
                           f"train with lora.r <= {max_rank}")
    if conf.get("modules_to_save"):
        raise PublishError(f"adapter {d} saves full-weight modules {conf['modules_to_save']} (modules_to_save); "
                           f"the server loads LoRA matrices only: train without modules_to_save")
    try:
        with safe_open(str(d / "adapter_model.safetensors"), "pt") as f:
            keys = list(f.keys())
            shapes = {k: tuple(f.get_slice(k).get_shape()) for k in keys if "lora_A" in k}
    except Exception as e:  # noqa: BLE001 - safetensors raises its own error types for a corrupt file
        raise PublishError(f"{d / 'adapter_model.safetensors'} is not a readable safetensors file "
                           f"({type(e).__name__}); save the adapter again") from None
    full = [k for k in keys if "lora_" not in k]
    if full:
        raise PublishError(f"adapter {d} holds {len(full)} non-LoRA tensor(s) (e.g. {full[0]!r}); the server loads "
                           f"LoRA matrices only: train without modules_to_save or trainable embeddings")
    actual = max((s[0] for s in shapes.values() if s), default=0)  # lora_A weights are [r, in_features]
    if not shapes:
        raise PublishError(f"adapter {d} holds no lora_A tensors; pass a PEFT LoRA adapter")
    if actual != top:
        raise PublishError(f"adapter {d} declares LoRA rank {top} in adapter_config.json but its tensors have rank "
                           f"{actual}: the config does not match the weights; save the adapter again")
    return conf


def read_registry(store: str | Path) -> dict:
    """The store's registry (an empty one at revision 0 for a store that holds no version yet).

    Raises:
        RuntimeError: the file is not valid JSON, lacks an integer revision, has malformed entries, or is missing
            while version directories exist (the states would be lost: restore it rather than start over).
    """
    p = Path(store) / REGISTRY
    if not p.is_file():
        if Path(store).is_dir() and any(_VERSION_RE.match(c.name) for d in Path(store).iterdir() if d.is_dir()
                                        for c in d.iterdir()):
            raise RuntimeError(f"{p} is missing but the store holds adapter versions; restore registry.json from "
                               "a backup (starting a new one would lose every state and alias)")
        return {"revision": 0, "adapters": {}}
    try:
        reg = json.loads(p.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        raise RuntimeError(f"{p} is not valid JSON ({e}); restore it from a backup before publishing") from None
    if not isinstance(reg, dict) or not isinstance(reg.get("revision"), int):
        raise RuntimeError(f"{p} has no integer 'revision'; restore it from a backup before publishing")
    adapters = reg.get("adapters", {})
    bad = [] if isinstance(adapters, dict) else ["adapters"]
    for pid, e in (adapters.items() if not bad else []):
        if not isinstance(e, dict) or not isinstance(e.get("versions", {}), dict) or not all(
                isinstance(v, dict) for v in e.get("versions", {}).values()):
            bad.append(f"adapters.{pid}")
    if bad:
        raise RuntimeError(f"{p} has malformed entries ({', '.join(bad[:3])}); restore it from a backup")
    return reg


def _current_revision(store: Path) -> int:
    """The revision on disk now, for the compare-and-swap (0 when the file does not exist)."""
    p = Path(store) / REGISTRY
    if not p.is_file():
        return 0
    return read_registry(store).get("revision", 0)


@contextmanager
def registry_lock(store: Path, timeout_s: float = 30.0, stale_s: float = 600.0) -> Iterator[None]:
    """Hold ``<store>/registry.lock`` (``O_CREAT | O_EXCL``); a lock older than ``stale_s`` is broken.

    Raises:
        RegistryConflict: the lock stayed held for ``timeout_s``.
    """
    path = store / LOCK
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            break
        except FileExistsError:
            try:
                if time.time() - path.stat().st_mtime > stale_s:
                    path.unlink(missing_ok=True)
                    continue
            except FileNotFoundError:
                continue
            if time.monotonic() > deadline:
                raise RegistryConflict(f"{path} stayed locked for {timeout_s:.0f} s; if no publish is running, "
                                       f"remove it") from None
            time.sleep(0.05)
    try:
        os.write(fd, f"{os.getpid()}\n".encode())
        os.close(fd)
        yield
    finally:
        path.unlink(missing_ok=True)


def _existing_versions(pdir: Path, entry: dict | None) -> set[int]:
    got = {int(k) for k in (entry or {}).get("versions", {})}
    if pdir.is_dir():
        got |= {int(m.group(1)) for c in pdir.iterdir() if (m := _VERSION_RE.match(c.name))}
    return got


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def publish_adapter(store: str | Path, persona_id: str, adapter_dir: str | Path, *, base_model: str,
                    run_id: str, data_ids: list[str], eval_metrics: dict, max_rank: int = MAX_RANK,
                    attempts: int = 3) -> dict:
    """Publish one adapter as ``<store>/<persona_id>/v<N>`` (N = highest existing + 1) in state ``staged``.

    Args:
        store: Store root (local directory; created when missing).
        persona_id: The persona (snake_case id); the version is named ``<persona_id>--v<N>``.
        adapter_dir: PEFT adapter directory (``adapter_config.json``, ``adapter_model.safetensors``).
        base_model: The serving base model; must equal the adapter's ``base_model_name_or_path``.
        run_id: Training run id (manifest).
        data_ids: Data ids the adapter was trained on (manifest).
        eval_metrics: Evaluation metrics, e.g. the gate's (manifest).
        max_rank: Serving limit on the LoRA rank.
        attempts: Compare-and-swap attempts before :class:`RegistryConflict`.

    Returns:
        ``{"persona_id", "version", "name", "path", "digest", "revision"}`` (revision after the write).

    Raises:
        PublishError: the adapter fails a check or its copy does not match its digest.
        RegistryConflict: the registry kept changing or stayed locked.
        OSError: the store is not writable.
        In every case no version directory is left and the registry is unchanged.
    """
    if not ID_RE.match(persona_id):
        raise PublishError(f"persona id {persona_id!r} must be snake_case (lower-case letters, digits, '_')")
    src = Path(adapter_dir)
    conf = check_adapter(src, base_model=base_model, max_rank=max_rank)
    digest = file_digest(src / "adapter_model.safetensors")
    store = Path(store)
    pdir = store / persona_id
    new_pdir = not pdir.exists()
    pdir.mkdir(parents=True, exist_ok=True)
    try:
        return _publish_locked(store, pdir, persona_id, src, conf, digest, base_model=base_model, run_id=run_id,
                               data_ids=data_ids, eval_metrics=eval_metrics, attempts=attempts)
    except BaseException:
        if new_pdir:
            try:
                pdir.rmdir()  # only when empty: a version published meanwhile stays
            except OSError:
                pass
        raise


def _publish_locked(store: Path, pdir: Path, persona_id: str, src: Path, conf: dict, digest: str, *,
                    base_model: str, run_id: str, data_ids: list[str], eval_metrics: dict, attempts: int) -> dict:
    for _ in range(attempts):
        with registry_lock(store):
            for stale in pdir.glob("v*.tmp-*"):  # left by a killed publisher; we hold the lock
                shutil.rmtree(stale, ignore_errors=True)
            reg = read_registry(store)
            rev = reg.get("revision", 0)
            n = max(_existing_versions(pdir, reg.get("adapters", {}).get(persona_id)), default=0) + 1
            name, final = f"{persona_id}--v{n}", pdir / f"v{n}"
            tmp = pdir / f"v{n}.tmp-{uuid.uuid4().hex[:8]}"
            created = _now()
            renamed = False
            try:
                shutil.copytree(src, tmp, ignore=shutil.ignore_patterns("manifest.json", "checkpoint-*", ".*"))
                got = file_digest(tmp / "adapter_model.safetensors")
                if got != digest:
                    raise PublishError(f"the copy of {src / 'adapter_model.safetensors'} in the store has digest "
                                       f"{got[:12]}…, not {digest[:12]}…: the copy is corrupt; publish again")
                manifest = {"name": name, "persona_id": persona_id, "version": n, "digest": digest,
                            "base_model": str(base_model), "rank": conf["r"], "alpha": conf.get("lora_alpha"),
                            "target_modules": conf.get("target_modules"), "run_id": run_id,
                            "data_ids": list(data_ids), "eval_metrics": eval_metrics, "created": created}
                atomic_write_text(tmp / "manifest.json", json.dumps(manifest, indent=2, default=str) + "\n")
                if _current_revision(store) != rev:
                    shutil.rmtree(tmp, ignore_errors=True)
                    continue  # compare-and-swap failed (a writer outside the lock): retry
                os.rename(tmp, final)
                renamed = True
                new = json.loads(json.dumps(reg))
                new["revision"] = rev + 1
                entry = new.setdefault("adapters", {}).setdefault(
                    persona_id, {"versions": {}, "stable": None, "canary": None, "canary_weight": 0, "previous_stable": []})
                entry["versions"][str(n)] = {"state": "staged", "name": name, "digest": digest, "created": created}
                if _current_revision(store) != rev:
                    shutil.rmtree(final, ignore_errors=True)
                    renamed = False
                    continue
                atomic_write_text(store / REGISTRY, json.dumps(new, indent=2, sort_keys=True) + "\n")
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)
                if renamed:
                    shutil.rmtree(final, ignore_errors=True)
                raise
        return {"persona_id": persona_id, "version": n, "name": name, "path": str(final), "digest": digest,
                "revision": rev + 1}
    raise RegistryConflict(f"{store / REGISTRY} changed during each of {attempts} attempts; publish again")


def find_version(store: str | Path, persona_id: str, digest: str, adapter_dir: str | Path | None = None
                 ) -> dict | None:
    """The registered version of ``persona_id`` whose adapter has ``digest`` (``{"version", "name", ...}``).

    With ``adapter_dir``, its ``adapter_config.json`` must also equal the stored version's (parsed JSON), so a
    changed config (base model, alpha, targets) with the same weights is a new version, not a duplicate.
    """
    entry = read_registry(store).get("adapters", {}).get(persona_id) or {}
    for k, v in entry.get("versions", {}).items():
        if v.get("digest") != digest:
            continue
        if adapter_dir is not None:
            try:
                mine = json.loads((Path(adapter_dir) / "adapter_config.json").read_text(encoding="utf-8"))
                theirs = json.loads((Path(store) / persona_id / f"v{k}" / "adapter_config.json").read_text(
                    encoding="utf-8"))
            except (OSError, ValueError):
                continue
            if mine != theirs:
                continue
        return {"version": int(k), **v}
    return None


def update_registry(store: str | Path, change: Callable[[dict], None], attempts: int = 3) -> dict:
    """Apply ``change(registry)`` (it mutates a copy, or raises to abort) under the lock with a compare-and-swap on
    the revision; returns the new registry (revision + 1).

    Raises:
        Whatever ``change`` raises (nothing is written). RegistryConflict: the registry kept changing.
    """
    store = Path(store)
    store.mkdir(parents=True, exist_ok=True)
    for _ in range(attempts):
        with registry_lock(store):
            reg = read_registry(store)
            rev = reg.get("revision", 0)
            new = json.loads(json.dumps(reg))
            change(new)
            new["revision"] = rev + 1
            if _current_revision(store) != rev:
                continue
            atomic_write_text(store / REGISTRY, json.dumps(new, indent=2, sort_keys=True) + "\n")
            return new
    raise RegistryConflict(f"{store / REGISTRY} changed during each of {attempts} attempts; try again")
