"""A model's next version, picked safely: ``free_version`` counts registered versions and the
unfinished builds that will register theirs, and ``claim_name`` serializes the transactions that
pick one for a model name (a transaction-scoped PostgreSQL advisory lock), so concurrent imports
and uploads without a version each get their own number instead of a 409, and two with the same
version are refused at once rather than after a build."""

from __future__ import annotations

from typing import TYPE_CHECKING

from sqlalchemy import func, select

from kiln_platform.db.tables import CompileJob, Model, ModelVersion
from kiln_platform.errors import Conflict

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncSession

UNFINISHED = ("queued", "running")
"""The statuses of a build that has not registered its version yet."""


async def claim_name(session: AsyncSession, name: str) -> None:
    """Hold the model name's version picking until ``session``'s transaction ends."""
    key = func.hashtextextended(f"kiln.model-version:{name}", 0)
    await session.execute(select(func.pg_advisory_xact_lock(key)))


async def free_version(session: AsyncSession, name: str, task: str, version: str | None) -> str:
    """Check that ``name`` (if it exists) serves ``task`` and ``version`` is free, counting
    unfinished builds; pick the next number if no version is given."""
    model = await session.scalar(select(Model).where(Model.name == name))
    if model is not None and model.task != task:
        raise Conflict(f"the model {name!r} exists with task {model.task!r}, not {task}")
    taken: set[str] = set()
    if model is not None:
        taken |= set(
            await session.scalars(
                select(ModelVersion.version).where(ModelVersion.model_id == model.id)
            )
        )
    building = await session.scalars(
        select(CompileJob.version_name).where(
            CompileJob.kind == "build",
            CompileJob.model_name == name,
            CompileJob.status.in_(UNFINISHED),
        )
    )
    taken |= {v for v in building if v}
    if version is not None:
        if version in taken:
            raise Conflict(f"{name} version {version} already exists or is being built")
        return version
    n = len(taken) + 1
    while str(n) in taken:
        n += 1
    return str(n)
