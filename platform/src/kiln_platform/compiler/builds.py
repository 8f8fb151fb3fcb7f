"""Build jobs: a stored source built into a served folder, then registered as a version.

The build is ``python -m kiln_runtimes.build`` in its own process (torch and transformers live
only there), with the compile runner's minimal environment. Its progress lines update the job's
phase and percent as they come. Success stores the folder, registers the version (manifest,
engine settings, accuracy report, source digest) and marks the job done in one transaction; the
pool manager's next reconcile serves it. Failure marks the job failed with the file and field
the build named, and removes the source tree unless a version or another build still uses it:
a failed import leaves no tree and no version row.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec
import structlog
from sqlalchemy import func, select, text, update

from kiln_platform.db.tables import CompileJob, Model, ModelVersion
from kiln_platform.registry.artifacts import local_tree
from kiln_platform.registry.engine import decode
from kiln_platform.registry.imports import build_input, source_in_use
from kiln_platform.registry.services import register_version
from kiln_platform.registry.upload import upload_dir
from kiln_runtimes.protocol import BuildFailure, BuildProgress, BuildReport

if TYPE_CHECKING:
    import uuid

    from kiln_platform.db.database import Database
    from kiln_platform.settings import Settings
    from kiln_runtimes.store import ArtifactStore

log = structlog.get_logger("kiln.builds")
_TERM_GRACE_S = 30.0
"""How long a cancelled build gets to remove what it staged before it is killed."""


def command(job: CompileJob, source: Path, out: Path, settings: Settings) -> list[str]:
    """The build's command line."""
    cmd = [
        sys.executable, "-m", "kiln_runtimes.build", str(source), str(out),
        "--task", str(job.task), "--precision", job.precision, "--target", job.target,
        "--name", str(job.model_name), "--source-label", f"import:{job.source_digest}",
    ]  # fmt: skip
    scoring = bool((job.engine_settings or {}).get("score_prompts"))
    if job.task == "generate" and not scoring:  # logits of the last position only (faster)
        cmd += ["--prune-lm-head"]
    if settings.worker_max_memory_bytes:
        cmd += ["--max-memory-bytes", str(settings.worker_max_memory_bytes)]
    return cmd


async def run(
    db: Database, store: ArtifactStore, settings: Settings, env: dict[str, str],
    job_id: uuid.UUID,
) -> None:  # fmt: skip
    """Run one claimed build job to its end (done or failed)."""
    async with db.sessions() as session:
        job = await session.get(CompileJob, job_id)
    assert job is not None
    assert job.source_digest is not None
    try:
        tree = await local_tree(store, job.source_digest)
    except FileNotFoundError:
        await _fail(db, store, job, BuildFailure(error="the source is not in the artifact store"))
        return
    scratch = upload_dir(settings) / f"build-{job.id}"
    shutil.rmtree(scratch, ignore_errors=True)  # what a killed attempt left
    scratch.mkdir(parents=True)
    try:
        proc = await asyncio.create_subprocess_exec(
            *command(job, build_input(tree), scratch / "model", settings),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env,
        )  # fmt: skip
        try:
            last, stderr = await _follow(db, job.id, proc)
        except asyncio.CancelledError:  # shutting down: the build unwinds on SIGTERM
            await _stop(proc)
            raise
        await _finish(db, store, job, last, stderr, proc.returncode, tree)
    except Exception as exc:  # a failure of ours, not of the input: fail, never retry forever
        log.exception("build job failed", job=str(job.id))
        await _fail(db, store, job, BuildFailure(error=f"{type(exc).__name__}: {exc}"))
    finally:
        await asyncio.to_thread(shutil.rmtree, scratch, ignore_errors=True)


async def _follow(
    db: Database, job_id: uuid.UUID, proc: asyncio.subprocess.Process
) -> tuple[bytes, str]:
    """Record each progress line; returns the last stdout line and the tail of stderr."""
    assert proc.stdout is not None
    assert proc.stderr is not None
    tail: collections.deque[bytes] = collections.deque(maxlen=40)

    async def drain(stream: asyncio.StreamReader) -> None:
        async for line in stream:
            tail.append(line)

    errors = asyncio.create_task(drain(proc.stderr))
    last = b""
    async for line in proc.stdout:
        if not line.strip():
            continue
        last = line
        with contextlib.suppress(msgspec.ValidationError, msgspec.DecodeError):
            step = msgspec.json.decode(line, type=BuildProgress)
            async with db.sessions.begin() as session:
                await session.execute(
                    update(CompileJob)
                    .where(CompileJob.id == job_id)
                    .values(phase=step.phase, percent=step.percent)
                )
    await errors
    await proc.wait()
    return last, b"".join(tail).decode(errors="replace")


async def _stop(proc: asyncio.subprocess.Process) -> None:
    with contextlib.suppress(ProcessLookupError):
        proc.terminate()
    try:
        await asyncio.wait_for(proc.wait(), _TERM_GRACE_S)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()


async def _finish(  # noqa: PLR0917 (the build's outcome)
    db: Database, store: ArtifactStore, job: CompileJob, last: bytes, stderr: str,
    returncode: int | None, tree: Path,
) -> None:  # fmt: skip
    if returncode != 0:
        failure = None
        with contextlib.suppress(msgspec.ValidationError, msgspec.DecodeError):
            failure = _relative(msgspec.json.decode(last, type=BuildFailure), tree)
        if failure is None:
            lines = stderr.strip().splitlines()
            failure = BuildFailure(error=lines[-1] if lines else f"build exited with {returncode}")
        await _fail(db, store, job, failure)
        return
    report = msgspec.json.decode(last, type=BuildReport)
    digest = await asyncio.to_thread(store.put_dir, Path(report.out_dir))
    async with db.sessions.begin() as session:
        registered = await register_version(
            session, report.manifest, str(job.version_name), digest,
            engine=decode(job.engine_settings), accuracy=report.accuracy,
            source_digest=job.source_digest,
        )  # fmt: skip
        if registered:
            version_id = await session.scalar(
                select(ModelVersion.id)
                .join(Model, Model.id == ModelVersion.model_id)
                .where(Model.name == job.model_name, ModelVersion.version == job.version_name)
            )
            await session.execute(
                update(CompileJob)
                .where(CompileJob.id == job.id)
                .values(
                    status="done", phase="ready", percent=100, model_version_id=version_id,
                    finished_at=text("now()"),
                    report={"artifact_digest": digest, "seconds": report.seconds,
                            "accuracy": msgspec.to_builtins(report.accuracy)},
                )
            )  # fmt: skip
    if registered:
        log.info("build registered", job=str(job.id), model=job.model_name,
                 version=job.version_name, seconds=report.seconds)  # fmt: skip
        return
    async with db.sessions() as session:
        shared = await session.scalar(
            select(func.count())
            .select_from(ModelVersion)
            .where(ModelVersion.artifact_digest == digest)
        )
    if not shared:
        await asyncio.to_thread(store.remove_tree, digest)
    message = f"{job.model_name} version {job.version_name} was registered meanwhile"
    await _fail(db, store, job, BuildFailure(error=message, field="version"))


def _relative(failure: BuildFailure, tree: Path) -> BuildFailure:
    """Name a file by its path in the source, not in the store (the source itself: ``source``)."""
    if failure.file is None or not failure.file.startswith(str(tree)):
        return failure
    inside = failure.file[len(str(tree)) :].lstrip("/")
    return msgspec.structs.replace(failure, file=inside or "source")


async def _fail(db: Database, store: ArtifactStore, job: CompileJob, failure: BuildFailure) -> None:
    """The job failed: the source goes unless something still needs it, then the job says why
    and where (so a client that reads ``failed`` finds nothing of it left; a restart between the
    two fails the job again, its source missing)."""
    assert job.source_digest is not None
    async with db.sessions() as session:
        needed = await source_in_use(session, job.source_digest, job.id)
    if not needed:
        await asyncio.to_thread(store.remove_tree, job.source_digest)
    async with db.sessions.begin() as session:
        await session.execute(
            update(CompileJob)
            .where(CompileJob.id == job.id)
            .values(
                status="failed", reason=failure.error[:2000], error_file=failure.file,
                error_field=failure.field, finished_at=text("now()"),
            )
        )  # fmt: skip
    log.info("build failed", job=str(job.id), error=failure.error, file=failure.file,
             field=failure.field)  # fmt: skip
