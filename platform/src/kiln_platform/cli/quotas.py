"""``kiln quotas show`` and ``kiln quotas set``."""

from __future__ import annotations

from decimal import Decimal, InvalidOperation
from typing import TYPE_CHECKING

import click
import msgspec

from kiln_platform.cli._base import cli_actor, fail, run_or_fail, tenant_id
from kiln_platform.errors import BadRequest

if TYPE_CHECKING:
    from kiln_platform.db.database import Database
    from kiln_platform.quotas.schemas import Limits, QuotaView
    from kiln_platform.settings import Settings


@click.group()
def quotas() -> None:
    """Plans and quotas."""


@quotas.command("show")
@click.option("--tenant", required=True, help="Tenant name.")
@click.pass_context
def show(ctx: click.Context, *, tenant: str) -> None:
    """A tenant's limits, per-key overrides and this month's budget, as JSON."""
    from kiln_platform.quotas.services import get_quotas

    async def action(db: Database, settings: Settings) -> QuotaView:
        async with db.sessions.begin() as session:
            return await get_quotas(session, cli_actor(), await tenant_id(session, tenant))

    view = run_or_fail(ctx, action)
    click.echo(msgspec.json.format(msgspec.json.encode(view), indent=2).decode())


@quotas.command("set")
@click.option("--tenant", required=True, help="Tenant name.")
@click.option("--key", "key_ref", help="Set a per-key override (id, prefix or secret).")
@click.option("--rpm", type=click.IntRange(min=1), help="Requests per minute.")
@click.option("--tpm", type=click.IntRange(min=1), help="Tokens (input + output) per minute.")
@click.option("--concurrency", type=click.IntRange(min=1), help="Requests in flight.")
@click.option("--monthly-budget", help="Monthly budget in currency units, e.g. 12.50.")
@click.option("--budget-alerts", help="Alert thresholds, percent of the budget: 50,80,100.")
@click.option("--batch-tokens-per-day", type=click.IntRange(min=1),
              help="Tokens batch lines may use per tenant-local day.")  # fmt: skip
@click.option("--batch-enqueued-tokens", type=click.IntRange(min=1),
              help="Estimated tokens of open batches (OpenAI's enqueued token limit).")  # fmt: skip
@click.option("--clear", is_flag=True, help="Remove every limit not given here.")
@click.pass_context
def set_(
    ctx: click.Context, *, tenant: str, key_ref: str | None, rpm: int | None, tpm: int | None,
    concurrency: int | None, monthly_budget: str | None, budget_alerts: str | None,
    batch_tokens_per_day: int | None, batch_enqueued_tokens: int | None, clear: bool,
) -> None:  # fmt: skip
    """Set a tenant's (or a key's) limits; limits not given keep their value."""
    from kiln_platform.keys.services import find_key
    from kiln_platform.quotas.schemas import Limits
    from kiln_platform.quotas.services import get_quotas, set_limits

    budget, alerts = _budget(monthly_budget), _alerts(budget_alerts)

    async def action(db: Database, settings: Settings) -> Limits:
        actor = cli_actor()
        async with db.sessions.begin() as session:
            tid = await tenant_id(session, tenant)
            key_id = None
            if key_ref:
                key_id = (await find_key(session, actor, key_ref, settings.hmac_key())).id
            view = await get_quotas(session, actor, tid)
            old = next((k.limits for k in view.keys if k.api_key_id == key_id), Limits())
            old = view.limits if key_id is None else old
            if clear:
                old = Limits()
            new = Limits(
                rpm=rpm or old.rpm, tpm=tpm or old.tpm,
                concurrency=concurrency or old.concurrency,
                monthly_budget_micros=old.monthly_budget_micros if budget is None else budget,
                budget_alert_percents=alerts or old.budget_alert_percents,
                batch_tokens_per_day=batch_tokens_per_day or old.batch_tokens_per_day,
                batch_enqueued_tokens=batch_enqueued_tokens or old.batch_enqueued_tokens,
            )  # fmt: skip
            return await set_limits(session, actor, tid, new, key_id)

    limits = run_or_fail(ctx, action)
    click.echo(
        f"rpm={limits.rpm} tpm={limits.tpm} concurrency={limits.concurrency} "
        f"monthly_budget_micros={limits.monthly_budget_micros} "
        f"batch_tokens_per_day={limits.batch_tokens_per_day} "
        f"batch_enqueued_tokens={limits.batch_enqueued_tokens}"
    )


def _budget(text: str | None) -> int | None:
    """``--monthly-budget`` in micro-units."""
    try:
        return None if text is None else int(Decimal(text) * 1_000_000)
    except InvalidOperation:
        fail(BadRequest(f"--monthly-budget: not an amount: {text!r}"))


def _alerts(text: str | None) -> list[int] | None:
    """``--budget-alerts`` as percents."""
    try:
        return None if text is None else [int(p) for p in text.split(",")]
    except ValueError:
        fail(BadRequest(f"--budget-alerts: not percents: {text!r}"))
