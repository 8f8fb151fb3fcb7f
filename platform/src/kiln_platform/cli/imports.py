"""``kiln models import``: bring your own model (a Hugging Face folder, a .gguf, a GenAI folder
or an ONNX model, or an archive of one), built here unless a server takes the job."""

from __future__ import annotations

import asyncio
import tempfile
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
import msgspec

from kiln_platform.cli._base import cli_actor, run_or_fail
from kiln_platform.cli.models import accuracy_line, models

if TYPE_CHECKING:
    from kiln_platform.compiler.runner import CompileRunner
    from kiln_platform.compiler.schemas import CompileJobView
    from kiln_platform.db.database import Database
    from kiln_platform.registry.imports import ImportOptions
    from kiln_platform.settings import Settings


async def _follow(db: Database, runner: CompileRunner, job_id: uuid.UUID) -> CompileJobView:
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


async def _import(  # noqa: PLR0917 (the command's arguments, passed on)
    db: Database, settings: Settings, name: str, source: Path, options: ImportOptions, wait: bool
) -> tuple[str | None, CompileJobView | None]:
    """Stage the source; register a tensor model at once, or queue (and follow) its build."""
    from kiln_platform.compiler import services
    from kiln_platform.compiler.runner import CompileRunner
    from kiln_platform.registry import imports
    from kiln_platform.registry.upload import upload_dir, upload_version

    store = settings.store()
    runner = CompileRunner(db, settings)
    with tempfile.TemporaryDirectory(dir=upload_dir(settings), prefix="import-") as tmp:
        staged = await asyncio.to_thread(
            imports.stage, source, Path(tmp), settings.max_upload_bytes, options.task
        )
        if staged.kind == "tensor":
            done = await upload_version(
                db.sessions, store, settings, name, staged.root,
                actor=cli_actor(), version=options.version,
            )  # fmt: skip
            return done.version, None
        job_id = await imports.start_import(
            db.sessions, store, name, staged, options, actor=cli_actor(), env=runner.env
        )
    click.echo(f"build job {job_id}", err=True)
    if not wait:
        async with db.sessions() as session:
            job = await services.view(session, cli_actor(), job_id)
        return job.version, None
    job = await _follow(db, runner, job_id)
    return job.version, job


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
@click.option("--score-prompts", is_flag=True, default=None,
              help="Keep every position's logits: requests may score their prompt.")  # fmt: skip
@click.option("--no-wait", is_flag=True, help="Queue the build and return.")
@click.pass_context
def import_(
    ctx: click.Context, *, name: str, source: Path, task: str | None, precision: str | None,
    target: str | None, version: str | None, max_batch_size: int | None,
    max_context: int | None, adapter_slots: int | None, score_prompts: bool | None,
    no_wait: bool,
) -> None:  # fmt: skip
    """Import a Hugging Face folder, a .gguf, a GenAI folder or an ONNX model (or an archive
    of one): stored as the version's source and built here unless a server takes the job,
    with a progress bar. The version is the last line of stdout."""
    from kiln_platform.registry import imports
    from kiln_platform.registry.engine import EngineSettings

    engine = msgspec.convert(
        {"max_batch_size": max_batch_size, "max_context": max_context,
         "adapter_slots": adapter_slots, "score_prompts": score_prompts}, EngineSettings,
    )  # fmt: skip
    options = imports.ImportOptions(task, precision, target, version, engine)

    async def action(db: Database, settings: Settings) -> tuple[str | None, Any]:
        return await _import(db, settings, name, source, options, not no_wait)

    built_version, job = run_or_fail(ctx, action)
    if job is not None and job.status == "failed":
        where = ", ".join(
            f"{k} {v}" for k, v in (("file", job.error_file), ("field", job.error_field)) if v
        )
        click.echo(f"error: build failed: {job.reason}" + (f" ({where})" * bool(where)), err=True)
        raise SystemExit(1)
    if job is not None:
        click.echo(accuracy_line((job.report or {}).get("accuracy")))
    click.echo(built_version)
