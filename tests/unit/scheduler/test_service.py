"""The service model: a fitted service time and the service rate measured while saturated."""

from __future__ import annotations

import pytest

from kiln_platform.scheduler import service
from kiln_platform.scheduler.service import ServiceConfig

CONFIG = ServiceConfig(prior_a=0.01, prior_b=0.05, alpha=0.05)


def test_the_prior_is_the_configured_line() -> None:
    model = service.prior(CONFIG)
    assert service.service_time(model, 10.0) == pytest.approx(0.15)
    assert service.service_rate(model, slots=4) == pytest.approx(4 * 1.0 / 0.06)


def test_it_learns_a_line_from_completions() -> None:
    model = service.prior(CONFIG)
    for i in range(2000):
        cost = 1.0 + i % 16
        model = service.observe(
            model,
            CONFIG,
            now=i * 0.01,
            cost=cost,
            seconds=0.002 * cost + 0.02,
            busy_since=None,
            slots=1,
        )
    a, b = service.line(model)
    assert a == pytest.approx(0.002, rel=0.02)
    assert b == pytest.approx(0.02, rel=0.05)


def test_the_rate_is_measured_only_while_saturated() -> None:
    model = service.prior(CONFIG)
    now = 0.0
    for _ in range(500):  # a trickle: 1 cost every 0.1 s, the pool mostly idle
        now += 0.1
        model = service.observe(
            model, CONFIG, now=now, cost=1.0, seconds=0.06, busy_since=None, slots=4
        )
    assert service.service_rate(model, 4) == pytest.approx(4 / 0.06, rel=0.01)  # Little's law
    for _ in range(2000):  # saturated: 4 slots complete 200 cost per second
        now += 0.005
        model = service.observe(
            model, CONFIG, now=now, cost=1.0, seconds=0.02, busy_since=0.0, slots=4
        )
    assert service.service_rate(model, 4) == pytest.approx(200.0, rel=0.01)
    assert service.service_rate(model, 8) == pytest.approx(400.0, rel=0.01)  # per slot


def test_idle_time_before_saturation_is_not_counted() -> None:
    model = service.prior(CONFIG)
    model = service.observe(model, CONFIG, now=0.0, cost=1.0, seconds=0.1, busy_since=None, slots=1)
    now = 100.0  # long idle, then saturated from t=100
    for _ in range(1000):
        now += 0.01
        model = service.observe(
            model, CONFIG, now=now, cost=1.0, seconds=0.01, busy_since=100.0, slots=1
        )
    assert service.service_rate(model, 1) == pytest.approx(100.0, rel=0.01)


def test_negative_intercepts_fall_back_to_a_proportional_line() -> None:
    model = service.prior(ServiceConfig(prior_a=0.0, prior_b=0.0, alpha=0.5))
    for cost, seconds in [(1.0, 0.0), (10.0, 1.0), (1.0, 0.0), (10.0, 1.0)]:
        model = service.observe(
            model, CONFIG, now=0.0, cost=cost, seconds=seconds, busy_since=None, slots=1
        )
    a, b = service.line(model)
    assert a >= 0.0
    assert b >= 0.0
