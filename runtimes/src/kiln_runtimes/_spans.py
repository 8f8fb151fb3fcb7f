"""The worker's spans of one request: the stages the batcher and the engine timed themselves."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from kiln_runtimes import tracing

if TYPE_CHECKING:
    from kiln_runtimes._batch_types import Ticket
    from kiln_runtimes.protocol import GenerateChunk


def _wall_ns(monotonic_s: float) -> int:
    """A ``time.monotonic`` reading (the batch queue's clock) as wall-clock nanoseconds."""
    return time.time_ns() - time.monotonic_ns() + int(monotonic_s * 1e9)


def ticket_spans(ticket: Ticket) -> None:
    """``worker queue`` and ``batch compute`` of a settled ticket, children of the current span."""
    if not tracing.enabled():
        return
    started = ticket.started_at if ticket.started_at is not None else ticket.enqueued_at
    finished = ticket.finished_at if ticket.finished_at is not None else started
    tracing.record(
        "worker queue", _wall_ns(ticket.enqueued_at), _wall_ns(started),
        {"kiln.express": ticket.express},
    )  # fmt: skip
    tracing.record(
        "batch compute", _wall_ns(started), _wall_ns(finished),
        {"kiln.batch_size": ticket.batch_size, "kiln.items": ticket.size,
         "kiln.compute_ms": ticket.compute_s * 1000},
    )  # fmt: skip


def stream_spans(received_ns: int, last: GenerateChunk, batch_size: int) -> None:
    """``worker queue`` (the wait for a sequence slot) and ``batch compute`` (from then to the
    last chunk; ``kiln.batch_size``: sequences running when the first chunk came) of a
    generation, children of the current span."""
    if not tracing.enabled():
        return
    admitted = received_ns + int(last.queue_ms * 1e6)
    tracing.record("worker queue", received_ns, admitted)
    tracing.record(
        "batch compute", admitted, time.time_ns(),
        {"kiln.batch_size": batch_size, "kiln.compute_ms": last.compute_ms,
         "kiln.completion_tokens": last.completion_tokens},
    )  # fmt: skip
