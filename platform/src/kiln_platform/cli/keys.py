"""``kiln keys create | revoke``."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from kiln_platform.cli._base import ROLES, SCOPES, cli_actor, run_or_fail, tenant_id

if TYPE_CHECKING:
    from kiln_platform.db.database import Database
    from kiln_platform.settings import Settings


@click.group()
def keys() -> None:
    """API keys."""


@keys.command("create")
@click.option("--tenant", required=True, help="Tenant name.")
@click.option("--name", "label", default="", help="A label for the key.")
@click.option(
    "--scope", "scopes", multiple=True, type=click.Choice(SCOPES),
    help="A scope (repeatable; default: inference).",
)  # fmt: skip
@click.option("--role", type=click.Choice(ROLES), help="Admin role (see README).")
@click.pass_context
def create(
    ctx: click.Context, tenant: str, label: str, scopes: tuple[str, ...], role: str | None
) -> None:
    """Create an API key; its secret is printed once, alone on the last line."""
    from kiln_platform.keys.schemas import KeyCreate
    from kiln_platform.keys.services import create_key

    async def action(db: Database, settings: Settings) -> tuple[str, str]:
        async with db.sessions.begin() as session:
            tid = await tenant_id(session, tenant)
            data = KeyCreate(name=label, scopes=list(scopes or ("inference",)), role=role)  # type: ignore[arg-type]
            made = await create_key(session, cli_actor(), tid, data, settings.hmac_key())
            return made.key.prefix, made.secret

    prefix, secret = run_or_fail(ctx, action)
    click.echo(f"created key {prefix} for tenant {tenant} (the secret is shown only now):")
    click.echo(secret)


@keys.command("revoke")
@click.argument("key")
@click.pass_context
def revoke(ctx: click.Context, key: str) -> None:
    """Revoke KEY (its id, displayed prefix, or secret); refused everywhere within 5 s."""
    from kiln_platform.keys.services import revoke_key

    async def action(db: Database, settings: Settings) -> str:
        async with db.sessions.begin() as session:
            view = await revoke_key(session, cli_actor(), key, settings.hmac_key(), None)
            return view.prefix

    click.echo(f"revoked {run_or_fail(ctx, action)}")
