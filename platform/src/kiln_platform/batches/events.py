"""A batch's end as a tenant webhook event (``batch.completed|failed|expired|cancelled``),
queued in the transaction that moves it to that status."""

from __future__ import annotations

from typing import TYPE_CHECKING

from kiln_platform.batches.files import public_id
from kiln_platform.webhooks.events import EventType, emit

if TYPE_CHECKING:
    import uuid

    from sqlalchemy.ext.asyncio import AsyncSession

    from kiln_platform.batches.tables import BatchJob

ENDED: dict[str, EventType] = {
    "completed": "batch.completed", "failed": "batch.failed", "expired": "batch.expired",
    "cancelled": "batch.cancelled",
}  # fmt: skip


async def ended(
    session: AsyncSession, job: BatchJob, status: str,
    output: uuid.UUID | None = None, errors: uuid.UUID | None = None,
) -> None:  # fmt: skip
    """Queue the event of ``job`` reaching the terminal ``status`` (no-op for other statuses)."""
    event = ENDED.get(status)
    if event is None:
        return
    files = {"output_file_id": output, "error_file_id": errors}
    data = {"id": public_id("batch_", job.id), "object": "batch", "status": status,
            "endpoint": job.endpoint, "metadata": job.metadata_}  # fmt: skip
    data |= {k: public_id("file-", v) for k, v in files.items() if v is not None}
    await emit(session, job.tenant_id, event, data)
