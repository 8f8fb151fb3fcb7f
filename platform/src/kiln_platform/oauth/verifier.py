"""Local verification of JWT access tokens at the gateway: signature against the cached JWKS,
RFC 9068 claims, and the jti denylist (cached), so no request waits on the database."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import TYPE_CHECKING, Any, NamedTuple

from joserfc import jws, jwt
from joserfc.errors import ExpiredTokenError, JoseError
from sqlalchemy import func, select

from kiln_platform._ttlcache import TTLCache
from kiln_platform.db.tables import OAuthClient, RevokedToken, Tenant
from kiln_platform.errors import Unauthorized
from kiln_platform.keys.services import ADMIN_SCOPES, SCOPES, Principal
from kiln_platform.oauth.keys import ALG

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

    from kiln_platform.oauth.keys import Keyring

TYPES = frozenset({"at+jwt", "application/at+jwt"})
CLAIMS = ("iss", "aud", "exp", "iat", "sub", "jti", "client_id", "tenant")


def looks_like_jwt(token: str) -> bool:
    """A compact JWS (three base64url parts, a JSON header) rather than a ``kiln_`` API key."""
    return token.startswith("eyJ") and token.count(".") == 2


def role_of(scopes: frozenset[str]) -> str:
    """An OAuth client's role on ``/admin/v1``: as for a key without an explicit role."""
    return "tenant-admin" if scopes & ADMIN_SCOPES else "tenant-member"


class TokenVerifier:
    """Verifies access tokens; the denylist and tenant weights are cached for ``ttl`` seconds."""

    def __init__(
        self, sessions: async_sessionmaker[AsyncSession], keyring: Keyring, *,
        issuer: str, audience: str, ttl: float,
    ) -> None:  # fmt: skip
        self._sessions = sessions
        self.keyring = keyring
        options: dict[str, Any] = {c: {"essential": True} for c in CLAIMS}
        options["iss"]["value"], options["aud"]["value"] = issuer, audience
        self._registry = jwt.JWTClaimsRegistry(**options)
        self._ttl = ttl
        self._denied: frozenset[str] = frozenset()
        self._denied_until = float("-inf")
        self._tenants: TTLCache[tuple[uuid.UUID, str], _TenantInfo | None] = TTLCache(ttl)
        self._lock = asyncio.Lock()

    async def claims(self, token: str) -> dict[str, Any]:
        """The claims of a token signed by a published key, for us, unexpired; else 401."""
        try:
            header = jws.extract_compact(token.encode()).headers()
        except (JoseError, ValueError, TypeError) as exc:
            raise Unauthorized("Malformed access token.") from exc
        if header.get("typ") not in TYPES or header.get("alg") != ALG:
            raise Unauthorized("Not a JWT access token (RFC 9068 'at+jwt', RS256).")
        key = await self.keyring.public_key(str(header.get("kid")))
        if key is None:
            raise Unauthorized("The access token is signed by an unknown key.")
        try:
            claims: dict[str, Any] = jwt.decode(token, key, algorithms=[ALG]).claims
            self._registry.validate(claims)
        except ExpiredTokenError as exc:
            raise Unauthorized("The access token has expired.") from exc
        except (JoseError, ValueError, TypeError) as exc:
            raise Unauthorized("Invalid access token.") from exc
        return claims

    async def verify(self, token: str) -> Principal:
        """The principal of a valid, unrevoked token, or ``Unauthorized``."""
        claims = await self.claims(token)
        if claims["jti"] in await self._denylist():
            raise Unauthorized("The access token has been revoked.")
        try:
            tenant_id = uuid.UUID(str(claims["tenant"]))
        except ValueError as exc:
            raise Unauthorized("Invalid access token.") from exc
        client = str(claims["client_id"])
        weight, plan, timezone, client_row = await self._tenant(tenant_id, client)
        scopes = frozenset(str(claims.get("scope") or "").split()) & SCOPES
        return Principal(
            tenant_id, None, scopes, weight, role_of(scopes), f"oauth:{client}",
            plan=plan, timezone=timezone, oauth_client_id=client_row,
        )  # fmt: skip

    async def _denylist(self) -> frozenset[str]:
        if time.monotonic() >= self._denied_until:
            async with self._lock:
                started = time.monotonic()
                if started >= self._denied_until:
                    async with self._sessions() as session:
                        rows = await session.scalars(
                            select(RevokedToken.jti).where(RevokedToken.expires_at > func.now())
                        )
                        self._denied = frozenset(rows)
                    self._denied_until = started + self._ttl
        return self._denied

    async def _tenant(self, tenant_id: uuid.UUID, client: str) -> _TenantInfo:
        """The tenant's weight, plan and time zone, and the client's row id (cached)."""
        info = await self._tenants.get((tenant_id, client), lambda: self._load(tenant_id, client))
        if info is None:
            raise Unauthorized("The access token's client was revoked or no longer exists.")
        return info

    async def _load(self, tenant_id: uuid.UUID, client: str) -> _TenantInfo | None:
        async with self._sessions() as session:
            row = (
                await session.execute(
                    select(Tenant.weight, Tenant.plan, Tenant.timezone, OAuthClient.id)
                    .join(OAuthClient, OAuthClient.tenant_id == Tenant.id)
                    .where(
                        Tenant.id == tenant_id,
                        OAuthClient.client_id == client,
                        OAuthClient.revoked_at.is_(None),
                    )
                )
            ).first()
        return None if row is None else _TenantInfo(*row)


class _TenantInfo(NamedTuple):
    weight: float
    plan: str
    timezone: str
    client_id: uuid.UUID
