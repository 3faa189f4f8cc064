"""Domain errors shared by both services.

The domain core raises these; it never imports gRPC. `switchboard.grpc_errors`
is the one place that turns them into gRPC statuses. Every error carries a
stable `reason` (UPPER_SNAKE_CASE) for programs and a message for people.
"""

from __future__ import annotations

from collections.abc import Mapping


class DomainError(Exception):
    """Base class: a request the domain refuses, with a reason and a message."""

    def __init__(
        self, reason: str, message: str, metadata: Mapping[str, str] | None = None
    ) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message
        self.metadata: dict[str, str] = dict(metadata or {})


class InvalidArgument(DomainError):
    """A request field is malformed; `field` names it (e.g. "session_key")."""

    def __init__(self, field: str, message: str, reason: str = "INVALID_FIELD") -> None:
        super().__init__(reason, f"{field}: {message}", {"field": field})
        self.field = field


class MalformedRequest(DomainError):
    """The request body is not a message of the method's request type (undecodable,
    or the call ended before a whole one arrived): INVALID_ARGUMENT, no field to name."""


class NotFound(DomainError):
    """The named resource does not exist."""


class AlreadyExists(DomainError):
    """The resource to create exists already."""


class FailedPrecondition(DomainError):
    """The resource is not in a state that allows the request (e.g. a stale fence)."""


class PermissionDenied(DomainError):
    """The caller may not do this."""


class OutOfRange(DomainError):
    """The request points outside what is kept (e.g. below the retained log)."""


class Aborted(DomainError):
    """A concurrency conflict: re-read and retry."""


class Unauthenticated(DomainError):
    """No valid credentials were presented."""


class Unavailable(DomainError):
    """A dependency (the database) cannot serve the call now: the caller may retry.

    Raised only when the call wrote nothing, or when a retry carrying the same
    request id is safe (the outcome of a lost commit is then replayed, not redone).
    """


class ConnectionLost(Unavailable):
    """The call's database connection broke before it committed: nothing was written.

    The runner retries such a call once on a fresh connection, and discards the
    broken one; a backend's `translate` returns it for connection faults only.
    """


class TimedOut(Unavailable):
    """A statement of the call gave up waiting: for a lock another database connection
    held past the wait allowed (Postgres' lock_timeout, SQLite's busy timeout), or
    cancelled by the database (Postgres' statement_timeout). Nothing was written.

    The runner answers DEADLINE_EXCEEDED instead when the caller's deadline has passed
    (the wait allowed ends with it), and logs these as one rate-limited warning line.
    """


class ResourceExhausted(DomainError):
    """A resource the call needs has run out (e.g. the disk under SQLite)."""


class DeadlineExceeded(DomainError):
    """The call's deadline passed before its turn came: it was not executed."""
