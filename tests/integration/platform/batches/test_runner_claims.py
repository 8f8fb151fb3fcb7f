"""The batch runner's claims against a real database: a batch given back (its lines could not
be recorded) lets the next open batch through instead of being claimed again at once."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

from kiln_platform.batches.claims import Claim
from kiln_platform.batches.runner import BatchRunner
from kiln_platform.batches.tables import BatchJob
from kiln_platform.db.database import Database
from kiln_platform.settings import Settings
from tests.factories import make_tenant


async def test_a_batch_given_back_lets_the_next_one_be_claimed(db: Database) -> None:
    async with db.sessions.begin() as session:
        tenant = await make_tenant(session)
        now = datetime.now(UTC)
        jobs = [BatchJob(tenant_id=tenant, endpoint="/v1/embeddings", completion_window="24h",
                         status="in_progress", principal={}, expires_at=now + timedelta(days=1),
                         created_at=now - timedelta(minutes=m))
                for m in (2, 1)]  # fmt: skip
        session.add_all(jobs)
    older, newer = (j.id for j in jobs)
    runner = BatchRunner(Settings(batch_lease_s=60, batch_concurrency=0))  # claims by hand
    runner.start(SimpleNamespace(db=db))  # type: ignore[arg-type]  # what claims read
    first = await runner.claim()
    assert first is not None
    assert first.id == older
    await runner.give_back(Claim(first, first.status))
    second = await runner.claim()
    assert second is not None
    assert second.id == newer  # not the one given back
