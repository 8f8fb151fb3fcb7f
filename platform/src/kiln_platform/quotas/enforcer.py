"""Quota admission, shared by every gateway process through PostgreSQL.

- requests/min: a fixed one-minute window counter per subject, incremented only while under the
  limit by one atomic ``INSERT … ON CONFLICT DO UPDATE … WHERE … RETURNING`` (no read-then-write
  race between processes);
- tokens/min: the same row's ``tokens``, checked at admission and charged when usage is known;
- concurrency: lease rows counted under a transaction-scoped advisory lock per subject; a lease
  outlives the request timeout and is renewed while its request runs (``quotas.leases``), so it
  expires only once its process has died;
- monthly budget: not here; ``billing.reservations`` holds each request's worst-case cost once
  its quantities are known, against the limit cached here.

A subject is the key when it has its own override of that limit, else the tenant. Limits are
cached per process for ``ttl`` seconds (like keys), so an unlimited tenant costs no query.

While the database is unreachable, quotas fail open: limits are the last ones loaded (none if
never loaded), requests/min, tokens/min and concurrency are not counted, and a lease that
cannot be deleted lapses with its TTL (``docs/reliability.md``: the outage bound).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

import structlog
from sqlalchemy import select, text

from kiln_platform._ttlcache import TTLCache
from kiln_platform.db.outage import unreachable
from kiln_platform.db.tables import Quota
from kiln_platform.errors import RateLimited
from kiln_platform.quotas.leases import lifetime, renew_every
from kiln_platform.quotas.services import FIELDS

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

    from kiln_platform.keys.services import Principal

_COUNT = text(
    """
    INSERT INTO quota_counters AS c (subject, window_start, requests, tokens)
    VALUES (:s, date_trunc('minute', now()), 1, 0)
    ON CONFLICT (subject, window_start) DO UPDATE SET requests = c.requests + 1
        WHERE c.requests < :limit
    RETURNING requests, tokens
    """
)
_RENEW = text(
    "UPDATE quota_leases SET expires_at = greatest(expires_at, now() + :ttl) WHERE id = ANY(:ids)"
)
_TOKENS = text(
    "SELECT tokens FROM quota_counters"
    " WHERE subject = :s AND window_start = date_trunc('minute', now())"
)
_CHARGE = text(
    """
    INSERT INTO quota_counters AS c (subject, window_start, requests, tokens)
    VALUES (:s, date_trunc('minute', now()), 0, :n)
    ON CONFLICT (subject, window_start) DO UPDATE SET tokens = c.tokens + :n
    """
)


@dataclass(frozen=True, slots=True)
class Effective:
    """Each limit with the subject it is counted against."""

    limits: dict[str, tuple[int, str]] = field(default_factory=dict)


@dataclass(slots=True)
class QuotaGrant:
    """What the quotas decided for a request: its rate-limit headers (set even when refused),
    and its concurrency lease (released when the request's admission is left)."""

    headers: dict[str, str] = field(default_factory=dict)
    lease: uuid.UUID | None = None


log = structlog.get_logger("kiln.quotas")


def _reset() -> float:
    return 60.0 - (time.time() % 60.0)


class QuotaEnforcer:
    """Admits requests against their tenant's and key's limits."""

    def __init__(
        self, sessions: async_sessionmaker[AsyncSession], ttl: float, *, lease_ttl_s: float,
        timeout_s: float,
    ) -> None:  # fmt: skip
        self._sessions = sessions
        self._lease = timedelta(seconds=lifetime(lease_ttl_s, timeout_s))
        self._ttl = timedelta(seconds=lease_ttl_s)
        self._cache: TTLCache[tuple[uuid.UUID, uuid.UUID | None], Effective] = TTLCache(ttl)
        self._tasks: set[asyncio.Task[None]] = set()
        self._live: set[uuid.UUID] = set()
        """Leases this process holds for running requests: renewed until released."""
        self._renewer: asyncio.Task[None] | None = None

    async def effective(self, principal: Principal) -> Effective:
        """The limits that apply to a key (its overrides over its tenant's), cached; with the
        database unreachable, the last ones loaded (none if never)."""
        key = (principal.tenant_id, principal.key_id)
        try:
            return await self._cache.get(key, lambda: self._load(principal))
        except Exception as exc:
            if not unreachable(exc):
                raise
            return self._cache.peek(key) or Effective()

    async def _load(self, principal: Principal) -> Effective:
        async with self._sessions() as session:
            rows = await session.scalars(
                select(Quota).where(
                    Quota.tenant_id == principal.tenant_id,
                    Quota.api_key_id.is_(None) | (Quota.api_key_id == principal.key_id),
                )
            )
            limits: dict[str, tuple[int, str]] = {}
            for row in sorted(rows, key=lambda r: r.api_key_id is not None):  # key rows last
                subject = f"key:{row.api_key_id}" if row.api_key_id else f"tenant:{row.tenant_id}"
                for name in FIELDS:
                    if getattr(row, name) is not None:
                        limits[name] = (getattr(row, name), subject)
        return Effective(limits)

    async def admit(self, principal: Principal, admission: QuotaGrant) -> None:
        """Count the request in, or raise ``RateLimited`` (429); admitted uncounted while the
        database is unreachable.

        ``admission`` receives the rate-limit headers even when the request is refused.
        """
        eff = (await self.effective(principal)).limits
        if not eff.keys() & {"rpm", "tpm", "concurrency"}:
            return
        try:
            await self._count(eff, admission)
        except Exception as exc:
            if not unreachable(exc):
                raise

    async def _count(self, eff: dict[str, tuple[int, str]], admission: QuotaGrant) -> None:
        reset = _reset()
        counted: tuple[str, int] | None = None  # (subject, tokens) the rpm count returned
        async with self._sessions.begin() as session:
            if "rpm" in eff:
                limit, subject = eff["rpm"]
                row = (await session.execute(_COUNT, {"s": subject, "limit": limit})).first()
                counted = None if row is None else (subject, int(row[1]))
                used = limit if row is None else row[0]
                admission.headers.update(_headers("requests", limit, limit - used, reset))
                if row is None:
                    raise RateLimited(
                        f"Rate limit reached: {limit} requests per minute.", retry_after=reset
                    )
            if "tpm" in eff:
                limit, subject = eff["tpm"]
                if counted is not None and counted[0] == subject:
                    tokens = counted[1]  # the same window row: no second query
                else:
                    tokens = int(await session.scalar(_TOKENS, {"s": subject}) or 0)
                admission.headers.update(_headers("tokens", limit, limit - tokens, reset))
                if tokens >= limit:
                    raise TokensLimited(
                        f"Rate limit reached: {limit} tokens per minute.", retry_after=reset
                    )
        if "concurrency" in eff:
            admission.lease = await self._acquire(*eff["concurrency"])

    async def _acquire(self, limit: int, subject: str) -> uuid.UUID:
        async with self._sessions.begin() as session:
            await session.execute(
                text("SELECT pg_advisory_xact_lock(hashtextextended(:s, 0))"), {"s": subject}
            )
            await session.execute(
                text("DELETE FROM quota_leases WHERE subject = :s AND expires_at < now()"),
                {"s": subject},
            )
            held = await session.scalar(
                text("SELECT count(*) FROM quota_leases WHERE subject = :s"), {"s": subject}
            )
            if int(held or 0) >= limit:
                raise RateLimited(
                    f"Concurrency limit reached: {limit} requests in flight.", retry_after=1.0
                )
            lease = uuid.uuid4()
            await session.execute(
                text("INSERT INTO quota_leases (id, subject, expires_at) VALUES (:i, :s, :e)"),
                {"i": lease, "s": subject, "e": datetime.now(UTC) + self._lease},
            )
        self._live.add(lease)
        return lease

    async def release(self, lease: uuid.UUID) -> None:
        """End a concurrency lease (its renewals first, even if the delete fails: with the
        database unreachable, the lease lapses at its expiry)."""
        self._live.discard(lease)
        try:
            async with self._sessions.begin() as session:
                await session.execute(text("DELETE FROM quota_leases WHERE id = :i"), {"i": lease})
        except Exception as exc:
            if not unreachable(exc):
                raise

    async def renew(self) -> int:
        """Push the expiry of every lease this process holds to at least one TTL ahead."""
        live = list(self._live)
        if live:
            async with self._sessions.begin() as session:
                await session.execute(_RENEW, {"ids": live, "ttl": self._ttl})
        return len(live)

    async def start(self) -> None:
        """Start renewing the leases of running requests."""
        self._renewer = asyncio.create_task(self._renew_loop(), name="lease-renewer")

    async def stop(self) -> None:
        """Stop renewing."""
        if self._renewer is not None:
            self._renewer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._renewer

    async def _renew_loop(self) -> None:
        while True:
            await asyncio.sleep(renew_every(self._ttl.total_seconds()))
            try:
                await self.renew()
            except Exception:
                log.exception("renewing concurrency leases failed; will retry")

    def charge(self, tenant_id: uuid.UUID, key_id: uuid.UUID | None, tokens: int) -> None:
        """Charge a request's tokens to its tokens/min counter (off the request path)."""
        hit = self._cache.peek((tenant_id, key_id))  # an OAuth caller's key is None
        if tokens <= 0 or hit is None or "tpm" not in hit.limits:
            return  # no tokens/min limit: the ledger alone records its usage
        task = asyncio.create_task(self._charge(hit.limits["tpm"][1], tokens))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _charge(self, subject: str, tokens: int) -> None:
        with contextlib.suppress(Exception):  # best effort: tokens/min is not the bill
            async with self._sessions.begin() as session:
                await session.execute(_CHARGE, {"s": subject, "n": tokens})

    async def drain(self) -> None:
        """Wait for pending charges (at shutdown)."""
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)


class TokensLimited(RateLimited):
    """The tokens-per-minute limit is reached."""

    type = "tokens"


def _headers(kind: str, limit: int, remaining: int, reset: float) -> dict[str, str]:
    return {
        f"x-ratelimit-limit-{kind}": str(limit),
        f"x-ratelimit-remaining-{kind}": str(max(0, remaining)),
        f"x-ratelimit-reset-{kind}": f"{math.ceil(reset)}s",
    }
