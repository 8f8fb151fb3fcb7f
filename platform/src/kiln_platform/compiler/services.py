"""Compile jobs: enqueue (one row per engine cache key), claim with SKIP LOCKED, finish."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sqlalchemy import select, text, update
from sqlalchemy.dialects.postgresql import insert

from kiln_platform.admin.authz import require
from kiln_platform.audit.services import record
from kiln_platform.compiler.schemas import CompileJobView
from kiln_platform.db.tables import CompileJob, Model, ModelVersion
from kiln_platform.db.views import view_of
from kiln_platform.errors import BadRequest, NotFound
from kiln_platform.registry.versions import find_version
from kiln_runtimes.engines import engine_key, validate_target

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

    from kiln_platform.admin.authz import Actor
    from kiln_runtimes.protocol import CompileReport


@dataclass(frozen=True, slots=True)
class ClaimedJob:
    """A job this process now runs, with what the compiler needs."""

    id: uuid.UUID
    artifact_digest: str
    target: str
    precision: str
    kind: str = "compile"
    """``compile``, or ``build`` (``compiler.builds``: no version yet, a source digest)."""


_CLAIM = text(
    """
    UPDATE compile_jobs SET status = 'running', started_at = now(), attempts = attempts + 1
    WHERE id = (
        SELECT id FROM compile_jobs
        WHERE status = 'queued' AND (CAST(:only AS uuid) IS NULL OR id = CAST(:only AS uuid))
        ORDER BY created_at
        FOR UPDATE SKIP LOCKED
        LIMIT 1
    )
    RETURNING id, kind, model_version_id, target, precision
    """
)


async def enqueue(  # noqa: PLR0917 (who, what, and for which target)
    session: AsyncSession, actor: Actor, model: str, version: str, target: str, precision: str
) -> CompileJob:
    """Queue a compile (platform-admin, audited as ``model.compile``); an identical one (same
    cache key) is returned, a failed one requeued."""
    require(actor, "compile-jobs", write=True)
    found_model, found_version = await find_version(session, model, version)
    if found_model.task != "tensor":
        raise BadRequest(f"{model} is a {found_model.task} model; only tensor models compile")
    try:
        checked_target, checked_precision = validate_target(target, precision)
    except ValueError as exc:
        raise BadRequest(str(exc)) from None
    key = engine_key(found_version.artifact_digest, checked_target, checked_precision)
    await session.execute(
        insert(CompileJob)
        .values(
            id=uuid.uuid4(),
            model_version_id=found_version.id,
            cache_key=key.digest,
            target=target,
            precision=precision,
            hardware=key.hardware,
            status="queued",
        )
        .on_conflict_do_nothing(index_elements=["cache_key"])
    )
    job = await session.scalar(select(CompileJob).where(CompileJob.cache_key == key.digest))
    assert job is not None
    if job.status == "failed":
        job.status, job.reason, job.finished_at = "queued", None, None
    await session.flush()
    await record(session, actor, "model.compile", "compile-job", job.id, None,
                 after={"model": model, "version": version, "target": target,
                        "precision": precision, "status": job.status})  # fmt: skip
    return job


def lock_key(job_id: uuid.UUID) -> int:
    """The job's advisory-lock key: a runner holds it, on its own connection, while it runs."""
    return int.from_bytes(job_id.bytes[:8], "big", signed=True)


async def claim(
    session: AsyncSession | AsyncConnection, only: uuid.UUID | None = None, *, hold: bool = False
) -> ClaimedJob | None:
    """Take the oldest queued job (or ``only``) that nobody else holds; it becomes running.

    ``hold``: also take the job's session-level advisory lock on this connection, in the same
    transaction, so the job is never seen running without a live owner (see ``recover``).
    """
    row = (await session.execute(_CLAIM, {"only": str(only) if only else None})).first()
    if row is None:
        return None
    if hold:
        await session.execute(text("SELECT pg_advisory_lock(:k)"), {"k": lock_key(row.id)})
    if row.kind == "build":
        return ClaimedJob(row.id, "", row.target, row.precision, "build")
    digest = await session.scalar(
        select(ModelVersion.artifact_digest).where(ModelVersion.id == row.model_version_id)
    )
    return ClaimedJob(row.id, str(digest), row.target, row.precision)


async def finish(
    session: AsyncSession | AsyncConnection,
    job_id: uuid.UUID,
    report: CompileReport | None,
    reason: str | None,
) -> None:
    """Record a job's end: done with its report, or failed with the reason."""
    import msgspec

    values: dict[str, object] = {"finished_at": text("now()")}
    if report is not None:
        values.update(status="done", engine_digest=report.engine_digest)
        values["report"] = msgspec.to_builtins(report)
    else:
        values.update(status="failed", reason=reason or "unknown failure")
    await session.execute(update(CompileJob).where(CompileJob.id == job_id).values(**values))


async def requeue(session: AsyncSession | AsyncConnection, job_id: uuid.UUID) -> None:
    """Put a running job back in the queue (its runner is stopping)."""
    await session.execute(
        update(CompileJob)
        .where(CompileJob.id == job_id, CompileJob.status == "running")
        .values(status="queued", started_at=None)
    )


async def recover(session: AsyncSession) -> list[uuid.UUID]:
    """Requeue running jobs whose runner is gone: nobody holds their advisory lock any more
    (the lock went with the killed process's connection)."""
    running = await session.scalars(
        select(CompileJob.id)
        .where(CompileJob.status == "running")
        .with_for_update(skip_locked=True)
    )
    orphans = [
        job_id
        for job_id in list(running)
        if await session.scalar(
            text("SELECT pg_try_advisory_xact_lock(:k)"), {"k": lock_key(job_id)}
        )
    ]
    if orphans:
        await session.execute(
            update(CompileJob)
            .where(CompileJob.id.in_(orphans))
            .values(status="queued", started_at=None)
        )
    return orphans


async def view(session: AsyncSession, actor: Actor, job_id: uuid.UUID) -> CompileJobView:
    """One job (platform-admin), or ``NotFound``."""
    require(actor, "compile-jobs")
    jobs = await _views(session, CompileJob.id == job_id)
    if not jobs:
        raise NotFound(f"compile job {job_id} does not exist")
    return jobs[0]


async def list_jobs(session: AsyncSession, actor: Actor, limit: int = 100) -> list[CompileJobView]:
    """The newest jobs first (platform-admin)."""
    require(actor, "compile-jobs")
    return await _views(session, None, limit)


async def _views(session: AsyncSession, where: object, limit: int = 100) -> list[CompileJobView]:
    query = (
        select(CompileJob, Model.name, ModelVersion.version)
        .outerjoin(ModelVersion, ModelVersion.id == CompileJob.model_version_id)
        .outerjoin(Model, Model.id == ModelVersion.model_id)
        .order_by(CompileJob.created_at.desc())
        .limit(limit)
    )
    if where is not None:
        query = query.where(where)  # type: ignore[arg-type]
    return [
        view_of(
            CompileJobView,
            job,
            id=str(job.id),
            model=name or str(job.model_name),
            version=version or str(job.version_name),
        )
        for job, name, version in (await session.execute(query)).all()
    ]
