"""The worker's own errors; the HTTP layer maps each to an ``ErrorReply`` in one place."""

from __future__ import annotations

from typing import ClassVar

from kiln_runtimes.protocol import ErrorCode, ErrorReply


class WorkerError(Exception):
    """A refusal or failure reported to the caller as an ``ErrorReply`` with ``status``."""

    code: ClassVar[ErrorCode] = "internal"
    status: ClassVar[int] = 500
    default_retry_after_s: ClassVar[float | None] = None

    def __init__(
        self, message: str, retry_after_s: float | None = None, *, param: str | None = None
    ) -> None:
        super().__init__(message)
        self.retry_after_s = self.default_retry_after_s if retry_after_s is None else retry_after_s
        self.param = param

    def reply(self) -> ErrorReply:
        """Return the wire form of this error."""
        return ErrorReply(code=self.code, message=str(self), retry_after_s=self.retry_after_s,
                          param=self.param)  # fmt: skip


class FieldError(ValueError):
    """A request a backend cannot serve because of one field (``param``, as the client named
    it): a ``BadRequest`` naming it."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


class BadRequest(WorkerError):
    """The request can never succeed as sent."""

    code = "bad_request"
    status = 400


class Unsupported(WorkerError):
    """The request uses a field this worker does not know: the gateway is newer (a rolling
    upgrade). Another worker may know it."""

    code = "unsupported"
    status = 503
    default_retry_after_s = 1.0


class Overloaded(WorkerError):
    """The queue is full; retry after the predicted drain time."""

    code = "overloaded"
    status = 429


class Busy(WorkerError):
    """Every slot is taken (``--slots``): another worker, or this one a moment later, takes it."""

    code = "busy"
    status = 429
    default_retry_after_s = 0.05


class NotReady(WorkerError):
    """The model is still loading or warming up; another worker may take the request."""

    code = "overloaded"
    status = 503
    default_retry_after_s = 1.0


class Draining(WorkerError):
    """The worker is shutting down and accepts no new work."""

    code = "draining"
    status = 503
    default_retry_after_s = 0.0


class DeadlineExceeded(WorkerError):
    """The request's deadline can no longer be met."""

    code = "deadline_exceeded"
    status = 504


class Internal(WorkerError):
    """The backend failed while running the request."""


class Unauthorized(WorkerError):
    """The call does not carry the worker secret: it did not come from the gateway."""

    code = "unauthorized"
    status = 401
