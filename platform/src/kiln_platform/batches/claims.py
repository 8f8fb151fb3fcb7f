"""A batch a runner holds, as its lease renewal last saw it."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kiln_platform.batches.tables import BatchJob


@dataclass(slots=True)
class Claim:
    """A batch this gateway holds: what the lease renewal last saw of it."""

    job: BatchJob
    status: str
    lost: bool = False
    revoked: bool = False
    """The API key or OAuth client the batch runs as was revoked (or deleted)."""

    def stopping(self) -> bool:
        """No new line may start: cancelled, expired, its key or client revoked, or the lease
        was lost."""
        expired = datetime.now(UTC) >= self.job.expires_at
        return self.lost or self.revoked or self.status != "in_progress" or expired
