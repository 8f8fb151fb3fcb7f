"""``kiln webhooks create|list|update|delete|rotate-secret|deliveries|redeliver``: a tenant's
outbound webhooks, as a platform-admin CLI actor (audited like ``/admin/v1/.../webhooks``)."""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import click
import msgspec

from kiln_platform.cli._base import cli_actor, run_or_fail, tenant_id

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncSession

    from kiln_platform.db.database import Database
    from kiln_platform.settings import Settings

Step = Callable[["AsyncSession", uuid.UUID, "Settings"], Awaitable[Any]]
TENANT = click.option("--tenant", required=True, help="Tenant name.")
EVENTS = click.option("--event", "events", multiple=True, help="An event type (repeatable): "
                      "batch.completed, batch.failed, batch.expired, batch.cancelled, "
                      "budget.threshold_reached.")  # fmt: skip


def _run(ctx: click.Context, tenant: str, step: Step) -> None:
    """Run ``step`` in one transaction for the tenant; print its answer as JSON."""

    async def action(db: Database, settings: Settings) -> Any:
        async with db.sessions.begin() as session:
            return await step(session, await tenant_id(session, tenant), settings)

    found = run_or_fail(ctx, action)
    click.echo(msgspec.json.format(msgspec.json.encode(found), indent=2).decode())


def _convert(fields: dict[str, Any], kind: type[Any]) -> Any:
    try:
        return msgspec.convert({k: v for k, v in fields.items() if v is not None}, kind)
    except msgspec.ValidationError as exc:
        raise click.UsageError(str(exc)) from None


@click.group()
def webhooks() -> None:
    """Tenants' outbound webhooks: endpoints, secrets, the delivery log."""


@webhooks.command("create")
@TENANT
@click.option("--url", required=True, help="Where events are POSTed (public unless allowed).")
@EVENTS
@click.option("--description", default="")
@click.pass_context
def create(
    ctx: click.Context, tenant: str, url: str, events: tuple[str, ...], description: str
) -> None:
    """Register an endpoint; its whsec_ secret is printed once."""
    from kiln_platform.webhooks import guard, services, signing
    from kiln_platform.webhooks.schemas import EndpointCreate

    data = _convert({"url": url, "events": list(events), "description": description},
                    EndpointCreate)  # fmt: skip

    async def step(session: AsyncSession, tid: uuid.UUID, settings: Settings) -> Any:
        return await services.create_endpoint(
            session, cli_actor(), tid, data, seal=signing.webhook_seal(settings.hmac_key()),
            allow=guard.networks(settings.webhook_allow_networks),
        )  # fmt: skip

    _run(ctx, tenant, step)


@webhooks.command("list")
@TENANT
@click.pass_context
def list_(ctx: click.Context, tenant: str) -> None:
    """The tenant's endpoints (never a secret)."""
    from kiln_platform.webhooks import services

    async def step(session: AsyncSession, tid: uuid.UUID, settings: Settings) -> Any:
        return await services.list_endpoints(session, cli_actor(), tid)

    _run(ctx, tenant, step)


@webhooks.command("update")
@TENANT
@click.argument("endpoint", type=click.UUID)
@click.option("--url")
@EVENTS
@click.option("--description")
@click.option("--enable/--disable", "enabled", default=None)
@click.pass_context
def update(
    ctx: click.Context, *, tenant: str, endpoint: uuid.UUID, url: str | None,
    events: tuple[str, ...], description: str | None, enabled: bool | None,
) -> None:  # fmt: skip
    """Change ENDPOINT's URL, events, description, or enable/disable it."""
    from kiln_platform.webhooks import guard, services
    from kiln_platform.webhooks.schemas import EndpointUpdate

    fields = {"url": url, "events": list(events) or None, "description": description,
              "enabled": enabled}  # fmt: skip
    data = _convert(fields, EndpointUpdate)

    async def step(session: AsyncSession, tid: uuid.UUID, settings: Settings) -> Any:
        allow = guard.networks(settings.webhook_allow_networks)
        return await services.update_endpoint(session, cli_actor(), tid, endpoint, data,
                                              allow=allow)  # fmt: skip

    _run(ctx, tenant, step)


@webhooks.command("delete")
@TENANT
@click.argument("endpoint", type=click.UUID)
@click.pass_context
def delete(ctx: click.Context, tenant: str, endpoint: uuid.UUID) -> None:
    """Delete ENDPOINT with its deliveries."""
    from kiln_platform.webhooks import services

    async def step(session: AsyncSession, tid: uuid.UUID, settings: Settings) -> Any:
        await services.delete_endpoint(session, cli_actor(), tid, endpoint)
        return {"deleted": str(endpoint)}

    _run(ctx, tenant, step)


@webhooks.command("rotate-secret")
@TENANT
@click.argument("endpoint", type=click.UUID)
@click.pass_context
def rotate_secret(ctx: click.Context, tenant: str, endpoint: uuid.UUID) -> None:
    """A new secret for ENDPOINT (printed once); the old one signs too for the grace period."""
    from kiln_platform.webhooks import services, signing

    async def step(session: AsyncSession, tid: uuid.UUID, settings: Settings) -> Any:
        seal = signing.webhook_seal(settings.hmac_key())
        return await services.rotate_secret(session, cli_actor(), tid, endpoint, seal=seal,
                                            grace_s=settings.webhook_rotation_grace_s)  # fmt: skip

    _run(ctx, tenant, step)


@webhooks.command("deliveries")
@TENANT
@click.argument("endpoint", type=click.UUID)
@click.pass_context
def deliveries(ctx: click.Context, tenant: str, endpoint: uuid.UUID) -> None:
    """ENDPOINT's latest deliveries, each with its attempts."""
    from kiln_platform.webhooks import services

    async def step(session: AsyncSession, tid: uuid.UUID, settings: Settings) -> Any:
        return await services.list_deliveries(session, cli_actor(), tid, endpoint)

    _run(ctx, tenant, step)


@webhooks.command("redeliver")
@TENANT
@click.argument("endpoint", type=click.UUID)
@click.argument("delivery", type=click.UUID)
@click.pass_context
def redeliver(ctx: click.Context, tenant: str, endpoint: uuid.UUID, delivery: uuid.UUID) -> None:
    """Send DELIVERY of ENDPOINT again, with the same webhook-id."""
    from kiln_platform.webhooks import services

    async def step(session: AsyncSession, tid: uuid.UUID, settings: Settings) -> Any:
        return await services.redeliver(session, cli_actor(), tid, endpoint, delivery)

    _run(ctx, tenant, step)
