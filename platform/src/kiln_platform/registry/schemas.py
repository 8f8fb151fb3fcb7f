"""Wire types of the model registry's routes (msgspec)."""

from __future__ import annotations

import uuid
from typing import Annotated

import msgspec

Version = Annotated[str, msgspec.Meta(min_length=1, max_length=64)]


class RouteUpdate(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """A model's route: the stable version, and optionally a canary with its share of tenants."""

    stable_version: Version
    canary_version: Version | None = None
    canary_percent: Annotated[int, msgspec.Meta(ge=0, le=100)] = 0


class RouteView(msgspec.Struct, kw_only=True):
    """A model's route as served."""

    model: str
    stable_version: str
    canary_version: str | None = None
    canary_percent: int = 0
    routed: bool = True
    """False: no route is set, so the newest version serves."""


AliasName = Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z][A-Za-z0-9_.-]{0,63}$")]


class AliasUpdate(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """``PUT /admin/v1/models/{name}/aliases/{alias}``: the version the alias names."""

    version: Version


class AliasView(msgspec.Struct, kw_only=True):
    """One alias: ``model@alias`` answers from ``version``."""

    model: str
    alias: str
    version: str


class PinUpdate(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """``PUT /admin/v1/models/{name}/pins/{tenant_id}``: what the tenant's plain ``model`` gets."""

    target: Version
    """A version, an alias, ``stable`` or ``canary``."""


class PinView(msgspec.Struct, kw_only=True):
    """One tenant's pin: its requests for ``model`` answer from ``target``."""

    model: str
    tenant_id: uuid.UUID
    target: str
