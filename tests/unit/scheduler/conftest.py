"""Fakes for the scheduler tests: a request factory, fake workers, and a saturating driver."""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, TypeAlias

import pytest

from kiln_platform.scheduler.policy import PolicyConfig, PoolQueue
from kiln_platform.scheduler.schemas import Credit, Dispatch, Priority, Request

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence


class MakeRequest(Protocol):
    def __call__(
        self,
        tenant: str = ...,
        cost: float = ...,
        *,
        at: float = ...,
        deadline: float | None = ...,
        priority: Priority = ...,
        weight: float = ...,
    ) -> Request: ...


MakeWorkers: TypeAlias = "Callable[[dict[str, int]], FakeWorkers]"
Saturate: TypeAlias = Callable[..., dict[str, float]]
WriteToml: TypeAlias = Callable[[str], Path]


@pytest.fixture
def make_request() -> MakeRequest:
    """Requests with unique ids: ``make_request("a", 2.0, at=1.0, deadline=3.0)``."""
    ids = itertools.count()

    def make(
        tenant: str = "a",
        cost: float = 1.0,
        *,
        at: float = 0.0,
        deadline: float | None = None,
        priority: Priority = Priority.INTERACTIVE,
        weight: float = 1.0,
    ) -> Request:
        return Request(f"{tenant}-{next(ids)}", tenant, cost, at, deadline, priority, weight)

    return make


class FakeWorkers:
    """Workers that advertise credits and fail the test if they are ever sent more."""

    def __init__(self, slots: dict[str, int]) -> None:
        self.slots = dict(slots)
        self.running: dict[str, list[Request]] = {w: [] for w in slots}

    def credits(self) -> list[Credit]:
        """What each worker advertises now."""
        return [Credit(w, n - len(self.running[w])) for w, n in self.slots.items()]

    def take(self, dispatches: Iterable[Dispatch]) -> None:
        """Accept dispatches, asserting no worker goes over its slots."""
        for d in dispatches:
            self.running[d.worker].append(d.request)
            assert len(self.running[d.worker]) <= self.slots[d.worker], f"{d.worker} over-filled"

    def finish_oldest(self) -> list[Request]:
        """Each worker finishes its oldest running request."""
        return [run.pop(0) for run in self.running.values() if run]

    def finish_all(self) -> list[Request]:
        """Every running request finishes."""
        done = [r for run in self.running.values() for r in run]
        for run in self.running.values():
            run.clear()
        return done


@pytest.fixture
def fake_workers() -> MakeWorkers:
    """``fake_workers({"w0": 2, "w1": 4})``: fake workers with those slots."""
    return FakeWorkers


@pytest.fixture
def saturate(
    make_request: MakeRequest,
) -> Saturate:
    """Keep every ``(tenant, weight, cost)`` backlogged; return cost served per tenant.

    Dispatches one request at a time through a :class:`PoolQueue` (one worker, one slot), and
    tops up each tenant's queue so that it never runs dry.
    """

    def run(
        tenants: Sequence[tuple[str, float, float]],
        dispatches: int,
        *,
        config: PolicyConfig | None = None,
        priority: Callable[[str], Priority] = lambda _: Priority.INTERACTIVE,
        depth: int = 4,
    ) -> dict[str, float]:
        queue = PoolQueue(config)
        for tenant, weight, cost in tenants:
            for _ in range(depth):
                queue.push(make_request(tenant, cost, weight=weight, priority=priority(tenant)))
        served: dict[str, float] = defaultdict(float)
        for _ in range(dispatches):
            (d,), _ = queue.next_dispatch(0.0, [Credit("w", 1)])
            served[d.request.tenant] += d.request.cost
            r = d.request
            queue.push(make_request(r.tenant, r.cost, weight=r.weight, priority=r.priority))
        return served

    return run


@pytest.fixture
def write_toml(tmp_path: Path) -> WriteToml:
    """Write a simulation file into a temporary directory and return its path."""

    def write(text: str, name: str = "sim.toml") -> Path:
        path = tmp_path / name
        path.write_text(text)
        return path

    return write


@pytest.fixture
def repo_root() -> Path:
    """The repository root (for the documented example file)."""
    return Path(__file__).resolve().parents[3]
