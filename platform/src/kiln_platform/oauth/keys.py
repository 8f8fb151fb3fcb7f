"""JWT signing keys (RS256): generated on first use, rotated by ``kiln oauth keys rotate``, and
published in the JWKS until every token they signed has expired. The private keys are sealed at
rest (AES-256-GCM under a key derived from the server secret, ``kiln_platform.sealing``)."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import structlog
from cryptography.exceptions import InvalidTag
from joserfc.jwk import RSAKey
from sqlalchemy import or_, select, text, update

from kiln_platform.db.tables import SigningKey
from kiln_platform.sealing import Seal

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

ALG = "RS256"
KEY_BITS = 2048
GRACE_S = 60
"""Retired keys stay published this long past the token lifetime (clock skew, in-flight issues)."""
MIN_REFRESH_S = 2.0
"""An unknown ``kid`` reloads the public keys at most this often (no database flood)."""
MAX_AGE_S = 300.0
"""Known public keys are reloaded this often anyway, so retired ones leave the cache."""
log = structlog.get_logger("kiln.oauth")
PURPOSE = b"kiln oauth signing key v1"
_LOCK = text("SELECT pg_advisory_xact_lock(hashtext('kiln.oauth.signing_keys'))")


def key_seal(secret: bytes) -> Seal:
    """The seal of signing keys under the server secret."""
    return Seal(secret, PURPOSE)


def parse(row: SigningKey, seal: Seal) -> RSAKey:
    """The private key of a row, with its ``kid``."""
    pem = seal.open(row.private_sealed, row.kid.encode())
    return RSAKey.import_key(pem, parameters={"kid": row.kid, "use": "sig", "alg": ALG})


async def _newest_active(session: AsyncSession) -> SigningKey | None:
    query = select(SigningKey).where(SigningKey.retired_at.is_(None))
    return await session.scalar(query.order_by(SigningKey.created_at.desc()).limit(1))


def _generate(session: AsyncSession, seal: Seal) -> SigningKey:
    key = RSAKey.generate_key(KEY_BITS, parameters={"use": "sig", "alg": ALG}, private=True)
    kid = key.thumbprint()
    row = SigningKey(kid=kid, private_sealed=seal.seal(key.as_pem(private=True), kid.encode()))
    session.add(row)
    return row


async def active_key(session: AsyncSession, seal: Seal) -> SigningKey:
    """The key that signs new tokens; the first call anywhere generates it (once: locked)."""
    row = await _newest_active(session)
    if row is None:
        await session.execute(_LOCK)
        row = await _newest_active(session) or _generate(session, seal)
        await session.flush()
    return row


async def rotate(session: AsyncSession, seal: Seal) -> tuple[SigningKey, list[str]]:
    """Retire the active key(s) and add a new one; returns it and the retired kids."""
    await session.execute(_LOCK)
    retired = await session.scalars(
        update(SigningKey)
        .where(SigningKey.retired_at.is_(None))
        .values(retired_at=datetime.now(UTC))
        .returning(SigningKey.kid)
    )
    kids = list(retired)
    row = _generate(session, seal)
    await session.flush()
    return row, kids


async def published(session: AsyncSession, token_ttl_s: float) -> list[SigningKey]:
    """Active keys, and retired ones whose tokens may not have expired yet."""
    since = datetime.now(UTC) - timedelta(seconds=token_ttl_s + GRACE_S)
    query = select(SigningKey).where(
        or_(SigningKey.retired_at.is_(None), SigningKey.retired_at > since)
    )
    return list(await session.scalars(query.order_by(SigningKey.created_at)))


class Keyring:
    """Signing keys of this process: parsed once, public keys cached for verification."""

    def __init__(
        self, sessions: async_sessionmaker[AsyncSession], token_ttl_s: float, secret: bytes
    ) -> None:
        self._sessions = sessions
        self._seal = key_seal(secret)
        self._ttl = token_ttl_s
        self._private: dict[str, RSAKey] = {}
        self._public: dict[str, RSAKey] = {}
        self._loaded_at = float("-inf")
        self._lock = asyncio.Lock()

    async def signing_key(self) -> RSAKey:
        """The active key (looked up per token issued, so a rotation applies at once)."""
        async with self._sessions.begin() as session:
            row = await active_key(session, self._seal)
            if row.kid not in self._private:
                self._private[row.kid] = parse(row, self._seal)
        key = self._private[row.kid]
        self._public.setdefault(row.kid, key)
        return key

    async def jwks(self) -> dict[str, Any]:
        """The JSON Web Key Set: public halves of the published keys."""
        async with self._sessions() as session:
            rows = await published(session, self._ttl)
        return {"keys": [k.as_dict(private=False) for k in self._opened(rows).values()]}

    async def public_key(self, kid: str) -> RSAKey | None:
        """The published key ``kid``; an unknown one reloads the set (rate-limited)."""
        now = time.monotonic()
        stale = now - self._loaded_at > MAX_AGE_S
        if (kid not in self._public or stale) and now - self._loaded_at >= MIN_REFRESH_S:
            async with self._lock:
                if time.monotonic() - self._loaded_at >= MIN_REFRESH_S:
                    self._loaded_at = time.monotonic()
                    async with self._sessions() as session:
                        rows = await published(session, self._ttl)
                    self._public = self._opened(rows)
        return self._public.get(kid)

    def _opened(self, rows: list[SigningKey]) -> dict[str, RSAKey]:
        """The keys of ``rows`` by kid, less those sealed under another server secret (after
        the secret changed: ``kiln oauth keys rotate`` makes a new one)."""
        keys: dict[str, RSAKey] = {}
        for row in rows:
            try:
                keys[row.kid] = self._private.get(row.kid) or parse(row, self._seal)
            except InvalidTag:
                log.warning("signing key sealed under another server secret", kid=row.kid)
        return keys
