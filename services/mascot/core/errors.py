"""Service errors, each bound to exactly one gRPC status code.

Only the boundary interceptor (:mod:`mascot.core.interceptors`) turns these into statuses.
Messages say what the caller should change; they never contain prompts, user text or stack traces.
"""

from __future__ import annotations

import grpc


class ServiceError(Exception):
    """Base of all errors that cross a service boundary.

    Attributes:
        code: The gRPC status code the boundary sends.
        message: Text a person can act on (no user text, no prompt, no trace).
    """

    code: grpc.StatusCode = grpc.StatusCode.INTERNAL

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class InvalidArgument(ServiceError):
    """Bad input: empty message, unknown persona, text over the configured limit, unspecified enum."""

    code = grpc.StatusCode.INVALID_ARGUMENT


class NotFound(ServiceError):
    """An unknown conversation, persona set or adapter."""

    code = grpc.StatusCode.NOT_FOUND


class AlreadyExists(ServiceError):
    """The name is taken by something else (e.g. a training run id used by a run of another phase)."""

    code = grpc.StatusCode.ALREADY_EXISTS


class FailedPrecondition(ServiceError):
    """The state forbids the request (e.g. self-play on a conversation that already has turns)."""

    code = grpc.StatusCode.FAILED_PRECONDITION


class Unavailable(ServiceError):
    """A dependency is down or not ready, or the same request is still being answered: retry later."""

    code = grpc.StatusCode.UNAVAILABLE


class Aborted(ServiceError):
    """A concurrency conflict decided against this call: e.g. a round closed by a newer message of its conversation
    before this turn could be stored."""

    code = grpc.StatusCode.ABORTED


class ResourceExhausted(ServiceError):
    """Overload; the boundary adds ``retry-after`` metadata so that clients may retry."""

    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class DeadlineExceeded(ServiceError):
    """A propagated deadline ran out."""

    code = grpc.StatusCode.DEADLINE_EXCEEDED


class Unauthenticated(ServiceError):
    """No credentials were sent (e.g. the admin token is missing)."""

    code = grpc.StatusCode.UNAUTHENTICATED


class PermissionDenied(ServiceError):
    """The credentials sent do not allow the call (e.g. a wrong admin token)."""

    code = grpc.StatusCode.PERMISSION_DENIED
