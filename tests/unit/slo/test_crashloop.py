"""The pool crash-loop policy: fires on a crashed pool that keeps restarting, holds while it
restarts, resolves when a worker is ready or the pool is gone."""

from __future__ import annotations

from pathlib import Path

import pytest

from kiln_platform.pools.backend import PoolSpec, PoolWorker
from kiln_platform.slo.crashloop import PoolHealth, changes, health


def pool(*, ready: int = 0, restarts: int = 0, crashed: bool = False) -> PoolHealth:
    return PoolHealth("m", "1", workers=1, ready=ready, restarts=restarts, crashed=crashed)


@pytest.mark.unit
@pytest.mark.parametrize(
    ("now", "firing", "expected"),
    [
        (pool(restarts=3, crashed=True), set(), {"m@1": True}),
        (pool(restarts=2, crashed=True), set(), {}),  # one crash or two: not a loop yet
        (pool(restarts=9), set(), {}),  # restarting, not every worker down
        (pool(restarts=9, ready=1), set(), {}),
        (pool(restarts=4, crashed=True), {"m@1"}, {}),  # still firing: no new notification
        (pool(restarts=4), {"m@1"}, {}),  # starting again, not ready yet: holds
        (pool(restarts=4, ready=1), {"m@1"}, {"m@1": False}),
    ],
)
def test_a_crash_loop_fires_holds_and_resolves(
    now: PoolHealth, firing: set[str], expected: dict[str, bool]
) -> None:
    assert changes({"m@1": now}, firing, min_restarts=3) == expected


@pytest.mark.unit
def test_a_pool_no_longer_served_resolves_and_others_are_left_alone() -> None:
    pools = {"m@2": pool(ready=1), "n@1": pool(restarts=5, crashed=True)}
    assert changes(pools, {"m@1", "n@1"}, min_restarts=3) == {"m@1": False}


class FakeBackend:
    """The two things ``health`` reads of a pool backend."""

    def __init__(self, workers: list[PoolWorker]) -> None:
        self.specs = {w.spec.key: w.spec for w in workers}
        self.pools = {w.spec.key: [x for x in workers if x.spec is w.spec] for w in workers}

    def crashed(self, key: str) -> bool:
        return all(w.restarts and not w.ready for w in self.pools[key])


@pytest.mark.unit
def test_health_sums_a_pools_workers() -> None:
    spec = PoolSpec("m", "1", Path("/models/m/1"))
    workers = [PoolWorker(spec, restarts=2), PoolWorker(spec, restarts=1, ready=True)]
    assert health(FakeBackend(workers)) == {  # type: ignore[arg-type]
        "m@1": PoolHealth("m", "1", workers=2, ready=1, restarts=3, crashed=False)
    }
