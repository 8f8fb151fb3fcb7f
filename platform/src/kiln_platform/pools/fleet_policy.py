"""The shared fleet's rules as pure functions (issue 21): who leads, how big the leader makes a
pool, and how much of a worker each gateway may use."""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping


@dataclass(frozen=True, slots=True)
class Term:
    """This gateway's role: the pool manager's leader or a follower, since ``since``."""

    leader: bool
    since: float


def next_term(term: Term, held: bool, now: float) -> Term:
    """The role after a check: ``held`` says the lock is ours now (taken, or still held on a
    live connection); anything else (refused, connection lost) makes a follower."""
    if held == term.leader:
        return term
    return Term(held, now)


def lock_key(name: str) -> int:
    """The advisory lock's key for ``name``: a signed 64-bit number (``pg_try_advisory_lock``)."""
    digest = hashlib.blake2b(name.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


def fleet_replicas(own: int, wishes: Iterable[Mapping[str, int]], pool: str) -> int:
    """The size the leader gives ``pool``: the largest any live gateway's policy wants (each
    decides from its own queue; the largest is the one none can do without)."""
    return max([own, *(int(w.get(pool, 0)) for w in wishes)])


def gateway_share(slots: int, gateways: int) -> int:
    """Credits one of ``gateways`` live gateways keeps in flight on a worker of ``slots``:
    an even share, rounded up (the worker refuses the few over its limit, ``busy``)."""
    return max(1, math.ceil(slots / max(1, gateways)))
