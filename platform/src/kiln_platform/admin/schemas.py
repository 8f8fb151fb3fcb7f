"""Admin API wire types for tenants and API keys (msgspec; constraints appear in OpenAPI)."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Annotated, Literal

import msgspec

Name = Annotated[str, msgspec.Meta(min_length=1, max_length=100, pattern=r"^\S(.*\S)?$")]
Label = Annotated[str, msgspec.Meta(max_length=100)]
Weight = Annotated[float, msgspec.Meta(gt=0, le=1000)]
Plan = Annotated[str, msgspec.Meta(min_length=1, max_length=32, pattern=r"^[A-Za-z0-9_.-]+$")]
Zone = Annotated[str, msgspec.Meta(min_length=1, max_length=64)]
Scope = Literal["inference", "admin:read", "admin:write"]
RoleName = Literal["platform-admin", "tenant-admin", "tenant-member", "finance"]


class TenantCreate(msgspec.Struct, forbid_unknown_fields=True):
    """A new tenant."""

    name: Name
    weight: Weight = 1.0


class TenantUpdate(msgspec.Struct, forbid_unknown_fields=True):
    """Fields to change (absent: unchanged)."""

    name: Name | None = None
    weight: Weight | None = None
    plan: Plan | None = None
    """The plan: selects the discount price books give the tenant."""
    timezone: Zone | None = None
    """IANA time zone (e.g. ``Europe/Paris``): its calendar months are the budget months."""


class TenantView(msgspec.Struct):
    """A tenant."""

    id: uuid.UUID
    name: str
    weight: float
    created_at: datetime
    plan: str = "standard"
    timezone: str = "UTC"


class KeyCreate(msgspec.Struct, forbid_unknown_fields=True):
    """A new API key; ``role`` defaults to tenant-admin with an admin scope, else tenant-member."""

    name: Label = ""
    scopes: Annotated[list[Scope], msgspec.Meta(min_length=1, max_length=3)] = msgspec.field(
        default_factory=lambda: ["inference"]
    )
    role: RoleName | None = None
    expires_in_s: Annotated[int, msgspec.Meta(ge=1, le=10 * 365 * 86400)] | None = None


class KeyView(msgspec.Struct):
    """An API key as listed: never its secret."""

    id: uuid.UUID
    tenant_id: uuid.UUID
    prefix: str
    name: str
    role: str
    scopes: list[str]
    created_at: datetime
    last_used_at: datetime | None
    expires_at: datetime | None
    revoked_at: datetime | None


class KeyCreated(msgspec.Struct):
    """A created key: ``secret`` is shown here once and never again."""

    key: KeyView
    secret: str
