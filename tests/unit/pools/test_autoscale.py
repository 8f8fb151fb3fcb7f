"""The autoscaling policy, driven with made-up loads on a made-up clock."""

from __future__ import annotations

import pytest

from kiln_platform.pools.autoscale import (
    AutoscaleConfig,
    AutoscaleState,
    PoolLoad,
    bounded,
    decide,
    demand,
    initial,
)

CONFIG = AutoscaleConfig(max_replicas=4, scale_down_delay_s=30.0, idle_to_zero_s=300.0)


def load(work: int = 0, queued: int = 0, last: float | None = 0.0, slots: int = 10) -> PoolLoad:
    return PoolLoad(in_flight=work, queued=queued, slots_per_replica=slots, last_request_at=last)


def run(steps: list[tuple[float, PoolLoad]], config: AutoscaleConfig = CONFIG) -> list[int]:
    """Decisions at each (time, load), starting from a pool created at 0."""
    _, state = initial(config, 0.0)
    out = []
    for now, pool in steps:
        replicas, state = decide(pool, config, state, now)
        out.append(replicas)
    return out


def test_a_new_pool_starts_with_its_initial_replicas() -> None:
    assert initial(CONFIG, 0.0)[0] == 1
    assert initial(AutoscaleConfig(initial_replicas=0), 0.0)[0] == 0
    assert initial(AutoscaleConfig(initial_replicas=9, max_replicas=2), 0.0)[0] == 2


@pytest.mark.parametrize(
    ("work", "queued", "slots", "wanted"),
    [(0, 0, 10, 0), (1, 0, 10, 1), (8, 0, 10, 1), (9, 0, 10, 2), (10, 6, 10, 2), (17, 0, 10, 3)],
)
def test_demand_is_work_over_the_utilized_slots(
    work: int, queued: int, slots: int, wanted: int
) -> None:
    assert demand(load(work, queued, slots=slots), CONFIG) == wanted


def test_scale_up_is_immediate_and_clipped_to_the_maximum() -> None:
    assert run([(1.0, load(9)), (2.0, load(30)), (3.0, load(500))]) == [2, 4, 4]


def test_scale_down_waits_for_the_window() -> None:
    steps = [(10.0, load(30, last=10.0))]  # 4 replicas' worth
    steps += [(t, load(1, last=t)) for t in (20.0, 39.0, 40.5, 41.0)]
    assert run(steps) == [4, 4, 4, 1, 1]


def test_an_idle_pool_keeps_one_replica_until_its_idle_ttl_then_zero() -> None:
    steps = [(5.0, load(3, last=5.0)), (100.0, load(last=5.0)), (304.0, load(last=5.0)),
             (305.0, load(last=5.0))]  # fmt: skip
    assert run(steps) == [1, 1, 1, 0]


def test_idle_time_starts_when_the_work_ends_not_when_it_came() -> None:
    # one request at 5 s runs (a cold start, a long stream) until 400 s: not idle meanwhile
    steps = [(5.0, load(1, last=5.0)), (399.0, load(1, last=5.0)), (401.0, load(last=5.0)),
             (698.0, load(last=5.0)), (699.0, load(last=5.0))]  # fmt: skip
    assert run(steps) == [1, 1, 1, 1, 0]


def test_a_request_to_a_pool_at_zero_starts_it() -> None:
    steps = [(400.0, load(last=None)), (401.0, load(queued=1, last=401.0))]
    assert run(steps) == [0, 1]


def test_a_pool_never_used_falls_to_zero_after_the_idle_ttl_from_creation() -> None:
    assert run([(299.0, load(last=None)), (300.0, load(last=None))]) == [1, 0]


def test_minimum_and_warm_replicas() -> None:
    config = AutoscaleConfig(min_replicas=1, max_replicas=5, warm_replicas=1)
    assert run([(1.0, load(9, last=1.0)), (400.0, load(last=1.0))], config) == [3, 1]
    assert run([(1.0, load(last=1.0))], config) == [2]  # in use: one plus one warm


def test_the_window_forgets_old_recommendations() -> None:
    config = AutoscaleConfig(max_replicas=4, scale_down_delay_s=30.0)
    state = AutoscaleState(0.0, tuple((float(t), 4) for t in range(100)))
    replicas, after = decide(load(1, last=200.0), config, state, 200.0)
    assert replicas == 1
    assert after.recent == ((200.0, 1),)


def test_a_versions_bounds_replace_the_deployments_and_keep_min_within_max() -> None:
    assert bounded(CONFIG, None, None) == CONFIG
    two = bounded(CONFIG, 2, None)
    assert (two.min_replicas, two.max_replicas) == (2, 4)
    high = bounded(AutoscaleConfig(), 3, None)  # above the default max of 1: max follows
    assert (high.min_replicas, high.max_replicas) == (3, 3)
    idle = load(last=0.0)
    replicas, _ = decide(idle, two, initial(two, 0.0)[1], 1000.0)
    assert replicas == 2  # idle past the TTL, but the version keeps its minimum
