"""OpenAI's Files and Batches shapes (msgspec)."""

from __future__ import annotations

from typing import Any, Literal

import msgspec

ENDPOINTS = (
    "/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses", "/v1/messages",
)  # fmt: skip
"""What a batch may run (one endpoint per batch, as OpenAI's)."""
OPEN = ("validating", "in_progress", "finalizing", "cancelling")
"""Statuses a runner still has work in; the others are final."""


class FileObject(msgspec.Struct, kw_only=True):
    """``object: "file"``."""

    id: str
    bytes: int
    created_at: int
    filename: str
    purpose: str
    object: str = "file"
    status: str = "processed"
    status_details: str | None = None
    expires_at: int | None = None
    """When it is deleted (``expires_after``); null: kept until deleted."""


class ExpiresAfter(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """OpenAI's ``expires_after`` (a file's) and ``output_expires_after`` (a batch's files)."""

    anchor: Literal["created_at"]
    seconds: int


class FileList(msgspec.Struct, kw_only=True):
    """``GET /v1/files``."""

    data: list[FileObject]
    has_more: bool = False
    first_id: str | None = None
    last_id: str | None = None
    object: str = "list"


class FileDeleted(msgspec.Struct, kw_only=True):
    """``DELETE /v1/files/{id}``."""

    id: str
    deleted: bool = True
    object: str = "file"


class BatchCreate(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """``POST /v1/batches``; ``endpoint`` and ``completion_window`` are checked in the service,
    so their errors name the field."""

    input_file_id: str
    endpoint: str
    completion_window: str
    metadata: dict[str, str] | None = None
    output_expires_after: ExpiresAfter | None = None


class BatchError(msgspec.Struct, kw_only=True):
    """Why a batch failed validation: ``line`` is 1-based in the input file."""

    code: str
    message: str
    param: str | None = None
    line: int | None = None


class BatchErrors(msgspec.Struct, kw_only=True):
    """The ``errors`` list of a failed batch."""

    data: list[BatchError]
    object: str = "list"


class RequestCounts(msgspec.Struct, kw_only=True):
    """Lines in the batch, finished and failed so far."""

    total: int = 0
    completed: int = 0
    failed: int = 0


class BatchObject(msgspec.Struct, kw_only=True):
    """``object: "batch"``."""

    id: str
    endpoint: str
    input_file_id: str | None
    completion_window: str
    status: Literal[
        "validating", "failed", "in_progress", "finalizing", "completed", "expired",
        "cancelling", "cancelled",
    ]  # fmt: skip
    created_at: int
    expires_at: int | None
    request_counts: RequestCounts
    errors: BatchErrors | None = None
    output_file_id: str | None = None
    error_file_id: str | None = None
    in_progress_at: int | None = None
    finalizing_at: int | None = None
    completed_at: int | None = None
    failed_at: int | None = None
    expired_at: int | None = None
    cancelling_at: int | None = None
    cancelled_at: int | None = None
    metadata: dict[str, str] | None = None
    object: str = "batch"


class BatchList(msgspec.Struct, kw_only=True):
    """``GET /v1/batches``."""

    data: list[BatchObject]
    has_more: bool = False
    first_id: str | None = None
    last_id: str | None = None
    object: str = "list"


class InputLine(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """One line of a batch input file."""

    custom_id: str
    method: str
    url: str
    body: dict[str, Any]
