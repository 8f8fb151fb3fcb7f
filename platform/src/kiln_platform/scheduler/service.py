"""What a pool has been measured to do: service rate and per-request time, as pure updates.

Like Ray Serve's autoscaling policy, the state is a frozen value and every update returns a new
one, so the gateway, the simulator and the tests drive exactly the same arithmetic.

The service rate is an EWMA of completed cost per second *while every credit was in use*: only
then does throughput measure what the pool can do rather than what it was asked to do. It is kept
per slot, so it scales at once when workers join or leave. Until the pool has been saturated, the
rate comes from the service-time fit and Little's law (``slots`` requests in flight, each for
``service_time`` seconds).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

_MIN_BUSY_S = 0.25


@dataclass(frozen=True, slots=True)
class ServiceConfig:
    """How fast the estimates forget, and the prior used before the first completion."""

    rate_time_constant_s: float = 5.0
    """Busy seconds over which the service-rate EWMA averages."""
    alpha: float = 0.05
    """Weight of each completion in the service-time fit ``seconds = a * cost + b``."""
    prior_a: float = 0.01
    """Prior seconds per unit of cost (a pool benchmark or the manifest's hint)."""
    prior_b: float = 0.0
    """Prior fixed seconds per request."""


@dataclass(frozen=True, slots=True)
class ServiceModel:
    """Exponentially weighted estimates of a pool's service."""

    busy_cost: float = 0.0
    """Decayed cost completed per slot while saturated."""
    busy_s: float = 0.0
    """Decayed seconds of saturation matching ``busy_cost``."""
    last_done: float | None = None
    mean_cost: float = 1.0
    mean_s: float = 0.0
    var_cost: float = 0.0
    cov: float = 0.0
    slope: float = 0.0
    """Seconds per cost used while the costs seen so far are too alike to fit a slope."""


def prior(config: ServiceConfig) -> ServiceModel:
    """The model before anything completed: the configured line through cost 1."""
    return ServiceModel(mean_s=config.prior_a + config.prior_b, slope=config.prior_a)


def observe(
    model: ServiceModel,
    config: ServiceConfig,
    *,
    now: float,
    cost: float,
    seconds: float,
    busy_since: float | None,
    slots: int,
) -> ServiceModel:
    """Fold in one completion; ``busy_since``: when every credit last came into use, if so."""
    busy_cost, busy_s = model.busy_cost, model.busy_s
    if busy_since is not None and model.last_done is not None and slots > 0:
        dt = max(now - max(model.last_done, busy_since), 0.0)
        keep = math.exp(-dt / config.rate_time_constant_s)
        busy_cost, busy_s = busy_cost * keep + cost / slots, busy_s * keep + dt
    a = config.alpha
    dx = cost - model.mean_cost
    dy = seconds - model.mean_s
    return replace(
        model,
        busy_cost=busy_cost,
        busy_s=busy_s,
        last_done=now if model.last_done is None else max(now, model.last_done),
        mean_cost=model.mean_cost + a * dx,
        mean_s=model.mean_s + a * dy,
        var_cost=(1 - a) * (model.var_cost + a * dx * dx),
        cov=(1 - a) * (model.cov + a * dx * dy),
    )


def line(model: ServiceModel) -> tuple[float, float]:
    """The fitted ``(a, b)`` of ``seconds = a * cost + b``, both non-negative."""
    spread = model.var_cost > 1e-6 * max(model.mean_cost, 1e-9) ** 2
    a = max(model.cov / model.var_cost if spread else model.slope, 0.0)
    b = model.mean_s - a * model.mean_cost
    if b < 0.0:
        return max(model.mean_s, 0.0) / max(model.mean_cost, 1e-9), 0.0
    return a, b


def service_time(model: ServiceModel, cost: float) -> float:
    """Predicted seconds from dispatch to completion for a request of ``cost``."""
    a, b = line(model)
    return a * cost + b


def service_rate(model: ServiceModel, slots: int) -> float:
    """Cost per second the pool serves when saturated, with ``slots`` credits in all."""
    if model.busy_s > _MIN_BUSY_S and model.busy_cost > 0.0:
        return slots * model.busy_cost / model.busy_s
    per_request = service_time(model, model.mean_cost)
    return slots * model.mean_cost / per_request if per_request > 0 else math.inf
