"""The adapter store and its registry file on a local directory, a PVC or S3.

Where (:func:`open_store`; one :class:`AdapterStore` = an fsspec filesystem + a root path, one code path for all):

* a local directory: a plain path or ``file:///abs/path``;
* ``pvc://<claim>/<path>``: KServe's convention. KServe's storage initializer mounts the claim ``<claim>`` at
  ``/mnt/pvc`` and rewrites the URI to ``/mnt/pvc/<path>`` (the claim name is not part of the mount path); we resolve
  it the same way to ``<pvc_root>/<path>`` (``adapters.pvc_root``, default ``/mnt/pvc``). The pod must mount the
  claim there; the claim name is only checked for form;
* ``s3://<bucket>/<prefix>`` through s3fs: credentials from the standard AWS chain (``AWS_ACCESS_KEY_ID`` /
  ``AWS_SECRET_ACCESS_KEY`` / ``AWS_SESSION_TOKEN``, ``AWS_PROFILE``, web identity, ...), the endpoint from
  ``adapters.s3_endpoint_url`` or else ``AWS_ENDPOINT_URL_S3`` / ``AWS_ENDPOINT_URL`` (MinIO, Ceph, moto). The bucket
  must exist.

Store layout::

    <store>/registry.json                 the index (compare-and-swap on "revision")
    <store>/registry.lock                 held by a writer while it publishes or changes a state
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
tensors only), upload it to ``<persona>/v<N>.tmp-*``, verify the digest of what landed (read back from the store),
write its manifest, move it to ``v<N>`` and register it as ``staged`` with a compare-and-swap on the registry. Any
failure removes what was written and leaves the registry as it was, so the serving adapter is untouched. The move is
an atomic rename on a local directory or PVC; S3 has no rename, so the files are copied server-side with
``manifest.json`` last (the version's commit marker) and the temporary prefix is deleted. A publisher killed
mid-way leaves at most a ``v<N>.tmp-*`` prefix or a ``v<N>/`` prefix without ``manifest.json``; neither is in the
registry (nothing serves it) and the next publish of that persona removes both under the lock. A complete ``v<N>``
that is not in the registry (a kill between the move and the registry write, or a registry restored from an older
backup) is kept and its number skipped.

Writers serialise on ``<store>/registry.lock`` and every registry write is a compare-and-swap, so two writers never
lose an update (AdapterService, hosted by the gateway, is the writer in a deployment; a training Job without a
gateway address writes its own run store):

* local / PVC: the lock is created with ``O_CREAT | O_EXCL``; the registry is replaced atomically (temporary file +
  rename) after checking, under the lock, that its bytes are still the ones read (same digest);
* S3: the lock is an object written with ``If-None-Match: *`` (a second writer gets 412 Precondition Failed) and
  released with a ``DeleteObject`` conditional on its ETag; the registry is written with ``If-Match: <ETag read>``
  (``If-None-Match: *`` when it does not exist yet), so the server refuses a write over a registry that changed
  since it was read, even by a writer that ignored the lock. S3 has supported both conditions on ``PutObject``
  since 2024; moto (5.2.5) implements both and ``If-Match`` on ``DeleteObject``
  (tests/integration/test_adapter_store_s3.py).

A lock older than ``stale_s`` (600 s) is taken to be a killed writer's and broken.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import logging
import os
import re
import shutil
import time
import uuid
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterator

from mascot.core.adapters.registry import version_name
from mascot.core.files import atomic_write_text
from mascot.core.personas import ID_RE  # one rule for persona ids (snake_case)

log = logging.getLogger(__name__)

REGISTRY = "registry.json"
LOCK = "registry.lock"
MANIFEST = "manifest.json"
WEIGHTS = "adapter_model.safetensors"
ADAPTER_FILES = ("adapter_config.json", WEIGHTS)
#: Serving limit of vLLM ``max_lora_rank``.
MAX_RANK = 64
#: Where KServe's storage initializer mounts the claim of a ``pvc://`` URI (and where we resolve it by default).
DEFAULT_PVC_ROOT = "/mnt/pvc"
SCHEMES = ("file", "pvc", "s3")
#: Names a publish does not upload (matched at every level of the adapter directory, like shutil.ignore_patterns).
_IGNORE = ("manifest.json", "checkpoint-*", ".*")
_VERSION_RE = re.compile(r"^v([1-9][0-9]*)$")
_TMP_RE = re.compile(r"^v[1-9][0-9]*\.tmp-[0-9a-f]+$")
_URI_RE = re.compile(r"^(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*)://(?P<rest>.*)$")
_CLAIM_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")  # a Kubernetes object name (DNS-1123 label)
_BUCKET_RE = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")


class PublishError(ValueError):
    """The adapter cannot be published; the message says what to change. Nothing was written."""


class RegistryConflict(RuntimeError):
    """The registry changed under us (or stayed locked) on every attempt; nothing was written."""


class DigestMismatch(RuntimeError):
    """A version's files in the store do not match the digest registered for it (corrupt or tampered)."""


def backend_errors() -> tuple[type[BaseException], ...]:
    """Exceptions a store backend raises for I/O trouble: OSError, plus botocore's errors when it is installed
    (s3fs passes some through untranslated, e.g. ``NoCredentialsError``)."""
    try:
        from botocore.exceptions import BotoCoreError, ClientError
    except ImportError:  # pragma: no cover - s3fs (and so botocore) is a dependency
        return (OSError,)
    return (OSError, BotoCoreError, ClientError)


# ----------------------------------------------------------------------------------------------------- gate


def file_digest(path: str | Path) -> str:
    """SHA-256 (hex, 64 characters) of one local file.

    Raises:
        OSError: the file cannot be read.
    """
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
    """Check a local adapter directory against the serving limits before anything is written.

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
        raise PublishError(f"adapter {d} has LoRA rank {top}, above the serving limit adapters.max_rank {max_rank}: "
                           f"train with lora.r <= {max_rank}")
    if conf.get("modules_to_save"):
        raise PublishError(f"adapter {d} saves full-weight modules {conf['modules_to_save']} (modules_to_save); "
                           f"the server loads LoRA matrices only: train without modules_to_save")
    try:
        with safe_open(str(d / WEIGHTS), "pt") as f:
            keys = list(f.keys())
            shapes = {k: tuple(f.get_slice(k).get_shape()) for k in keys if "lora_A" in k}
    except Exception as e:  # noqa: BLE001 - safetensors raises its own error types for a corrupt file
        raise PublishError(f"{d / WEIGHTS} is not a readable safetensors file "
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


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _ignored(name: str) -> bool:
    return any(fnmatch.fnmatch(name, p) for p in _IGNORE)


def path_inside(path: Path, root: Path) -> bool:
    """True when ``path`` is ``root`` or lies under it (both already resolved: :func:`os.path.realpath`)."""
    return path == root or root in path.parents


def _check_still_inside(f: Path, root: Path, name: str) -> None:
    """At copy time: ``f`` (listed by :func:`_source_files`) must still resolve inside ``root``.

    Raises:
        PublishError: a link, or a directory on its path, was swapped for one leading out.
    """
    if not path_inside(Path(os.path.realpath(f)), root):
        raise PublishError(f"the adapter file {name} leads outside the adapter directory (a link changed during "
                           "the copy); nothing is copied through such links")


def _source_files(src: Path) -> list[tuple[Path, str]]:
    """``(local file, relative posix path)`` of an adapter directory, without :data:`_IGNORE` names at any level.

    Links are never followed out of ``src``: a linked file is listed (and later copied as a regular file) only when
    its target lies inside ``src``; a linked directory, or a link whose target is outside ``src`` or missing, at any
    depth, is refused.

    Raises:
        PublishError: naming the first such link (relative path).
    """
    root = Path(os.path.realpath(src))
    out = []
    for dirpath, dirnames, filenames in os.walk(src):  # followlinks=False: linked directories are not entered
        here = Path(dirpath)
        for d in dirnames:
            if not _ignored(d) and (here / d).is_symlink():
                raise PublishError(f"the adapter directory holds a linked directory {(here / d).relative_to(src)}; "
                                   "publish a directory of regular files")
        dirnames[:] = sorted(d for d in dirnames if not _ignored(d))
        for f in sorted(filenames):
            if _ignored(f):
                continue
            p = here / f
            rel = p.relative_to(src).as_posix()
            if p.is_symlink():
                target = Path(os.path.realpath(p))
                if not path_inside(target, root) or not target.is_file():
                    raise PublishError(f"the adapter file {rel} is a link to a file outside the adapter directory "
                                       "(or to nothing); nothing is copied through such links: copy the file in")
            out.append((p, rel))
    return out


def _copy_source_file(f: Path, root: Path, dest: Path) -> Path:
    """Copy one listed adapter file to ``dest`` as a regular file, checking again at copy time that a link still
    points inside ``root`` (the adapter directory, resolved).

    Raises:
        PublishError: the link now points elsewhere.
    """
    _check_still_inside(f, root, f.name)
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(f, dest)
    return dest


# ---------------------------------------------------------------------------------------------------- store


def open_store(store: "str | Path | AdapterStore", *, pvc_root: str | None = None,
               s3_endpoint_url: str | None = None, config: Any = None) -> "AdapterStore":
    """The :class:`AdapterStore` of a store URI (an AdapterStore is returned as it is).

    Args:
        store: A local path, ``file:///abs/path``, ``pvc://<claim>/<path>`` or ``s3://<bucket>/<prefix>``.
        pvc_root: Mount root of ``pvc://`` claims; None = ``config.pvc_root`` or :data:`DEFAULT_PVC_ROOT`.
        s3_endpoint_url: S3 endpoint; None/"" = ``config.s3_endpoint_url``, else the ``AWS_ENDPOINT_URL_S3`` /
            ``AWS_ENDPOINT_URL`` variables (read when the store is opened), else AWS.
        config: Optional :class:`mascot.core.config.AdaptersConfig` supplying the two settings above.

    Raises:
        ValueError: an empty store, an unsupported scheme (the message lists the supported ones), a malformed claim
            or bucket name, or a ``pvc://`` path that leaves the mount root.
    """
    if isinstance(store, AdapterStore):
        return store
    if pvc_root is None:
        pvc_root = getattr(config, "pvc_root", "") or DEFAULT_PVC_ROOT
    if not s3_endpoint_url:
        s3_endpoint_url = getattr(config, "s3_endpoint_url", "") or ""
    uri = os.fspath(store).strip()
    if not uri:
        raise ValueError("no adapter store configured (adapters.store is empty)")
    m = _URI_RE.match(uri)
    if not m:
        return AdapterStore(uri, _local_fs(), os.path.abspath(uri), local=True)
    scheme, rest = m["scheme"].lower(), m["rest"]
    if scheme == "file":
        if not rest.startswith("/"):
            raise ValueError(f"adapters.store {uri!r}: a file:// URI needs an absolute path (file:///data/adapters)")
        return AdapterStore(uri, _local_fs(), os.path.normpath(rest), local=True)
    if scheme == "pvc":
        claim, _, sub = rest.partition("/")
        if not _CLAIM_RE.match(claim) or len(claim) > 253:
            raise ValueError(f"adapters.store {uri!r}: {claim!r} is not a PersistentVolumeClaim name; use "
                             "pvc://<claim>/<path>")
        base = os.path.normpath(pvc_root)
        root = os.path.normpath(os.path.join(base, sub.strip("/")))
        if root != base and not root.startswith(base + os.sep):
            raise ValueError(f"adapters.store {uri!r}: the path leaves the claim's mount {base}")
        if not os.path.isdir(base):  # else a publish would write to the pod's own (ephemeral) disk
            raise ValueError(f"adapters.store {uri!r}: the claim is not mounted at {base} (adapters.pvc_root); mount "
                             f"the PersistentVolumeClaim {claim!r} there, or set adapters.pvc_root to its mount path")
        return AdapterStore(uri, _local_fs(), root, local=True)
    if scheme == "s3":
        bucket, _, prefix = rest.partition("/")
        if not _BUCKET_RE.match(bucket):
            raise ValueError(f"adapters.store {uri!r}: {bucket!r} is not an S3 bucket name; use s3://<bucket>/<prefix>")
        prefix = "/".join(p for p in prefix.split("/") if p)
        if any(p in (".", "..") for p in prefix.split("/")):
            raise ValueError(f"adapters.store {uri!r}: '.' and '..' are not allowed in the prefix")
        return AdapterStore(uri, _s3_fs(s3_endpoint_url), f"{bucket}/{prefix}" if prefix else bucket, local=False)
    raise ValueError(f"adapters.store {uri!r}: unsupported scheme {scheme!r}; use a local path, file:///path, "
                     "pvc://<claim>/<path> or s3://<bucket>/<prefix>")


def _local_fs() -> Any:
    import fsspec

    return fsspec.filesystem("file")


def _s3_fs(endpoint_url: str) -> Any:
    try:
        import s3fs
    except ImportError as e:  # pragma: no cover - s3fs is a dependency
        raise ValueError(f"an s3:// adapter store needs s3fs ({e}); install the project's dependencies") from None
    # The endpoint is resolved here (setting, else the AWS variables botocore reads) so fsspec's instance cache, keyed
    # by these arguments, never hands out a client for another endpoint. No listing cache: the gateway writes and
    # model services list from other processes.
    endpoint = endpoint_url or os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or None
    return s3fs.S3FileSystem(endpoint_url=endpoint, use_listings_cache=False)


class AdapterStore:
    """An adapter store: an fsspec filesystem ``fs`` and the ``root`` path of the store in it.

    Every operation goes through ``fs`` (listing, reading, uploading, digests); only four primitives depend on the
    backend's guarantees: the writer lock, the registry's compare-and-swap, the upload of an adapter directory and
    the move of a finished upload to its version prefix (see the module docstring).

    Attributes:
        uri: The store as configured (for messages).
        fs: The fsspec filesystem (``LocalFileSystem`` for local/``file://``/``pvc://``, ``S3FileSystem`` for s3).
        root: The store's root in ``fs`` (an absolute local path, or ``bucket/prefix``).
        local: True when ``root`` is a local directory (engines can load versions in place).

    Blocking (s3fs runs its own event loop thread): call the methods from a worker thread
    (``asyncio.to_thread``), never from a coroutine.
    """

    def __init__(self, uri: str, fs: Any, root: str, *, local: bool) -> None:
        self.uri, self.fs, self.root, self.local = uri, fs, root.rstrip("/") or root, local

    def __repr__(self) -> str:
        return f"AdapterStore({self.uri!r})"

    def __str__(self) -> str:
        return self.display()

    def path(self, *parts: str) -> str:
        """The path of ``parts`` below the root, in ``fs``."""
        return "/".join([self.root, *parts]) if parts else self.root

    def display(self, *parts: str) -> str:
        """``parts`` below the root as a person would name it (``s3://bucket/prefix/...`` or a local path)."""
        return self.path(*parts) if self.local else "s3://" + self.path(*parts)

    # ------------------------------------------------------------------------------------------ primitives

    def _s3_call(self, method: str, **kw: Any) -> dict:
        """One raw S3 call through s3fs's client (botocore errors untranslated); a GetObject's body is read.

        Raises:
            botocore.exceptions.ClientError / BotoCoreError.
        """
        import fsspec.asyn

        fs = self.fs

        async def call() -> dict:
            await fs.set_session()
            client = await fs.get_s3(kw.get("Bucket"))
            out = await getattr(client, method)(**kw)
            body = out.get("Body")
            if body is not None and hasattr(body, "read"):
                try:
                    out["Body"] = await body.read()
                finally:
                    body.close()
            return out

        return fsspec.asyn.sync(fs.loop, call)

    def _key(self, *parts: str) -> dict:
        bucket, _, key = self.path(*parts).partition("/")
        return {"Bucket": bucket, "Key": key}

    @staticmethod
    def _code(e: BaseException) -> str:
        resp = getattr(e, "response", None) or {}
        return str(resp.get("Error", {}).get("Code") or resp.get("ResponseMetadata", {}).get("HTTPStatusCode", ""))

    @classmethod
    def _precondition_failed(cls, e: BaseException) -> bool:
        # 412 PreconditionFailed; 409 ConditionalRequestConflict: a concurrent conditional write won the race
        return cls._code(e) in ("PreconditionFailed", "412", "ConditionalRequestConflict", "409")

    @classmethod
    def _missing(cls, e: BaseException) -> bool:
        return cls._code(e) in ("NoSuchKey", "404", "NotFound")

    def _os_error(self, e: BaseException, what: str) -> OSError:
        return OSError(f"S3 {what} on {self.display()} failed: {self._code(e) or type(e).__name__} "
                       f"({str(e).splitlines()[0][:200] if str(e) else ''})")

    def _read_bytes(self, name: str) -> tuple[bytes | None, str | None]:
        """``(content, token)`` of ``<root>/<name>``, ``(None, None)`` when missing. The token is the ETag on S3 and
        the SHA-256 of the content on a local store: equal tokens mean an unchanged file."""
        if self.local:
            try:
                data = Path(self.path(name)).read_bytes()
            except FileNotFoundError:
                return None, None
            return data, hashlib.sha256(data).hexdigest()
        try:
            out = self._s3_call("get_object", **self._key(name))
        except Exception as e:  # noqa: BLE001 - botocore errors, mapped below
            if self._missing(e):
                return None, None
            raise self._os_error(e, f"GetObject {name}") from None
        return out["Body"], out["ETag"]

    def _token(self, name: str) -> str | None:
        """The current token of ``<root>/<name>`` (see :meth:`_read_bytes`), None when missing."""
        if self.local:
            return self._read_bytes(name)[1]
        try:
            return self._s3_call("head_object", **self._key(name))["ETag"]
        except Exception as e:  # noqa: BLE001 - botocore errors, classified below
            if self._missing(e):
                return None
            raise self._os_error(e, f"HeadObject {name}") from None

    def _write_registry(self, reg: dict, token: str | None) -> None:
        """Write ``reg`` as the registry if it is still the one whose token was ``token`` (None: it did not exist).

        Raises:
            RegistryConflict: the registry changed since it was read. OSError: the store cannot be written.
        """
        text = json.dumps(reg, indent=2, sort_keys=True) + "\n"
        if self.local:  # the caller holds the lock; this catches writers that ignore it
            if self._token(REGISTRY) != token:
                raise RegistryConflict(f"{self.display(REGISTRY)} changed since it was read")
            atomic_write_text(self.path(REGISTRY), text)
            return
        cond = {"IfMatch": token} if token else {"IfNoneMatch": "*"}
        try:
            self._s3_call("put_object", **self._key(REGISTRY), Body=text.encode("utf-8"),
                          ContentType="application/json", **cond)
        except Exception as e:  # noqa: BLE001 - botocore errors, classified below
            if self._precondition_failed(e) or (token and self._missing(e)):
                raise RegistryConflict(f"{self.display(REGISTRY)} changed since it was read") from None
            raise self._os_error(e, "PutObject registry.json") from None

    @contextmanager
    def lock(self, timeout_s: float = 30.0, stale_s: float = 600.0) -> Iterator[None]:
        """Hold ``<store>/registry.lock`` for the block; a lock older than ``stale_s`` seconds is broken.

        Raises:
            RegistryConflict: the lock stayed held for ``timeout_s`` seconds (someone else's lock is left alone).
            OSError: the store cannot be written.
        """
        if self.local:
            with _local_lock(Path(self.path(LOCK)), timeout_s, stale_s):
                yield
            return
        etag = self._s3_acquire(timeout_s, stale_s)
        try:
            yield
        finally:
            self._s3_release(etag)

    def _s3_acquire(self, timeout_s: float, stale_s: float) -> str:
        body = json.dumps({"owner": uuid.uuid4().hex, "pid": os.getpid(), "created": _now()}).encode()
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                return self._s3_call("put_object", **self._key(LOCK), Body=body, IfNoneMatch="*")["ETag"]
            except Exception as e:  # noqa: BLE001 - botocore errors, classified below
                if not self._precondition_failed(e):
                    raise self._os_error(e, "PutObject registry.lock") from None
            try:
                head = self._s3_call("head_object", **self._key(LOCK))
            except Exception as e:  # noqa: BLE001 - botocore errors, classified below
                if self._missing(e):
                    continue  # released meanwhile
                raise self._os_error(e, "HeadObject registry.lock") from None
            age = time.time() - head["LastModified"].timestamp()
            if age > stale_s:
                log.warning("breaking the stale lock %s (%.0f s old)", self.display(LOCK), age)
                self._s3_delete_if(LOCK, head["ETag"])
                continue
            if time.monotonic() > deadline:
                raise RegistryConflict(f"{self.display(LOCK)} stayed locked for {timeout_s:.0f} s; if no publish is "
                                       "running, remove it")
            time.sleep(0.05)

    def _s3_delete_if(self, name: str, etag: str) -> None:
        """Delete ``name`` only while its ETag is ``etag`` (so a lock taken over meanwhile is not removed)."""
        try:
            self._s3_call("delete_object", **self._key(name), IfMatch=etag)
        except Exception as e:  # noqa: BLE001 - botocore errors, classified below
            if self._precondition_failed(e) or self._missing(e):
                return
            # a server without conditional deletes: compare, then delete (a narrow race, logged)
            log.warning("conditional DeleteObject refused on %s (%s); comparing the ETag first", self.display(name),
                        self._code(e))
            if self._token(name) == etag:
                self.fs.rm_file(self.path(name))

    def _s3_release(self, etag: str) -> None:
        try:
            self._s3_delete_if(LOCK, etag)
        except Exception as e:  # noqa: BLE001 - a lock left behind is broken after stale_s; never mask an error
            log.warning("could not release %s: %s", self.display(LOCK), e)

    def _upload_dir(self, src: Path, dest: str) -> None:
        """Copy the adapter directory ``src`` (without manifest.json, ``checkpoint-*``, dot files) to ``dest``: regular
        files only, never through a link that leaves ``src`` (:func:`_source_files`)."""
        files = _source_files(src)
        root = Path(os.path.realpath(src))
        if self.local:
            shutil.copytree(src, dest, ignore=shutil.ignore_patterns(*_IGNORE),
                            copy_function=lambda f, to: _copy_source_file(Path(f), root, Path(to)))
            return
        for f, rel in files:
            _check_still_inside(f, root, rel)
            self.fs.put_file(str(f), f"{dest}/{rel}")

    def _move_version(self, tmp: str, final: str) -> None:
        """Make the upload ``tmp`` the version ``final``: an atomic rename locally; on S3 a server-side copy of each
        object with manifest.json last (the commit marker), then the temporary prefix is deleted."""
        if self.local:
            os.rename(tmp, final)
            return
        files = sorted(self.fs.find(tmp), key=lambda p: p.endswith("/" + MANIFEST))
        for f in files:
            self.fs.cp_file(f, final + f[len(tmp):])
        self._rm(tmp)

    def _rm(self, path: str) -> None:
        """Remove a file or folder/prefix tree; missing is fine."""
        if self.local:
            shutil.rmtree(path, ignore_errors=True)
            return
        try:
            self.fs.rm(path, recursive=True)
        except FileNotFoundError:
            pass

    def _children(self, path: str) -> list[str]:
        """Names of the folders/prefixes directly under ``path`` ([] when missing)."""
        try:
            entries = self.fs.ls(path, detail=True)
        except (FileNotFoundError, NotADirectoryError):
            return []
        return [e["name"].rstrip("/").rsplit("/", 1)[-1] for e in entries if e.get("type") == "directory"]

    def digest(self, *parts: str) -> str:
        """SHA-256 (hex) of ``<root>/<parts>`` read back from the store.

        Raises:
            FileNotFoundError: no such file. OSError: it cannot be read.
        """
        if self.local:
            return file_digest(self.path(*parts))
        h = hashlib.sha256()
        with self.fs.open(self.path(*parts), "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        return h.hexdigest()

    # ------------------------------------------------------------------------------------------- registry

    def read_registry(self) -> dict:
        """The registry (an empty one at revision 0 for a store that holds no version yet).

        Raises:
            RuntimeError: the file is not valid JSON, lacks an integer revision, has malformed entries, or is missing
                while version folders exist (the states would be lost: restore it rather than start over).
            OSError: the store cannot be read.
        """
        return self._read_registry()[0]

    def _read_registry(self) -> tuple[dict, str | None]:
        data, token = self._read_bytes(REGISTRY)
        where = self.display(REGISTRY)
        if data is None:
            if any(_VERSION_RE.match(c) for p in self._children(self.root) for c in self._children(self.path(p))):
                raise RuntimeError(f"{where} is missing but the store holds adapter versions; restore registry.json "
                                   "from a backup (starting a new one would lose every state and alias)")
            return {"revision": 0, "adapters": {}}, None
        try:
            reg = json.loads(data.decode("utf-8"))
        except (ValueError, UnicodeDecodeError) as e:
            raise RuntimeError(f"{where} is not valid JSON ({e}); restore it from a backup before publishing") from None
        if not isinstance(reg, dict) or not isinstance(reg.get("revision"), int):
            raise RuntimeError(f"{where} has no integer 'revision'; restore it from a backup before publishing")
        adapters = reg.get("adapters", {})
        bad = [] if isinstance(adapters, dict) else ["adapters"]
        for pid, e in (adapters.items() if not bad else []):
            if not isinstance(e, dict) or not isinstance(e.get("versions", {}), dict) or not all(
                    isinstance(v, dict) for v in e.get("versions", {}).values()):
                bad.append(f"adapters.{pid}")
        if bad:
            raise RuntimeError(f"{where} has malformed entries ({', '.join(bad[:3])}); restore it from a backup")
        return reg, token

    def update(self, change: Callable[[dict], None], attempts: int = 3) -> dict:
        """Apply ``change(registry)`` (it mutates a copy, or raises to abort) under the lock with a compare-and-swap;
        returns the new registry (revision + 1).

        Raises:
            Whatever ``change`` raises (nothing is written). RegistryConflict: the registry kept changing, or the lock
            stayed held. RuntimeError: the registry is unreadable. OSError: the store cannot be written.
        """
        if self.local:
            os.makedirs(self.root, exist_ok=True)
        for _ in range(attempts):
            with self.lock():
                reg, token = self._read_registry()
                new = json.loads(json.dumps(reg))
                change(new)
                new["revision"] = reg.get("revision", 0) + 1
                try:
                    self._write_registry(new, token)
                except RegistryConflict:
                    continue
                return new
        raise RegistryConflict(f"{self.display(REGISTRY)} changed during each of {attempts} attempts; try again")

    def _existing_versions(self, persona_id: str, entry: dict | None) -> set[int]:
        got = {int(k) for k in (entry or {}).get("versions", {})}
        got |= {int(m.group(1)) for c in self._children(self.path(persona_id)) if (m := _VERSION_RE.match(c))}
        return got

    def _clean_leftovers(self, persona_id: str, entry: dict | None) -> None:
        """Remove what killed publishers of ``persona_id`` left (the caller holds the lock): ``v<N>.tmp-*`` uploads
        and ``v<N>/`` prefixes without manifest.json that the registry does not list (an interrupted S3 move)."""
        known = set((entry or {}).get("versions", {}))
        for c in self._children(self.path(persona_id)):
            m = _VERSION_RE.match(c)
            half = m and m.group(1) not in known and not self.fs.exists(self.path(persona_id, c, MANIFEST))
            if _TMP_RE.match(c) or half:
                log.warning("removing %s left by an interrupted publish", self.display(persona_id, c))
                self._rm(self.path(persona_id, c))

    # -------------------------------------------------------------------------------------------- publish

    def publish(self, persona_id: str, adapter_dir: str | Path, *, base_model: str, run_id: str,
                data_ids: list[str], eval_metrics: dict, max_rank: int = MAX_RANK, attempts: int = 3) -> dict:
        """See :func:`publish_adapter`."""
        if not ID_RE.match(persona_id):
            raise PublishError(f"persona id {persona_id!r} must be snake_case (lower-case letters, digits, '_')")
        src = Path(adapter_dir)
        conf = check_adapter(src, base_model=base_model, max_rank=max_rank)
        _source_files(src)  # a link out of the directory is refused before anything is written
        digest = file_digest(src / WEIGHTS)
        pdir = self.path(persona_id)
        new_pdir = self.local and not os.path.exists(pdir)
        if self.local:
            os.makedirs(pdir, exist_ok=True)
        try:
            return self._publish_locked(persona_id, src, conf, digest, base_model=base_model, run_id=run_id,
                                        data_ids=data_ids, eval_metrics=eval_metrics, attempts=attempts)
        except BaseException:
            if new_pdir:
                try:
                    os.rmdir(pdir)  # only when empty: a version published meanwhile stays
                except OSError:
                    pass
            raise

    def _publish_locked(self, persona_id: str, src: Path, conf: dict, digest: str, *, base_model: str, run_id: str,
                        data_ids: list[str], eval_metrics: dict, attempts: int) -> dict:
        for _ in range(attempts):
            with self.lock():
                reg, token = self._read_registry()
                entry = reg.get("adapters", {}).get(persona_id)
                self._clean_leftovers(persona_id, entry)
                rev = reg.get("revision", 0)
                n = max(self._existing_versions(persona_id, entry), default=0) + 1
                name, final = version_name(persona_id, n), self.path(persona_id, f"v{n}")
                tmp = self.path(persona_id, f"v{n}.tmp-{uuid.uuid4().hex[:8]}")
                created, moving = _now(), False
                try:
                    self._upload_dir(src, tmp)
                    got = self.digest(persona_id, tmp.rsplit("/", 1)[1], WEIGHTS)
                    if got != digest:
                        raise PublishError(f"the copy of {src / WEIGHTS} in the store has digest {got[:12]}…, not "
                                           f"{digest[:12]}…: the copy is corrupt; publish again")
                    manifest = {"name": name, "persona_id": persona_id, "version": n, "digest": digest,
                                "base_model": str(base_model), "rank": conf["r"], "alpha": conf.get("lora_alpha"),
                                "target_modules": conf.get("target_modules"), "run_id": run_id,
                                "data_ids": list(data_ids), "eval_metrics": eval_metrics, "created": created}
                    self.fs.pipe_file(f"{tmp}/{MANIFEST}",
                                      (json.dumps(manifest, indent=2, default=str) + "\n").encode("utf-8"))
                    if self._token(REGISTRY) != token:
                        self._rm(tmp)
                        continue  # compare-and-swap failed early (a writer outside the lock): retry before moving
                    moving = True
                    self._move_version(tmp, final)
                    new = json.loads(json.dumps(reg))
                    new["revision"] = rev + 1
                    e = new.setdefault("adapters", {}).setdefault(persona_id, {
                        "versions": {}, "stable": None, "canary": None, "canary_weight": 0, "previous_stable": []})
                    e["versions"][str(n)] = {"state": "staged", "name": name, "digest": digest, "created": created}
                    self._write_registry(new, token)
                except RegistryConflict:
                    self._rm(tmp)
                    self._rm(final)
                    continue
                except BaseException:
                    self._rm(tmp)
                    if moving:
                        self._rm(final)
                    raise
            return {"persona_id": persona_id, "version": n, "name": name, "path": self.display(persona_id, f"v{n}"),
                    "digest": digest, "revision": rev + 1}
        raise RegistryConflict(f"{self.display(REGISTRY)} changed during each of {attempts} attempts; publish again")

    def find_version(self, persona_id: str, digest: str, adapter_dir: str | Path | None = None) -> dict | None:
        """See :func:`find_version`."""
        entry = self.read_registry().get("adapters", {}).get(persona_id) or {}
        for k, v in entry.get("versions", {}).items():
            if v.get("digest") != digest:
                continue
            if adapter_dir is not None:
                try:
                    mine = json.loads((Path(adapter_dir) / "adapter_config.json").read_text(encoding="utf-8"))
                    theirs = json.loads(self.fs.cat_file(self.path(persona_id, f"v{k}", "adapter_config.json")))
                except (OSError, ValueError):
                    continue
                if mine != theirs:
                    continue
            return {"version": int(k), **v}
        return None

    # -------------------------------------------------------------------------------------------- serving

    def latest_live(self, persona_id: str) -> dict | None:
        """The latest live version of ``persona_id``: its ``stable`` version, else its highest version that is not
        ``retired`` (a canary or a freshly published ``staged`` one, e.g. a phase 1 run's output).

        Returns:
            ``{"version": N, **registry entry}`` (``state``, ``name``, ``digest``, ``created``), or None when the
            persona has no version that is not retired.

        Raises:
            RuntimeError: the registry is unreadable. OSError (or a botocore error): the store cannot be read.
        """
        entry = self.read_registry().get("adapters", {}).get(persona_id) or {}
        versions = entry.get("versions") or {}
        live = {int(n) for n, v in versions.items() if v.get("state") != "retired"}
        if not live:
            return None
        n = entry.get("stable") if entry.get("stable") in live else max(live)
        return {"version": n, **versions[str(n)]}

    def local_version(self, persona_id: str, version: int | str, digest: str, cache_dir: str | Path) -> Path:
        """A local directory holding version ``version`` of ``persona_id``, checked against ``digest``.

        A local or PVC store is read in place; a remote one is downloaded to
        ``<cache_dir>/<store hash>/<persona>--v<N>-<digest[:16]>`` (into a temporary folder next to it first, renamed
        once complete and checked, so a half-downloaded version is never used; an existing checked copy is reused).

        Args:
            persona_id: The persona.
            version: N of ``v<N>``.
            digest: The SHA-256 the registry holds for the version (``versions[N].digest``).
            cache_dir: Local download cache of a remote store.

        Returns:
            The directory to give the engine's ``load_adapter``.

        Raises:
            DigestMismatch: manifest.json names another digest, or the weights do not hash to ``digest``.
            FileNotFoundError: the version or its manifest is missing. OSError: it cannot be read or the cache
                cannot be written.
        """
        vdir = f"v{int(version)}"
        try:
            manifest = json.loads(self.fs.cat_file(self.path(persona_id, vdir, MANIFEST)))
        except ValueError as e:
            raise DigestMismatch(f"{self.display(persona_id, vdir, MANIFEST)} is not valid JSON ({e})") from None
        if digest and manifest.get("digest") != digest:
            raise DigestMismatch(f"{self.display(persona_id, vdir, MANIFEST)} names digest "
                                 f"{str(manifest.get('digest'))[:12]}…, the registry {digest[:12]}…")
        want = digest or manifest.get("digest", "")
        if self.local:
            got = file_digest(Path(self.path(persona_id, vdir, WEIGHTS)))
            if got != want:
                raise DigestMismatch(f"{self.display(persona_id, vdir, WEIGHTS)} has digest {got[:12]}…, not the "
                                     f"registered {want[:12]}…: the store copy is corrupt; promote or roll back to "
                                     "another version, retire this one, and publish the adapter again (it gets a new "
                                     "version)")
            return Path(self.path(persona_id, vdir))
        base = Path(cache_dir) / hashlib.sha256(self.uri.encode()).hexdigest()[:12]
        target = base / f"{persona_id}--{vdir}-{want[:16]}"
        if (target / WEIGHTS).is_file():
            if file_digest(target / WEIGHTS) == want:
                return target
            log.warning("cached adapter %s is corrupt; downloading it again", target)
            shutil.rmtree(target, ignore_errors=True)
        base.mkdir(parents=True, exist_ok=True)
        tmp = base / f".tmp-{uuid.uuid4().hex[:12]}"
        try:
            src = self.path(persona_id, vdir)
            for f in self.fs.find(src):
                dest = tmp / f[len(src) + 1:]
                dest.parent.mkdir(parents=True, exist_ok=True)
                self.fs.get_file(f, str(dest))
            got = file_digest(tmp / WEIGHTS) if (tmp / WEIGHTS).is_file() else "(missing)"
            if got != want:
                raise DigestMismatch(f"{self.display(persona_id, vdir, WEIGHTS)} has digest {got[:12]}…, not the "
                                     f"registered {want[:12]}…: the store copy is corrupt; promote or roll back to "
                                     "another version, retire this one, and publish the adapter again (it gets a new "
                                     "version)")
            try:
                os.rename(tmp, target)
            except OSError:  # another process put a copy there meanwhile
                if not (target / WEIGHTS).is_file():
                    raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return target


@contextmanager
def _local_lock(path: Path, timeout_s: float, stale_s: float) -> Iterator[None]:
    """Hold the local lock file ``path`` (``O_CREAT | O_EXCL``); a lock older than ``stale_s`` is broken."""
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


# ------------------------------------------------------------------------------------------ module API
# Each function takes a store URI/path (opened with the default PVC root and botocore's endpoint resolution) or an
# AdapterStore (opened once with the configured settings).


def read_registry(store: str | Path | AdapterStore) -> dict:
    """The registry of ``store`` (see :meth:`AdapterStore.read_registry`).

    Raises:
        RuntimeError: unreadable, malformed, or missing while versions exist. OSError (or a botocore error): the store
            cannot be read. ValueError: ``store`` is not a supported URI.
    """
    return open_store(store).read_registry()


@contextmanager
def registry_lock(store: str | Path | AdapterStore, timeout_s: float = 30.0, stale_s: float = 600.0
                  ) -> Iterator[None]:
    """Hold ``<store>/registry.lock`` (see :meth:`AdapterStore.lock`).

    Raises:
        RegistryConflict: the lock stayed held for ``timeout_s`` seconds.
    """
    with open_store(store).lock(timeout_s, stale_s):
        yield


def publish_adapter(store: str | Path | AdapterStore, persona_id: str, adapter_dir: str | Path, *, base_model: str,
                    run_id: str, data_ids: list[str], eval_metrics: dict, max_rank: int = MAX_RANK,
                    attempts: int = 3) -> dict:
    """Publish one adapter as ``<store>/<persona_id>/v<N>`` (N = highest existing + 1) in state ``staged``.

    Args:
        store: Store URI or :class:`AdapterStore` (a local directory is created when missing; an S3 bucket must exist).
        persona_id: The persona (snake_case id); the version is named ``<persona_id>--v<N>``.
        adapter_dir: Local PEFT adapter directory (``adapter_config.json``, ``adapter_model.safetensors``).
        base_model: The serving base model; must equal the adapter's ``base_model_name_or_path``.
        run_id: Training run id (manifest).
        data_ids: Data ids the adapter was trained on (manifest).
        eval_metrics: Evaluation metrics, e.g. the gate's (manifest).
        max_rank: Serving limit on the LoRA rank.
        attempts: Compare-and-swap attempts before :class:`RegistryConflict`.

    Returns:
        ``{"persona_id", "version", "name", "path", "digest", "revision"}`` (``path`` as displayed: a local path or an
        ``s3://`` URI; ``revision`` after the write).

    Raises:
        PublishError: the adapter fails a check or what landed in the store does not match its digest.
        RegistryConflict: the registry kept changing or stayed locked.
        RuntimeError: the registry is unreadable.
        OSError: the store is not writable.
        In every case no version is left in the registry or under ``v<N>/``, and the registry is unchanged.
    """
    return open_store(store).publish(persona_id, adapter_dir, base_model=base_model, run_id=run_id,
                                     data_ids=data_ids, eval_metrics=eval_metrics, max_rank=max_rank,
                                     attempts=attempts)


def find_version(store: str | Path | AdapterStore, persona_id: str, digest: str,
                 adapter_dir: str | Path | None = None) -> dict | None:
    """The registered version of ``persona_id`` whose adapter has ``digest`` (``{"version", "name", ...}``), or None.

    With ``adapter_dir``, its ``adapter_config.json`` must also equal the stored version's (parsed JSON), so a
    changed config (base model, alpha, targets) with the same weights is a new version, not a duplicate.

    Raises:
        RuntimeError: the registry is unreadable. OSError: the store cannot be read.
    """
    return open_store(store).find_version(persona_id, digest, adapter_dir)


def update_registry(store: str | Path | AdapterStore, change: Callable[[dict], None], attempts: int = 3) -> dict:
    """Apply ``change(registry)`` (it mutates a copy, or raises to abort) under the lock with a compare-and-swap on
    the registry; returns the new registry (revision + 1).

    Raises:
        Whatever ``change`` raises (nothing is written). RegistryConflict: the registry kept changing.
        RuntimeError: the registry is unreadable. OSError: the store cannot be written.
    """
    return open_store(store).update(change, attempts)

