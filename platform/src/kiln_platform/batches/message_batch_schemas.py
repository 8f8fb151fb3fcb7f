"""Anthropic's Message Batches shapes (msgspec): ``message_batches``' request and answers."""

from __future__ import annotations

from typing import Any, Literal

import msgspec


class BatchRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """One request of a batch: its ``custom_id`` and a Messages request's ``params``."""

    custom_id: str
    params: dict[str, Any]


class MessageBatchCreate(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """``POST /v1/messages/batches``."""

    requests: list[BatchRequest]


class MessageRequestCounts(msgspec.Struct, kw_only=True, omit_defaults=False):
    """The batch's requests by where they are."""

    processing: int = 0
    succeeded: int = 0
    errored: int = 0
    canceled: int = 0
    expired: int = 0


class MessageBatch(msgspec.Struct, kw_only=True, omit_defaults=False):
    """``type: "message_batch"``; its times are RFC 3339 (UTC)."""

    id: str
    processing_status: Literal["in_progress", "canceling", "ended"]
    request_counts: MessageRequestCounts
    created_at: str
    expires_at: str
    ended_at: str | None = None
    cancel_initiated_at: str | None = None
    archived_at: str | None = None
    results_url: str | None = None
    """``…/v1/messages/batches/{id}/results`` once processing ended."""
    type: str = "message_batch"


class MessageBatchList(msgspec.Struct, kw_only=True, omit_defaults=False):
    """``GET /v1/messages/batches``: newest first."""

    data: list[MessageBatch]
    has_more: bool
    first_id: str | None
    last_id: str | None


class DeletedMessageBatch(msgspec.Struct, kw_only=True):
    """``DELETE /v1/messages/batches/{id}``."""

    id: str
    type: str = "message_batch_deleted"
