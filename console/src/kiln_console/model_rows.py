"""The models page's rows: each version's state, pool and latency, from what the services and
this gateway's pool manager already hold (no query of its own)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kiln_platform.compiler.schemas import CompileJobView
    from kiln_platform.gateway.latency import Latency
    from kiln_platform.pools.backend import PoolSize
    from kiln_platform.registry.schemas import RouteView

SERVING, NOT_ROUTED, BUILDING, FAILED = "serving", "not routed", "building", "failed"


@dataclass(frozen=True, slots=True)
class VersionRow:
    """One row of a model's table."""

    version: str
    state: str
    """serving, not routed, building (an import's job runs) or failed (its job failed)."""
    serves: str
    """stable / canary and the share, or empty."""
    pool: PoolSize | None
    latency: Latency | None
    job: CompileJobView | None = None


def serves(route: RouteView, version: str) -> str:
    """What share of the model's traffic ``version`` takes under ``route``."""
    canary = route.canary_version
    if version == route.stable_version:
        return f"stable ({100 - route.canary_percent} %)" if canary else "stable"
    if version == canary:
        return f"canary ({route.canary_percent} %)"
    return ""


def rows(
    route: RouteView,
    versions: list[str],
    jobs: list[CompileJobView],
    sizes: dict[str, PoolSize],
    latency: dict[str, Latency],
) -> list[VersionRow]:
    """The model's versions, oldest first, then its imports still building or failed (the
    newest job per version; a version that exists is past its job)."""
    found = []
    for version in versions:
        key = f"{route.model}@{version}"
        share = serves(route, version)
        state = SERVING if share else NOT_ROUTED
        found.append(VersionRow(version, state, share, sizes.get(key), latency.get(key)))
    seen = set(versions)
    for job in jobs:  # newest first
        if job.model != route.model or job.version in seen:
            continue
        seen.add(job.version)
        if job.status in ("queued", "running"):
            found.append(VersionRow(job.version, BUILDING, "", None, None, job))
        elif job.status == "failed":
            found.append(VersionRow(job.version, FAILED, "", None, None, job))
    return found
