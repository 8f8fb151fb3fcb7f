"""API key creation and verification.

A key reads ``kiln_<8 hex id>_<secret>``. ``kiln_<id>`` is the displayed prefix and the lookup
index; the whole key is kept only as HMAC-SHA256 under the server secret and compared in
constant time.
"""

from __future__ import annotations

import hmac
import secrets
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from hashlib import sha256
from typing import TYPE_CHECKING

from sqlalchemy import select, update

from kiln_platform._ttlcache import TTLCache
from kiln_platform.db.tables import ApiKey, Tenant
from kiln_platform.errors import Unauthorized

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

SCOPES = frozenset({"inference", "admin:read", "admin:write"})
ADMIN_SCOPES = frozenset({"admin:read", "admin:write"})


@dataclass(frozen=True, slots=True)
class Principal:
    """Who is calling: the tenant and the key."""

    tenant_id: uuid.UUID
    key_id: uuid.UUID | None
    """The API key; None for an OAuth access token (its client is in ``name``)."""
    scopes: frozenset[str]
    weight: float = 1.0
    role: str = "tenant-member"
    """The key's role on ``/admin/v1`` (``kiln_platform.admin.authz``)."""
    name: str = ""
    """How the audit log names the caller: the key's prefix (or ``oauth:<client id>``)."""
    plan: str = "standard"
    """The tenant's plan (its discount in price books)."""
    timezone: str = "UTC"
    """The tenant's time zone (its budget months)."""
    oauth_client_id: uuid.UUID | None = None
    """For an OAuth access token: ``oauth_clients.id`` of its client."""


def key_digest(hmac_key: bytes, secret: str) -> bytes:
    """Keyed hash of a presented key."""
    return hmac.new(hmac_key, secret.encode(), sha256).digest()


def split_prefix(secret: str) -> str | None:
    """The ``kiln_<id>`` prefix of a well-formed key, else None."""
    parts = secret.split("_", 2)
    if len(parts) != 3 or parts[0] != "kiln" or len(parts[1]) != 8 or not parts[2]:
        return None
    return f"kiln_{parts[1]}"


async def create_key(
    session: AsyncSession,
    hmac_key: bytes,
    tenant_id: uuid.UUID,
    *,
    name: str = "",
    scopes: frozenset[str] = frozenset({"inference"}),
    expires_at: datetime | None = None,
    role: str | None = None,
) -> tuple[ApiKey, str]:
    """Create a key; returns the row and the secret, which is never stored or shown again.

    Without ``role``, a key with an admin scope is a tenant-admin key, else a tenant-member key.
    """
    prefix = f"kiln_{secrets.token_hex(4)}"
    secret = f"{prefix}_{secrets.token_urlsafe(32)}"
    key = ApiKey(
        tenant_id=tenant_id,
        name=name,
        prefix=prefix,
        digest=key_digest(hmac_key, secret),
        scopes=sorted(scopes),
        expires_at=expires_at,
        role=role or ("tenant-admin" if scopes & ADMIN_SCOPES else "tenant-member"),
    )
    session.add(key)
    await session.flush()
    return key, secret


class KeyVerifier:
    """Verifies presented keys; results are cached for ``ttl`` seconds (the revocation bound)."""

    def __init__(
        self, sessions: async_sessionmaker[AsyncSession], hmac_key: bytes, ttl: float
    ) -> None:
        self._sessions = sessions
        self._hmac_key = hmac_key
        self._cache: TTLCache[bytes, Principal | None] = TTLCache(ttl)

    async def verify(self, secret: str) -> Principal:
        """Return the principal for a key, or raise ``Unauthorized``."""
        digest = key_digest(self._hmac_key, secret)
        principal = await self._cache.get(digest, lambda: self._lookup(secret, digest))
        if principal is None:
            raise Unauthorized("Incorrect API key provided.")
        return principal

    async def _lookup(self, secret: str, digest: bytes) -> Principal | None:
        prefix = split_prefix(secret)
        if prefix is None:
            return None
        async with self._sessions() as session:
            row = (
                await session.execute(
                    select(ApiKey, Tenant.weight, Tenant.plan, Tenant.timezone)
                    .join(Tenant, Tenant.id == ApiKey.tenant_id)
                    .where(ApiKey.prefix == prefix)
                )
            ).first()
            if row is None or not hmac.compare_digest(row[0].digest, digest):
                return None
            key, weight, plan, timezone = row
            now = datetime.now(UTC)
            if key.revoked_at is not None or (key.expires_at is not None and key.expires_at <= now):
                return None
            # once per cache period per process: cheap enough, and "last used" stays current
            await session.execute(
                update(ApiKey).where(ApiKey.id == key.id).values(last_used_at=now)
            )
            await session.commit()
        return Principal(
            key.tenant_id, key.id, frozenset(key.scopes), weight, key.role, prefix,
            plan=plan, timezone=timezone,
        )  # fmt: skip
