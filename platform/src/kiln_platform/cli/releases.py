"""``kiln models alias | version``: point an alias at a version, read a version's lifecycle
and lineage (registered on the ``models`` group by ``cli.models``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click
import msgspec

from kiln_platform.cli._base import cli_actor, run_or_fail

if TYPE_CHECKING:
    from kiln_platform.db.database import Database
    from kiln_platform.settings import Settings


@click.command("alias")
@click.argument("name")
@click.argument("alias")
@click.argument("version")
@click.pass_context
def alias(ctx: click.Context, name: str, alias: str, version: str) -> None:
    """Point NAME@ALIAS at VERSION (created, or moved atomically; gateways follow within 2 s)."""
    from kiln_platform.registry.aliases import set_alias

    async def action(db: Database, settings: Settings) -> str:
        async with db.sessions.begin() as session:
            view = await set_alias(session, cli_actor(), name, alias, version)
        return f"{view.model}@{view.alias} -> {view.version}"

    click.echo(run_or_fail(ctx, action))


@click.command("version")
@click.argument("name")
@click.argument("version")
@click.pass_context
def version(ctx: click.Context, name: str, version: str) -> None:
    """Show one version as JSON: state, sunset, successor, lineage, engine settings."""
    from kiln_platform.registry.versions import view

    async def action(db: Database, settings: Settings) -> bytes:
        async with db.sessions() as session:
            found = await view(session, cli_actor(), name, version)
        return msgspec.json.format(msgspec.json.encode(found), indent=2)

    click.echo(run_or_fail(ctx, action).decode())
