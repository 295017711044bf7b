"""Retries of an idempotent unary gRPC call within a time budget.

One helper for every client that must ride out a restarting dependency (``mascot eval --judge-target``, the
training ``judge`` stage with ``judge.target``): each attempt gets its own deadline; UNAVAILABLE and
DEADLINE_EXCEEDED are retried with exponential backoff (jittered, capped), and RESOURCE_EXHAUSTED only when the
server marks it as overload with ``retry-after`` metadata (seconds; the wait honours it, capped by the remaining
budget). Any other status is raised at once. When no answer came within the budget,
:class:`RetryBudgetExhausted` says which target, for how long, and the last status. The caller is responsible for
the call being safe to repeat (JudgeCandidates is: the judge answers a repeated item from its cache).
"""

from __future__ import annotations

import asyncio
import random
import re
import time
from dataclasses import dataclass
from typing import Awaitable, Callable, TypeVar

import grpc

T = TypeVar("T")

#: Status codes retried whatever the metadata says.
RETRYABLE = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})


@dataclass(frozen=True)
class RetryPolicy:
    """How long and how often to retry.

    Attributes:
        call_timeout_s: Deadline of each attempt, in seconds (> 0).
        budget_s: Seconds after the first attempt started during which a failed attempt is retried; no attempt
            starts after it (>= 0; 0 tries once).
        initial_backoff_s: Wait before the first retry, in seconds.
        max_backoff_s: Cap of the wait between attempts, in seconds (the wait doubles up to it).
        multiplier: Growth of the wait per retry (>= 1).
    """

    call_timeout_s: float = 120.0
    budget_s: float = 300.0
    initial_backoff_s: float = 0.2
    max_backoff_s: float = 4.0
    multiplier: float = 2.0

    def __post_init__(self) -> None:
        if self.call_timeout_s <= 0 or self.budget_s < 0 or self.initial_backoff_s < 0 or self.multiplier < 1 \
                or self.max_backoff_s < self.initial_backoff_s:
            raise ValueError(f"bad retry policy {self}: call_timeout_s > 0, budget_s >= 0, multiplier >= 1 and "
                             "max_backoff_s >= initial_backoff_s >= 0 are required")


class RetryBudgetExhausted(Exception):
    """Every attempt within the budget failed with a retryable status.

    Attributes:
        target: ``host:port`` that did not answer.
        budget_s: The budget in seconds.
        attempts: Attempts made.
        code: The last attempt's status code.
        details: The last attempt's status message.
    """

    def __init__(self, target: str, budget_s: float, attempts: int, code: grpc.StatusCode, details: str) -> None:
        self.target, self.budget_s, self.attempts, self.code, self.details = target, budget_s, attempts, code, details
        super().__init__(f"{target} did not answer within the retry budget of {budget_s:g} s ({attempts} attempt"
                         f"{'s' if attempts != 1 else ''}, last {code.name}: {one_line(details)})")


def one_line(text: str | None, limit: int = 200) -> str:
    """The first line of ``text``, at most ``limit`` characters (status details can hold a multi-line debug
    string)."""
    line = (text or "").strip().splitlines()[0] if (text or "").strip() else ""
    return line if len(line) <= limit else line[:limit - 3] + "..."


def _retry_after_s(err: grpc.aio.AioRpcError) -> float | None:
    """Seconds from the ``retry-after`` trailing metadata, or None when absent or not a number."""
    for key, value in err.trailing_metadata() or ():
        if key == "retry-after":
            try:
                return max(0.0, float(value))
            except (TypeError, ValueError):
                return None
    return None


def overload_wait_s(err: grpc.aio.AioRpcError) -> float | None:
    """Seconds to wait before retrying a call the server refused as overloaded (RESOURCE_EXHAUSTED with
    ``retry-after`` metadata, e.g. the gateway's round admission), else None (do not retry it for that reason)."""
    return _retry_after_s(err) if err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED else None


async def call_with_retry(call: Callable[[float], Awaitable[T]], target: str, policy: RetryPolicy, *,
                          sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
                          clock: Callable[[], float] = time.monotonic,
                          on_retry: Callable[[int, grpc.StatusCode, float], None] | None = None) -> T:
    """Run ``call(timeout_s)`` until it answers, retrying transient failures within ``policy.budget_s``.

    Args:
        call: Makes one attempt; receives the attempt's deadline in seconds (pass it as the RPC's ``timeout``).
        target: ``host:port`` named in the error.
        policy: Deadlines, budget and backoff.
        sleep: Awaitable sleep (tests inject a fake).
        clock: Monotonic clock in seconds (tests inject a fake).
        on_retry: Called as ``on_retry(attempt, code, wait_s)`` before each wait (logging).

    Returns:
        What ``call`` returned.

    Raises:
        RetryBudgetExhausted: the budget ran out with every attempt UNAVAILABLE, DEADLINE_EXCEEDED or overloaded.
        grpc.aio.AioRpcError: any other status (raised at once, never retried).
    """
    start = clock()
    backoff = policy.initial_backoff_s
    attempt = 0
    while True:
        attempt += 1
        try:
            return await call(policy.call_timeout_s)
        except grpc.aio.AioRpcError as e:
            code = e.code()
            hint = _retry_after_s(e) if code == grpc.StatusCode.RESOURCE_EXHAUSTED else None
            if code not in RETRYABLE and hint is None:
                raise
            left = policy.budget_s - (clock() - start)
            wait = hint if hint is not None else backoff * random.uniform(0.5, 1.0)
            if left <= 0 or wait >= left:
                raise RetryBudgetExhausted(target, policy.budget_s, attempt, code, e.details() or "") from None
            if on_retry is not None:
                on_retry(attempt, code, wait)
            await sleep(wait)
            backoff = min(backoff * policy.multiplier, policy.max_backoff_s)


_TARGET = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+):([0-9]{1,5})$")


def target_problem(target: str) -> str | None:
    """Why ``target`` is not a ``HOST:PORT`` address a client can call (None when it is).

    HOST is a name, an IPv4 address or a bracketed IPv6 address; PORT is 1-65535.
    """
    m = _TARGET.match(target)
    if not m:
        return f"{target!r} is not HOST:PORT (e.g. 127.0.0.1:50063 or judge.mascot.svc:50063)"
    if not 1 <= int(m.group(2)) <= 65535:
        return f"{target!r} is not HOST:PORT: port {m.group(2)} is out of range 1-65535"
    return None
