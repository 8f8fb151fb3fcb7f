"""``kiln oauth-clients create`` and ``kiln oauth keys rotate``."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from kiln_platform.cli._base import SCOPES, cli_actor, run_or_fail, tenant_id

if TYPE_CHECKING:
    from kiln_platform.db.database import Database
    from kiln_platform.oauth.schemas import ClientCreated
    from kiln_platform.settings import Settings


@click.group("oauth-clients")
def oauth_clients() -> None:
    """OAuth2 clients (client credentials grant)."""


@oauth_clients.command("create")
@click.option("--tenant", required=True, help="Tenant name.")
@click.option("--name", "label", default="", help="A label for the client.")
@click.option(
    "--scope", "scopes", multiple=True, type=click.Choice(SCOPES),
    help="A scope its tokens may carry (repeatable; default: inference).",
)  # fmt: skip
@click.pass_context
def create(ctx: click.Context, tenant: str, label: str, scopes: tuple[str, ...]) -> None:
    """Create a client; its id and secret are the last two lines (the secret shown once)."""
    from kiln_platform.oauth.schemas import ClientCreate
    from kiln_platform.oauth.services import create_client

    async def action(db: Database, settings: Settings) -> ClientCreated:
        async with db.sessions.begin() as session:
            tid = await tenant_id(session, tenant)
            data = ClientCreate(name=label, scopes=list(scopes or ("inference",)))  # type: ignore[arg-type]
            return await create_client(session, cli_actor(), tid, data, settings.hmac_key())

    made = run_or_fail(ctx, action)
    click.echo(f"created OAuth client for tenant {tenant} with scopes "
               f"{' '.join(made.client.scopes)} (the secret is shown only now):")  # fmt: skip
    click.echo(made.client.client_id)
    click.echo(made.client_secret)


@click.group("oauth")
def oauth() -> None:
    """The OAuth2 authorization server."""


@oauth.group("keys")
def signing_keys() -> None:
    """JWT signing keys."""


@signing_keys.command("rotate")
@click.pass_context
def rotate(ctx: click.Context) -> None:
    """Add a new active signing key; old ones stay in the JWKS until their tokens expire."""
    from kiln_platform.oauth.services import rotate_keys

    async def action(db: Database, settings: Settings) -> str:
        async with db.sessions.begin() as session:
            return await rotate_keys(session, cli_actor(), settings.hmac_key())

    click.echo(f"active signing key: {run_or_fail(ctx, action)}")
