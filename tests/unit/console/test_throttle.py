"""The sign-in throttle on a made-up clock."""

from __future__ import annotations

from kiln_console.throttle import Throttle


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_limit_blocks_until_the_oldest_failure_leaves_the_window() -> None:
    clock = Clock()
    throttle = Throttle(3, 60.0, clock=clock)
    for t in (0.0, 10.0, 20.0):
        clock.now = t
        assert throttle.retry_after("a") is None
        throttle.failed("a")
    clock.now = 30.0
    assert throttle.retry_after("a") == 30.0  # the failure at 0 leaves at 60
    assert throttle.retry_after("b") is None  # keys are separate
    clock.now = 60.0
    assert throttle.retry_after("a") is None


def test_a_success_clears_and_old_keys_are_forgotten() -> None:
    clock = Clock()
    throttle = Throttle(2, 60.0, max_keys=2, clock=clock)
    throttle.failed("a")
    throttle.failed("a")
    assert throttle.retry_after("a") is not None
    throttle.clear("a")
    assert throttle.retry_after("a") is None
    throttle.failed("x")
    throttle.failed("x")
    throttle.failed("y")
    throttle.failed("z")  # three keys: the least recent, x, is dropped
    assert throttle.retry_after("x") is None
