"""A tenant's pin: honoured while its target resolves, else the route's choice (no 404)."""

from __future__ import annotations

import uuid
from dataclasses import replace
from datetime import UTC, datetime

import pytest

from kiln_platform.registry.outcomes import RolloutOutcomes, Watched
from kiln_platform.registry.resolver import Resolver
from kiln_platform.registry.routes import Route
from kiln_platform.registry.services import ResolvedVersion
from kiln_runtimes.protocol import ModelManifest

pytestmark = pytest.mark.unit

V1 = ResolvedVersion(
    "m", "1", "sha256:" + "ab12" * 16, ModelManifest(name="m", task="embeddings",
    engine="onnxruntime", dimensions=4), datetime(2026, 1, 1, tzinfo=UTC),
)  # fmt: skip
V2 = replace(V1, version="2", created_at=datetime(2026, 2, 1, tzinfo=UTC))


def _resolver(
    pin: str, route: Route | None, aliases: dict[str, str] | None = None,
    outcomes: RolloutOutcomes | None = None,
) -> Resolver:  # fmt: skip
    deferred = (outcomes or RolloutOutcomes()).deferred  # one watching nothing counts nothing
    resolver = Resolver(None, deferred)  # type: ignore[arg-type]  # lookups open no session
    resolver.catalog = {"m": {"1": V1, "2": V2}}
    resolver.routes = {} if route is None else {"m": route}
    resolver.aliases = {"m": aliases or {}}
    resolver.pins = {"m": {"t": pin}}
    return resolver


@pytest.mark.parametrize(
    ("pin", "route", "aliases"),
    [
        ("canary", Route("1"), None),  # no canary on the route
        ("canary", None, None),  # no route at all
        ("stable", None, None),  # no route: falls to the default (newest)
        ("gone", Route("1"), None),  # an alias deleted since
    ],
)
def test_a_pin_that_names_nothing_falls_back_to_the_route(
    pin: str, route: Route | None, aliases: dict[str, str] | None
) -> None:
    resolver = _resolver(pin, route, aliases)
    unpinned = resolver._lookup("m", None, "other")
    assert unpinned is not None
    assert resolver._lookup("m", None, "t") == unpinned


def test_a_pin_that_resolves_is_honoured() -> None:
    assert _resolver("1", None)._lookup("m", None, "t") == V1
    assert _resolver("prod", Route("2"), {"prod": "1"})._lookup("m", None, "t") == V1
    assert _resolver("canary", Route("2", "1", 0))._lookup("m", None, "t") == V1


def test_an_explicit_address_ignores_the_pin() -> None:
    assert _resolver("1", Route("2"))._lookup("m", "2", "t") == V2
    assert _resolver("1", Route("2"))._lookup("m", "canary", "t") is None


def test_only_the_routes_draw_is_a_rollouts_evidence() -> None:
    """A canary's arms compare requests the split assigned; a pinned tenant, a version, an alias
    or ``@canary`` named by the client chose its arm itself."""
    resolver = _resolver("1", Route("1", "2", 50))
    assert resolver.split("m", "other")
    assert not resolver.split("m", "t")  # pinned
    assert not resolver.split("m@2", "other")
    assert not resolver.split("m@canary", "other")
    assert not _resolver("1", None).split("m", "other")  # no route: no rollout to feed


async def test_a_warming_canarys_draws_are_served_by_stable_and_are_no_evidence() -> None:
    """While the canary's pool has no ready worker, the tenants the split draws for it get the
    stable version and do not count for the rollout; a pinned tenant and ``@canary`` wait."""
    outcomes, rollout = RolloutOutcomes(), uuid.uuid4()
    outcomes.watch([Watched(rollout, "m", 0, "1", "2")])
    resolver, asked = _resolver("canary", Route("1", "2", 100), outcomes=outcomes), list[str]()

    def warming(pool: str) -> bool:
        asked.append(pool)
        return True

    resolver.warming = warming
    assert (await resolver.resolve("m", "other")).version == "1"
    assert not resolver.split("m", "other")
    assert set(asked) == {"m@2"}  # asking is the pool manager's demand: it starts the pool
    assert (await resolver.resolve("m", "t")).version == "2"  # pinned to the canary
    assert (await resolver.resolve("m@canary", "other")).version == "2"
    counts = outcomes.snapshot()  # the draw kept on stable counts toward the progress deadline
    assert {k: v.total for k, v in counts.items()} == {(rollout, 0, "deferred"): 1}
    resolver.warming = lambda _: False  # ready
    assert (await resolver.resolve("m", "other")).version == "2"
    assert resolver.split("m", "other")
    idle, asked[:] = _resolver("1", Route("1", "2", 0)), []
    idle.warming = warming
    assert (await idle.resolve("m", "other")).version == "1"
    assert idle.split("m", "other")
    assert asked == []  # a canary at 0 % is no demand
