"""Kiln's own errors. Services raise these; the app maps them to responses in one place."""

from __future__ import annotations

import errno
import os
import shutil

_DISK_FULL = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})
DISK_FULL = (
    "Kiln's disk is full: nothing of this upload was kept. Free space on the data directory's "
    "filesystem and retry."
)
"""The message of the 507 an upload or import gets when a disk it writes to fills up."""


class KilnError(Exception):
    """Base error: ``status_code`` and ``code`` are class attributes, like Litestar's."""

    status_code = 500
    code = "internal_error"
    type = "server_error"

    def __init__(
        self, message: str, *, param: str | None = None, retry_after: float | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.retry_after = retry_after


class BadRequest(KilnError):
    """The request is malformed or violates a limit; ``param`` names the field."""

    status_code = 400
    code = "invalid_request_error"
    type = "invalid_request_error"


class PayloadTooLarge(KilnError):
    """The request body is larger than its route's limit (refused while it streams in)."""

    status_code = 413
    code = "request_too_large"
    type = "invalid_request_error"


class RequestTimeout(KilnError):
    """The request body stalled or trickled past its deadline (``KILN_BODY_TIMEOUT_S``)."""

    status_code = 408
    code = "request_timeout"
    type = "invalid_request_error"


class Unauthorized(KilnError):
    """Missing, unknown, revoked or expired credentials."""

    status_code = 401
    code = "invalid_api_key"
    type = "invalid_request_error"


class Forbidden(KilnError):
    """Authenticated, but the credential lacks the scope."""

    status_code = 403
    code = "insufficient_permissions"
    type = "invalid_request_error"


class NotFound(KilnError):
    """The object does not exist (or belongs to another tenant)."""

    status_code = 404
    code = "not_found"
    type = "invalid_request_error"


class ModelNotFound(NotFound):
    """No such model is registered."""

    code = "model_not_found"


class Gone(KilnError):
    """The object existed and was retired on purpose (a retired model version)."""

    status_code = 410
    code = "model_retired"
    type = "invalid_request_error"


class Conflict(KilnError):
    """The object already exists or is being changed concurrently."""

    status_code = 409
    code = "conflict"
    type = "invalid_request_error"


class IdempotencyInProgress(Conflict):
    """A request with the same Idempotency-Key is still running; retry after it has finished."""

    code = "idempotency_key_in_use"
    type = "idempotency_error"


class IdempotencyKeyReused(KilnError):
    """An Idempotency-Key already used with a different request body."""

    status_code = 422
    code = "idempotency_key_reused"
    type = "idempotency_error"


class Overloaded(KilnError):
    """Capacity is exhausted for now; retry after ``retry_after`` seconds."""

    status_code = 429
    code = "rate_limit_exceeded"
    type = "rate_limit_error"


class ServiceUnavailable(KilnError):
    """No ready worker (starting, restarting, draining); retry after ``retry_after`` seconds."""

    status_code = 503
    code = "service_unavailable"
    type = "server_error"


class InsufficientStorage(KilnError):
    """A disk Kiln writes to is full (the data directory: uploads, the store, the spool)."""

    status_code = 507
    code = "insufficient_storage"
    type = "server_error"


def disk_full(exc: BaseException) -> bool:
    """Whether ``exc`` (or what caused it) is a write refused for want of space or quota."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno in _DISK_FULL:
            return True
        if isinstance(seen, shutil.Error):  # copytree gathers its failures as strings
            reasons = {os.strerror(code) for code in _DISK_FULL}
            if any(reason in str(seen) for reason in reasons):
                return True
        seen = seen.__cause__ or seen.__context__
    return False


class DeadlineExceeded(KilnError):
    """The request could not be served within its deadline."""

    status_code = 504
    code = "timeout"
    type = "server_error"


class RateLimited(Overloaded):
    """A tenant's or key's requests/min, tokens/min or concurrency limit is reached for now."""

    code = "rate_limit_exceeded"
    type = "requests"


class QuotaExceeded(KilnError):
    """The monthly budget is spent: no retry helps before the next month (or a higher budget)."""

    status_code = 429
    code = "insufficient_quota"
    type = "insufficient_quota"
