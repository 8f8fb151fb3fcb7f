"""OAuth client wire types (msgspec). Token, introspection and revocation bodies are the RFCs'
own form-encoded requests and JSON responses, produced by authlib."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Annotated

import msgspec

from kiln_platform.keys.schemas import Label, Scope


class ClientCreate(msgspec.Struct, forbid_unknown_fields=True):
    """A new OAuth client (client credentials grant); the scopes its tokens may carry."""

    name: Label = ""
    scopes: Annotated[list[Scope], msgspec.Meta(min_length=1, max_length=3)] = msgspec.field(
        default_factory=lambda: ["inference"]
    )


class ClientView(msgspec.Struct):
    """An OAuth client as listed: never its secret."""

    id: uuid.UUID
    tenant_id: uuid.UUID
    client_id: str
    name: str
    scopes: list[str]
    created_at: datetime
    revoked_at: datetime | None


class ClientCreated(msgspec.Struct):
    """A created client: ``client_secret`` is shown here once and never again."""

    client: ClientView
    client_secret: str
