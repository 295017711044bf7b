"""Security of the public API (docs/security.md): caller tokens, per-caller rate limits and the retention sweep.

- :class:`CallerAuth` maps ``authorization: Bearer <token>`` to a caller id (``security.caller_auth``); the tokens
  come from a mounted file or an environment variable, never from the YAML. Tokens are kept only as SHA-256
  digests and never logged or echoed.
- :class:`RateLimiter` is a token bucket per caller (the caller id, or the peer address without caller tokens): one
  for the calls that store something (StartConversation, SendMessage, RunSelfPlay; off by default) and one for the
  conversations a caller starts (on by default); over a limit the call fails with :class:`RateLimited`
  (RESOURCE_EXHAUSTED + ``retry-after``) before anything is stored.
- :func:`watch_retention` deletes conversations inactive for ``security.retention_days``
  (:meth:`mascot.gateway.store.Store.delete_inactive`).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import math
import os
import re
import time
from collections import OrderedDict
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable

from mascot.core.errors import PermissionDenied, ResourceExhausted, Unauthenticated

log = logging.getLogger(__name__)
CALLER_ID_RE = re.compile(r"^[A-Za-z0-9_.@-]{1,64}$")
MIN_TOKEN_CHARS = 16


class RateLimited(ResourceExhausted):
    """A caller went over its rate limit; ``retry_after_s`` is when the next call will be accepted."""

    def __init__(self, message: str, retry_after_s: float) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8")).digest()


def token_entries(text: str, source: str, what: str, name_ok: Callable[[str], str]) -> dict[bytes, tuple[str, str]]:
    """Parse ``<name>=<token>`` entries (one per line or comma-separated; lines starting with ``#`` are comments), the
    format of the caller tokens and of the control plane's tokens.

    Args:
        text: The file's or variable's content.
        source: Where it came from, for messages (``security.caller_tokens_file /x``).
        what: The entry's form, for messages (``caller_id=token``).
        name_ok: Checks the part before ``=`` and returns the entry's label for messages ("" when it is malformed).

    Returns:
        SHA-256 digest of each token -> (the part before ``=``, its label).

    Raises:
        ValueError: a malformed entry, a token shorter than 16 characters or with spaces, or a token given twice.
            Messages name the entry's position and label, never a token.
    """
    out: dict[bytes, tuple[str, str]] = {}
    entries = [e.strip() for line in text.splitlines() if not line.lstrip().startswith("#") for e in line.split(",")]
    for n, entry in enumerate((e for e in entries if e), 1):
        name, sep, token = entry.partition("=")
        name, token = name.strip(), token.strip()
        label = name_ok(name) if sep else ""
        if not label:
            raise ValueError(f"{source}: entry {n} is not {what}")
        if len(token) < MIN_TOKEN_CHARS or any(c.isspace() for c in token):
            raise ValueError(f"{source}: the token of {label} must be at least {MIN_TOKEN_CHARS} characters without "
                             "spaces")
        d = _digest(token)
        if d in out:
            raise ValueError(f"{source}: the token of {label} is also the token of {out[d][1]}")
        out[d] = (name, label)
    return out


def parse_caller_tokens(text: str, source: str) -> dict[bytes, str]:
    """Parse ``caller_id=token`` entries (:func:`token_entries`).

    Returns:
        SHA-256 digest of each token -> caller id.

    Raises:
        ValueError: a malformed entry, a bad caller id, a token shorter than 16 characters or with spaces, or a
            token given twice. Messages name the entry's position, never a token.
    """
    def caller(name: str) -> str:
        return f"caller {name!r}" if CALLER_ID_RE.match(name) else ""

    entries = token_entries(text, source, "caller_id=token with a caller id of letters, digits and '_ . @ -' (at "
                                          "most 64)", caller)
    return {d: name for d, (name, _) in entries.items()}


def bearer(context: Any) -> str | None:
    """The token of the ``authorization: Bearer <token>`` metadata of a call (scheme case-insensitive, as the admin
    token's); "" when there is no authorization metadata, None when it is not a bearer token."""
    for k, v in context.invocation_metadata() or ():
        if k == "authorization":
            v = v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)
            scheme, _, value = v.strip().partition(" ")
            return value.strip() if scheme.lower() == "bearer" and value.strip() else None
    return ""


def peer_host(context: Any) -> str:
    """The peer address of a call without its port (``ipv4:10.0.0.7``), the rate-limit key without caller tokens."""
    peer = context.peer() or "unknown"
    if isinstance(peer, bytes):
        peer = peer.decode("utf-8", "replace")
    return peer.rsplit(":", 1)[0] if peer.startswith(("ipv4:", "ipv6:")) else peer


class CallerAuth:
    """Caller tokens of ConversationService.

    Args:
        tokens: SHA-256 digest of each token -> caller id (:func:`parse_caller_tokens`); None turns caller
            authentication off (every call is the anonymous caller "").
    """

    def __init__(self, tokens: dict[bytes, str] | None) -> None:
        self._tokens = tokens

    @property
    def enabled(self) -> bool:
        """True when every call must carry a caller token."""
        return self._tokens is not None

    @classmethod
    def from_config(cls, sec: Any, environ: dict[str, str] | None = None) -> "CallerAuth":
        """From ``security`` (:class:`~mascot.core.config.SecurityConfig`): off unless ``caller_auth``; tokens from
        ``caller_tokens_file``, else the variable ``caller_tokens_env``.

        Raises:
            ValueError: ``caller_auth`` is on and no token can be read, or the tokens are malformed.
        """
        if not sec.caller_auth:
            return cls(None)
        if sec.caller_tokens_file:
            try:
                text = Path(sec.caller_tokens_file).read_text(encoding="utf-8")
            except OSError as e:
                raise ValueError(f"security.caller_tokens_file {sec.caller_tokens_file} cannot be read "
                                 f"({e.strerror or type(e).__name__})") from None
            source = f"security.caller_tokens_file {sec.caller_tokens_file}"
        else:
            text = (os.environ if environ is None else environ).get(sec.caller_tokens_env, "")
            source = f"${sec.caller_tokens_env}"
        tokens = parse_caller_tokens(text, source)
        if not tokens:
            raise ValueError(f"security.caller_auth is on but {source} holds no caller_id=token entry; add tokens or "
                             "turn caller_auth off")
        return cls(tokens)

    def authenticate(self, context: Any) -> str:
        """The caller id of a call ("" when caller authentication is off).

        Raises:
            Unauthenticated: no ``authorization`` metadata.
            PermissionDenied: a token no caller has.
        """
        if self._tokens is None:
            return ""
        token = bearer(context)
        if token is None:
            raise Unauthenticated("the authorization metadata must be 'Bearer <token>'")
        if not token:
            raise Unauthenticated("a caller token is required: send 'authorization: Bearer <token>' metadata (the "
                                  "mascot CLI reads it from MASCOT_CALLER_TOKEN or --token-file)")
        caller = self._tokens.get(_digest(token))
        if caller is None:
            raise PermissionDenied("the caller token is not valid")
        return caller


class RateLimiter:
    """A token bucket per key: ``burst`` calls at once, refilled at ``per_minute / 60`` calls per second.

    Args:
        per_minute: Sustained calls per minute; 0 turns the limiter off.
        burst: Bucket size.
        max_keys: Most buckets kept; the least recently used is dropped beyond it (it starts full again).
        clock: Monotonic seconds (tests inject one).
        what: What is counted, for the message ("calls", "new conversations").
        settings: The config keys of ``per_minute`` and ``burst``, for the message.
    """

    def __init__(self, per_minute: float, burst: int, max_keys: int = 10_000,
                 clock: Callable[[], float] = time.monotonic, *, what: str = "calls",
                 settings: str = "security.rate_limit_per_minute, security.rate_limit_burst") -> None:
        self.rate, self.burst, self.max_keys, self.clock = per_minute / 60.0, float(burst), max_keys, clock
        self.what, self.settings = what, settings
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()  # key -> (tokens, at)

    @property
    def enabled(self) -> bool:
        """False when there is no limit."""
        return self.rate > 0

    @classmethod
    def from_config(cls, sec: Any, clock: Callable[[], float] = time.monotonic) -> "RateLimiter":
        """From ``security.rate_limit_*``."""
        return cls(sec.rate_limit_per_minute, sec.rate_limit_burst, sec.rate_limit_max_callers, clock)

    @classmethod
    def conversations(cls, sec: Any, clock: Callable[[], float] = time.monotonic) -> "RateLimiter":
        """The conversations a caller starts, from ``security.conversations_per_minute`` and
        ``security.conversations_burst``."""
        return cls(sec.conversations_per_minute, sec.conversations_burst, sec.rate_limit_max_callers, clock,
                   what="new conversations",
                   settings="security.conversations_per_minute, security.conversations_burst")

    def take(self, key: str) -> None:
        """Spend one call of ``key``'s bucket.

        Raises:
            RateLimited: the bucket is empty; ``retry_after_s`` says when one call is available again.
        """
        if not self.enabled:
            return
        now = self.clock()
        tokens, at = self._buckets.pop(key, (self.burst, now))
        tokens = min(self.burst, tokens + (now - at) * self.rate)
        if tokens < 1.0:
            self._buckets[key] = (tokens, now)
            wait = (1.0 - tokens) / self.rate
            raise RateLimited(f"rate limit exceeded: at most {self.rate * 60:g} {self.what} per minute (bursts of "
                              f"{self.burst:g}) per caller ({self.settings}); retry in {math.ceil(wait)} s (the "
                              "retry-after metadata gives the seconds)", wait)
        self._buckets[key] = (tokens - 1.0, now)
        while len(self._buckets) > self.max_keys:
            self._buckets.popitem(last=False)


async def sweep_retention(store: Any, days: float, skip: set[str] | frozenset = frozenset(), now: Any = None) -> int:
    """Delete the conversations inactive for ``days`` (none when ``days`` is 0) except ``skip``; returns the
    count."""
    if days <= 0:
        return 0
    return await asyncio.to_thread(store.delete_inactive, timedelta(days=days), now, frozenset(skip))


async def watch_retention(store: Any, days: float, every_s: float, busy: Callable[[], set[str]]) -> None:
    """Run :func:`sweep_retention` now and every ``every_s`` seconds until cancelled; ``busy()`` names the
    conversations with a round running (skipped). A failed sweep is logged and retried at the next tick."""
    while True:
        try:
            n = await sweep_retention(store, days, set(busy()))
            if n:
                log.info("retention: deleted %d conversation(s) inactive for %g day(s)", n, days)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - a store hiccup must not end the sweep
            log.warning("retention sweep failed (%s); retrying in %g s", type(e).__name__, every_s)
        await asyncio.sleep(every_s)
