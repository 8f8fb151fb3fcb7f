"""What every ``kiln`` command shares: the settings, a database for one action, the CLI actor,
and failing with a message instead of a traceback."""

from __future__ import annotations

import asyncio
import getpass
import sys
import uuid
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, NoReturn

import click
from pydantic import ValidationError

from kiln_platform.admin.authz import Actor, Role
from kiln_platform.settings import Settings

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncSession

    from kiln_platform.db.database import Database

Action = Callable[["Database", Settings], Awaitable[Any]]
ROLES = [r.value for r in Role]
SCOPES = ["inference", "admin:read", "admin:write"]


def settings_of(ctx: click.Context, **overrides: Any) -> Settings:
    """The settings, or a usage error naming each bad ``KILN_*`` variable (no traceback)."""
    values = {k: v for k, v in {**ctx.find_root().obj, **overrides}.items() if v is not None}
    try:
        return Settings(**values)
    except ValidationError as exc:
        bad = "; ".join(
            f"KILN_{'_'.join(map(str, e['loc'])).upper()}: {e['msg']} (got {e['input']!r})"
            for e in exc.errors()
        )
        raise click.UsageError(f"invalid settings: {bad}") from None


def with_db(ctx: click.Context, action: Action) -> Any:
    """Run ``action`` with the database (migrated first) and the settings."""
    from kiln_platform.db.database import open_database

    settings = settings_of(ctx)

    async def run() -> Any:
        async with open_database(settings) as db:
            return await action(db, settings)

    return asyncio.run(run())


def run_or_fail(ctx: click.Context, action: Action) -> Any:
    """``with_db``, with Kiln's own errors printed as ``error: ...`` and exit status 1."""
    from kiln_platform.errors import KilnError

    try:
        return with_db(ctx, action)
    except KilnError as exc:
        fail(exc)


def fail(exc: Exception) -> NoReturn:
    """Print the error and exit with status 1."""
    click.echo(f"error: {exc}", err=True)
    sys.exit(1)


def cli_actor() -> Actor:
    """The actor of a ``kiln`` command: the operator at the console, platform-wide."""
    return Actor(f"cli:{getpass.getuser()}", Role.PLATFORM_ADMIN, None, source="cli")


async def tenant_id(session: AsyncSession, name: str) -> uuid.UUID:
    """A tenant's id from its name."""
    from kiln_platform.tenants.services import tenant_id_of

    return await tenant_id_of(session, name)
