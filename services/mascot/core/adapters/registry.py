"""State transitions of the adapter registry as functions on the registry dict.

States: ``staged`` (published, not serving) → ``canary`` (a weighted share of new conversations) → ``stable``
(new conversations) → ``retired`` (no new conversations; unloaded once none uses it). Each persona entry holds the
aliases ``stable``, ``canary``, ``canary_weight`` and ``previous_stable`` (the stable versions before, for
rollback). The functions mutate the dict they are given (:func:`mascot.core.adapters.store.update_registry` hands
them a copy and writes it with a compare-and-swap) and raise the service error a caller should see.
"""

from __future__ import annotations

import hashlib
import re

from mascot.core.errors import FailedPrecondition, InvalidArgument, NotFound
from mascot.core.personas import ID_PATTERN, ID_RE

#: The registry's version states (the proto ``AdapterState`` names, tests/unit/test_enums.py).
STATES = ("staged", "canary", "stable", "retired")
#: A version's name, ``<persona>--v<N>``: a persona id (:data:`mascot.core.personas.ID_RE`) and N >= 1 in decimal
#: without leading zeros. It names the engine adapter, the registry entry and ``adapter_version`` on the wire.
VERSION_NAME_RE = re.compile(rf"^(?P<persona>{ID_PATTERN})--v(?P<n>[1-9][0-9]*)\Z")


def version_name(persona_id: str, n: int) -> str:
    """``<persona_id>--v<n>``, the name of version ``n`` of a persona's adapter (``version_name("anchor", 3)``).

    Raises:
        ValueError: ``persona_id`` is not a persona id (snake_case, 1-63 characters) or ``n`` is not an int >= 1.
    """
    if not isinstance(persona_id, str) or not ID_RE.match(persona_id):
        raise ValueError(f"{str(persona_id)[:80]!r} is not a persona id (snake_case, 1-63 characters)")
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"an adapter version number is an int >= 1, got {n!r}")
    return f"{persona_id}--v{n}"


def parse_version_name(name: str) -> tuple[str, int]:
    """``(persona_id, n)`` of a version name ``<persona_id>--v<n>`` (:func:`version_name`'s inverse).

    Raises:
        ValueError: ``name`` is not of that form: ``v0``, leading zeros, a persona id that is not snake_case or is
            over 63 characters, anything else.
    """
    m = VERSION_NAME_RE.match(name) if isinstance(name, str) else None
    if not m:
        raise ValueError(f"{str(name)[:80]!r} is not an adapter version name ('<persona>--v<N>', N >= 1)")
    return m["persona"], int(m["n"])


def entry_of(reg: dict, persona_id: str) -> dict:
    """The registry entry of ``persona_id`` (defaults filled in).

    Raises:
        NotFound: no version of the persona was ever published.
    """
    entry = reg.get("adapters", {}).get(persona_id)
    if not entry:
        raise NotFound(f"no adapter is published for {persona_id!r}; ListAdapters shows what is")
    entry.setdefault("stable", None)
    entry.setdefault("canary", None)
    entry.setdefault("canary_weight", 0)
    entry.setdefault("previous_stable", [])
    return entry


def _version(entry: dict, persona_id: str, version: int) -> dict:
    v = entry["versions"].get(str(version))
    if v is None:
        known = ", ".join(sorted(entry["versions"], key=int)) or "none"
        raise NotFound(f"{persona_id} has no version {version} (versions: {known})")
    return v


def promote(reg: dict, persona_id: str, version: int, canary_weight: float = 0.0) -> None:
    """Make ``version`` stable (``canary_weight`` 0) or the canary with that share of new conversations.

    A new stable retires the old one and pushes it on ``previous_stable``; a new canary sends the canary it replaces
    back to ``staged``. A retired version may be promoted again (its files stay in the store).

    Raises:
        InvalidArgument: ``canary_weight`` outside [0, 1). NotFound: unknown persona or version.
        FailedPrecondition: the version is already stable, or a canary is asked with no stable version.
    """
    if not 0.0 <= canary_weight < 1.0:
        raise InvalidArgument(f"canary_weight must be in [0, 1), got {canary_weight}")
    entry = entry_of(reg, persona_id)
    v = _version(entry, persona_id, version)
    if v["state"] == "stable":
        raise FailedPrecondition(f"{persona_id} v{version} is already stable")
    if canary_weight > 0:
        if entry["stable"] is None:
            raise FailedPrecondition(f"{persona_id} has no stable version for a canary to share traffic with; "
                                     "promote one to stable first")
        old = entry["canary"]
        if old is not None and old != version:
            entry["versions"][str(old)]["state"] = "staged"
        entry["canary"], entry["canary_weight"] = version, float(canary_weight)
        v["state"] = "canary"
        return
    old = entry["stable"]
    if old is not None:
        entry["versions"][str(old)]["state"] = "retired"
        entry["previous_stable"].append(old)
    if entry["canary"] == version:
        entry["canary"], entry["canary_weight"] = None, 0
    entry["previous_stable"] = [n for n in entry["previous_stable"] if n != version]
    entry["stable"] = version
    v["state"] = "stable"


def rollback(reg: dict, persona_id: str) -> None:
    """Restore the previous stable version; the current stable and any canary are retired (a canary is rolled back
    with the release it was tested against).

    Raises:
        NotFound: unknown persona. FailedPrecondition: no previous stable version.
    """
    entry = entry_of(reg, persona_id)
    if not entry["previous_stable"]:
        raise FailedPrecondition(f"{persona_id} has no previous stable version to roll back to")
    prev = entry["previous_stable"].pop()
    if entry["stable"] is not None:
        entry["versions"][str(entry["stable"])]["state"] = "retired"
    if entry["canary"] is not None:
        entry["versions"][str(entry["canary"])]["state"] = "retired"
        entry["canary"], entry["canary_weight"] = None, 0
    entry["stable"] = prev
    entry["versions"][str(prev)]["state"] = "stable"


def retire(reg: dict, persona_id: str, version: int) -> None:
    """Retire a staged or canary version.

    Raises:
        NotFound: unknown persona or version. FailedPrecondition: already retired, or the stable version.
    """
    entry = entry_of(reg, persona_id)
    v = _version(entry, persona_id, version)
    if v["state"] == "retired":
        raise FailedPrecondition(f"{persona_id} v{version} is already retired")
    if v["state"] == "stable":
        raise FailedPrecondition(f"{persona_id} v{version} is the stable version; promote another or roll back "
                                 "before retiring it")
    if entry["canary"] == version:
        entry["canary"], entry["canary_weight"] = None, 0
    v["state"] = "retired"


def choose_version(entry: dict, conversation_key: str) -> int | None:
    """The version a new conversation uses: the canary for a ``canary_weight`` share of keys, else the stable one.

    The draw is u = first 8 bytes of SHA-256(key) / 2^64, uniform in [0, 1): the same conversation always gets the
    same version. Returns None when the persona has no stable and no canary version.
    """
    stable, canary, w = entry.get("stable"), entry.get("canary"), float(entry.get("canary_weight") or 0)
    if canary is not None and w > 0:
        u = int.from_bytes(hashlib.sha256(conversation_key.encode("utf-8")).digest()[:8], "big") / 2**64
        if u < w or stable is None:
            return canary
    return stable
