"""The operator commands of the tenancy contexts: ``kiln users``, ``kiln keys revoke``,
``kiln quotas set``, ``kiln oauth-clients create``. They run as a platform-admin CLI actor, and
every change they make is audited like one made through ``/admin/v1``."""

from __future__ import annotations

import getpass
import uuid
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import click

from kiln_platform.admin.authz import Actor, Role

if TYPE_CHECKING:
    from kiln_platform.db.database import Database
    from kiln_platform.settings import Settings

WithDb = Callable[[click.Context, Callable[["Database", "Settings"], Awaitable[Any]]], Any]
ROLES = [r.value for r in Role]


def cli_actor() -> Actor:
    """The actor of a ``kiln`` command: the operator at the console, platform-wide."""
    return Actor(f"cli:{getpass.getuser()}", Role.PLATFORM_ADMIN, None, source="cli")


async def tenant_id(session: Any, name: str) -> uuid.UUID:
    """A tenant's id from its name."""
    from kiln_platform.tenants.services import get_tenant_by_name

    return (await get_tenant_by_name(session, name)).id


def register(
    main: click.Group, keys: click.Group, with_db: WithDb, fail: Callable[[Exception], None]
) -> None:
    """Add the commands to ``kiln`` and ``kiln keys``."""
    from kiln_platform.errors import KilnError

    register_quotas(main, with_db, fail)

    @keys.command("revoke")
    @click.argument("key")
    @click.pass_context
    def keys_revoke(ctx: click.Context, key: str) -> None:
        """Revoke KEY (its id, displayed prefix, or secret); refused everywhere within 5 s."""
        from kiln_platform.admin.services import revoke_key

        async def action(db: Database, settings: Settings) -> str:
            async with db.sessions.begin() as session:
                view = await revoke_key(session, cli_actor(), key, settings.hmac_key(), None)
                return view.prefix

        try:
            click.echo(f"revoked {with_db(ctx.find_root(), action)}")
        except KilnError as exc:
            fail(exc)

    @main.group()
    def users() -> None:
        """Console users."""

    @users.command("create")
    @click.option("--email", required=True)
    @click.option("--role", required=True, type=click.Choice(ROLES))
    @click.option("--tenant", help="Tenant name (required for tenant roles).")
    @click.option("--password", prompt=True, hide_input=True, confirmation_prompt=True)
    @click.pass_context
    def users_create(
        ctx: click.Context, email: str, role: str, tenant: str | None, password: str
    ) -> None:
        """Create a console user with a role; prints its id."""
        from kiln_platform.users.schemas import UserCreate
        from kiln_platform.users.services import create_user

        async def action(db: Database, settings: Settings) -> str:
            async with db.sessions.begin() as session:
                tid = await tenant_id(session, tenant) if tenant else None
                data = UserCreate(email=email, password=password, role=role, tenant_id=tid)  # type: ignore[arg-type]
                return str((await create_user(session, cli_actor(), data)).id)

        try:
            click.echo(with_db(ctx.find_root(), action))
        except KilnError as exc:
            fail(exc)


def register_quotas(main: click.Group, with_db: WithDb, fail: Callable[[Exception], None]) -> None:
    """Add ``kiln quotas set``."""
    from kiln_platform.errors import KilnError

    @main.group()
    def quotas() -> None:
        """Plans and quotas."""

    @quotas.command("set")
    @click.option("--tenant", required=True, help="Tenant name.")
    @click.option("--key", "key_ref", help="Set a per-key override (id, prefix or secret).")
    @click.option("--rpm", type=click.IntRange(min=1), help="Requests per minute.")
    @click.option("--tpm", type=click.IntRange(min=1), help="Tokens (input + output) per minute.")
    @click.option("--concurrency", type=click.IntRange(min=1), help="Requests in flight.")
    @click.option("--monthly-budget", help="Monthly budget in currency units, e.g. 12.50.")
    @click.option("--budget-alerts", help="Alert thresholds, percent of the budget: 50,80,100.")
    @click.option("--clear", is_flag=True, help="Remove every limit not given here.")
    @click.pass_context
    def quotas_set(
        ctx: click.Context, *, tenant: str, key_ref: str | None, rpm: int | None, tpm: int | None,
        concurrency: int | None, monthly_budget: str | None, budget_alerts: str | None,
        clear: bool,
    ) -> None:  # fmt: skip
        """Set a tenant's (or a key's) limits; limits not given keep their value."""
        from decimal import Decimal, InvalidOperation

        from kiln_platform.admin.services import find_key
        from kiln_platform.errors import BadRequest
        from kiln_platform.quotas.schemas import Limits
        from kiln_platform.quotas.services import get_quotas, set_limits

        try:
            budget = None if monthly_budget is None else int(Decimal(monthly_budget) * 1_000_000)
        except InvalidOperation:
            fail(BadRequest(f"--monthly-budget: not an amount: {monthly_budget!r}"))
            return
        try:
            alerts = None if budget_alerts is None else [int(p) for p in budget_alerts.split(",")]
        except ValueError:
            fail(BadRequest(f"--budget-alerts: not percents: {budget_alerts!r}"))
            return

        async def action(db: Database, settings: Settings) -> Limits:
            actor = cli_actor()
            async with db.sessions.begin() as session:
                tid = await tenant_id(session, tenant)
                key_id = None
                if key_ref:
                    key_id = (await find_key(session, actor, key_ref, settings.hmac_key())).id
                view = await get_quotas(session, actor, tid)
                old = next((k.limits for k in view.keys if k.api_key_id == key_id), Limits())
                old = view.limits if key_id is None else old
                if clear:
                    old = Limits()
                new = Limits(
                    rpm=rpm or old.rpm, tpm=tpm or old.tpm,
                    concurrency=concurrency or old.concurrency,
                    monthly_budget_micros=old.monthly_budget_micros if budget is None else budget,
                    budget_alert_percents=alerts or old.budget_alert_percents,
                )  # fmt: skip
                return await set_limits(session, actor, tid, new, key_id)

        try:
            limits = with_db(ctx.find_root(), action)
        except KilnError as exc:
            fail(exc)
        click.echo(
            f"rpm={limits.rpm} tpm={limits.tpm} concurrency={limits.concurrency} "
            f"monthly_budget_micros={limits.monthly_budget_micros}"
        )
