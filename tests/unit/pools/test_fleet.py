"""The shared fleet's pure rules and the follower/leader switch of its pool backend."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from kiln_platform.pools.backend import PoolSpec, PoolWorker
from kiln_platform.pools.fleet_policy import (
    Term,
    fleet_replicas,
    gateway_share,
    lock_key,
    next_term,
)
from kiln_platform.pools.shared import SharedBackend
from kiln_platform.pools.tables import FleetReplica

pytestmark = pytest.mark.unit
SPEC = PoolSpec("m", "1", Path("/models/m"))


def test_a_follower_that_takes_the_lock_leads_and_a_leader_that_loses_it_follows() -> None:
    follower = Term(False, 0.0)
    assert next_term(follower, held=False, now=1.0) is follower
    leader = next_term(follower, held=True, now=2.0)
    assert leader == Term(True, 2.0)
    assert next_term(leader, held=True, now=3.0) is leader  # still held: the same term
    assert next_term(leader, held=False, now=4.0) == Term(False, 4.0)


def test_the_lock_key_is_a_stable_signed_64_bit_number() -> None:
    key = lock_key("kiln.pool-manager")
    assert key == lock_key("kiln.pool-manager") != lock_key("another")
    assert -(2**63) <= key < 2**63


def test_the_leader_sizes_a_pool_to_the_largest_any_live_gateway_wants() -> None:
    assert fleet_replicas(1, [{"m@1": 3}, {"m@1": 2, "n@1": 5}], "m@1") == 3
    assert fleet_replicas(2, [{}], "m@1") == 2
    assert fleet_replicas(0, [], "m@1") == 0


@pytest.mark.parametrize(
    ("slots", "gateways", "share"), [(33, 1, 33), (33, 3, 11), (32, 3, 11), (2, 3, 1), (8, 0, 8)]
)
def test_each_gateway_keeps_an_even_share_of_a_worker_rounded_up(
    slots: int, gateways: int, share: int
) -> None:
    assert gateway_share(slots, gateways) == share


@dataclass
class Backend:
    """A pool backend that only records (what ``SharedBackend`` delegates to)."""

    pools: dict[str, list[PoolWorker]] = field(default_factory=dict)
    specs: dict[str, PoolSpec] = field(default_factory=dict)
    on_change: object = None
    scaled: list[tuple[str, int]] = field(default_factory=list)
    workers_outlive_gateway: bool = False

    def step_down(self) -> None:  # as the local backend: its workers stop
        for key in list(self.pools):
            self.remove(key)

    def ensure(self, spec: PoolSpec) -> None:
        self.specs[spec.key] = spec
        self.pools.setdefault(spec.key, [])

    def remove(self, key: str) -> None:
        self.scale(key, 0)
        self.specs.pop(key)
        self.pools.pop(key)

    def scale(self, key: str, replicas: int) -> None:
        self.scaled.append((key, replicas))
        self.pools[key] = [PoolWorker(self.specs[key], port=9000 + n) for n in range(replicas)]

    def credits(self, worker: PoolWorker | None) -> int:
        return 33


def _row(url: str) -> FleetReplica:
    return FleetReplica(url=url, pool=SPEC.key, gateway_id=uuid.uuid4(), task="embeddings",
                        slots=33, max_batch_size=32, max_queue=2048)  # fmt: skip


def test_a_follower_starts_nothing_and_dispatches_to_the_registered_workers() -> None:
    local = Backend()
    shared = SharedBackend(local)  # type: ignore[arg-type]
    changed: list[PoolWorker] = []
    shared.on_change = changed.append
    shared.ensure(SPEC)
    shared.scale(SPEC.key, 2)
    assert local.scaled == []
    assert local.specs == {}
    shared.discover([_row("http://127.0.0.1:7001")])
    (worker,) = shared.ready(SPEC.key)
    assert (worker.url, worker.info and worker.info.max_queue) == ("http://127.0.0.1:7001", 2048)
    assert shared.find(SPEC.key, worker.url) is worker
    assert changed == [worker]
    shared.discover([_row("http://127.0.0.1:7001")])
    assert shared.ready(SPEC.key) == [worker]  # the same object while it stays registered
    shared.gateways = 3
    assert shared.credits(worker) == 11
    shared.discover([])
    assert shared.ready(SPEC.key) == []
    assert not worker.ready


def test_a_follower_tells_of_a_worker_only_once_its_pools_list_it() -> None:
    """A runner poked about a discovered worker finds it ready (a request queued before the
    first discovery was otherwise stuck until another poke: issue 21's late joiner)."""
    shared = SharedBackend(Backend())  # type: ignore[arg-type]
    seen: list[list[PoolWorker]] = []
    shared.on_change = lambda worker: seen.append(shared.ready(worker.spec.key))
    shared.ensure(SPEC)
    shared.discover([_row("http://127.0.0.1:7001")])
    assert [[w.url for w in ready] for ready in seen] == [["http://127.0.0.1:7001"]]
    shared.discover([])
    assert seen[-1] == []


def test_each_gateway_keeps_its_share_of_a_workers_express_credits_too() -> None:
    shared = SharedBackend(Backend())  # type: ignore[arg-type]
    assert shared.express() == 3
    shared.gateways = 2
    assert shared.express() == 2
    shared.gateways = 3
    assert shared.express() == 1  # three gateways hold the worker's 3 together, not 9


def test_a_new_leader_makes_every_pool_as_big_as_the_fleet_wants_and_a_lost_one_stops() -> None:
    local = Backend()
    shared = SharedBackend(local)  # type: ignore[arg-type]
    shared.ensure(SPEC)
    shared.own = {SPEC.key: 1}
    shared.wishes = [{SPEC.key: 2}]
    shared.discover([_row("http://127.0.0.1:7001")])
    shared.lead(True)
    assert local.scaled == [(SPEC.key, 2)]
    assert shared.pools is local.pools
    assert len(shared.pools[SPEC.key]) == 2
    shared.wishes = []
    shared.scale(SPEC.key, 1)  # its own policy's size, nobody wants more
    assert local.scaled[-1] == (SPEC.key, 1)
    shared.lead(False)
    assert local.scaled[-1] == (SPEC.key, 0)
    assert local.specs == {}
    assert shared.pools == {}
    assert shared.specs == {SPEC.key: SPEC}
