"""Audit log wire types."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

import msgspec


class AuditView(msgspec.Struct):
    """One audit record."""

    id: int
    created_at: datetime
    actor: str
    actor_role: str
    tenant_id: uuid.UUID | None
    action: str
    target_type: str
    target_id: str
    before: dict[str, Any] | None
    after: dict[str, Any] | None
    request_id: str | None
    source: str | None


class AuditPage(msgspec.Struct):
    """A page of records, newest first; pass ``next_cursor`` as ``cursor`` for the next page."""

    data: list[AuditView]
    next_cursor: int | None
