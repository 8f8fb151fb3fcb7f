"""``kiln db upgrade``."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from kiln_platform.cli._base import with_db

if TYPE_CHECKING:
    from kiln_platform.db.database import Database
    from kiln_platform.settings import Settings


@click.group()
def db() -> None:
    """Database schema."""


@db.command("upgrade")
@click.pass_context
def upgrade(ctx: click.Context) -> None:
    """Apply migrations up to the newest revision."""

    async def done(db: Database, settings: Settings) -> None:
        click.echo("database is at the newest revision")

    with_db(ctx, done)
