"""Shadow traffic's pure decisions: the share copied, when a copy is dropped (only idle
capacity is used), how answers compare, and the report's figures."""

from __future__ import annotations

import numpy as np
import pytest

from kiln_platform.shadow.policy import (
    CandidateLoad,
    Drop,
    DropLimits,
    compare_embeddings,
    compare_scores,
    compare_tensors,
    compare_tokens,
    drop_reason,
    sampled,
    smoothed,
)
from kiln_platform.shadow.stats import ShadowStats

pytestmark = pytest.mark.unit


def test_the_share_copied_follows_the_percent_and_is_stable_per_request() -> None:
    ids = [f"req_{i}" for i in range(20_000)]
    share = sum(sampled(i, 20) for i in ids) / len(ids)
    assert 0.19 < share < 0.21
    assert [sampled(i, 20) for i in ids[:50]] == [sampled(i, 20) for i in ids[:50]]
    assert not any(sampled(i, 0) for i in ids[:1000])
    assert all(sampled(i, 100) for i in ids[:1000])


@pytest.mark.parametrize(
    ("load", "reason"),
    [
        (CandidateLoad(slots=2, in_flight=0, queued=0, copies=0), None),
        (CandidateLoad(slots=2, in_flight=1, queued=0, copies=1), None),
        (CandidateLoad(slots=0, in_flight=0, queued=0, copies=0), Drop.NOT_READY),
        (CandidateLoad(slots=2, in_flight=2, queued=0, copies=0), Drop.BUSY),
        (CandidateLoad(slots=2, in_flight=1, queued=1, copies=0), Drop.QUEUED),
        (CandidateLoad(slots=8, in_flight=0, queued=0, copies=4), Drop.BOUND),
    ],
)
def test_a_copy_is_dropped_unless_the_candidate_is_idle_enough(
    load: CandidateLoad, reason: Drop | None
) -> None:
    assert drop_reason(load) is reason


@pytest.mark.parametrize(
    ("primary_busy", "primary_queued", "reason"),
    [
        (0.0, 0, None),  # light load: one client
        (0.5, 0, None),  # two clients: the other's request in flight half the time
        (1.0, 0, None),
        (1.5, 0, Drop.PRIMARY_BUSY),  # four clients
        (0.0, 1, Drop.PRIMARY_QUEUED),
        (3.0, 2, Drop.PRIMARY_QUEUED),
    ],
)
def test_a_copy_is_dropped_unless_the_primary_has_spare_capacity(
    primary_busy: float, primary_queued: int, reason: Drop | None
) -> None:
    idle_candidate = CandidateLoad(2, 0, 0, 0, primary_busy, primary_queued)
    assert drop_reason(idle_candidate) is reason


def test_the_primary_rule_comes_before_the_candidates() -> None:
    both_busy = CandidateLoad(2, 2, 1, 0, primary_busy=5.0, primary_queued=0)
    assert drop_reason(both_busy) is Drop.PRIMARY_BUSY
    assert drop_reason(CandidateLoad(0, 0, 0, 0, 5, 5)) is Drop.NOT_READY


def test_the_limits_are_knobs() -> None:
    queued = CandidateLoad(slots=2, in_flight=0, queued=2, copies=6)
    assert drop_reason(queued, DropLimits(max_copies=8, max_queued=2)) is None
    assert drop_reason(queued, DropLimits(max_copies=6, max_queued=2)) is Drop.BOUND
    busy_primary = CandidateLoad(slots=2, in_flight=0, queued=0, copies=0, primary_busy=4.0)
    assert drop_reason(busy_primary, DropLimits(max_primary_busy=4.0)) is None


def test_the_primarys_load_is_averaged_over_its_answers() -> None:
    assert smoothed(None, 3.0) == 3.0
    # a batch of four answered: the readings 3, 2, 1, 0 average to 1.5, over the bound
    busy = None
    for _ in range(50):
        for now in (3.0, 2.0, 1.0, 0.0):
            busy = smoothed(busy, now)
    assert busy is not None
    assert 1.1 < busy < 1.9
    # one empty reading between batches does not make it idle
    assert smoothed(busy, 0.0) > 1.0


def test_embeddings_agree_by_cosine() -> None:
    rng = np.random.default_rng(0)
    a = rng.standard_normal((3, 8)).astype(np.float32)
    same = compare_embeddings(a, a * 2)  # scale does not change the direction
    assert same.agrees
    assert same.cosine_min == pytest.approx(1.0)
    b = a.copy()
    b[1] = rng.standard_normal(8)
    other = compare_embeddings(a, b)
    assert not other.agrees
    assert other.cosine_min is not None
    assert other.cosine_min < 0.9
    assert other.cosine_mean is not None
    assert other.cosine_min < other.cosine_mean < 1.0
    assert not compare_embeddings(a, a[:2]).agrees


def test_scores_agree_by_their_difference_not_their_sign() -> None:
    scores = np.array([[0.91], [0.12], [0.5]], dtype=np.float32)
    # a cosine of 1-wide rows is their signs' agreement: 1.0 for any two positive scores
    assert compare_embeddings(scores, scores / 3).agrees
    close = compare_scores(scores, scores + np.float32(2e-4))
    assert close.agrees
    assert close.max_abs_diff == pytest.approx(2e-4, rel=1e-2)
    apart = compare_scores(scores, scores / 3)
    assert not apart.agrees
    assert apart.max_abs_diff == pytest.approx(0.91 * 2 / 3, rel=1e-5)
    assert not compare_scores(scores, scores[:2]).agrees
    assert not compare_scores(scores, np.full_like(scores, np.nan)).agrees


def test_tensors_agree_by_max_abs_diff() -> None:
    y = np.arange(8, dtype=np.float32).reshape(2, 4)
    assert compare_tensors({"y": y}, {"y": y.copy()}).max_abs_diff == 0.0
    off = compare_tensors({"y": y}, {"y": y + np.float32(0.5)})
    assert not off.agrees
    assert off.max_abs_diff == pytest.approx(0.5)
    assert compare_tensors({"y": y}, {"z": y}).max_abs_diff == float("inf")


def test_generations_agree_by_exact_tokens() -> None:
    assert compare_tokens([1, 2, 3], [1, 2, 3]).agrees
    assert not compare_tokens([1, 2, 3], [1, 2, 4]).agrees
    assert not compare_tokens([1, 2, 3], [1, 2]).agrees


def test_the_report_counts_and_summarizes() -> None:
    stats = ShadowStats("m", "2")
    stats.drop(Drop.BUSY)
    stats.drop(Drop.BUSY)
    stats.skip()
    for i in range(4):
        stats.sent()
        stats.record(compare_tokens([1], [1] if i else [2]), 0.010, 0.020 + i / 1000)
    stats.sent()
    stats.fail()
    report = stats.report("gw")
    assert (report.mirrored, report.failed, report.compared) == (5, 1, 4)
    assert report.dropped == {"busy": 2}
    assert report.not_comparable == 1
    assert report.agreement == 0.75
    assert report.shadow_error_rate == 0.2
    assert report.primary_p50_ms == pytest.approx(10.0)
    assert report.shadow_p99_ms is not None
    assert 22.9 < report.shadow_p99_ms <= 23.0
