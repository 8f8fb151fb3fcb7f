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
        if self.by_request:
            bucket = random.randrange(_BUCKETS)
            return self.canary if bucket < self.canary_percent * _BUCKETS // 100 else self.stable
        digest = hashlib.sha256(f"{model}\0{sticky}".encode()).digest()
        bucket = int.from_bytes(digest[:8], "big") % _BUCKETS
        return self.canary if bucket < self.canary_percent * _BUCKETS // 100 else self.stable
