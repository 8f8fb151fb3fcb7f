"""Adapter API shapes."""

from __future__ import annotations

import uuid
from datetime import datetime

import msgspec


class AdapterView(msgspec.Struct, kw_only=True):
    """A tenant's adapter; requests name it ``model`` (``<base model>:<adapter name>``)."""

    id: uuid.UUID
    tenant_id: uuid.UUID
    name: str
    base_model: str
    model: str
    rank: int
    modules: list[str]
    size_bytes: int
    created_at: datetime
