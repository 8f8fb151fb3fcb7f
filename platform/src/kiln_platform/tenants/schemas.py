"""Admin API wire types for tenants (msgspec; constraints appear in OpenAPI)."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Annotated

import msgspec

_SHOWN, _INK = r"[^\x00-\x1f\x7f]", r"[^\s\x00-\x1f\x7f]"
"""A character a name shows (no control character: no tab, newline or escape); one not blank."""
Name = Annotated[str, msgspec.Meta(min_length=1, max_length=100,
                                   pattern=rf"^{_INK}(?:{_SHOWN}*{_INK})?$")]  # fmt: skip
"""A tenant's name: shown characters, no blank at either end."""
Weight = Annotated[float, msgspec.Meta(gt=0, le=1000)]
Plan = Annotated[str, msgspec.Meta(min_length=1, max_length=32, pattern=r"^[A-Za-z0-9_.-]+$")]
Zone = Annotated[str, msgspec.Meta(min_length=1, max_length=64)]


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
