"""The SLO monitor: every interval each gateway adds its counts to ``slo_counts``; then one
gateway at a time (an advisory lock) evaluates every SLO's burn-rate alerts and announces new
budget thresholds (``slo.budget``), storing each change with a notification, and delivers the
notifications that are due."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

import aiohttp
import structlog
from sqlalchemy import delete, func, select, text
from sqlalchemy.dialects.postgresql import insert

from kiln_platform.slo import budget, crashloop, fanout, notify, policy
from kiln_platform.slo.receivers import receiver_seal
from kiln_platform.slo.services import objective, window_counts
from kiln_platform.slo.sli import SliRecorder, Watched
from kiln_platform.slo.tables import Alert, Slo, SloCount

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

    from kiln_platform.settings import Settings

EVALUATOR_LOCK = 0x6B696C6E_736C6F  # pg_try_advisory_xact_lock key: "kiln" "slo"
POOLS_LOCK = 0x6B696C6E_706F6F6C  # pg_advisory_xact_lock key: "kiln" "pool"
log = structlog.get_logger("kiln.slo")


def fingerprint(slo: Slo, sli: policy.Sli, severity: str) -> str:
    """Stable per SLO, SLI and severity (the alert's identity across evaluations)."""
    return hashlib.sha256(f"{slo.id}:{sli}:{severity}".encode()).hexdigest()[:16]


class SloMonitor:
    """Flushes the recorder, evaluates the SLOs and delivers their alerts in the background."""

    def __init__(
        self, sessions: async_sessionmaker[AsyncSession], slis: SliRecorder, settings: Settings,
        pools: Callable[[], Mapping[str, crashloop.PoolHealth]] = dict,
    ) -> None:  # fmt: skip
        self._sessions = sessions
        self._pools = pools
        self._seal = receiver_seal(settings.hmac_key())
        """This gateway's pools as the crash-loop policy sees them (``crashloop.health``)."""
        self.slis = slis
        self._settings = settings
        self._task: asyncio.Task[None] | None = None
        self._http: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        """Load the SLOs, then run every ``KILN_SLO_EVAL_INTERVAL_S``."""
        self._http = aiohttp.ClientSession()
        await self._load()
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        """Stop, storing the last counts."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        with contextlib.suppress(Exception):
            await self._flush()
        if self._http is not None:
            await self._http.close()

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._settings.slo_eval_interval_s)
            try:
                await self.tick()
            except Exception:  # the next interval retries; counts stay in memory until stored
                log.exception("SLO evaluation failed")

    async def tick(self) -> None:
        """One interval: store counts, reload SLOs, evaluate (if no other gateway is), deliver."""
        await self._flush()
        await self._load()
        async with self._sessions.begin() as session:
            locked = await session.scalar(select(func.pg_try_advisory_xact_lock(EVALUATOR_LOCK)))
            if locked:
                for slo in await session.scalars(select(Slo)):
                    await self._evaluate(session, slo)
                await budget.announce(session)
        await self.check_pools()
        await self.deliver()

    async def deliver(self) -> None:
        """Deliver the due notifications: to ``KILN_ALERT_WEBHOOK_URL`` and the receivers."""
        url = self._settings.alert_webhook_url
        if url and self._http is not None:
            async with self._sessions.begin() as session:
                await notify.deliver_due(
                    session, self._http, url, self._settings.alert_key(),
                    self._settings.alert_retry_s,
                )  # fmt: skip
        if self._http is not None:
            async with self._sessions.begin() as session:
                await fanout.deliver_due(session, self._http, self._seal,
                                         self._settings.alert_retry_s)  # fmt: skip

    async def check_pools(self) -> None:
        """Raise or resolve this gateway's pools' crash-loop alerts (gateways take turns)."""
        pools, now = self._pools(), datetime.now(UTC)
        async with self._sessions.begin() as session:
            await session.execute(select(func.pg_advisory_xact_lock(POOLS_LOCK)))
            open_ = await session.scalars(
                select(Alert).where(Alert.status == "firing", Alert.name == crashloop.ALERTNAME)
            )
            firing = {f"{a.labels['model']}@{a.labels['version']}": a for a in open_}
            limit = self._settings.crash_loop_restarts
            for key, fires in crashloop.changes(pools, firing, limit).items():
                if fires:
                    await _raise_crash_loop(session, pools[key], now)
                else:
                    firing[key].status, firing[key].ends_at = "resolved", now
                    await notify.enqueue(session, firing[key])
                    log.info("alert", alert=firing[key].labels, status="resolved")

    async def _load(self) -> None:
        async with self._sessions() as session:
            rows = await session.scalars(select(Slo))
            self.slis.watch([Watched(s.id, s.model, s.plan, s.latency_ms) for s in rows])

    async def _flush(self) -> None:
        counts = self.slis.drain()
        if not counts:
            return
        rows = [
            {"slo_id": slo_id, "bucket": datetime.fromtimestamp(bucket, UTC),
             "total": c[0], "errors": c[1], "slow": c[2]}
            for (slo_id, bucket), c in counts.items()
        ]  # fmt: skip
        stmt = insert(SloCount).values(rows)
        stmt = stmt.on_conflict_do_update(
            index_elements=[SloCount.slo_id, SloCount.bucket],
            set_={
                c: getattr(SloCount, c) + getattr(stmt.excluded, c)
                for c in ("total", "errors", "slow")
            },
        )
        try:
            async with self._sessions.begin() as session:
                await session.execute(text("SET LOCAL lock_timeout = '5s'"))
                await session.execute(stmt)
        except Exception:
            self.slis.restore(counts)
            raise

    async def _evaluate(self, session: AsyncSession, slo: Slo) -> None:
        goal, now = objective(slo), datetime.now(UTC)
        spans = policy.windows(goal)
        counts = await window_counts(session, slo.id, spans, self._settings.slo_bucket_s, now)
        states = policy.evaluate(counts, goal, now)
        stale = now - timedelta(seconds=slo.period_s + 2 * self._settings.slo_bucket_s)
        await session.execute(
            delete(SloCount).where(SloCount.slo_id == slo.id, SloCount.bucket < stale)
        )
        for (sli, severity), firing in policy.alerts(states).items():
            burns = {f"{s.rule.name}": round(s.long_burn, 2) for s in states if s.sli is sli}
            await _transition(session, slo, sli, severity, firing, burns, now)


async def _transition(  # noqa: PLR0917 (one alert's whole identity)
    session: AsyncSession,
    slo: Slo,
    sli: policy.Sli,
    severity: str,
    firing: bool,
    burns: dict[str, float],
    now: datetime,
) -> None:
    """Store the alert's change of state, if any, and a notification of it."""
    key = fingerprint(slo, sli, severity)
    open_ = await session.scalar(
        select(Alert).where(Alert.fingerprint == key, Alert.status == "firing")
    )
    if firing == (open_ is not None):
        return
    if open_ is None:
        open_ = Alert(
            fingerprint=key, name="KilnSLOBurnRate", status="firing", starts_at=now,
            labels={"alertname": "KilnSLOBurnRate", "slo": slo.name, "model": slo.model,
                    "sli": str(sli), "severity": severity},
            annotations={"summary": f"SLO {slo.name}: {sli} error budget burning too fast",
                         "burn_rates": str(burns)},
        )  # fmt: skip
        session.add(open_)
    else:
        open_.status, open_.ends_at = "resolved", now
    await notify.enqueue(session, open_)
    log.info("alert", alert=open_.labels, status=open_.status)


async def _raise_crash_loop(
    session: AsyncSession, pool: crashloop.PoolHealth, now: datetime
) -> None:
    """Store a firing ``KilnPoolCrashLoop`` for ``pool`` and a notification of it."""
    labels = {"alertname": crashloop.ALERTNAME, "model": pool.model, "version": pool.version,
              "severity": "page"}  # fmt: skip
    key = hashlib.sha256(f"{crashloop.ALERTNAME}:{pool.model}@{pool.version}".encode())
    alert = Alert(
        fingerprint=key.hexdigest()[:16], name=crashloop.ALERTNAME, status="firing",
        starts_at=now, labels=labels,
        annotations={"summary": f"Every worker of {pool.model}@{pool.version} is down after "
                                f"{pool.restarts} restarts; requests get 503",
                     "restarts": str(pool.restarts)},
    )  # fmt: skip
    session.add(alert)
    await notify.enqueue(session, alert)
    log.info("alert", alert=labels, status="firing")
