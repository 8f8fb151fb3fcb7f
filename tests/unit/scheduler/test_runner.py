"""The scheduler on a real asyncio loop, with fake async workers."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest
import uvloop

from kiln_platform.errors import DeadlineExceeded, Overloaded, ServiceUnavailable
from kiln_platform.scheduler.admission import AdmissionLimits, RejectReason
from kiln_platform.scheduler.core import PoolScheduler, SchedulerConfig
from kiln_platform.scheduler.policy import PolicyConfig
from kiln_platform.scheduler.runner import PoolRunner, rejection
from kiln_platform.scheduler.schemas import Request
from kiln_platform.scheduler.service import ServiceConfig


class FakeWorkers:
    """Async workers that record their concurrency and can be held busy."""

    def __init__(self, slots: dict[str, int]) -> None:
        self.slots = slots
        self.running: Counter[str] = Counter()
        self.peak: Counter[str] = Counter()
        self.release = asyncio.Event()
        self.release.set()

    async def call(self, request: Request, worker: str) -> str:
        self.running[worker] += 1
        self.peak[worker] = max(self.peak[worker], self.running[worker])
        try:
            await self.release.wait()
            await asyncio.sleep(0.001)
            if request.tenant == "broken":
                raise RuntimeError("worker failed")
            return f"{request.id}@{worker}"
        finally:
            self.running[worker] -= 1


def make_runner(
    slots: dict[str, int],
    *,
    express: bool = False,
    service_s: float = 0.01,
    max_tenant_queue: int | None = None,
    spare: int = 3,
) -> tuple[PoolRunner, FakeWorkers]:
    """A runner over fake workers; the express lane is off unless a test is about it.

    ``service_s`` is the service time the scheduler predicts per request before any completes.
    """
    workers = FakeWorkers(slots)
    policy = PolicyConfig(express=express)
    limits = (
        AdmissionLimits()
        if max_tenant_queue is None
        else AdmissionLimits(max_tenant_queue=max_tenant_queue)
    )
    config = SchedulerConfig(policy=policy, limits=limits,
                             service=ServiceConfig(prior_a=service_s))  # fmt: skip
    return PoolRunner(PoolScheduler(config), lambda: workers.slots, express=lambda: spare), workers


async def test_requests_run_without_overfilling_any_worker() -> None:
    runner, workers = make_runner({"w0": 2, "w1": 1})
    requests = [runner.request(f"r{i}", "abc"[i % 3], 1.0, timeout_s=None) for i in range(30)]
    results = await asyncio.gather(*(runner.run(r, workers.call) for r in requests))
    assert len(results) == 30
    assert workers.peak["w0"] <= 2
    assert workers.peak["w1"] <= 1
    assert runner.scheduler.in_flight == 0


async def _fill_a_queue(
    runner: PoolRunner, workers: FakeWorkers
) -> tuple[asyncio.Future[str], asyncio.Future[str]]:
    """Tenant ``a`` holds the only credit and its one queue place (``max_tenant_queue=1``)."""
    workers.release.clear()
    busy = asyncio.ensure_future(
        runner.run(runner.request("1", "a", 1.0, timeout_s=None), workers.call)
    )
    queued = asyncio.ensure_future(
        runner.run(runner.request("2", "a", 1.0, timeout_s=None), workers.call)
    )
    await asyncio.sleep(0.001)
    return busy, queued


async def test_a_tenant_over_its_queue_bound_gets_429_at_once() -> None:
    runner, workers = make_runner({"w": 1}, max_tenant_queue=1)
    busy, queued = await _fill_a_queue(runner, workers)
    with pytest.raises(Overloaded) as info:
        await runner.run(runner.request("3", "a", 1.0, timeout_s=None), workers.call)
    assert info.value.status_code == 429
    assert info.value.retry_after is not None
    assert info.value.retry_after > 0
    workers.release.set()
    assert list(await asyncio.gather(busy, queued)) == ["1@w", "2@w"]


async def test_a_queued_request_expires_before_its_deadline_passes() -> None:
    # Predicted service 0.3 s: admitted (0.6 s of predicted wait and work fit in 1 s), then
    # answered at its latest start (0.7 s), before the deadline, while the worker is still busy.
    runner, workers = make_runner({"w": 1}, service_s=0.3)
    workers.release.clear()
    busy = asyncio.ensure_future(
        runner.run(runner.request("1", "a", 1.0, timeout_s=None), workers.call)
    )
    await asyncio.sleep(0)
    start = runner.now()
    with pytest.raises(DeadlineExceeded):
        async with asyncio.timeout(5):  # a missing expiry fails here instead of hanging
            await runner.run(runner.request("2", "b", 1.0, timeout_s=1.0), workers.call)
    waited = runner.now() - start
    assert 0.6 < waited < 1.0  # queued, then answered before the deadline, not after it
    assert not busy.done()
    workers.release.set()
    await busy
    (b,) = [t for t in runner.scheduler.snapshot(runner.now()).tenants if t.tenant == "b"]
    assert b.rejected == {"deadline_expired": 1}


async def test_a_cancelled_waiter_leaves_the_queue() -> None:
    runner, workers = make_runner({"w": 1})
    workers.release.clear()
    busy = asyncio.ensure_future(
        runner.run(runner.request("1", "a", 1.0, timeout_s=None), workers.call)
    )
    waiter = asyncio.ensure_future(
        runner.run(runner.request("2", "a", 1.0, timeout_s=None), workers.call)
    )
    await asyncio.sleep(0.001)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert len(runner.scheduler.queue) == 0
    workers.release.set()
    await busy
    assert runner.scheduler.in_flight == 0


async def test_a_failed_call_gives_its_credit_back() -> None:
    runner, workers = make_runner({"w": 1})
    with pytest.raises(RuntimeError, match="worker failed"):
        await runner.run(runner.request("1", "broken", 1.0, timeout_s=None), workers.call)
    assert await runner.run(runner.request("2", "a", 1.0, timeout_s=None), workers.call) == "2@w"


async def test_no_ready_worker_means_503_for_deadlines() -> None:
    runner, workers = make_runner({})
    waiting = asyncio.ensure_future(
        runner.run(runner.request("1", "a", 1.0, timeout_s=None), workers.call)
    )
    await asyncio.sleep(0)
    with pytest.raises(ServiceUnavailable) as info:
        await runner.run(runner.request("2", "b", 1.0, timeout_s=1.0), workers.call)
    assert info.value.status_code == 503
    workers.slots = {"w": 1}  # a worker became ready
    runner.poke()
    assert await waiting == "1@w"


@pytest.mark.parametrize(
    ("reason", "status"),
    [
        (RejectReason.TENANT_OVER_SHARE, 429),
        (RejectReason.POOL_OVERLOADED, 503),
        (RejectReason.DEADLINE_TOO_SHORT, 504),
    ],
)
def test_rejections_map_to_kiln_errors(reason: RejectReason, status: int) -> None:
    error = rejection(reason, 2.5)
    assert error.status_code == status


async def test_a_waiter_cancelled_just_after_dispatch_gives_its_credit_back() -> None:
    runner, workers = make_runner({"w": 1})
    workers.release.clear()
    busy = asyncio.ensure_future(
        runner.run(runner.request("1", "a", 1.0, timeout_s=None), workers.call)
    )
    waiter = asyncio.ensure_future(
        runner.run(runner.request("2", "a", 1.0, timeout_s=None), workers.call)
    )
    await asyncio.sleep(0.001)
    workers.slots = {"w": 2}
    runner.poke()  # dispatches the waiter: its future is resolved...
    waiter.cancel()  # ...but the client leaves before its task resumes
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert runner.scheduler.in_flight == 1
    workers.release.set()
    await busy
    assert runner.scheduler.in_flight == 0
    assert await runner.run(runner.request("3", "a", 1.0, timeout_s=None), workers.call) == "3@w"


async def test_screen_rejects_like_slot_without_queueing() -> None:
    runner, workers = make_runner({"w": 1}, max_tenant_queue=1)
    busy, queued = await _fill_a_queue(runner, workers)
    with pytest.raises(Overloaded) as info:  # a's queue is full: turned away before preparing
        runner.screen(runner.request("3", "a", 1.0, timeout_s=None))
    assert info.value.status_code == 429
    runner.screen(runner.request("4", "b", 1.0, timeout_s=None))  # b would be admitted
    assert len(runner.scheduler.queue) == 1  # screening queues nothing
    stats = {t.tenant: t for t in runner.scheduler.snapshot(runner.now()).tenants}
    assert sum(stats["a"].rejected.values()) == 1
    assert "b" not in stats or stats["b"].admitted == 0
    workers.release.set()
    assert list(await asyncio.gather(busy, queued)) == ["1@w", "2@w"]


async def test_light_tenants_run_on_the_express_credits() -> None:
    runner, workers = make_runner({"w": 1}, express=True)
    workers.release.clear()
    leases: list[tuple[str, bool]] = []

    async def hold(request_id: str, tenant: str) -> None:
        async with runner.slot(runner.request(request_id, tenant, 1.0, timeout_s=None)) as lease:
            leases.append((request_id, lease.express))
            await workers.release.wait()

    tasks = [asyncio.ensure_future(hold(i, t)) for i, t in (("b1", "b"), ("c1", "c"), ("d1", "d"))]
    await asyncio.sleep(0.001)
    assert leases == [("b1", True), ("c1", True), ("d1", True)]  # three express credits
    flood = [asyncio.ensure_future(hold(f"a{i}", "a")) for i in range(4)]
    await asyncio.sleep(0.001)
    tasks.append(asyncio.ensure_future(hold("e1", "e")))
    await asyncio.sleep(0.001)
    assert leases[3:] == [("a0", False)]  # the slot; e waits for an express credit
    assert runner.scheduler.in_flight == 4
    workers.release.set()
    await asyncio.gather(*flood, *tasks)
    assert sorted(i for i, _ in leases) == ["a0", "a1", "a2", "a3", "b1", "c1", "d1", "e1"]
    assert runner.scheduler.in_flight == 0


async def test_a_runner_holds_only_the_express_credits_it_is_given() -> None:
    """A gateway in a fleet of three keeps 1 of a worker's 3 express credits (``express``)."""
    runner, workers = make_runner({"w": 1}, express=True, spare=1)
    workers.release.clear()
    leases: list[bool] = []

    async def hold(request_id: str, tenant: str) -> None:
        async with runner.slot(runner.request(request_id, tenant, 1.0, timeout_s=None)) as lease:
            leases.append(lease.express)
            await workers.release.wait()

    tasks = [asyncio.ensure_future(hold(t, t)) for t in ("b", "c", "d")]
    await asyncio.sleep(0.001)
    assert leases == [True, False]  # one express credit, then the worker's one slot
    assert runner.scheduler.in_flight == 2
    workers.release.set()
    await asyncio.gather(*tasks)
    assert len(leases) == 3


def test_queue_waits_are_measured_finer_than_uvloops_millisecond_clock() -> None:
    """uvloop's ``loop.time()`` ticks in whole milliseconds; ``Server-Timing: queue`` and the
    wait histogram would then show 0 or 1 ms for requests that never waited."""

    async def waits() -> list[float]:
        runner, workers = make_runner({"w": 1})
        seen: list[float] = []
        runner.on_wait = lambda request, seconds: seen.append(seconds)
        for i in range(20):
            await runner.run(runner.request(str(i), "a", 1.0, timeout_s=None), workers.call)
        return seen

    seen = uvloop.run(waits())
    assert len(seen) == 20
    assert any(abs(s * 1000 - round(s * 1000)) > 1e-6 for s in seen)
    assert max(seen) < 0.5


async def test_a_pool_starting_from_zero_queues_a_burst_instead_of_refusing_it() -> None:
    workers = FakeWorkers({})
    planned = PoolRunner(PoolScheduler(SchedulerConfig()), lambda: workers.slots, planned=lambda: 2)
    cold = PoolRunner(PoolScheduler(SchedulerConfig()), lambda: workers.slots)
    burst = [planned.request(f"r{i}", "a", 1.0, timeout_s=30.0) for i in range(4)]
    tasks = [asyncio.create_task(planned.run(r, workers.call)) for r in burst]
    await asyncio.sleep(0.01)
    assert not any(t.done() for t in tasks)  # all four wait for the worker being started
    first = asyncio.create_task(
        cold.run(cold.request("c0", "a", 1.0, timeout_s=None), workers.call)
    )
    await asyncio.sleep(0)
    with pytest.raises(Overloaded):  # without the planned slots the second one is refused
        await cold.run(cold.request("c1", "a", 1.0, timeout_s=30.0), workers.call)
    first.cancel()
    workers.slots = {"w": 2}  # the worker is ready
    planned.poke()
    assert sorted(await asyncio.gather(*tasks)) == [f"r{i}@w" for i in range(4)]


def test_a_deadline_timer_armed_for_a_past_time_works_under_uvloop() -> None:
    """uvloop's ``call_at`` for a time already past returns a ``Handle`` without ``when()``:
    re-arming compared against it raised (a 500 under overload, ``bench/overload.py``)."""

    async def main() -> None:
        runner, _ = make_runner({"w": 1})
        past = runner.now() - 1.0
        runner.scheduler.next_expiry = lambda: past  # type: ignore[method-assign]
        runner._arm()
        runner._arm()  # compares with the timer armed for the past
        runner.scheduler.next_expiry = lambda: None  # type: ignore[method-assign]
        runner._arm()

    uvloop.run(main())
