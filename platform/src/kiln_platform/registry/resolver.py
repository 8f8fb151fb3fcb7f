"""The Resolver: a model address -> the version that serves a request, from an in-memory copy
of the catalog (versions, routes, aliases, tenant pins) reloaded from the database."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from sqlalchemy import select

from kiln_platform.db.tables import Model, ModelAlias, ModelPin, ModelRoute, ModelVersion
from kiln_platform.errors import ModelNotFound
from kiln_platform.registry.lifecycle import DEFAULT_SERVING, address, refuse_retired
from kiln_platform.registry.routes import Route
from kiln_platform.registry.services import ResolvedVersion, resolved
from kiln_platform.shadow.policy import Shadow
from kiln_platform.shadow.tables import ModelShadow

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker


Catalog = dict[str, dict[str, ResolvedVersion]]
"""Every model's versions, by version."""
Named = dict[str, dict[str, str]]
"""Per model: alias -> version, or tenant id -> pinned target."""


async def load_catalog(
    session: AsyncSession,
) -> tuple[Catalog, dict[str, Route], Named, Named]:
    """Every version, route, alias and tenant pin (four queries)."""
    catalog: Catalog = {}
    rows = await session.execute(
        select(Model, ModelVersion).join(ModelVersion, ModelVersion.model_id == Model.id)
    )
    for model, version in rows.all():
        catalog.setdefault(model.name, {})[version.version] = resolved(model, version)
    routes = {
        name: Route(
            row.stable_version,
            row.canary_version,
            row.canary_percent,
            row.canary_split == "request",
        )
        for name, row in (
            await session.execute(
                select(Model.name, ModelRoute).join(ModelRoute, ModelRoute.model_id == Model.id)
            )
        ).all()
    }
    aliases = await _named(session, ModelAlias.alias, ModelAlias.version)
    pins = await _named(session, ModelPin.tenant_id, ModelPin.target)
    return catalog, routes, aliases, pins


async def load_shadows(session: AsyncSession) -> dict[str, Shadow]:
    """Every model's shadow candidate and share (``shadow``)."""
    rows = await session.execute(
        select(Model.name, ModelShadow).join(ModelShadow, ModelShadow.model_id == Model.id)
    )
    return {name: Shadow(row.version, row.percent) for name, row in rows.all()}


async def _named(session: AsyncSession, key: Any, value: Any) -> dict[str, dict[str, str]]:
    """Rows of a per-model table as model name -> str(key) -> value (aliases, pins)."""
    found: dict[str, dict[str, str]] = {}
    query = select(Model.name, key, value).join(Model, Model.id == key.class_.model_id)
    for name, k, v in (await session.execute(query)).all():
        found.setdefault(name, {})[str(k)] = v
    return found


def _default(versions: dict[str, ResolvedVersion]) -> ResolvedVersion | None:
    """A model's newest active or deprecated version (what it serves without a route)."""
    live = [v for v in versions.values() if v.state in DEFAULT_SERVING]
    return max(live, key=lambda v: v.created_at) if live else None


def _choose(  # noqa: PLR0917
    name: str, route: Route | None, versions: dict[str, ResolvedVersion], aliases: dict[str, str],
    suffix: str | None, sticky: str,
) -> str | None:  # fmt: skip
    """The version an address's suffix names (``None``: the route's choice, else the default)."""
    if route is not None and suffix in {None, "stable", "canary"}:
        return route.choose(name, sticky) if suffix is None else (
            route.stable if suffix == "stable" else route.canary)  # fmt: skip
    if suffix in {None, "stable"}:
        return getattr(_default(versions), "version", None)
    if suffix == "canary":
        return None
    return aliases.get(suffix, suffix)


DEMAND_IDLE_S = 30.0
"""A version asked for by number (``model@3``) that no route or alias serves keeps its pool
while it was asked for within this long; then its pool is retired like any unrouted one."""

MISS_REFRESH_S = 0.25
"""A name the cache does not know reloads the catalog, but at most this often (a miss soon after
a reload waits for the next one) and concurrent misses share one reload: a flood of made-up
model names costs the database one reload per 250 ms, not one per request."""


def _never(_: str) -> bool:
    return False


def _ignore(_: str) -> None:
    return None


class Resolver:
    """Model address -> the version that serves a request, from an in-memory copy of the
    catalog refreshed from the database (no round trip per request).

    ``model``: the route's stable version or its canary (sticky per tenant), else the newest
    active one; ``model@stable`` / ``model@canary``: the route's; ``model@prod``: an alias;
    ``model@3``: that version. Served versions (one pool each) are the routed or default ones,
    alias targets, and versions requested by number since this process started."""

    def __init__(
        self, sessions: async_sessionmaker[AsyncSession],
        deferred: Callable[[str], None] = _ignore,
    ) -> None:  # fmt: skip
        self._sessions = sessions
        self._deferred = deferred
        """Told of each draw of a model's canary served by its stable version while the canary's
        pool started (``RolloutOutcomes.deferred``: a canary never ready is rolled back)."""
        self.catalog: Catalog = {}
        self.routes: dict[str, Route] = {}
        self.aliases: Named = {}
        self.pins: Named = {}
        """Per model: tenant id -> the version or alias an operator pinned it to."""
        self.shadows: dict[str, Shadow] = {}
        """Per model: the candidate a share of its requests is copied to (``shadow``)."""
        self.candidates: set[tuple[str, str]] = set()
        """(model, version) of pools that serve only as a shadow's candidate."""
        self.served: Catalog = {}
        """Each model's served versions, by version."""
        self.warming: Callable[[str], bool] = _never
        """Whether a pool (``model@version``) is still starting, no worker of it ready yet (set
        by the pool manager, for whom asking counts as demand: it starts a pool at zero)."""
        self._demanded: dict[tuple[str, str], float] = {}
        """Versions asked for by number that nothing else serves, and when they last were."""
        self._refreshed_at = -math.inf
        self._reload: asyncio.Future[list[ResolvedVersion]] | None = None

    async def refresh(self) -> list[ResolvedVersion]:
        """Reload the catalog; returns every served version (one pool each)."""
        if self._reload is None:  # concurrent callers share the reload in flight
            self._reload = asyncio.ensure_future(self._load())
            self._reload.add_done_callback(self._reloaded)
        return await asyncio.shield(self._reload)

    def _reloaded(self, _: asyncio.Future[list[ResolvedVersion]]) -> None:
        self._reload = None

    async def _load(self) -> list[ResolvedVersion]:
        started = time.monotonic()
        async with self._sessions() as session:
            catalog, routes, aliases, pins = await load_catalog(session)
            shadows = await load_shadows(session)
        routes = {m: r for m, r in routes.items() if set(r.versions) <= set(catalog.get(m, {}))}
        idle = started - DEMAND_IDLE_S
        self._demanded = {k: t for k, t in self._demanded.items() if t > idle}
        wanted: set[tuple[str, str]] = set()
        for name, versions in catalog.items():
            route, default = routes.get(name), _default(versions)
            if route is not None:
                wanted.update((name, v) for v in route.versions)
            elif default is not None:
                wanted.add((name, default.version))
            named = aliases.get(name, {})
            wanted.update((name, v) for v in named.values())
            wanted.update((name, named.get(t, t)) for t in pins.get(name, {}).values())
        candidates = {(n, s.version) for n, s in shadows.items()} - wanted
        wanted |= candidates | set(self._demanded)  # a candidate has a pool, like a canary
        served: Catalog = {}
        for name, version in wanted:
            found = catalog.get(name, {}).get(version)
            if found is not None and found.state != "retired":
                served.setdefault(name, {})[version] = found
        self.catalog, self.routes, self.served = catalog, routes, served
        self.aliases, self.pins, self.shadows = aliases, pins, shadows
        self.candidates = candidates
        self._refreshed_at = started
        return [v for versions in served.values() for v in versions.values()]

    async def resolve(self, model: str, sticky: str = "") -> ResolvedVersion:
        """The version ``model`` (an address) names for ``sticky`` (a tenant id)."""
        name, suffix = address(model)
        found = self._lookup(name, suffix, sticky)
        if found is None:  # new since the last reload, or made up: reload, at most so often
            await asyncio.sleep(self._refreshed_at + MISS_REFRESH_S - time.monotonic())
            await self.refresh()
            found = self._lookup(name, suffix, sticky)
        if found is None:
            raise ModelNotFound(f"The model `{model}` does not exist.", param="model")
        if suffix is None and self._canary_warming(name, sticky) == found.version:
            self._deferred(name)
            found = self.catalog[name].get(self.routes[name].stable, found)
        return self._serve(refuse_retired(found))

    def _canary_warming(self, name: str, sticky: str) -> str | None:
        """The canary ``name``'s split may draw for ``sticky`` while its pool is still starting.
        Such a draw is served by the stable version, as Flagger shifts traffic only to a ready
        canary: the canary's start is then no request's wait, nor a latency its rollout
        compares (a pinned tenant, and ``@canary``, wait for it)."""
        route = self.routes.get(name)
        if route is None or route.canary is None or route.canary_percent <= 0:
            return None
        if sticky in self.pins.get(name, {}):
            return None
        return route.canary if self.warming(f"{name}@{route.canary}") else None

    def listed(self, sticky: str) -> list[ResolvedVersion]:
        """What each model's plain name gives ``sticky`` now (``/v1/models``), without reloads;
        models with nothing to give (only staging or retired versions) are left out."""
        found = (self._lookup(name, None, sticky) for name in sorted(self.catalog))
        return [v for v in found if v is not None and v.state != "retired"]

    def _lookup(self, name: str, suffix: str | None, sticky: str) -> ResolvedVersion | None:
        """What ``name@suffix`` gives ``sticky``; a plain name honours the tenant's pin while
        its target resolves (a pin to an absent canary, a routeless ``stable`` or a deleted
        alias falls back to the unpinned choice, not to a 404 and a reload per request)."""
        versions = self.catalog.get(name)
        if versions is None:
            return None
        route, aliases = self.routes.get(name), self.aliases.get(name, {})
        pin = self.pins.get(name, {}).get(sticky) if suffix is None else None
        if pin is not None:
            found = versions.get(_choose(name, route, versions, aliases, pin, sticky) or "")
            if found is not None:
                return found
        chosen = _choose(name, route, versions, aliases, suffix, sticky)
        return None if chosen is None else versions.get(chosen)

    def split(self, model: str, sticky: str) -> bool:
        """Whether ``model`` (an address) reaches ``sticky`` through its route's split: a plain
        name, a route, no pin for the tenant, and the canary's pool ready. Only such requests
        are a rollout's evidence: ones that name a version, an alias or ``@canary``, come from
        a pinned tenant or were kept on stable while the canary started did not land on their
        arm by the split's draw, so they would bias the comparison."""
        name, suffix = address(model)
        return (suffix is None and name in self.routes and sticky not in self.pins.get(name, {})
                and self._canary_warming(name, sticky) is None)  # fmt: skip

    def _serve(self, version: ResolvedVersion) -> ResolvedVersion:
        """Make sure ``version`` has a pool (the pool manager adopts it on first use)."""
        served, key = self.served.setdefault(version.model, {}), (version.model, version.version)
        if version.version not in served or key in self._demanded:
            self._demanded[key] = time.monotonic()
            served[version.version] = version
        return version
