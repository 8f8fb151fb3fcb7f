"""Plain data the scheduler takes and gives: requests, credits, dispatches, backlog snapshots."""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import IntEnum


class Priority(IntEnum):
    """Priority classes, highest first."""

    INTERACTIVE = 0
    BATCH = 1


@dataclass(frozen=True, slots=True)
class Request:
    """A request waiting for a worker; times are seconds on the scheduler's clock."""

    id: str
    tenant: str
    cost: float
    """What fair share charges: tokens for LLMs, items for tensor models."""
    arrival: float
    deadline: float | None = None
    priority: Priority = Priority.INTERACTIVE
    weight: float = 1.0
    """The tenant's share weight, from its plan."""
    least: float | None = None
    """The cost it surely takes, when ``cost`` is only a bound (a generation's prompt and one
    token: it may end at any token before ``max_tokens``); None: all of ``cost``."""

    @property
    def least_cost(self) -> float:
        """What the deadline checks hold against the deadline: a request that could finish in
        time is not turned away for its bound."""
        return self.cost if self.least is None else self.least


@dataclass(frozen=True, slots=True)
class Credit:
    """Free slots a worker advertises; the scheduler never sends it more.

    ``express``: the worker's unused spare express credits: it may take that many requests
    beyond ``free`` from tenants holding no normal credit in the pool (the express lane).
    ``room``: the cost (items) its queue still holds, of ``capacity``. A request costing more
    waits in the pool's queue until the worker has room rather than overflowing it, unless
    nothing is in flight there (``room == capacity``): then it goes alone, however big.
    """

    worker: str
    free: int
    express: int = 0
    room: float = math.inf
    capacity: float = math.inf

    def fits(self, cost: float, room: float) -> bool:
        """Whether a request of ``cost`` may go to this worker while it has ``room`` left."""
        return cost <= room or room >= self.capacity


@dataclass(frozen=True, slots=True)
class Dispatch:
    """Send ``request`` to ``worker`` now; ``express``: on the worker's express credit."""

    request: Request
    worker: str
    express: bool = False


@dataclass(frozen=True, slots=True)
class TenantBacklog:
    """What one tenant has queued in one priority class."""

    tenant: str
    priority: Priority
    weight: float
    count: int
    cost: float
    rate: float = 0.0
    """Cost per second the tenant has recently been adding to this class."""


@dataclass(frozen=True, slots=True)
class Backlog:
    """A snapshot of a pool's queue, the input of admission control."""

    flows: tuple[TenantBacklog, ...] = ()

    @property
    def count(self) -> int:
        """Requests queued in the pool."""
        return sum(f.count for f in self.flows)

    def tenant_count(self, tenant: str) -> int:
        """Requests ``tenant`` has queued, all classes."""
        return sum(f.count for f in self.flows if f.tenant == tenant)
