"""API keys: create, list, find, revoke, and verification on the request path.

A key reads ``kiln_<8 hex id>_<secret>``. ``kiln_<id>`` is the displayed prefix and the lookup
index; the whole key is kept only as HMAC-SHA256 under the server secret and compared in
constant time.
"""

from __future__ import annotations

import hmac
import secrets
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from hashlib import sha256
from typing import TYPE_CHECKING

from sqlalchemy import select, tuple_, update

from kiln_platform._ttlcache import TTLCache
from kiln_platform.admin.authz import Actor, Role, check_tenant, grantable, require
from kiln_platform.audit.services import record, snapshot
from kiln_platform.db import after_commit
from kiln_platform.db.outage import unreachable
from kiln_platform.db.tables import ApiKey, Tenant
from kiln_platform.errors import Conflict, NotFound, ServiceUnavailable, Unauthorized
from kiln_platform.keys.schemas import KeyCreate, KeyCreated, KeyRotated, KeyView
from kiln_platform.tenants.services import get_tenant

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

SCOPES = frozenset({"inference", "admin:read", "admin:write"})
ADMIN_SCOPES = frozenset({"admin:read", "admin:write"})
FIELDS = ("id", "prefix", "name", "role", "scopes", "expires_at", "revoked_at")


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
    expires_at: datetime | None = None
    """The key's expiry, checked on every call (a cached principal stops at it too)."""


def key_digest(hmac_key: bytes, secret: str) -> bytes:
    """Keyed hash of a presented key."""
    return hmac.new(hmac_key, secret.encode(), sha256).digest()


def split_prefix(secret: str) -> str | None:
    """The ``kiln_<id>`` prefix of a well-formed key, else None."""
    parts = secret.split("_", 2)
    if len(parts) != 3 or parts[0] != "kiln" or len(parts[1]) != 8 or not parts[2]:
        return None
    return f"kiln_{parts[1]}"


async def insert_key(
    session: AsyncSession,
    hmac_key: bytes,
    tenant_id: uuid.UUID,
    *,
    name: str = "",
    scopes: frozenset[str] = frozenset({"inference"}),
    expires_at: datetime | None = None,
    role: str | None = None,
) -> tuple[ApiKey, str]:
    """Insert a key (no actor, no audit: for ``create_key`` and for seeding tests); returns the
    row and the secret, which is never stored or shown again.

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


MAX_PAGE = 200


async def list_keys(
    session: AsyncSession, actor: Actor, tenant_id: uuid.UUID, *, revoked: bool = False,
    limit: int = MAX_PAGE, before: uuid.UUID | None = None,
) -> list[KeyView]:  # fmt: skip
    """A tenant's keys, newest first: prefix, label, role, scopes, dates; never secrets. At
    most ``limit``; ``before``: only keys older than that one (the last of the previous page);
    revoked keys only with ``revoked`` (they stay in the audit log): a tenant that rotates
    keys all day must not make its own key list slower to read by the hour."""
    await get_tenant(session, actor, tenant_id)
    require(actor, "keys")
    query = select(ApiKey).where(ApiKey.tenant_id == tenant_id)
    if not revoked:
        query = query.where(ApiKey.revoked_at.is_(None))
    if before is not None:
        last = (
            select(ApiKey.created_at)
            .where(ApiKey.id == before, ApiKey.tenant_id == tenant_id)
            .scalar_subquery()
        )  # another tenant's key is no cursor: nothing is older than no key
        query = query.where(tuple_(ApiKey.created_at, ApiKey.id) < tuple_(last, before))
    order = (ApiKey.created_at.desc(), ApiKey.id.desc())
    rows = await session.scalars(query.order_by(*order).limit(min(limit, MAX_PAGE)))
    return [key_view(k) for k in rows]


async def create_key(
    session: AsyncSession, actor: Actor, tenant_id: uuid.UUID, data: KeyCreate, hmac_key: bytes
) -> KeyCreated:
    """Create a key in a tenant; the secret is in the result only."""
    await get_tenant(session, actor, tenant_id)
    require(actor, "keys", write=True)
    if data.role is not None:
        grantable(actor, Role(data.role))
    expires = None
    if data.expires_in_s is not None:
        expires = datetime.now(UTC) + timedelta(seconds=data.expires_in_s)
    key, secret = await insert_key(
        session, hmac_key, tenant_id, name=data.name, scopes=frozenset(data.scopes),
        expires_at=expires, role=data.role,
    )  # fmt: skip
    await record(session, actor, "key.create", "api_key", key.id, tenant_id,
                 after=snapshot(key, *FIELDS))  # fmt: skip
    return KeyCreated(key=key_view(key), secret=secret)


async def find_key(session: AsyncSession, actor: Actor, ref: str, hmac_key: bytes) -> ApiKey:
    """A key by id, displayed prefix or secret, if the actor may see it."""
    query = select(ApiKey)
    try:
        query = query.where(ApiKey.id == uuid.UUID(ref))
    except ValueError:
        prefix = split_prefix(ref)
        if prefix is not None:
            query = query.where(ApiKey.prefix == prefix, ApiKey.digest == key_digest(hmac_key, ref))
        else:
            query = query.where(ApiKey.prefix == ref)
    key = await session.scalar(query)
    if key is None:
        raise NotFound("No such API key.")
    check_tenant(actor, key.tenant_id, "API key")
    return key


async def revoke_key(
    session: AsyncSession, actor: Actor, ref: str, hmac_key: bytes, tenant_id: uuid.UUID | None,
    *, verifier: KeyVerifier | None = None,
) -> KeyView:  # fmt: skip
    """Revoke a key (idempotent; one audit record per call that revokes). ``verifier`` (this
    process's) refuses it once committed; other gateways within their key cache TTL."""
    key = await find_key(session, actor, ref, hmac_key)
    if tenant_id is not None and key.tenant_id != tenant_id:
        raise NotFound("No such API key.")
    require(actor, "keys", write=True)
    if key.revoked_at is None:
        before = snapshot(key, *FIELDS)
        key.revoked_at = datetime.now(UTC)
        await session.flush()
        await record(session, actor, "key.revoke", "api_key", key.id, key.tenant_id,
                     before=before, after=snapshot(key, *FIELDS))  # fmt: skip
    _forget(session, verifier, key.id)
    return key_view(key)


async def rotate_key(
    session: AsyncSession, actor: Actor, tenant_id: uuid.UUID, key_id: uuid.UUID, *,
    overlap_s: int, hmac_key: bytes, verifier: KeyVerifier | None = None,
) -> KeyRotated:  # fmt: skip
    """Replace a key in one step: a new key with the old one's label, scopes, role and expiry,
    and the old key expiring ``overlap_s`` seconds from now (0: now), unless it expires sooner.
    One audit record each: ``key.create`` for the new key, ``key.rotate`` for the old."""
    old = await find_key(session, actor, str(key_id), hmac_key)
    if old.tenant_id != tenant_id:
        raise NotFound("No such API key.")
    require(actor, "keys", write=True)
    now = datetime.now(UTC)
    if old.revoked_at is not None or (old.expires_at is not None and old.expires_at <= now):
        raise Conflict("This key is revoked or expired: create a new key instead.")
    key, secret = await insert_key(
        session, hmac_key, tenant_id, name=old.name, scopes=frozenset(old.scopes),
        expires_at=old.expires_at, role=old.role,
    )  # fmt: skip
    await record(session, actor, "key.create", "api_key", key.id, tenant_id,
                 after=snapshot(key, *FIELDS))  # fmt: skip
    before = snapshot(old, *FIELDS)
    ends = now + timedelta(seconds=overlap_s)
    old.expires_at = ends if old.expires_at is None else min(old.expires_at, ends)
    await session.flush()
    after = {**snapshot(old, *FIELDS), "replaced_by": str(key.id)}
    await record(session, actor, "key.rotate", "api_key", old.id, tenant_id,
                 before=before, after=after)  # fmt: skip
    _forget(session, verifier, old.id)
    return KeyRotated(key=key_view(key), secret=secret, replaces=key_view(old))


def _forget(session: AsyncSession, verifier: KeyVerifier | None, key_id: uuid.UUID) -> None:
    """Have ``verifier`` drop the key's cached principal once the change is committed."""
    if verifier is not None:
        after_commit.defer(session, lambda: verifier.forget(key_id))


def key_view(k: ApiKey) -> KeyView:
    """Wire form of a key."""
    return KeyView(
        id=k.id, tenant_id=k.tenant_id, prefix=k.prefix, name=k.name, role=k.role,
        scopes=list(k.scopes), created_at=k.created_at, last_used_at=k.last_used_at,
        expires_at=k.expires_at, revoked_at=k.revoked_at,
    )  # fmt: skip


class KeyVerifier:
    """Verifies presented keys; results are cached for ``ttl`` seconds (the revocation bound).

    While the database is unreachable a key verified before is served from the cache for up to
    ``outage_s`` seconds past its TTL; a key not in the cache answers 503 + Retry-After."""

    def __init__(
        self, sessions: async_sessionmaker[AsyncSession], hmac_key: bytes, ttl: float,
        outage_s: float = 0.0,
    ) -> None:  # fmt: skip
        self._sessions = sessions
        self._hmac_key = hmac_key
        self._cache: TTLCache[bytes, Principal | None] = TTLCache(ttl, keep_s=outage_s)
        self._outage_s = outage_s

    async def verify(self, secret: str) -> Principal:
        """Return the principal for a key, or raise ``Unauthorized`` (``ServiceUnavailable`` if
        the database is unreachable and the key is not cached)."""
        digest = key_digest(self._hmac_key, secret)
        try:
            principal = await self._cache.get(digest, lambda: self._lookup(secret, digest))
        except Exception as exc:
            held = self._cache.stale(digest, self._outage_s) if unreachable(exc) else None
            if held is None and unreachable(exc):
                raise ServiceUnavailable(
                    "Kiln cannot verify this API key now: its database is unreachable. "
                    "Retry shortly.", retry_after=5.0,
                ) from None  # fmt: skip
            if held is None:
                raise
            principal = held[0]
        expired = (
            principal is not None
            and principal.expires_at is not None
            and (principal.expires_at <= datetime.now(UTC))
        )
        if principal is None or expired:
            raise Unauthorized("Incorrect API key provided.")
        return principal

    def cached(self, secret: str) -> Principal | None:
        """The principal of a key verified within the TTL and not expired, without loading
        (``None`` otherwise: the request path verifies it)."""
        principal = self._cache.fresh(key_digest(self._hmac_key, secret))
        if principal is None or (
            principal.expires_at is not None and principal.expires_at <= datetime.now(UTC)
        ):
            return None
        return principal

    def forget(self, key_id: uuid.UUID) -> None:
        """Drop a key's cached principal after its change committed: this process sees a
        revocation or expiry at once (other processes within the TTL)."""
        self._cache.forget_where(lambda p: p is not None and p.key_id == key_id)

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
            plan=plan, timezone=timezone, expires_at=key.expires_at,
        )  # fmt: skip
