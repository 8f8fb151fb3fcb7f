"""``kiln slo create|list|delete|status|rules|webhook-secret`` and ``kiln alerts list``: SLOs
and their alerts, as a platform-admin CLI actor (audited like ``/admin/v1/slos``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click
import msgspec

from kiln_platform.cli._base import cli_actor, run_or_fail

if TYPE_CHECKING:
    from kiln_platform.db.database import Database
    from kiln_platform.settings import Settings


def _echo(value: object) -> None:
    click.echo(msgspec.json.format(msgspec.json.encode(value), indent=2).decode())


@click.group()
def slo() -> None:
    """Service level objectives: availability and latency targets, error budgets, rules."""


@slo.command("create")
@click.argument("name")
@click.option("--model", required=True, help="The served model's name.")
@click.option("--plan", help="Only requests of tenants on this plan.")
@click.option("--availability", type=float, help="e.g. 0.999: requests not server errors.")
@click.option("--latency", type=float, help="e.g. 0.99: requests under --latency-ms.")
@click.option("--latency-ms", type=float, default=1000.0, show_default=True,
              help="The latency threshold (time to first token for generation).")  # fmt: skip
@click.option("--period-days", type=float, default=30.0, show_default=True)
@click.pass_context
def create(
    ctx: click.Context, *, name: str, model: str, plan: str | None, availability: float | None,
    latency: float | None, latency_ms: float, period_days: float,
) -> None:  # fmt: skip
    """Define an SLO NAME for a model."""
    from kiln_platform.slo import services
    from kiln_platform.slo.schemas import SloCreate

    fields = {"name": name, "model": model, "plan": plan, "availability": availability,
              "latency": latency, "latency_ms": latency_ms, "period_days": period_days}  # fmt: skip
    try:
        data = msgspec.convert(fields, SloCreate)
    except msgspec.ValidationError as exc:
        raise click.UsageError(str(exc)) from None

    async def action(db: Database, settings: Settings) -> None:
        async with db.sessions.begin() as session:
            _echo(await services.create_slo(session, cli_actor(), data))

    run_or_fail(ctx, action)


@slo.command("list")
@click.pass_context
def list_(ctx: click.Context) -> None:
    """Every SLO."""
    from kiln_platform.slo import services

    async def action(db: Database, settings: Settings) -> None:
        async with db.sessions() as session:
            for row in await services.list_slos(session, cli_actor()):
                goals = f"availability={row.availability} latency={row.latency}@{row.latency_ms}ms"
                click.echo(f"{row.name}\t{row.model}\t{row.plan or '*'}\t{goals}\t"
                           f"{row.period_days:g}d")  # fmt: skip

    run_or_fail(ctx, action)


@slo.command("delete")
@click.argument("name")
@click.pass_context
def delete(ctx: click.Context, name: str) -> None:
    """Delete the SLO NAME and its counts."""
    from kiln_platform.slo import services

    async def action(db: Database, settings: Settings) -> None:
        async with db.sessions.begin() as session:
            await services.delete_slo(session, cli_actor(), name)

    run_or_fail(ctx, action)


@slo.command("status")
@click.argument("name")
@click.pass_context
def status(ctx: click.Context, name: str) -> None:
    """Error budget remaining and burn rates of the SLO NAME."""
    from kiln_platform.slo import services

    async def action(db: Database, settings: Settings) -> None:
        async with db.sessions() as session:
            _echo(await services.slo_status(session, cli_actor(), name, settings.slo_bucket_s))

    run_or_fail(ctx, action)


@slo.command("rules")
@click.pass_context
def rules(ctx: click.Context) -> None:
    """Prometheus recording and alerting rules for every SLO (YAML on stdout)."""
    from kiln_platform.slo import services
    from kiln_platform.slo.rules import NamedObjective
    from kiln_platform.slo.rules import rules as generate

    async def action(db: Database, settings: Settings) -> None:
        async with db.sessions() as session:
            rows = await services.stored_slos(session, cli_actor())
        named = [NamedObjective(r.name, services.objective(r), r.plan) for r in rows]
        click.echo(generate(named), nl=False)

    run_or_fail(ctx, action)


@slo.command("webhook-secret")
@click.pass_context
def webhook_secret(ctx: click.Context) -> None:
    """Print the key alert notifications are signed with (for the receiver to verify)."""
    from kiln_platform.cli._base import settings_of

    click.echo(settings_of(ctx).alert_key().decode())


@click.group()
def alerts() -> None:
    """Alerts Kiln raised (SLO burn rates)."""


@alerts.command("list")
@click.option("--status", type=click.Choice(["firing", "resolved"]))
@click.pass_context
def list_alerts(ctx: click.Context, status: str | None) -> None:
    """The latest alerts, newest first."""
    from kiln_platform.slo import services

    async def action(db: Database, settings: Settings) -> None:
        async with db.sessions() as session:
            for a in await services.list_alerts(session, cli_actor(), status):
                ended = a.ends_at.isoformat() if a.ends_at else "-"
                labels = ",".join(f"{k}={v}" for k, v in a.labels.items() if k != "alertname")
                click.echo(f"{a.status}\t{a.starts_at.isoformat()}\t{ended}\t{a.name}\t{labels}")

    run_or_fail(ctx, action)
