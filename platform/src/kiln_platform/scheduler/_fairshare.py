"""Start-time fair queuing tags for weighted flows; the caller owns the queues.

Start-time fair queuing (Goyal, Vin and Cheng, SIGCOMM 1996) gives each flow a virtual finish
tag that advances by ``cost / weight`` whenever the flow is served, and always serves the flow
with the smallest start tag ``max(v, finish)``, where ``v`` is the start tag last served. Tags
are computed lazily for the head of each flow only, so requests that leave the queue without
service (expired, cancelled) cost their flow nothing.

Two properties matter to Kiln:

* a flow that was idle starts at ``v`` (no credit is banked while idle, so it cannot burst
  ahead of the others) and is served within one round (a new tenant is never starved);
* ``max_lag`` bounds what one request may charge (``cost / weight``, in virtual time): however
  large a request was, its flow's next request waits at most ``max_lag`` of others' service
  (aging for tiny weights and giant requests).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Generic, TypeVar

if TYPE_CHECKING:
    from collections.abc import Hashable, Iterable

K = TypeVar("K", bound="Hashable")

_PRUNE_EVERY = 1024


@dataclass(slots=True)
class _Tag:
    finish: float
    weight: float
    served: int


class VirtualTime(Generic[K]):
    """Weighted fair share between flows keyed by ``K`` (tenants, or priority classes)."""

    def __init__(self, max_lag: float = math.inf) -> None:
        self.v = 0.0
        self.max_lag = max_lag
        self._tags: dict[K, _Tag] = {}
        self._served = 0

    def start(self, key: K) -> float:
        """The start tag the head request of ``key`` would get if served now."""
        tag = self._tags.get(key)
        return self.v if tag is None else max(self.v, tag.finish)

    def pick(self, keys: Iterable[K]) -> K | None:
        """The flow to serve next: smallest start tag, then least recently served."""
        best: K | None = None
        best_rank = (math.inf, math.inf)
        for key in keys:
            tag = self._tags.get(key)
            rank = (self.start(key), -1 if tag is None else tag.served)
            if best is None or rank < best_rank:
                best, best_rank = key, rank
        return best

    def charge(self, key: K, cost: float, weight: float, *, advance: bool = True) -> None:
        """Serve one request of ``cost`` from ``key``: advance ``v`` and the flow's finish tag.

        ``advance=False`` leaves ``v`` alone: for a request served ahead of its turn (the express
        lane), so that it cannot pull the other flows' start tags forward.
        """
        start = self.start(key)
        if advance:
            self.v = start
        self._served += 1
        self._tags[key] = _Tag(start + min(cost / weight, self.max_lag), weight, self._served)
        if self._served % _PRUNE_EVERY == 0:
            self._tags = {k: t for k, t in self._tags.items() if t.finish > self.v}

    def adjust(self, key: K, delta: float) -> None:
        """Correct the last charge of ``key`` by ``delta`` cost (actual minus estimated)."""
        tag = self._tags.get(key)
        if tag is not None:
            tag.finish = min(tag.finish + delta / tag.weight, self.v + self.max_lag)
