"""User wire types."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Annotated

import msgspec

from kiln_platform.admin.authz import RoleName

Email = Annotated[str, msgspec.Meta(min_length=3, max_length=320, pattern=r"^[^@\s]+@[^@\s]+$")]
Password = Annotated[str, msgspec.Meta(min_length=8, max_length=1024)]


class UserCreate(msgspec.Struct, forbid_unknown_fields=True):
    """A new console user; tenant roles need ``tenant_id``."""

    email: Email
    password: Password
    role: RoleName
    tenant_id: uuid.UUID | None = None


class UserUpdate(msgspec.Struct, forbid_unknown_fields=True):
    """A role change."""

    role: RoleName


class UserView(msgspec.Struct):
    """A user (never the password hash)."""

    id: uuid.UUID
    email: str
    role: str
    tenant_id: uuid.UUID | None
    created_at: datetime
    last_login_at: datetime | None


class Login(msgspec.Struct, forbid_unknown_fields=True):
    """Console login."""

    email: Email
    password: Annotated[str, msgspec.Meta(min_length=1, max_length=1024)]


class VerifiedIdentity(msgspec.Struct, frozen=True):
    """Who an identity provider's ID token says signed in: its issuer, subject and email."""

    issuer: str
    subject: str
    email: str


class LoginResult(msgspec.Struct):
    """A short-lived bearer token for ``/admin/v1`` (a JWT carrying the user's role)."""

    access_token: str
    token_type: str
    expires_in: int
