"""``kiln reports export``: a cost report streamed from the database to a file or stdout.

Rows go from PostgreSQL's server-side cursor to the output chunk by chunk, so memory stays flat
however long the range.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

import click

from kiln_platform.cli._base import cli_actor, run_or_fail, tenant_id
from kiln_platform.reports.schemas import DEFAULT_GROUPS, GROUPS

if TYPE_CHECKING:
    from kiln_platform.db.database import Database
    from kiln_platform.settings import Settings


def _sink(output: Path | None) -> BinaryIO:
    """The output file, or stdout's bytes (left open)."""
    return output.open("wb") if output else open(sys.stdout.fileno(), "wb", closefd=False)


@click.group()
def reports() -> None:
    """Finance reports."""


@reports.command("export")
@click.option("--from", "start", required=True, help="ISO 8601 date or datetime (inclusive).")
@click.option("--to", "end", required=True, help="ISO 8601 date or datetime (exclusive).")
@click.option("--format", "fmt", type=click.Choice(["csv", "json"]), default="csv",
              show_default=True)  # fmt: skip
@click.option("--output", type=click.Path(dir_okay=False, path_type=Path),
              help="Write here instead of stdout.")  # fmt: skip
@click.option("--group-by", default=DEFAULT_GROUPS, show_default=True,
              help=f"Comma-separated: {', '.join(GROUPS)}.")  # fmt: skip
@click.option("--tenant", help="Only this tenant (name).")
@click.pass_context
def export(
    ctx: click.Context, *, start: str, end: str, fmt: str, output: Path | None, group_by: str,
    tenant: str | None,
) -> None:  # fmt: skip
    """Export costs in [FROM, TO) as CSV or JSON (columns: docs/billing.md)."""
    from kiln_platform.reports import services

    async def action(db: Database, settings: Settings) -> None:
        tid = None
        if tenant:
            async with db.sessions() as session:
                tid = await tenant_id(session, tenant)
        query = services.cost_query(cli_actor(), start, end, group_by, tid)
        encode = services.stream_csv if fmt == "csv" else services.stream_json
        with _sink(output) as out:
            async for chunk in encode(db.sessions.begin, query):
                out.write(chunk)

    run_or_fail(ctx, action)
