"""Pure pool crash-loop policy: when a pool's workers keep crashing, raise
``KilnPoolCrashLoop{model, version}``; resolve it once the pool has a ready worker again.

A pool crash-loops when its backend reports it crashed (every worker down after a crash: the
path that answers 503 at once) and its workers have restarted at least ``min_restarts`` times
in all. It stays firing while its workers restart or start; it resolves when one is ready, or
when the gateway no longer serves the pool at all.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kiln_platform.pools.backend import PoolBackend

ALERTNAME = "KilnPoolCrashLoop"


@dataclass(frozen=True, slots=True)
class PoolHealth:
    """What the policy needs of one pool, as its backend sees it now."""

    model: str
    version: str
    workers: int
    ready: int
    restarts: int
    """Restarts of its workers, summed."""
    crashed: bool
    """Every worker is down after a crash (``PoolBackend.crashed``)."""


def health(backend: PoolBackend) -> dict[str, PoolHealth]:
    """Each pool of ``backend`` (by ``model@version``) as the policy sees it."""
    out = {}
    for key, spec in list(backend.specs.items()):
        workers = backend.pools.get(key, [])
        out[key] = PoolHealth(
            spec.model, spec.version, len(workers), sum(w.ready for w in workers),
            sum(w.restarts for w in workers), backend.crashed(key),
        )  # fmt: skip
    return out


def changes(
    pools: Mapping[str, PoolHealth], firing: Collection[str], min_restarts: int
) -> dict[str, bool]:
    """The crash-loop alerts that change state: pool key -> True (starts firing) or False
    (resolves). ``firing``: the keys whose alert fires now."""
    out = {}
    for key, pool in pools.items():
        if key not in firing and pool.crashed and pool.restarts >= min_restarts:
            out[key] = True
        elif key in firing and pool.ready > 0:
            out[key] = False
    out.update({key: False for key in firing if key not in pools})
    return out
