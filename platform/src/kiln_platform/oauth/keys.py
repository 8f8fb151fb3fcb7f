"""JWT signing keys (RS256): generated on first use, rotated by ``kiln oauth keys rotate``, and
published in the JWKS until every token they signed has expired."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from joserfc.jwk import RSAKey
from sqlalchemy import or_, select, text, update

from kiln_platform.db.tables import SigningKey

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
_LOCK = text("SELECT pg_advisory_xact_lock(hashtext('kiln.oauth.signing_keys'))")


def parse(row: SigningKey) -> RSAKey:
    """The private key of a row, with its ``kid``."""
    return RSAKey.import_key(row.private_pem, parameters={"kid": row.kid, "use": "sig", "alg": ALG})


async def _newest_active(session: AsyncSession) -> SigningKey | None:
    query = select(SigningKey).where(SigningKey.retired_at.is_(None))
    return await session.scalar(query.order_by(SigningKey.created_at.desc()).limit(1))


def _generate(session: AsyncSession) -> SigningKey:
    key = RSAKey.generate_key(KEY_BITS, parameters={"use": "sig", "alg": ALG}, private=True)
    row = SigningKey(kid=key.thumbprint(), private_pem=key.as_pem(private=True).decode())
    session.add(row)
    return row


async def active_key(session: AsyncSession) -> SigningKey:
    """The key that signs new tokens; the first call anywhere generates it (once: locked)."""
    row = await _newest_active(session)
    if row is None:
        await session.execute(_LOCK)
        row = await _newest_active(session) or _generate(session)
        await session.flush()
    return row


async def rotate(session: AsyncSession) -> tuple[SigningKey, list[str]]:
    """Retire the active key(s) and add a new one; returns it and the retired kids."""
    await session.execute(_LOCK)
    retired = await session.scalars(
        update(SigningKey)
        .where(SigningKey.retired_at.is_(None))
        .values(retired_at=datetime.now(UTC))
        .returning(SigningKey.kid)
    )
    kids = list(retired)
    row = _generate(session)
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

    def __init__(self, sessions: async_sessionmaker[AsyncSession], token_ttl_s: float) -> None:
        self._sessions = sessions
        self._ttl = token_ttl_s
        self._private: dict[str, RSAKey] = {}
        self._public: dict[str, RSAKey] = {}
        self._loaded_at = float("-inf")
        self._lock = asyncio.Lock()

    async def signing_key(self) -> RSAKey:
        """The active key (looked up per token issued, so a rotation applies at once)."""
        async with self._sessions.begin() as session:
            row = await active_key(session)
            if row.kid not in self._private:
                self._private[row.kid] = parse(row)
        key = self._private[row.kid]
        self._public.setdefault(row.kid, key)
        return key

    async def jwks(self) -> dict[str, Any]:
        """The JSON Web Key Set: public halves of the published keys."""
        async with self._sessions() as session:
            rows = await published(session, self._ttl)
        return {"keys": [parse(r).as_dict(private=False) for r in rows]}

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
                    self._public = {r.kid: self._private.get(r.kid) or parse(r) for r in rows}
        return self._public.get(kid)
