"""Model services follow the adapter registry (DESIGN.md section 5): load versions under their own names, pin
conversations to versions.

:class:`AdapterResolver` (one per engine) loads every ``stable`` and ``canary`` version of the registry
(:meth:`reconcile_once`, polled by :meth:`run`) under its name ``<persona>--v<N>``, never over another name, so a
conversation that started on a version keeps it after a promote; a pinned version that is not loaded yet is loaded
on first use (:meth:`ensure`). Retired versions stay loaded (a conversation may still be pinned to one); unloading
them is left to a later change. :func:`pin_versions` picks the versions of a new conversation (stable, or the
canary for its weighted share, :func:`mascot.core.adapters.registry.choose_version`).
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from pathlib import Path
from typing import Any, Iterable

from mascot.core.adapters import registry as rg
from mascot.core.adapters import store as st
from mascot.core.errors import InvalidArgument, Unavailable

log = logging.getLogger(__name__)
BASE = "base"
NAME_RE = re.compile(r"^(?P<persona>[a-z][a-z0-9_]{0,62})--v(?P<n>[1-9][0-9]*)$")
SERVING_STATES = ("stable", "canary")


def pin_versions(store: str | Path, persona_ids: Iterable[str], conversation_key: str) -> dict[str, str]:
    """``{persona_id: "<persona>--v<N>" | "base"}`` for a new conversation: the stable version, or the canary for a
    ``canary_weight`` share of conversation keys; ``"base"`` when the persona has neither.

    An unreadable registry pins nothing (``{}``: the services' own choice) and logs a warning, so chat keeps working
    while an operator restores it; the admin plane reports the problem.
    """
    try:
        reg = st.read_registry(store)
    except (RuntimeError, OSError) as e:
        log.warning("adapter registry unreadable; conversation not pinned: %s", e)
        return {}
    out = {}
    for pid in persona_ids:
        entry = reg.get("adapters", {}).get(pid)
        n = rg.choose_version(entry, conversation_key) if entry else None
        out[pid] = f"{pid}--v{n}" if n is not None else BASE
    return out


class AdapterResolver:
    """Loads registry versions into one engine and resolves pinned versions.

    Args:
        engine: The generation engine (``adapters()``, ``load_adapter(name, path)``).
        store: Store root, or None (then only already loaded adapters resolve).
        metrics: Optional :class:`~mascot.core.metrics.Metrics` (``mascot_adapter_info``, load seconds, failures).
    """

    def __init__(self, engine: Any, store: str | Path | None, metrics: Any = None) -> None:
        self.engine, self.store, self.metrics = engine, Path(store) if store else None, metrics
        self._locks: dict[str, asyncio.Lock] = {}
        self.failures: dict[str, str] = {}

    async def _load(self, name: str, persona: str, version: str) -> None:
        lock = self._locks.setdefault(name, asyncio.Lock())
        async with lock:
            if name in self.engine.adapters():
                return
            path = self.store / persona / f"v{version}"
            t0 = time.perf_counter()
            try:
                await self.engine.load_adapter(name, str(path))
            except Exception as e:  # noqa: BLE001 - any load failure is counted and reported, others still load
                self.failures[name] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]
                log.warning("adapter %s failed to load from %s: %s", name, path, self.failures[name])
                if self.metrics is not None:
                    self.metrics.adapter_load_failures.labels(type(e).__name__).inc()
                raise
            self.failures.pop(name, None)
            log.info("loaded adapter %s from %s in %.2f s", name, path, time.perf_counter() - t0)

    async def ensure(self, name: str, persona_id: str) -> str | None:
        """The engine adapter for a pinned ``name`` of ``persona_id`` (loaded now if needed); None for ``"base"``.

        Raises:
            InvalidArgument: the name is malformed, belongs to another persona, or is not in the registry.
            Unavailable: it could not be loaded, or no store is configured to load it from.
        """
        if name == BASE:
            return None
        m = NAME_RE.match(name)
        if not m or m["persona"] != persona_id:
            raise InvalidArgument(f"adapter_version {name[:80]!r} is not a version of {persona_id} "
                                  f"('{persona_id}--v<N>' or 'base')")
        if name in self.engine.adapters():
            return name
        if self.store is None:
            raise Unavailable(f"adapter {name} is not loaded and this service has no adapter store configured")
        entry = st.read_registry(self.store).get("adapters", {}).get(persona_id) or {}
        if m["n"] not in entry.get("versions", {}):
            raise InvalidArgument(f"adapter_version {name} is not in the registry")
        try:
            await self._load(name, persona_id, m["n"])
        except Exception:  # noqa: BLE001
            raise Unavailable(f"adapter {name} could not be loaded ({self.failures.get(name, 'error')}); "
                              "retry later") from None
        return name

    async def reconcile_once(self) -> dict[str, str]:
        """Load every stable and canary version that is not loaded; returns ``{name: error}`` of failed loads."""
        if self.store is None:
            return {}
        try:
            reg = await asyncio.to_thread(st.read_registry, self.store)
        except RuntimeError as e:
            log.warning("adapter registry unreadable: %s", e)
            return {"registry": str(e)}
        failed = {}
        loaded = set(self.engine.adapters())
        for pid, entry in sorted(reg.get("adapters", {}).items()):
            for n, v in sorted(entry.get("versions", {}).items(), key=lambda kv: int(kv[0])):
                name = v.get("name") or f"{pid}--v{n}"
                if v.get("state") in SERVING_STATES and name not in loaded:
                    try:
                        await self._load(name, pid, n)
                    except Exception:  # noqa: BLE001 - reported below; the other versions still load
                        failed[name] = self.failures.get(name, "error")
                if self.metrics is not None:
                    self.metrics.adapter_info.labels(pid, name, v.get("state", "")).set(
                        1 if name in self.engine.adapters() else 0)
        return failed

    async def run(self, poll_s: float) -> None:
        """Reconcile every ``poll_s`` seconds until cancelled."""
        while True:
            try:
                failed = await self.reconcile_once()
                if failed:
                    log.warning("adapter loads failed: %s", failed)
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - keep following the registry
                log.exception("adapter reconcile failed")
            await asyncio.sleep(poll_s)
