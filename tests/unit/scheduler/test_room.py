"""Item room: a worker is never sent more cost than its queue holds; the rest waits in the pool."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from kiln_platform.scheduler.core import PoolScheduler, SchedulerConfig
from kiln_platform.scheduler.policy import PolicyConfig, PoolQueue
from kiln_platform.scheduler.runner import PoolRunner
from kiln_platform.scheduler.schemas import Credit, Request

if TYPE_CHECKING:
    from tests.unit.scheduler.conftest import MakeRequest


def test_a_head_that_does_not_fit_waits_and_keeps_its_place(make_request: MakeRequest) -> None:
    queue = PoolQueue()
    big, small = make_request("a", cost=64.0), make_request("b", cost=1.0)
    queue.push(big)
    queue.push(small)
    sent, _ = queue.next_dispatch(0.0, [Credit("w", 5, room=32.0, capacity=100.0)])
    assert sent == []  # the small one does not overtake the fair head
    assert len(queue) == 2
    (d1, d2), _ = queue.next_dispatch(0.0, [Credit("w", 5, room=100.0, capacity=100.0)])
    assert [d1.request, d2.request] == [big, small]


def test_dispatch_stops_when_the_room_is_used_up(make_request: MakeRequest) -> None:
    queue = PoolQueue()
    for _ in range(5):
        queue.push(make_request("a", cost=30.0))
    sent, _ = queue.next_dispatch(0.0, [Credit("w", 5, room=100.0, capacity=100.0)])
    assert len(sent) == 3
    assert len(queue) == 2


def test_an_empty_worker_takes_one_request_bigger_than_its_queue(make_request: MakeRequest) -> None:
    queue = PoolQueue()
    huge, small = make_request("a", cost=500.0), make_request("a", cost=1.0)
    queue.push(huge)
    queue.push(small)
    (d,), _ = queue.next_dispatch(0.0, [Credit("w", 5, room=100.0, capacity=100.0)])
    assert d.request is huge  # the worker refuses it; it must not block the pool forever
    assert len(queue) == 1


def test_a_head_goes_to_the_worker_it_fits(make_request: MakeRequest) -> None:
    queue = PoolQueue()
    queue.push(make_request("a", cost=50.0))
    (d,), _ = queue.next_dispatch(
        0.0, [Credit("w0", 5, room=10.0, capacity=90.0), Credit("w1", 1, room=60.0, capacity=90.0)]
    )
    assert d.worker == "w1"


def test_express_requests_need_room_too(make_request: MakeRequest) -> None:
    queue = PoolQueue(PolicyConfig(express=True))
    queue.push(make_request("light", cost=40.0))
    full, roomy = Credit("w", 0, 1, room=10.0, capacity=50.0), Credit("w", 0, 1, 40.0, 50.0)
    sent, _ = queue.next_dispatch(0.0, [full], busy={"flood"})
    assert sent == []
    (d,), _ = queue.next_dispatch(0.0, [roomy], busy={"flood"})
    assert d.express


class Items:
    """A fake worker with a bounded item queue that fails loudly if it overflows."""

    def __init__(self, capacity: float) -> None:
        self.capacity = capacity
        self.held = 0.0
        self.peak = 0.0
        self.release = asyncio.Event()

    async def call(self, request: Request, worker: str) -> float:
        self.held += request.cost
        self.peak = max(self.peak, self.held)
        try:
            if self.held > self.capacity and self.held != request.cost:
                raise AssertionError(f"worker queue overflowed: {self.held} > {self.capacity}")
            await self.release.wait()
            await asyncio.sleep(0.001)
            return request.cost
        finally:
            self.held -= request.cost


def runner_over(items: Items, slots: int) -> PoolRunner:
    config = SchedulerConfig(policy=PolicyConfig(express=False))
    return PoolRunner(PoolScheduler(config), lambda: {"w": slots}, lambda: {"w": items.capacity})


async def test_big_requests_queue_in_the_pool_instead_of_overflowing_the_worker() -> None:
    items = Items(capacity=1024.0)
    runner = runner_over(items, slots=32)
    requests = [runner.request(f"r{i}", "ab"[i % 2], 64.0, timeout_s=None) for i in range(32)]
    calls = [asyncio.ensure_future(runner.run(r, items.call)) for r in requests]
    await asyncio.sleep(0.01)
    assert items.held == 1024.0  # 16 requests sent, 16 queued in the pool
    assert len(runner.scheduler.queue) == 16
    items.release.set()
    assert sum(await asyncio.wait_for(asyncio.gather(*calls), 10.0)) == 32 * 64.0
    assert items.peak == 1024.0
    assert runner.scheduler.in_flight == 0


async def test_a_request_bigger_than_the_worker_queue_goes_alone() -> None:
    items = Items(capacity=100.0)
    runner = runner_over(items, slots=4)
    items.release.set()
    got = await asyncio.wait_for(asyncio.gather(
        *(runner.run(runner.request(f"r{i}", "a", c, timeout_s=None), items.call)
          for i, c in enumerate([60.0, 500.0, 60.0]))
    ), 10.0)  # fmt: skip
    assert got == [60.0, 500.0, 60.0]
    assert items.peak == 500.0


async def test_room_is_given_back_when_a_call_fails() -> None:
    items = Items(capacity=10.0)
    runner = runner_over(items, slots=2)
    items.release.set()

    async def flaky(request: Request, worker: str) -> float:
        if request.id == "bad":
            raise RuntimeError("worker failed")
        return await items.call(request, worker)

    bad = runner.run(runner.request("bad", "a", 10.0, timeout_s=None), flaky)
    results = await asyncio.gather(bad, return_exceptions=True)
    assert isinstance(results[0], RuntimeError)
    ok = runner.run(runner.request("ok", "a", 10.0, timeout_s=None), flaky)
    assert await asyncio.wait_for(ok, 2.0) == 10.0  # kept room would leave it queued forever
