"""Batch quotas enforced (``quotas.batch_policy`` decides): a new batch is refused (429) when
its file's estimated tokens do not fit under ``batch_enqueued_tokens`` beside the open batches,
or under what is left today of ``batch_tokens_per_day``; a running batch's line waits while the
day's count is spent; each recorded line's tokens are added to the day's count.

The limits and their subject (the key with its own override, else the tenant) are the quota
enforcer's, cached like the others. The day's count is a ``quota_counters`` row per subject
(``batch-day:<subject>``) whose window starts at the tenant-local midnight; lines in flight
when the count runs out finish, so a day may overshoot by the lines one gateway runs or holds
unrecorded at once.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import structlog
from sqlalchemy import func, select, text

from kiln_platform.batches.schemas import OPEN
from kiln_platform.batches.tables import BatchJob
from kiln_platform.errors import RateLimited
from kiln_platform.quotas.batch_policy import day_of, line_tokens, line_waits, refusal

if TYPE_CHECKING:
    from collections.abc import Callable

    from kiln_platform.billing.ledger import Usage
    from kiln_platform.context import Kiln
    from kiln_platform.keys.services import Principal

log = structlog.get_logger("kiln.batches")
_USED = text("SELECT tokens FROM quota_counters WHERE subject = :s AND window_start = :day")
_ADD = text(
    """
    INSERT INTO quota_counters AS c (subject, window_start, requests, tokens)
    VALUES (:s, :day, 1, :n)
    ON CONFLICT (subject, window_start) DO UPDATE
        SET requests = c.requests + 1, tokens = c.tokens + :n
    """
)


class BatchTokensLimited(RateLimited):
    """A new batch does not fit under a batch quota (OpenAI's code for its enqueued limit)."""

    code = "token_limit_exceeded"
    type = "tokens"


async def _used_today(kiln: Kiln, subject: str, day: datetime) -> int:
    async with kiln.db.sessions() as session:
        used = await session.scalar(_USED, {"s": f"batch-day:{subject}", "day": day})
    return int(used or 0)


async def _enqueued(kiln: Kiln, principal: Principal, subject: str) -> int:
    """Estimated tokens of the subject's open batches (a key's: those it created)."""
    query = select(func.coalesce(func.sum(BatchJob.estimated_tokens), 0)).where(
        BatchJob.tenant_id == principal.tenant_id, BatchJob.status.in_(OPEN)
    )
    if subject.startswith("key:"):
        query = query.where(BatchJob.principal["key_id"].astext == subject.removeprefix("key:"))
    async with kiln.db.sessions() as session:
        return int(await session.scalar(query) or 0)


async def admit(kiln: Kiln, principal: Principal, tokens: int) -> None:
    """Refuse (``BatchTokensLimited``, 429) a new batch of ``tokens`` estimated tokens that a
    batch quota has no room for."""
    limits = (await kiln.quotas.effective(principal)).limits
    if "batch_enqueued_tokens" in limits:
        limit, subject = limits["batch_enqueued_tokens"]
        used = await _enqueued(kiln, principal, subject)
        if why := refusal("batch_enqueued_tokens", limit, used, tokens, today=False):
            raise BatchTokensLimited(why, param="input_file_id", retry_after=60.0)
    if "batch_tokens_per_day" in limits:
        limit, subject = limits["batch_tokens_per_day"]
        start, end = day_of(principal.timezone, datetime.now(UTC))
        used = await _used_today(kiln, subject, start)
        if why := refusal("batch_tokens_per_day", limit, used, tokens, today=True):
            wait = (end - datetime.now(UTC)).total_seconds()
            raise BatchTokensLimited(why, param="input_file_id", retry_after=wait)


async def line_wait_s(kiln: Kiln, principal: Principal, tokens: int) -> float:
    """0 if a line of ``tokens`` estimated tokens may start now, else the seconds until the
    tenant's next day (when the daily count starts again)."""
    limits = (await kiln.quotas.effective(principal)).limits
    if "batch_tokens_per_day" not in limits:
        return 0.0
    limit, subject = limits["batch_tokens_per_day"]
    start, end = day_of(principal.timezone, datetime.now(UTC))
    if not line_waits(limit, await _used_today(kiln, subject, start), tokens):
        return 0.0
    return max(0.001, (end - datetime.now(UTC)).total_seconds())


async def within_day(
    kiln: Kiln, principal: Principal, body: dict[str, Any], stopping: Callable[[], bool],
    poll_s: float,
) -> None:  # fmt: skip
    """Wait while the line ``body`` would pass the daily batch tokens, checking every
    ``poll_s``: until the tenant's next day, a higher limit, or ``stopping()`` (the batch is
    cancelled, expired, revoked)."""
    tokens = line_tokens(body)
    while not stopping():
        try:
            wait = await line_wait_s(kiln, principal, tokens)
        except Exception:  # the database is away: the line goes on, as quotas fail open
            log.exception("checking the daily batch tokens failed")
            return
        if not wait:
            return
        await asyncio.sleep(min(wait, poll_s))


async def count(kiln: Kiln, principal: Principal, usage: Usage | None) -> None:
    """Add a recorded line's tokens to its day's count (if a daily limit applies)."""
    limits = (await kiln.quotas.effective(principal)).limits
    tokens = 0 if usage is None else usage.input_tokens + usage.output_tokens
    if "batch_tokens_per_day" not in limits or tokens <= 0:
        return
    _, subject = limits["batch_tokens_per_day"]
    start, _ = day_of(principal.timezone, usage.at if usage else datetime.now(UTC))
    try:  # best effort, like tokens/min: the line is recorded and billed already
        async with kiln.db.sessions.begin() as session:
            await session.execute(_ADD, {"s": f"batch-day:{subject}", "day": start, "n": tokens})
    except Exception:
        log.exception("counting a batch line's tokens failed")
