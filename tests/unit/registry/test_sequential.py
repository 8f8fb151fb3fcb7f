"""The canary's sequential error test (``registry.sequential``): its false-alarm rate under
equal failure rates stays under alpha however often it is looked at, and against a stable
version that does not fail it rejects at exactly the canary failure ``failures_to_reject``
promises, not one before."""

from __future__ import annotations

import math
import random

import pytest

from kiln_platform.registry.sequential import alternative, failures_to_reject, sprt

pytestmark = pytest.mark.unit

ALPHA, RATIO = 0.05, 2.0


def _run(rng: random.Random, share: float, canary_p: float, stable_p: float, n: int) -> int:
    """Requests until the test rejects, looked at after every request (0: it never did)."""
    counts = [0, 0, 0, 0]  # canary n, canary failed, stable n, stable failed
    for i in range(1, n + 1):
        canary = rng.random() < share
        failed = rng.random() < (canary_p if canary else stable_p)
        arm = 0 if canary else 2
        counts[arm] += 1
        counts[arm + 1] += failed
        if failed and sprt(*counts, alpha=ALPHA, ratio=RATIO, share=share).worse:
            return i
    return 0


@pytest.mark.parametrize(("share", "rate"), [(0.5, 0.05), (0.05, 0.02), (0.25, 0.2)])
def test_equal_rates_raise_false_alarms_less_often_than_alpha(share: float, rate: float) -> None:
    rng = random.Random(19)
    runs = 400
    alarms = sum(_run(rng, share, rate, rate, 3000) > 0 for _ in range(runs))
    assert alarms / runs <= ALPHA, alarms


def test_the_observed_share_keeps_the_bound_too() -> None:
    """Split by tenant: the share is the observed one (looked at every 50 requests)."""
    rng = random.Random(7)
    alarms = 0
    for _ in range(300):
        c = [0, 0, 0, 0]
        for i in range(3000):
            arm = 0 if rng.random() < 0.3 else 2
            c[arm] += 1
            c[arm + 1] += rng.random() < 0.05
            if i % 50 == 49 and sprt(*c, alpha=ALPHA, ratio=RATIO).worse:
                alarms += 1
                break
    assert alarms / 300 <= ALPHA, alarms


@pytest.mark.parametrize("share", [0.05, 0.25, 0.5])
def test_the_test_rejects_at_the_promised_failure_and_not_before(share: float) -> None:
    bound = failures_to_reject(share, alpha=ALPHA, ratio=RATIO)
    n = 1000  # requests per arm: the share is fixed, so only the failures count
    assert not sprt(n, bound - 1, n, 0, alpha=ALPHA, ratio=RATIO, share=share).worse
    assert sprt(n, bound, n, 0, alpha=ALPHA, ratio=RATIO, share=share).worse
    # a canary failing 5 % of its requests is caught within 300 of them, on average
    assert bound / 0.05 <= 300


def test_the_figures() -> None:
    assert alternative(0.5, 2.0) == pytest.approx(2 / 3)
    assert failures_to_reject(0.5, alpha=0.05, ratio=2.0) == math.ceil(
        math.log(20) / math.log(4 / 3)
    )  # 11
    verdict = sprt(100, 3, 100, 0, alpha=0.05, ratio=2.0)
    assert verdict.share == 0.5
    assert verdict.llr == pytest.approx(3 * math.log(4 / 3))
    assert not verdict.worse
    assert sprt(100, 11, 100, 0, alpha=0.05, ratio=2.0).worse
    assert not sprt(100, 11, 100, 10, alpha=0.05, ratio=2.0).worse  # the stable fails too
    assert sprt(0, 0, 0, 0, alpha=0.05, ratio=2.0).llr == 0.0
    assert sprt(5, 5, 0, 0, alpha=0.05, ratio=2.0).llr == 0.0  # no stable: nothing to compare
