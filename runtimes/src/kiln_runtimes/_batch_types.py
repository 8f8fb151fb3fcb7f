"""Plain data the batcher and its driver hand each other."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import numpy.typing as npt

if TYPE_CHECKING:
    from kiln_runtimes._errors import WorkerError

CloseReason = Literal["size", "wait", "deadline", "alone"]
Rows = npt.NDArray[np.float32]
# What a backend returns for a batch: float32 rows (embeddings), or one entry per item (tensors).
BatchResult = Rows | list[Any]


@dataclass(eq=False, slots=True)
class Ticket:
    """One request's inputs; it settles once, with every row or with one error."""

    request_id: str
    size: int
    enqueued_at: float
    deadline: float | None
    rows: list[Any]
    pending: int
    started_at: float | None = None
    finished_at: float | None = None
    error: WorkerError | None = None
    compute_s: float = 0.0
    """This request's share of the batches it ran in (``_attribution.shares``)."""
    express: bool = False
    """Queued ahead of normal requests and batched only with other express requests."""
    batch_size: int = 0
    """Items in the largest batch it ran in (its ``batch compute`` span's attribute)."""

    @property
    def settled(self) -> bool:
        """Whether the ticket has its result or its error."""
        return self.finished_at is not None

    def embeddings(self) -> Rows:
        """Return the rows in input order, ``[size, dimensions]``."""
        return np.stack([row for row in self.rows if row is not None])


@dataclass(frozen=True, slots=True)
class Item:
    """One input of a ticket: token ids (embeddings) or one tensor row (tensor models)."""

    ticket: Ticket
    index: int
    input_ids: Any
    preempted: bool = False
    """Its batch was stopped once for an express request; a batch holding it is not stopped."""


@dataclass(frozen=True, slots=True)
class Batch:
    """Items closed together, in queue order."""

    items: tuple[Item, ...]
    reason: CloseReason
    started_at: float
    """When it closed: when it started, unless it was prefetched (``BatchQueue._start``)."""

    @property
    def express(self) -> bool:
        """Whether this is a batch of express items (a batch never mixes the two)."""
        return self.items[0].ticket.express

    @property
    def preemptible(self) -> bool:
        """Whether an express request may stop it: none of its items was stopped before."""
        return not any(item.preempted for item in self.items)

    def costs(self) -> list[int]:
        """Each item's cost: its tokens (embeddings), or 1 (a tensor row)."""
        return [len(i.input_ids) if isinstance(i.input_ids, list) else 1 for i in self.items]

    @property
    def inputs(self) -> list[Any]:
        """The inputs to run (token-id lists, or tensor rows)."""
        return [item.input_ids for item in self.items]

    def tickets(self) -> list[Ticket]:
        """The distinct tickets in this batch, in order."""
        return list(dict.fromkeys(item.ticket for item in self.items))

    def split(self) -> list[Batch]:
        """One batch per ticket, to isolate a request that makes the backend fail."""
        return [
            Batch(tuple(i for i in self.items if i.ticket is t), self.reason, self.started_at)
            for t in self.tickets()
        ]


@dataclass(frozen=True, slots=True)
class Outcome:
    """What running one batch produced: rows or the exception, and the seconds it took."""

    batch: Batch
    result: BatchResult | Exception
    seconds: float
    preempted: bool = False
    """Stopped for an express request: its items went back to the queue, the seconds are lost."""
