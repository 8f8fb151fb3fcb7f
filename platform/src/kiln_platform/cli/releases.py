"""``kiln models alias | version | shadow``: point an alias at a version, read a version's
lifecycle and lineage, copy a share of requests to a candidate (registered on the ``models``
group by ``cli.models``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click
import msgspec

from kiln_platform.cli._base import cli_actor, fail, run_or_fail

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


@click.command("shadow")
@click.argument("name")
@click.option("--version", "candidate", help="Copy a share of NAME's requests to this version.")
@click.option("--percent", type=int, default=20, show_default=True, help="The share copied.")
@click.option("--off", is_flag=True, help="Stop copying NAME's requests.")
@click.pass_context
def shadow(ctx: click.Context, name: str, candidate: str | None, percent: int, off: bool) -> None:
    """Shadow traffic: set (--version V [--percent P]), stop (--off), or show (neither) NAME's
    candidate and the comparison reports as JSON (gateways follow within 2 s)."""
    from kiln_platform.shadow import services
    from kiln_platform.shadow.schemas import ShadowUpdate

    async def action(db: Database, settings: Settings) -> bytes:
        async with db.sessions.begin() as session:
            if off:
                await services.delete_shadow(session, cli_actor(), name)
            elif data is not None:
                await services.set_shadow(session, cli_actor(), name, data)
            found = await services.view(session, cli_actor(), name)
        return msgspec.json.format(msgspec.json.encode(found), indent=2)

    data = None
    if candidate is not None:
        try:
            data = msgspec.convert({"version": candidate, "percent": percent}, ShadowUpdate)
        except msgspec.ValidationError as exc:
            fail(exc)
    click.echo(run_or_fail(ctx, action).decode())
