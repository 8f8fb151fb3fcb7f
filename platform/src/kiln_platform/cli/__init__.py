"""The ``kiln`` command: one module per command group, each command a plain function over the
context services, acting as a platform-admin CLI actor and audited like ``/admin/v1``.

The platform builds every group but ``up``: serving includes the console, which imports the
platform, so ``kiln_console.cli`` composes the command (``kiln(up)``)."""

from __future__ import annotations

from pathlib import Path

import click

from kiln_platform.cli import (
    db,
    keys,
    models,
    oauth,
    quotas,
    reports,
    slo,
    tenants,
    users,
    webhooks,
    worker,
)
from kiln_platform.cli import imports as imports  # adds `kiln models import` to `models`


@click.pass_context
def _root(ctx: click.Context, data_dir: Path | None) -> None:
    ctx.obj = {"data_dir": data_dir}


def kiln(*extra: click.Command) -> click.Group:
    """The ``kiln`` group: every platform command, and ``extra`` ones."""
    data_dir = click.Option(
        ["--data-dir"], type=click.Path(path_type=Path), help="Kiln's data directory."
    )
    commands = [
        db.db, tenants.tenants, keys.keys, users.users, quotas.quotas, models.models,
        oauth.oauth_clients, oauth.oauth, reports.reports, slo.slo, slo.alerts, webhooks.webhooks,
        worker.worker, worker.simulate,
        *extra,
    ]  # fmt: skip
    return click.Group(
        "kiln", commands=commands, callback=_root, params=[data_dir],
        help="Kiln: a serverless, multi-tenant inference platform.",
    )  # fmt: skip
