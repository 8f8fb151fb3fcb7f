"""Choosing a version by route: sticky per tenant, the canary's share honoured."""

from __future__ import annotations

import uuid

import pytest

from kiln_platform.registry.routes import Route, bucket_of, in_share
from kiln_platform.shadow.policy import sampled

TENANTS = [str(uuid.UUID(int=i)) for i in range(4000)]


def test_without_a_canary_everyone_gets_stable() -> None:
    assert {Route("1").choose("m", t) for t in TENANTS} == {"1"}
    assert {Route("1", "2", 0).choose("m", t) for t in TENANTS} == {"1"}
    assert Route("1", "2", 30).versions == ("1", "2")
    assert Route("1").versions == ("1",)


def test_all_of_a_full_canary() -> None:
    assert {Route("1", "2", 100).choose("m", t) for t in TENANTS} == {"2"}


@pytest.mark.parametrize("percent", [1, 10, 30, 50, 90])
def test_the_canary_gets_its_share_of_tenants(percent: int) -> None:
    share = sum(Route("1", "2", percent).choose("m", t) == "2" for t in TENANTS) / len(TENANTS)
    assert abs(share - percent / 100) < 0.025


def test_a_tenant_keeps_its_version_and_a_bigger_canary_only_adds_tenants() -> None:
    small, big = Route("1", "2", 10), Route("1", "2", 40)
    for t in TENANTS[:200]:
        assert small.choose("m", t) == small.choose("m", t)
        if small.choose("m", t) == "2":
            assert big.choose("m", t) == "2"  # widening a canary never moves a tenant back


def test_models_hash_independently() -> None:
    a = [Route("1", "2", 50).choose("a", t) for t in TENANTS]
    b = [Route("1", "2", 50).choose("b", t) for t in TENANTS]
    assert a != b  # not the same half of the tenants on every model


def test_one_share_rule_for_routes_and_shadows() -> None:
    assert (in_share(99, 1), in_share(100, 1), in_share(0, 0), in_share(9999, 100)) == (
        True, False, False, True)  # fmt: skip
    assert all(sampled(t, 30) == in_share(bucket_of(t), 30) for t in TENANTS)
    assert all((Route("1", "2", 30).choose("m", t) == "2") == in_share(bucket_of(f"m\0{t}"), 30)
               for t in TENANTS)  # fmt: skip
