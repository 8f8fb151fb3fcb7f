"""Admin API wire types for API keys (msgspec; constraints appear in OpenAPI)."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Annotated, Literal

import msgspec

from kiln_platform.admin.authz import RoleName

Label = Annotated[str, msgspec.Meta(max_length=100)]
Scope = Literal["inference", "admin:read", "admin:write"]


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


DAY_S = 86400


class KeyRotate(msgspec.Struct, forbid_unknown_fields=True):
    """Rotate a key: the old one keeps working ``overlap_s`` seconds more (0: refused now)."""

    overlap_s: Annotated[int, msgspec.Meta(ge=0, le=30 * DAY_S)] = DAY_S


class KeyRotated(msgspec.Struct):
    """A rotation: the new key (its ``secret`` shown here once) and the key it replaces."""

    key: KeyView
    secret: str
    replaces: KeyView
