"""Budget reservations on the request path: hold a request's worst case at admission, renew the
hold while the request runs, release what the ledger will not settle, and expire what a killed
process left behind.

The hold is one conditional ``UPDATE … WHERE spent + reserved + :x <= :limit`` on the tenant's
period row, so concurrent requests (in any number of gateway processes) serialize on that row
and never admit more than fits. A tenant without a budget costs no query: its limits are cached.

While the database is unreachable, budgets fail open: a request is admitted without a hold (its
usage is spooled and settled against the budget when the database is back), so a tenant can
overspend by what it is served during the outage's bound (``docs/reliability.md``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Protocol

import structlog
from sqlalchemy import text
from sqlalchemy.exc import IntegrityError

from kiln_platform.billing.budgets import Key, move, period_end, period_of, take, worst_case
from kiln_platform.db.outage import unreachable
from kiln_platform.errors import Conflict, QuotaExceeded
from kiln_platform.quotas.leases import lifetime, renew_every

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

    from kiln_platform.billing.pricebooks import PriceBooks
    from kiln_platform.billing.pricing import Quantities
    from kiln_platform.keys.services import Principal
    from kiln_platform.registry.services import ResolvedVersion

log = structlog.get_logger("kiln.budgets")

_OPEN = text(
    "INSERT INTO budget_periods (tenant_id, period) VALUES (:t, :p) ON CONFLICT DO NOTHING"
)
_HOLD = text(
    """
    WITH held AS (
        UPDATE budget_periods SET reserved_micros = reserved_micros + :x
        WHERE tenant_id = :t AND period = :p AND spent_micros + reserved_micros + :x <= :limit
        RETURNING tenant_id, period
    )
    INSERT INTO budget_reservations (request_id, tenant_id, period, amount_micros, expires_at)
    SELECT :r, tenant_id, period, :x, :e FROM held
    RETURNING request_id
    """
)
_RENEW = text(
    "UPDATE budget_reservations SET expires_at = greatest(expires_at, now() + :ttl)"
    " WHERE request_id = ANY(:ids)"
)
_EXPIRED = text(
    "SELECT request_id FROM budget_reservations WHERE expires_at < now()"
    " ORDER BY request_id LIMIT 1000 FOR UPDATE SKIP LOCKED"
)


class _Effective(Protocol):
    @property
    def limits(self) -> dict[str, tuple[int, str]]: ...


class Limits(Protocol):
    """What budgets read of ``quotas.enforcer.QuotaEnforcer`` (which imports this module)."""

    async def effective(self, principal: Principal) -> _Effective: ...


class Budgets:
    """Reserves, renews, releases and expires budget holds (one per process)."""

    def __init__(
        self, sessions: async_sessionmaker[AsyncSession], quotas: Limits,
        books: PriceBooks, *, timeout_s: float, ttl_s: float, sweep_s: float = 10.0,
    ) -> None:  # fmt: skip
        self._sessions = sessions
        self._quotas = quotas
        self._books = books
        self._timeout_s = timeout_s
        self._ttl_s = ttl_s
        self._sweep_s = sweep_s
        self._open: set[str] = set()
        """Reservations this process holds that the ledger has not been handed yet: renewed."""
        self._periods: set[Key] = set()
        self._task: asyncio.Task[None] | None = None

    async def reserve(
        self, principal: Principal, request_id: str, version: ResolvedVersion, most: Quantities,
        run_s: float | None = None,
    ) -> None:  # fmt: skip
        """Hold the most this request can cost, or raise ``QuotaExceeded`` (429).

        ``most`` are the request's maximum quantities; its compute time is bounded by the most
        the server lets it run (``run_s``: a generation's stream deadline; else
        ``KILN_REQUEST_TIMEOUT_S``), never by a timeout the client chose. The hold lives at least
        that long too, and is renewed until the request ends.
        """
        limits = (await self._quotas.effective(principal)).limits
        if "monthly_budget_micros" not in limits:
            return
        limit = limits["monthly_budget_micros"][0]
        now = datetime.now(UTC)
        book = await self._books.current(now)
        run_s = self._timeout_s if run_s is None else run_s
        most = dataclasses.replace(most, compute_ms=1000 * run_s)
        amount = worst_case(book, version.model, version.version, principal.plan, most)
        if amount == 0:
            return
        key = (principal.tenant_id, period_of(principal.timezone, now))
        params = {"t": key[0], "p": key[1], "x": amount, "limit": limit, "r": request_id,
                  "e": now + timedelta(seconds=lifetime(self._ttl_s, run_s))}  # fmt: skip
        try:
            async with self._sessions.begin() as session:
                if key not in self._periods:
                    await session.execute(_OPEN, params)
                held = await session.scalar(_HOLD, params)
        except IntegrityError as exc:
            raise Conflict("A request with this request id is in flight.") from exc
        except Exception as exc:
            if unreachable(exc):
                return  # fail open: no hold (the outage's bound)
            raise
        self._periods.add(key)
        if held is None:
            raise QuotaExceeded(
                "You exceeded your current quota: this month's budget cannot cover this "
                f"request (up to {amount} micro-units).",
                retry_after=(period_end(principal.timezone, key[1]) - now).total_seconds(),
            )
        self._open.add(request_id)

    def handed(self, request_id: str) -> bool:
        """This process stops tracking the request's hold; whether it had one.

        Called when the ledger takes the request (its write settles the hold with the usage row;
        without one it skips the lookup) and by ``finish``.
        """
        held = request_id in self._open
        self._open.discard(request_id)
        return held

    async def finish(self, request_id: str) -> None:
        """At the end of a response: release the hold if the ledger was not handed the request."""
        if self.handed(request_id):
            await self.release(request_id)

    async def release(self, request_id: str) -> None:
        """Give a request's hold back (it ends with no ledger row); with the database
        unreachable, the hold lapses at its expiry (the sweep)."""
        try:
            async with self._sessions.begin() as session:
                await move(session, {}, await take(session, [request_id]))
        except Exception as exc:
            if not unreachable(exc):
                raise

    async def renew(self) -> int:
        """Push the expiry of every hold this process tracks to at least one TTL ahead."""
        live = list(self._open)
        if live:
            async with self._sessions.begin() as session:
                await session.execute(_RENEW, {"ids": live, "ttl": timedelta(seconds=self._ttl_s)})
        return len(live)

    async def sweep(self) -> int:
        """Release holds past their expiry (left by a killed process); how many."""
        async with self._sessions.begin() as session:
            ids = list(await session.scalars(_EXPIRED))
            if ids:
                await move(session, {}, await take(session, ids))
        return len(ids)

    async def start(self) -> None:
        """Start the renewer and sweeper."""
        self._task = asyncio.create_task(self._loop(), name="budget-sweeper")

    async def stop(self) -> None:
        """Stop the renewer and sweeper."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _loop(self) -> None:
        every = min(self._sweep_s, renew_every(self._ttl_s))
        swept = asyncio.get_running_loop().time()
        while True:
            await asyncio.sleep(every)
            try:
                await self.renew()
            except Exception:
                log.exception("renewing budget holds failed; will retry")
            if asyncio.get_running_loop().time() - swept < self._sweep_s - every / 2:
                continue
            swept = asyncio.get_running_loop().time()
            try:
                if expired := await self.sweep():
                    log.info("budget reservations expired", count=expired)
            except Exception:
                log.exception("budget sweep failed; will retry")
