"""Routing a model's traffic between its versions: a stable version, and optionally a canary
that serves a share of tenants, chosen by a sticky hash so each tenant sees one version (or,
for a rollout split by request, a share of requests, each drawn anew).

Rollback is setting the route back (``canary_percent`` 0, or the old version as stable);
promotion is making the canary stable. A model without a route serves its newest version.
Routes are read and set by ``registry.services``.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass

_BUCKETS = 10_000


@dataclass(frozen=True, slots=True)
class Route:
    """Which versions serve, and the canary's share (percent of sticky keys)."""

    stable: str
    canary: str | None = None
    canary_percent: int = 0
    by_request: bool = False
    """Draw each request's version anew (a rollout's ``split: request``), not per tenant."""

    @property
    def versions(self) -> tuple[str, ...]:
        """The versions that need a pool."""
        return (self.stable,) if self.canary is None else (self.stable, self.canary)

    def choose(self, model: str, sticky: str) -> str:
        """The version for ``sticky`` (a tenant id): the same one every time for a given route."""
        if self.canary is None or self.canary_percent <= 0:
            return self.stable
        bucket = random.randrange(_BUCKETS) if self.by_request else bucket_of(f"{model}\0{sticky}")
        return self.canary if in_share(bucket, self.canary_percent) else self.stable


def bucket_of(key: str) -> int:
    """``key``'s bucket of 10 000, by hash: the same key lands in the same one every time."""
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big") % _BUCKETS


def in_share(bucket: int, percent: int) -> bool:
    """Whether ``bucket`` is among the first ``percent`` % (a wider share only adds buckets)."""
    return bucket < percent * _BUCKETS // 100
