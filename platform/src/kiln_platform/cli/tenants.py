"""``kiln tenants create``."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click
import msgspec

from kiln_platform.cli._base import cli_actor, fail, run_or_fail

if TYPE_CHECKING:
    from kiln_platform.db.database import Database
    from kiln_platform.settings import Settings


@click.group()
def tenants() -> None:
    """Tenants."""


@tenants.command("create")
@click.argument("name")
@click.option("--weight", type=float, default=1.0, show_default=True, help="Fair-share weight.")
@click.pass_context
def create(ctx: click.Context, name: str, weight: float) -> None:
    """Create a tenant."""
    from kiln_platform.tenants.schemas import TenantCreate
    from kiln_platform.tenants.services import create_tenant

    async def action(db: Database, settings: Settings) -> str:
        async with db.sessions.begin() as session:
            return str((await create_tenant(session, cli_actor(), data)).id)

    try:  # checked as the API checks it (a Struct's constructor does not)
        data = msgspec.convert({"name": name, "weight": weight}, TenantCreate)
    except msgspec.ValidationError as exc:
        fail(exc)
    click.echo(run_or_fail(ctx, action))
