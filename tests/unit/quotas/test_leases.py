"""The lease and hold policy: how long they live, and how often running requests renew them."""

from __future__ import annotations

import pytest

from kiln_platform.quotas.leases import lifetime, renew_every
from kiln_platform.settings import Settings


def test_a_lease_outlives_the_servers_bound_by_one_ttl() -> None:
    assert lifetime(30.0, 60.0) == 90.0
    assert lifetime(30.0, 300.0) == 330.0
    assert lifetime(0.5, 0.0) == 0.5
    assert lifetime(0.5, -3.0) == 0.5  # no bound never shortens it below the TTL


@pytest.mark.parametrize("bound", [0.0, 1.0, 60.0, 300.0, 86_400.0])
@pytest.mark.parametrize("ttl", [0.3, 30.0])
def test_never_less_than_the_bound_nor_the_ttl(ttl: float, bound: float) -> None:
    assert lifetime(ttl, bound) >= bound
    assert lifetime(ttl, bound) >= ttl


def test_renewed_three_times_a_ttl() -> None:
    assert renew_every(30.0) == 10.0
    assert renew_every(0.6) == pytest.approx(0.2)
    assert 2 * renew_every(7.0) < 7.0  # two failed renewals in a row still leave it alive


def test_defaults_hold_a_stream_for_its_deadline() -> None:
    settings = Settings()
    assert settings.stream_timeout_s == 300.0
    assert settings.lease_ttl_s == 30.0
    assert lifetime(settings.lease_ttl_s, settings.stream_timeout_s) > settings.stream_timeout_s
    assert lifetime(settings.lease_ttl_s, settings.request_timeout_s) > settings.request_timeout_s
