"""Shedding a flood before it costs the gateway: the pools' recent refusals, and the ASGI gate
that repeats them to the requests that follow, before Litestar parses, authenticates (beyond
the key cache) or validates anything.

When a pool's scheduler turns a request away with a ``Retry-After`` (429 over its tenant's
share, 503 overloaded), it predicts that no request of that tenant, class and deadline can be
admitted for that long. Under a burst of 10x capacity nine in ten requests meet that answer;
without the gate each one still runs the whole request path first (middleware, dependencies,
the body's validation, model resolution), and on a CPU-bound gateway that work delays every
answer, the refusals most (issue 23: shed p99 0.2-1.3 s). The gate answers them for the
cost of a cache lookup and a peek at the body's ``model``: the same status, error and
``Retry-After`` (what is left of the pool's), from the same error renderer. Requests that
arrive once the time is up reach the scheduler, which decides afresh. With nothing refused
recently the gate costs one check of an empty dict.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kiln_platform.errors import KilnError, Overloaded, ServiceUnavailable

if TYPE_CHECKING:
    from kiln_platform.scheduler.schemas import Priority

MAX_HELD_S = 1.0
"""The longest a refusal is repeated without asking the scheduler again."""
MAX_ENTRIES = 4096
"""Past this many refusals held, expired ones are dropped (the map stays bounded)."""
_SHED = (Overloaded, ServiceUnavailable)

Key = tuple[str, str, "Priority"]


@dataclass(frozen=True, slots=True)
class _Held:
    until: float
    timeout_s: float
    error: KilnError


class RecentRefusals:
    """The pools' refusals with a ``Retry-After``, by tenant, requested model and class."""

    def __init__(self) -> None:
        self._held: dict[Key, _Held] = {}
        self._latest = 0.0
        """When the last held refusal ends: past it, all are dropped at once."""

    def __bool__(self) -> bool:
        """Whether any refusal is held now."""
        if self._held and time.monotonic() >= self._latest:
            self._held.clear()
        return bool(self._held)

    def __len__(self) -> int:
        return len(self._held)

    def hold(self, key: Key, timeout_s: float | None, error: KilnError) -> None:
        """Remember a pool's refusal of a request (``key``: its tenant, model as requested and
        class) that had ``timeout_s``: a 429/503 with a retry time."""
        if not isinstance(error, _SHED) or error.retry_after is None or timeout_s is None:
            return
        now = time.monotonic()
        if len(self._held) >= MAX_ENTRIES:
            self._held = {k: v for k, v in self._held.items() if v.until > now}
        until = now + min(error.retry_after, MAX_HELD_S)
        self._latest = max(self._latest, until)
        self._held[key] = _Held(until, timeout_s, error)

    def refusal(
        self, tenant: str, model: str, priority: Priority, timeout_s: float
    ) -> KilnError | None:
        """The refusal a request with these terms meets now, if any: the pool's held one, for
        a deadline no longer than the refused request's, with what is left of its retry time."""
        key = (tenant, model, priority)
        held = self._held.get(key)
        if held is None:
            return None
        left = held.until - time.monotonic()
        if left <= 0:
            del self._held[key]
            return None
        if timeout_s > held.timeout_s:
            return None
        return type(held.error)(held.error.message, retry_after=left)
