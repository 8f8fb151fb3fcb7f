"""The delivery loop (one per gateway, any number of gateways): claims due deliveries with
``FOR UPDATE SKIP LOCKED`` and a short lease, POSTs them signed (no redirects followed, the SSRF
guard before and during the connection), records each attempt and schedules the next with
backoff and jitter (``policy.retry_at``) until the retry window closes; now and then it
deletes the deliveries that ended longer ago than their retention (``retention.prune``)."""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

import aiohttp
import msgspec
import structlog
from cryptography.exceptions import InvalidTag
from sqlalchemy import select, update

from kiln_platform.webhooks import guard, metrics, policy, resolver, retention, signing, transport
from kiln_platform.webhooks.tables import WebhookAttempt, WebhookDelivery, WebhookEndpoint
from kiln_platform.webhooks.transport import Sent

if TYPE_CHECKING:
    import uuid

    from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

    from kiln_platform.settings import Settings

BATCH = 32
log = structlog.get_logger("kiln.webhooks")


@dataclass(frozen=True, slots=True)
class Outgoing:
    """A claimed delivery, as plain data: where, what, signed with which secrets."""

    id: uuid.UUID
    tenant_id: uuid.UUID
    url: str
    body: bytes
    keys: list[str]


class WebhookSender:
    """Delivers the outbox (``webhook_deliveries``) in the background."""

    def __init__(self, sessions: async_sessionmaker[AsyncSession], settings: Settings) -> None:
        self._sessions = sessions
        self._settings = settings
        self._allow = guard.networks(settings.webhook_allow_networks)
        self._seal = signing.webhook_seal(settings.hmac_key())
        self._task: asyncio.Task[None] | None = None
        self._http: aiohttp.ClientSession | None = None

    def start(self) -> None:
        """Poll every ``KILN_WEBHOOK_POLL_S`` (at once again while deliveries are due)."""
        connector = aiohttp.TCPConnector(resolver=resolver.GuardedResolver(self._allow), limit=64)
        self._http = aiohttp.ClientSession(connector=connector)
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        """Stop; a delivery in flight is sent again after its lease lapses (same id)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._http is not None:
            await self._http.close()

    async def _run(self) -> None:
        prune_at = 0.0
        while True:
            sent = 0
            try:
                sent = await self.tick()
                if time.monotonic() >= prune_at:
                    prune_at = time.monotonic() + retention.PRUNE_EVERY_S
                    await self._prune()
            except Exception:  # the next poll retries
                log.exception("webhook delivery failed")
            if sent < BATCH:
                await asyncio.sleep(self._settings.webhook_poll_s)

    async def _prune(self) -> None:
        """Delete the deliveries past ``KILN_WEBHOOK_RETENTION_S`` (``retention.prune``)."""
        pruned = await retention.prune(self._sessions, self._settings.webhook_retention_s)
        if pruned:
            log.info("webhook deliveries pruned", deliveries=pruned)

    async def tick(self) -> int:
        """Send every due delivery (up to ``BATCH``) at once; how many were attempted."""
        claimed = await self._claim()
        results = await asyncio.gather(*(self._send(out) for out in claimed))
        if claimed:
            await self._record(claimed, results)
        return len(claimed)

    async def _claim(self) -> list[Outgoing]:
        """Lock due deliveries (another gateway skips them) and lease them past one attempt."""
        now = datetime.now(UTC)
        lease = now + timedelta(seconds=self._settings.webhook_timeout_s + 30)
        async with self._sessions.begin() as session:
            rows = (await session.execute(
                select(WebhookDelivery, WebhookEndpoint)
                .join(WebhookEndpoint, WebhookEndpoint.id == WebhookDelivery.endpoint_id)
                .where(WebhookDelivery.state == "pending", WebhookDelivery.next_attempt_at <= now,
                       WebhookEndpoint.enabled)
                .order_by(WebhookDelivery.next_attempt_at).limit(BATCH)
                .with_for_update(of=WebhookDelivery, skip_locked=True)
            )).all()  # fmt: skip
            if rows:
                await session.execute(
                    update(WebhookDelivery)
                    .where(WebhookDelivery.id.in_([d.id for d, _ in rows]))
                    .values(next_attempt_at=lease)
                )
            return [
                Outgoing(d.id, d.tenant_id, e.url, msgspec.json.encode(d.payload),
                         self._keys(e, now))
                for d, e in rows
            ]  # fmt: skip

    def _keys(self, endpoint: WebhookEndpoint, now: datetime) -> list[str]:
        """The endpoint's secrets in force; none if they do not open (the server secret
        changed, or the row was tampered with): its deliveries then fail, the others go on."""
        try:
            return signing.secrets_in_force(endpoint, self._seal, now)
        except (InvalidTag, ValueError):
            log.error("a webhook secret does not open", endpoint=str(endpoint.id))
            return []

    async def _send(self, out: Outgoing) -> Sent:
        """One POST (``transport.post``), after the SSRF guard's check (``refused``)."""
        started = time.perf_counter()
        if not out.keys:
            return Sent("error", None, 0.0, "The endpoint's secret does not open; rotate it.")
        try:
            await guard.screen(out.url, self._allow)
        except guard.Refused as exc:
            return Sent("refused", None, time.perf_counter() - started, exc.message)
        headers = signing.headers(signing.message_id(out.id), out.body, out.keys)
        assert self._http is not None
        return await transport.post(
            self._http, out.url, out.body, headers, self._settings.webhook_timeout_s
        )

    async def _record(self, claimed: list[Outgoing], results: list[Sent]) -> None:
        """Store each attempt; end a delivery (delivered, failed) or schedule its next try."""
        async with self._sessions.begin() as session:
            for out, sent in zip(claimed, results, strict=True):
                metrics.ATTEMPTS.labels(sent.outcome).inc()
                metrics.LATENCY.observe(sent.duration_s)
                row = await session.get(WebhookDelivery, out.id, with_for_update=True)
                if row is None:
                    continue  # deleted with its endpoint meanwhile
                session.add(WebhookAttempt(
                    tenant_id=out.tenant_id, delivery_id=out.id, outcome=sent.outcome,
                    response_code=sent.code, duration_ms=sent.duration_s * 1000, error=sent.error,
                ))  # fmt: skip
                if row.state == "pending":
                    self._settle(row, sent)

    def _settle(self, row: WebhookDelivery, sent: Sent) -> None:
        """Count the attempt on its delivery: delivered, failed for good, or due again later."""
        now = datetime.now(UTC)
        row.attempts += 1
        row.last_code = sent.code
        if sent.outcome == "delivered":
            row.state, row.delivered_at = "delivered", now
            metrics.DELIVERIES.labels("delivered").inc()
            return
        at = policy.retry_at(
            now, row.window_from, row.attempts, base_s=self._settings.webhook_retry_base_s,
            window_s=self._settings.webhook_retry_window_s, jitter=random.random(),
        )  # fmt: skip
        if at is None:
            row.state = "failed"
            metrics.DELIVERIES.labels("failed").inc()
        else:
            row.next_attempt_at = at
        log.info("webhook attempt failed", delivery=str(row.id), error=sent.error, retry_at=at)
