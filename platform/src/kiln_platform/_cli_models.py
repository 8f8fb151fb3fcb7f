"""``kiln models upload | compile | jobs | route``: tensor models, their compiled engines, and
which versions serve."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
import msgspec

from kiln_platform.admin._cli import cli_actor

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from kiln_platform.compiler.schemas import CompileJobView
    from kiln_platform.db.database import Database
    from kiln_platform.settings import Settings

    WithDb = Callable[[click.Context, Callable[[Database, Settings], Awaitable[Any]]], Any]


def _job_line(job: CompileJobView) -> str:
    report = job.report or {}
    extra = ""
    if report.get("max_abs_diff") is not None:
        extra = (
            f"\tmax_abs_diff={report['max_abs_diff']:.3g} cosine={report['cosine']:.6f}"
            f" ms/batch {report['reference_ms']:.2f}->{report['engine_ms']:.2f}"
        )
    reason = f"\t{job.reason}" if job.reason else ""
    return (
        f"{job.id}\t{job.model}\t{job.version}\t{job.target}/{job.precision}\t{job.status}"
        f"{reason}{extra}"
    )


def register(models: click.Group, with_db: WithDb, fail: Callable[[Exception], None]) -> None:
    """Add the tensor-model commands to the ``kiln models`` group."""
    from kiln_platform.errors import KilnError

    @models.command("upload")
    @click.argument("name")
    @click.argument("path", type=click.Path(exists=True, path_type=Path))
    @click.option("--version", help="Version tag (default: the next number).")
    @click.pass_context
    def upload(ctx: click.Context, name: str, path: Path, version: str | None) -> None:
        """Validate and register an ONNX model (.onnx, .zip/.tar or folder); prints the version."""
        from kiln_platform.registry.upload import upload_version
        from kiln_runtimes.store import ArtifactStore

        async def action(db: Database, settings: Settings) -> str:
            store = ArtifactStore(settings.store_dir)
            done = await upload_version(
                db.sessions, store, settings, name, path, actor=cli_actor(), version=version
            )
            specs = ", ".join(f"{s.name} {s.datatype}{s.shape}" for s in done.manifest.inputs)
            click.echo(f"registered {name} ({done.artifact_digest[:19]}) inputs: {specs}")
            return done.version

        try:
            click.echo(with_db(ctx.find_root(), action))
        except KilnError as exc:
            fail(exc)

    @models.command("compile")
    @click.argument("name")
    @click.option("--version", required=True, help="The version to compile.")
    @click.option("--target", default="cpu", show_default=True, help="cpu, cuda or tensorrt.")
    @click.option("--precision", default="fp32", show_default=True, help="fp32, int8 or fp16.")
    @click.option("--no-wait", is_flag=True, help="Queue the job and return.")
    @click.pass_context
    def compile_(
        ctx: click.Context, *, name: str, version: str, target: str, precision: str, no_wait: bool
    ) -> None:
        """Compile a version into a cached engine (runs here unless a server took the job)."""
        from kiln_platform.compiler import services
        from kiln_platform.compiler.runner import CompileRunner

        async def action(db: Database, settings: Settings) -> CompileJobView:
            async with db.sessions.begin() as session:
                job = await services.enqueue(session, cli_actor(), name, version, target, precision)
                job_id = job.id
            if not no_wait:
                await _wait(db, settings, CompileRunner(db, settings), job_id)
            async with db.sessions() as session:
                return await services.view(session, cli_actor(), job_id)

        try:
            job = with_db(ctx.find_root(), action)
        except KilnError as exc:
            fail(exc)
        click.echo(_job_line(job))
        if job.report:
            click.echo(msgspec.json.encode(job.report).decode())
        if job.status == "failed":
            raise SystemExit(1)

    @models.command("jobs")
    @click.option("--id", "job_id", type=click.UUID, help="Show one job with its full report.")
    @click.pass_context
    def jobs(ctx: click.Context, job_id: uuid.UUID | None) -> None:
        """List compile jobs (newest first)."""
        from kiln_platform.compiler import services

        async def action(db: Database, settings: Settings) -> list[CompileJobView]:
            async with db.sessions() as session:
                if job_id is not None:
                    return [await services.view(session, cli_actor(), job_id)]
                return await services.list_jobs(session, cli_actor())

        try:
            for job in with_db(ctx.find_root(), action):
                click.echo(_job_line(job))
                if job_id is not None and job.report:
                    click.echo(msgspec.json.encode(job.report).decode())
        except KilnError as exc:
            fail(exc)


async def _wait(db: Database, settings: Settings, runner: Any, job_id: uuid.UUID) -> None:
    """Run the job here if it is still queued; otherwise wait for whoever runs it."""
    from kiln_platform.compiler import services

    await runner.run_once(job_id)
    while True:
        async with db.sessions() as session:
            if (await services.view(session, cli_actor(), job_id)).status in ("done", "failed"):
                return
        await asyncio.sleep(0.5)


def register_routes(
    models: click.Group, with_db: WithDb, fail: Callable[[Exception], None]
) -> None:
    """Add ``kiln models route`` to the ``kiln models`` group."""
    from kiln_platform.errors import KilnError

    @models.command("route")
    @click.argument("name")
    @click.option("--stable", required=True, help="The version most tenants get.")
    @click.option("--canary", help="A version a share of tenants get (sticky per tenant).")
    @click.option("--percent", type=int, default=0, show_default=True, help="The canary's share.")
    @click.pass_context
    def route(ctx: click.Context, name: str, stable: str, canary: str | None, percent: int) -> None:
        """Route a model's traffic: promote (--stable V), canary, or roll back (--stable OLD)."""
        from kiln_platform.admin._cli import cli_actor
        from kiln_platform.registry.routes import set_route
        from kiln_platform.registry.schemas import RouteUpdate

        async def action(db: Database, settings: Settings) -> str:
            data = msgspec.convert(
                {"stable_version": stable, "canary_version": canary, "canary_percent": percent},
                RouteUpdate,
            )
            async with db.sessions.begin() as session:
                view = await set_route(session, cli_actor(), name, data)
            canary_part = f" canary={view.canary_version} {view.canary_percent}%" * bool(canary)
            return f"{name}: stable={view.stable_version}{canary_part}"

        try:
            click.echo(with_db(ctx.find_root(), action))
        except (KilnError, msgspec.ValidationError) as exc:
            fail(exc)
