"""``kiln users create``."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from kiln_platform.cli._base import ROLES, cli_actor, run_or_fail, tenant_id

if TYPE_CHECKING:
    from kiln_platform.db.database import Database
    from kiln_platform.settings import Settings


@click.group()
def users() -> None:
    """Console users."""


@users.command("create")
@click.option("--email", required=True)
@click.option("--role", required=True, type=click.Choice(ROLES))
@click.option("--tenant", help="Tenant name (required for tenant roles).")
@click.option("--password", prompt=True, hide_input=True, confirmation_prompt=True)
@click.pass_context
def create(ctx: click.Context, email: str, role: str, tenant: str | None, password: str) -> None:
    """Create a console user with a role; prints its id."""
    from kiln_platform.users.schemas import UserCreate
    from kiln_platform.users.services import create_user

    async def action(db: Database, settings: Settings) -> str:
        async with db.sessions.begin() as session:
            tid = await tenant_id(session, tenant) if tenant else None
            data = UserCreate(email=email, password=password, role=role, tenant_id=tid)  # type: ignore[arg-type]
            return str((await create_user(session, cli_actor(), data)).id)

    click.echo(run_or_fail(ctx, action))
