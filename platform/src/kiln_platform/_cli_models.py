"""``kiln models upload | compile | jobs | route | import``: tensor models, their compiled
engines, which versions serve, and models brought as sources to build."""

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
    from kiln_platform.context import Database
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
    if job.kind == "build":  # an import: where it is, and the file and field it failed on
        where = "".join(f" {k}={v}" for k, v in (("file", job.error_file),
                                                  ("field", job.error_field)) if v)  # fmt: skip
        extra = f"\t{job.phase} {job.percent}%{where}"
        if job.status == "done":
            extra += "\t" + _accuracy_line(report.get("accuracy"))
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


# --- `kiln models import`: bring your own model (issue 16) --------------------------------------


def _accuracy_line(accuracy: dict[str, Any] | None) -> str:
    """The build's accuracy report in one line."""
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
    return f"accuracy: skipped ({accuracy.get('reason')})"


async def _follow_build(db: Database, runner: Any, job_id: uuid.UUID) -> CompileJobView:
    """Run the build here unless a server took it, with a progress bar on stderr until it ends."""
    from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn

    from kiln_platform.compiler import services

    async def watch(progress: Progress, task: Any) -> CompileJobView:
        while True:
            async with db.sessions() as session:
                job = await services.view(session, cli_actor(), job_id)
            progress.update(task, completed=job.percent, description=job.phase or job.status)
            if job.status in ("done", "failed"):
                return job
            await asyncio.sleep(0.3)

    columns = (TextColumn("{task.description:<18}"), BarColumn(), TaskProgressColumn())
    with Progress(*columns, transient=False) as progress:  # rich writes to stderr
        task = progress.add_task("received", total=100)
        watcher = asyncio.create_task(watch(progress, task))
        await runner.run_once(job_id)
        return await watcher


def register_import(
    models: click.Group, with_db: WithDb, fail: Callable[[Exception], None]
) -> None:
    """Add ``kiln models import`` to the ``kiln models`` group."""
    from kiln_platform.errors import KilnError

    @models.command("import")
    @click.argument("name")
    @click.argument("source", type=click.Path(exists=True, path_type=Path))
    @click.option("--task", type=click.Choice(["generate", "embeddings", "tensor"]))
    @click.option("--precision", type=click.Choice(["int4", "int8", "fp16", "fp32"]))
    @click.option("--target", type=click.Choice(["cpu", "cuda", "tensorrt"]))
    @click.option("--version", help="Version tag (default: the next number).")
    @click.option("--max-batch-size", type=int, help="The version's max batch size.")
    @click.option("--max-context", type=int, help="Tokens a request may use at most.")
    @click.option("--adapter-slots", type=int, help="LoRA adapters a worker holds at once.")
    @click.option("--no-wait", is_flag=True, help="Queue the build and return.")
    @click.pass_context
    def import_(
        ctx: click.Context, *, name: str, source: Path, task: str | None, precision: str | None,
        target: str | None, version: str | None, max_batch_size: int | None,
        max_context: int | None, adapter_slots: int | None, no_wait: bool,
    ) -> None:  # fmt: skip
        """Import a Hugging Face folder, a .gguf, a GenAI folder or an ONNX model (or an archive
        of one): stored as the version's source and built here unless a server takes the job,
        with a progress bar. The version is the last line of stdout."""
        import tempfile

        from kiln_platform.compiler import services
        from kiln_platform.compiler.runner import CompileRunner
        from kiln_platform.registry import imports
        from kiln_platform.registry.engine import EngineSettings
        from kiln_platform.registry.upload import upload_dir, upload_version
        from kiln_runtimes.store import ArtifactStore

        engine = msgspec.convert(
            {"max_batch_size": max_batch_size, "max_context": max_context,
             "adapter_slots": adapter_slots}, EngineSettings,
        )  # fmt: skip
        options = imports.ImportOptions(task, precision, target, version, engine)

        async def action(db: Database, settings: Settings) -> tuple[str, CompileJobView | None]:
            store = ArtifactStore(settings.store_dir)
            runner = CompileRunner(db, settings)
            with tempfile.TemporaryDirectory(dir=upload_dir(settings), prefix="import-") as tmp:
                staged = await asyncio.to_thread(
                    imports.stage, source, Path(tmp), settings.max_upload_bytes, task
                )
                if staged.kind == "tensor":
                    done = await upload_version(
                        db.sessions, store, settings, name, staged.root,
                        actor=cli_actor(), version=version,
                    )  # fmt: skip
                    return done.version, None
                job_id = await imports.start_import(
                    db.sessions, store, name, staged, options, actor=cli_actor(), env=runner.env
                )
            click.echo(f"build job {job_id}", err=True)
            if no_wait:
                async with db.sessions() as session:
                    job = await services.view(session, cli_actor(), job_id)
                return job.version, None
            job = await _follow_build(db, runner, job_id)
            return job.version, job

        try:
            built_version, job = with_db(ctx.find_root(), action)
        except (KilnError, msgspec.ValidationError) as exc:
            fail(exc)
        if job is not None and job.status == "failed":
            where = ", ".join(
                f"{k} {v}" for k, v in (("file", job.error_file), ("field", job.error_field)) if v
            )
            click.echo(
                f"error: build failed: {job.reason}" + (f" ({where})" * bool(where)), err=True
            )
            raise SystemExit(1)
        if job is not None:
            click.echo(_accuracy_line((job.report or {}).get("accuracy")))
        click.echo(built_version)
