"""Model services follow the adapter registry: load versions under their own names, pin
conversations to versions, unload versions nobody uses any more.

:class:`AdapterResolver` (one per engine) loads every ``stable`` and ``canary`` version of the registry
(:meth:`~AdapterResolver.reconcile_once`, polled by :meth:`~AdapterResolver.run`) under its name ``<persona>--v<N>``,
never over another name, so a conversation that started on a version keeps it after a promote; a pinned version
that is not loaded is loaded on first use (:meth:`~AdapterResolver.ensure`). Engines load from local files: a local
or PVC store is read in place, a remote (S3) one is downloaded to ``adapters.cache_dir`` first; either way the weights
must hash to the digest the registry holds (:meth:`mascot.core.adapters.store.AdapterStore.local_version`).

A loaded version that is no longer served to new conversations (``retired``, or ``staged`` again after a newer
canary replaced it) is unloaded once no :meth:`~AdapterResolver.ensure` has resolved it for
``adapters.retired_unload_s`` seconds; a conversation still pinned to it loads it again on its next turn.
:class:`VersionPinner` picks the versions of a new conversation (stable, or the canary for its weighted share,
:func:`mascot.core.adapters.registry.choose_version`), from the last registry it read when the registry cannot be
read.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import time
from pathlib import Path
from typing import Any, Callable, Iterable

from mascot.core.adapters import registry as rg
from mascot.core.adapters import store as st
from mascot.core.engine.base import UnknownAdapter
from mascot.core.errors import InvalidArgument, Unavailable

log = logging.getLogger(__name__)
BASE = "base"
SERVING_STATES = ("stable", "canary")
#: Default of ``adapters.retired_unload_s``.
RETIRED_UNLOAD_S = 600.0


def default_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/mascot/adapters`` (``~/.cache/mascot/adapters`` when unset): where versions of a remote store
    are downloaded when ``adapters.cache_dir`` is empty."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "mascot" / "adapters"


class VersionPinner:
    """Pins new conversations to ``{persona_id: "<persona>--v<N>" | "base"}``: the stable version, or the canary for
    a ``canary_weight`` share of conversation keys; ``"base"`` when the persona has neither. It remembers the last
    registry it read: while the registry cannot be read (deleted, corrupt, store down) new conversations are pinned
    from that last good registry, or to the base model when none was ever read, never left to a service's own
    choice.

    Args:
        store: Store URI / path / :class:`~mascot.core.adapters.store.AdapterStore`.
        config: Optional ``AdaptersConfig`` (PVC root, S3 endpoint).
    """

    def __init__(self, store: str | Path | st.AdapterStore, config: Any = None) -> None:
        self.store, self.config = store, config
        self.last_good: dict | None = None
        self._opened: st.AdapterStore | None = None

    def pin(self, persona_ids: Iterable[str], conversation_key: str) -> dict[str, str]:
        """The pins of a new conversation (blocking; call it in a worker thread). ``config`` of the constructor (an
        ``AdaptersConfig``) supplies the PVC root and S3 endpoint when the store is a URI. Never raises for an
        unreadable registry (it logs a warning)."""
        try:
            if self._opened is None:  # opened once, on first use
                self._opened = st.open_store(self.store, config=self.config)
            reg = self._opened.read_registry()
            self.last_good = reg
        except (RuntimeError, ValueError, *st.backend_errors()) as e:
            reg = self.last_good
            log.warning("adapter registry unreadable (%s); pinning from %s", e,
                        "the last registry read" if reg is not None else "the base model (none was read yet)")
        return _pins(reg or {}, persona_ids, conversation_key)


def _pins(reg: dict, persona_ids: Iterable[str], conversation_key: str) -> dict[str, str]:
    out = {}
    for pid in persona_ids:
        entry = reg.get("adapters", {}).get(pid)
        n = rg.choose_version(entry, conversation_key) if entry else None
        out[pid] = rg.version_name(pid, n) if n is not None else BASE
    return out


class AdapterResolver:
    """Loads registry versions into one engine, resolves pinned versions, unloads unused retired ones.

    Args:
        engine: The generation engine (``adapters()``, ``load_adapter(name, path)``, ``unload_adapter(name)``).
        store: Store URI / path / :class:`~mascot.core.adapters.store.AdapterStore`, or None (then only already
            loaded adapters resolve).
        metrics: Optional :class:`~mascot.core.metrics.Metrics` (``mascot_adapter_info``, load seconds, failures).
        config: Optional ``AdaptersConfig``: ``pvc_root`` and ``s3_endpoint_url`` (opening ``store``), ``cache_dir``
            and ``retired_unload_s``; defaults when None.
        clock: Monotonic seconds (injected by tests); the time of each use and of :meth:`reconcile_once`.

    Attributes:
        failures: ``{name: "ErrorType: first line"}`` of the last failed load of each version (cleared on success).
        last_used: ``{name: clock seconds}`` of the last :meth:`ensure` (or load) of each loaded version.
    """

    def __init__(self, engine: Any, store: str | Path | st.AdapterStore | None, metrics: Any = None, *,
                 config: Any = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.engine, self.metrics, self.clock = engine, metrics, clock
        self.store = st.open_store(store, config=config) if store else None
        self.cache_dir = Path(getattr(config, "cache_dir", "") or default_cache_dir())
        unload_s = getattr(config, "retired_unload_s", None)
        self.retired_unload_s = float(RETIRED_UNLOAD_S if unload_s is None else unload_s)
        self._locks: dict[str, asyncio.Lock] = {}
        self._paths: dict[str, Path] = {}
        self._info: dict[str, tuple[str, str]] = {}  # name -> (persona, state) last reported
        self.failures: dict[str, str] = {}
        self.last_used: dict[str, float] = {}
        #: The last registry read successfully (None before the first read): what :meth:`default_adapter` follows
        #: while the registry cannot be read.
        self.registry: dict | None = None

    def _lock(self, name: str) -> asyncio.Lock:
        return self._locks.setdefault(name, asyncio.Lock())

    async def _load(self, name: str, persona: str, version: str, digest: str, now: float | None = None) -> None:
        """Fetch (digest-checked) and load one version unless it is loaded; ``now`` (default ``clock()``) is recorded
        as its last use.

        Raises:
            Whatever the fetch or the engine raised (recorded in :attr:`failures` and the failure counter first).
        """
        async with self._lock(name):
            if name in self.engine.adapters():
                return
            t0 = time.perf_counter()
            stage = "fetch"
            try:
                path = await asyncio.to_thread(self.store.local_version, persona, version, digest, self.cache_dir)
                stage = "engine"
                await self.engine.load_adapter(name, str(path))
            except Exception as e:  # any load failure is counted and reported (and re-raised); others still load
                self.failures[name] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]
                log.warning("adapter %s failed to load from %s: %s", name, self.store.display(persona, f"v{version}"),
                            self.failures[name])
                if self.metrics is not None:
                    reason = "digest" if isinstance(e, st.DigestMismatch) else stage
                    self.metrics.adapter_load_failures.labels(reason).inc()
                raise
            took = time.perf_counter() - t0
            self.failures.pop(name, None)
            self._paths[name] = path
            self.last_used[name] = self.clock() if now is None else now
            if self.metrics is not None:
                self.metrics.adapter_load_seconds.labels(persona).observe(took)
            log.info("loaded adapter %s from %s in %.2f s", name, path, took)

    async def _unload(self, name: str, now: float) -> bool:
        """Unload ``name`` if it is still idle at ``now`` (an :meth:`ensure` may have used it meanwhile); a downloaded
        copy is removed from the cache. Returns True when it was unloaded."""
        async with self._lock(name):
            if now - self.last_used.get(name, now) < self.retired_unload_s or name not in self.engine.adapters():
                return False
            try:
                await self.engine.unload_adapter(name)
            except UnknownAdapter:  # unloaded by someone else meanwhile
                pass
            self.last_used.pop(name, None)
            path = self._paths.pop(name, None)
            if path is not None and self.cache_dir in path.parents:
                await asyncio.to_thread(shutil.rmtree, path, True)
            log.info("unloaded adapter %s (not served and unused for %.0f s)", name, self.retired_unload_s)
            return True

    async def ensure(self, name: str, persona_id: str) -> str | None:
        """The engine adapter for a pinned ``name`` of ``persona_id`` (loaded now if needed); None for ``"base"``.

        Marks the version used now (:attr:`last_used`), which keeps a retired version loaded.

        Raises:
            InvalidArgument: the name is malformed, belongs to another persona, or is not in the registry.
            Unavailable: it could not be loaded (store down, digest mismatch, engine error), the registry is
                unreadable, or no store is configured to load it from.
        """
        if name == BASE:
            return None
        try:
            persona, n = rg.parse_version_name(name)
        except ValueError:
            persona, n = "", 0
        if persona != persona_id:
            raise InvalidArgument(f"adapter_version {name[:80]!r} is not a version of {persona_id} "
                                  f"('{persona_id}--v<N>' or 'base')")
        if name in self.engine.adapters():
            self.last_used[name] = self.clock()
            return name
        if self.store is None:
            raise Unavailable(f"adapter {name} is not loaded and this service has no adapter store configured")
        try:
            reg = await asyncio.to_thread(self.store.read_registry)
        except (RuntimeError, *st.backend_errors()) as e:
            raise Unavailable(f"adapter {name} is not loaded and the adapter registry is unreadable ({e}); "
                              "retry later") from None
        v = (reg.get("adapters", {}).get(persona_id) or {}).get("versions", {}).get(str(n))
        if v is None:
            raise InvalidArgument(f"adapter_version {name} is not in the registry")
        self.last_used[name] = self.clock()
        try:
            await self._load(name, persona_id, str(n), v.get("digest", ""))
        except Exception:  # noqa: BLE001 - _load recorded the reason in self.failures
            raise Unavailable(f"adapter {name} could not be loaded ({self.failures.get(name, 'error')}); "
                              "retry later") from None
        self.last_used[name] = self.clock()
        return name

    async def reconcile_once(self, now: float | None = None) -> dict[str, str]:
        """Follow the registry once: load every stable and canary version that is not loaded; unload every loaded
        version in another state (retired, staged) unused for ``retired_unload_s`` seconds; set
        ``mascot_adapter_info{persona, adapter_version, state}`` to 1 when loaded, else 0 (the series of a version's
        previous state is removed).

        Args:
            now: The time on :attr:`clock`'s scale (default: ``clock()``); tests pass it instead of sleeping.

        Returns:
            ``{name: error}`` of failed loads (``{"registry": reason}`` when the registry cannot be read).
        """
        if self.store is None:
            return {}
        now = self.clock() if now is None else now
        try:
            reg = await asyncio.to_thread(self.store.read_registry)
        except (RuntimeError, *st.backend_errors()) as e:
            log.warning("adapter registry unreadable: %s", e)
            return {"registry": str(e)}
        self.registry = reg
        failed = {}
        for pid, entry in sorted(reg.get("adapters", {}).items()):
            for n, v in sorted(entry.get("versions", {}).items(), key=lambda kv: int(kv[0])):
                name, state = v.get("name") or rg.version_name(pid, int(n)), v.get("state", "")
                loaded = name in self.engine.adapters()
                if state in SERVING_STATES and not loaded:
                    try:
                        await self._load(name, pid, n, v.get("digest", ""), now)
                    except Exception:  # noqa: BLE001 - reported below; the other versions still load
                        failed[name] = self.failures.get(name, "error")
                elif state not in SERVING_STATES and loaded:
                    self.last_used.setdefault(name, now)  # loaded by someone else: idle from now on
                    if now - self.last_used[name] >= self.retired_unload_s:
                        await self._unload(name, now)
                self._report(pid, name, state)
        return failed

    def default_adapter(self, persona_id: str) -> str | None:
        """The adapter for a request that names no version: the persona's stable version in the last registry read
        (:attr:`registry`) when it is loaded, else None (the base model). Never a canary, retired or merely the
        highest loaded version, so a rollback holds while the registry cannot be read.

        Raises:
            LookupError: this resolver has no store (nothing says which version is stable).
        """
        if self.store is None:
            raise LookupError("no adapter store")
        entry = (self.registry or {}).get("adapters", {}).get(persona_id) or {}
        n = entry.get("stable")
        name = rg.version_name(persona_id, n) if n else None
        if name is not None and name in self.engine.adapters():
            self.last_used[name] = self.clock()
            return name
        return None

    def _report(self, persona: str, name: str, state: str) -> None:
        if self.metrics is None:
            return
        gauge = self.metrics.adapter_info
        old = self._info.get(name)
        if old is not None and old != (persona, state):
            try:
                gauge.remove(old[0], name, old[1])
            except KeyError:
                pass
        self._info[name] = (persona, state)
        gauge.labels(persona, name, state).set(1 if name in self.engine.adapters() else 0)

    async def run(self, poll_s: float) -> None:
        """Reconcile every ``poll_s`` seconds until cancelled."""
        while True:
            try:
                failed = await self.reconcile_once()
                if failed:
                    log.warning("adapter loads failed: %s", failed)
            except asyncio.CancelledError:
                raise
            except Exception:  # logged with its traceback; keep following the registry
                log.exception("adapter reconcile failed")
            await asyncio.sleep(poll_s)
