"""How long a concurrency lease or a budget hold lives, and how often its request renews it.

A lease (or hold) is written with an expiry, so that one left behind by a killed gateway lapses.
Two rules keep a live request's from lapsing first:

- it is written to outlive the most the server lets its request run (``bound_s``: the request
  timeout, or a generation's stream deadline), plus one TTL of slack for its release;
- while its request runs, its gateway pushes the expiry to at least one TTL ahead, every third of
  a TTL, so two renewals can fail in a row before it lapses.
"""

from __future__ import annotations


def lifetime(ttl_s: float, bound_s: float) -> float:
    """Seconds a new lease or hold lives: the server's bound on its request, plus one TTL."""
    return max(0.0, bound_s) + ttl_s


def renew_every(ttl_s: float) -> float:
    """Seconds between renewals of the leases and holds of running requests."""
    return ttl_s / 3
