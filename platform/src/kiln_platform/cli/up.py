"""``kiln up``: serve an app built by the caller's factory (the console's full app: the
platform cannot import the console, so ``kiln_console.cli`` hands the factory in)."""

from __future__ import annotations

import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import click

from kiln_platform.cli._base import settings_of, with_db
from kiln_platform.cli.models import has_models, import_bundled
from kiln_platform.settings import GRACEFUL_SHUTDOWN_S

if TYPE_CHECKING:
    from litestar import Litestar

    from kiln_platform.settings import Settings

AppFactory = Callable[["Settings"], "Litestar"]


def command(create_app: AppFactory) -> click.Command:
    """``kiln up``, serving ``create_app(settings)``."""

    @click.command()
    @click.option("--host")
    @click.option("--port", type=int)
    @click.option("--data-dir", "local_data_dir", type=click.Path(path_type=Path))
    @click.option(
        "--import/--no-import", "do_import", default=True, help="Import bundled models first."
    )
    @click.pass_context
    def up(
        ctx: click.Context, host: str | None, port: int | None, local_data_dir: Path | None,
        do_import: bool,
    ) -> None:  # fmt: skip
        """Run Kiln (gateway, pool supervisor, workers) until Ctrl-C or SIGTERM."""
        if local_data_dir is not None:
            ctx.find_root().obj["data_dir"] = local_data_dir
        settings = settings_of(ctx, host=host, port=port)
        if do_import and not with_db(ctx, has_models):
            ctx.invoke(import_bundled, only=())
        serve(create_app, settings)

    return up


def serve(create_app: AppFactory, settings: Settings) -> None:
    """Serve ``create_app(settings)`` with uvicorn until Ctrl-C or SIGTERM (then drain and exit
    cleanly)."""
    import uvicorn

    from kiln_platform.client_limits import ClientLimits, protocol

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
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
        # header and send timeouts, connections per client (uvicorn bounds none of them)
        http=protocol(ClientLimits.from_settings(settings)),
        ws="none",  # Kiln serves no websockets: an upgrade request is plain HTTP
        # X-Forwarded-* only from KILN_FORWARDED_ALLOW_IPS (never uvicorn's FORWARDED_ALLOW_IPS
        # environment default, which trusts any local process)
        proxy_headers=bool(settings.forwarded_allow_ips.strip()),
        forwarded_allow_ips=settings.forwarded_allow_ips.strip() or "",
    )
