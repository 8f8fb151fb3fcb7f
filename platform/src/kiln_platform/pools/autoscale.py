"""How many workers a pool should run: a pure policy, like Ray Serve's and Knative's.

``decide(load, config, state, now) -> (replicas, state)``. Scaling up is immediate: demand is the
work in the pool (in flight + queued) over what one replica should carry (its slots times the
target utilization), plus the warm replicas kept beyond demand while the pool is in use. Scaling
down waits: the decision is the highest recommendation of the last ``scale_down_delay_s``
(Knative's stable window), so a lull does not stop a worker that the next burst needs. A pool
with no work for ``idle_to_zero_s`` falls to ``min_replicas`` — zero by default — and the next
request starts it again (the pool manager holds that request while the worker starts).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace


@dataclass(frozen=True, slots=True)
class AutoscaleConfig:
    """The knobs (``KILN_POOL_*`` settings)."""

    min_replicas: int = 0
    max_replicas: int = 1
    initial_replicas: int = 1
    """Replicas a pool starts with when its model is registered (then idle rules apply)."""
    target_utilization: float = 0.8
    """Fraction of a replica's slots that demand may fill before another replica is wanted."""
    warm_replicas: int = 0
    """Replicas kept beyond demand while the pool is in use (headroom for a burst)."""
    scale_down_delay_s: float = 30.0
    idle_to_zero_s: float = 300.0


@dataclass(frozen=True, slots=True)
class PoolLoad:
    """What the pool manager sees of a pool at one instant."""

    in_flight: int
    queued: int
    slots_per_replica: int
    last_request_at: float | None
    """When the pool last received a request (None: never)."""


@dataclass(frozen=True, slots=True)
class AutoscaleState:
    """What the policy remembers between decisions."""

    created_at: float
    recent: tuple[tuple[float, int], ...] = field(default=())
    """(time, recommendation) over the scale-down window, oldest first."""
    busy_at: float | None = None
    """The last decision that saw work in the pool: idle time counts from the later of it and
    the last request (a request that ran longer than the idle TTL is not idle time)."""


def bounded(
    config: AutoscaleConfig, min_replicas: int | None, max_replicas: int | None
) -> AutoscaleConfig:
    """``config`` with a version's own bounds (its engine settings; None: the deployment's).
    A minimum above the deployment's maximum raises the maximum with it."""
    low = config.min_replicas if min_replicas is None else min_replicas
    high = config.max_replicas if max_replicas is None else max_replicas
    return replace(config, min_replicas=low, max_replicas=max(low, high))


def initial(config: AutoscaleConfig, now: float) -> tuple[int, AutoscaleState]:
    """A new pool's replicas and state."""
    replicas = _clip(config.initial_replicas, config)
    return replicas, AutoscaleState(now, ((now, replicas),))


def demand(load: PoolLoad, config: AutoscaleConfig) -> int:
    """Replicas the work in the pool needs now (0 with no work)."""
    work = load.in_flight + load.queued
    if work == 0:
        return 0
    per_replica = max(load.slots_per_replica * config.target_utilization, 1e-9)
    return math.ceil(work / per_replica - 1e-9)


def decide(
    load: PoolLoad, config: AutoscaleConfig, state: AutoscaleState, now: float
) -> tuple[int, AutoscaleState]:
    """Desired replicas now, and the new state."""
    work = load.in_flight + load.queued
    busy_at = now if work else state.busy_at
    last_used = max(load.last_request_at or state.created_at, busy_at or 0.0, state.created_at)
    idle = work == 0 and now - last_used >= config.idle_to_zero_s
    in_use = max(demand(load, config), 1) + config.warm_replicas
    wanted = _clip(config.min_replicas if idle else in_use, config)
    window = now - config.scale_down_delay_s
    recent = (*(r for r in state.recent if r[0] > window), (now, wanted))
    replicas = wanted if idle else max(n for _, n in recent)
    return replicas, AutoscaleState(state.created_at, recent, busy_at)


def _clip(replicas: int, config: AutoscaleConfig) -> int:
    return max(config.min_replicas, min(replicas, config.max_replicas))
