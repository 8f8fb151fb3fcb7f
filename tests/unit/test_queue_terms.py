"""A request's deadline counts from its arrival, not from when it reached its pool's queue."""

from __future__ import annotations

import time

from kiln_platform.admission.services import QueueTerms


def test_time_before_the_queue_counts_against_the_deadline() -> None:
    terms = QueueTerms("t", timeout_s=2.0, arrived=time.monotonic() - 1.5)
    left = terms.left_s()
    assert left is not None
    assert 0.4 < left <= 0.5
    late = QueueTerms("t", timeout_s=2.0, arrived=time.monotonic() - 3.0).left_s()
    assert late is not None
    assert late < 0, "past its deadline before it was queued: refused at once"


def test_terms_without_arrival_or_timeout_keep_the_timeout() -> None:
    assert QueueTerms("t", timeout_s=2.0).left_s() == 2.0
    assert QueueTerms("t", arrived=time.monotonic()).left_s() is None
