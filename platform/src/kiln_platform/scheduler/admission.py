"""Admission control: admit at once, or reject at once with a reason and a retry hint.

The predicted wait of a request is the work the fair queue will serve before it starts, divided
by the pool's measured service rate. "Work served before it" follows the fluid (GPS) model of the
policy: while the tenant's own backlog drains, every other flow is served what it has queued and
keeps adding, up to its weighted share of that backlog plus one request; first between the
tenants of the class, then between priority classes. Decisions are plain data (``Decision``);
the gateway turns rejections into 429/503/504 responses (``runner.rejection``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING

from kiln_platform.scheduler.schemas import Priority

if TYPE_CHECKING:
    from kiln_platform.scheduler.policy import PolicyConfig
    from kiln_platform.scheduler.schemas import Backlog, Request


_STEPS = 8


class RejectReason(StrEnum):
    """Why a request was turned away (metric label, log field, and error message key)."""

    TENANT_QUEUE_FULL = "tenant_queue_full"
    TENANT_OVER_SHARE = "tenant_over_share"
    POOL_QUEUE_FULL = "pool_queue_full"
    POOL_OVERLOADED = "pool_overloaded"
    DEADLINE_TOO_SHORT = "deadline_too_short"
    DEADLINE_EXPIRED = "deadline_expired"
    """Not an admission outcome: admitted, then dropped while queued (counted alongside)."""

    @property
    def status(self) -> int:
        """The HTTP status the gateway answers with."""
        if self in (RejectReason.TENANT_QUEUE_FULL, RejectReason.TENANT_OVER_SHARE):
            return 429
        if self in (RejectReason.DEADLINE_TOO_SHORT, RejectReason.DEADLINE_EXPIRED):
            return 504
        return 503


@dataclass(frozen=True, slots=True)
class AdmissionLimits:
    """Bounds on queue length and on how much of its deadline a request may spend waiting."""

    max_pool_queue: int = 1024
    max_tenant_queue: int = 256
    headroom: float = 0.8
    """Admit when the predicted wait is at most this share of the deadline's slack.

    Slack is the time left to the deadline minus the predicted service time; the margin absorbs
    the error of the wait prediction (arrival bursts, a changing mix of request sizes).
    """
    min_retry_after_s: float = 0.1
    max_retry_after_s: float = 60.0


@dataclass(frozen=True, slots=True)
class Decision:
    """The outcome of admission; ``retry_after_s`` is set on rejections that retrying can fix."""

    admitted: bool
    predicted_wait_s: float
    reason: RejectReason | None = None
    retry_after_s: float | None = None

    @property
    def status(self) -> int:
        """200 when admitted, else the rejection's HTTP status."""
        return 200 if self.reason is None else self.reason.status


Flow = tuple[float, float, float, float]
"""Another flow: ``(queued cost, cost per second it adds, weight, cost of its next request)``."""


def _others(
    backlog: Backlog, request: Request, policy: PolicyConfig
) -> tuple[list[Flow], list[Flow]]:
    """The other tenants of the request's class, and the other classes, as flows."""
    p = request.priority
    tenants = [
        (f.cost, f.rate, f.weight, f.cost / f.count if f.count else 0.0)
        for f in backlog.flows
        if f.priority is p and f.tenant != request.tenant
    ]
    queued: dict[Priority, tuple[float, float, int]] = {}
    for f in backlog.flows:
        if f.priority is not p:
            q, r, n = queued.get(f.priority, (0.0, 0.0, 0))
            queued[f.priority] = (q + f.cost, r + f.rate, n + f.count)
    classes = [
        (q, r, policy.class_weight(c), q / n if n else 0.0) for c, (q, r, n) in queued.items()
    ]
    return tenants, classes


def _ahead(
    others: tuple[list[Flow], list[Flow]], own: float, w: float, wc: float, t: float
) -> float:
    """Work served before a flow of weight ``w`` (class weight ``wc``) gets through ``own``.

    The fluid (GPS) view of the fair queue, per round of start-time fair queuing: every other
    flow is served what it has queued plus what it adds in ``t`` seconds, but no more than its
    weighted share of ``own`` plus its next request; first among tenants, then among classes.
    The request's own cost does not enter, so the prediction is the same for every size.
    """
    tenants, classes = others
    in_class = own
    for q, r, wu, head in tenants:
        in_class += min(q + r * t, own * wu / w + head)
    total = in_class
    for q, r, wu, head in classes:
        total += min(q + r * t, in_class * wu / wc + head)
    return total


def _wait(
    others: tuple[list[Flow], list[Flow]], request: Request, own: float, rate: float, wc: float
) -> float:
    t = 0.0
    for _ in range(_STEPS):
        ahead = _ahead(others, own, request.weight, wc, t)
        if ahead <= 0.0:
            return 0.0
        if rate <= 0.0:
            return math.inf
        t, last = ahead / rate, t
        if t - last <= 1e-3 * t:
            break
    return t


def predicted_wait(
    backlog: Backlog, request: Request, *, rate: float, policy: PolicyConfig, own: float
) -> float:
    """Seconds until ``request`` starts if its tenant has ``own`` cost queued ahead of it.

    Other tenants keep adding work at their recent rates while it waits, so the wait ``t``
    solves ``t = ahead(t) / rate``; ``ahead`` is increasing and capped by the shares, so a few
    fixed-point steps from ``t = 0`` converge (from below).
    """
    wc = policy.class_weight(request.priority)
    return _wait(_others(backlog, request, policy), request, own, rate, wc)


def _queue_bounds(
    request: Request, backlog: Backlog, limits: AdmissionLimits, wait: float, rate: float
) -> tuple[RejectReason, float] | None:
    mine = backlog.tenant_count(request.tenant)
    if mine >= limits.max_tenant_queue:
        excess = (mine - limits.max_tenant_queue + 1) / mine
        return RejectReason.TENANT_QUEUE_FULL, wait * excess
    count = backlog.count
    if count < limits.max_pool_queue:
        return None
    excess = (count - limits.max_pool_queue + 1) / count
    queued = {f.tenant: f.weight for f in backlog.flows if f.count} | {
        request.tenant: request.weight
    }
    if mine >= limits.max_pool_queue * request.weight / sum(queued.values()):
        return RejectReason.TENANT_OVER_SHARE, wait * excess
    drain = sum(f.cost for f in backlog.flows) / rate if rate > 0 else math.inf
    return RejectReason.POOL_QUEUE_FULL, drain * excess


def admit(
    request: Request,
    backlog: Backlog,
    *,
    now: float,
    rate: float,
    service_s: float,
    limits: AdmissionLimits,
    policy: PolicyConfig,
    typical_service_s: float | None = None,
) -> Decision:
    """Admit ``request`` or say why not, given the queue, the rate (cost/s) and its service time.

    The wait is held against the slack a *typical* request would have (``typical_service_s``),
    not this one's: when a flood keeps the queue right at the limit, a size-dependent limit would
    admit only the flood's smallest requests. This request's own service time only bounds it.
    """
    p, tenant = request.priority, request.tenant
    own = sum(f.cost for f in backlog.flows if f.tenant == tenant and f.priority is p)
    others = _others(backlog, request, policy)
    wc = policy.class_weight(p)
    wait = _wait(others, request, own, rate, wc)

    def reject(reason: RejectReason, retry_after: float | None) -> Decision:
        if retry_after is not None:
            retry_after = min(max(retry_after, limits.min_retry_after_s), limits.max_retry_after_s)
        return Decision(False, wait, reason, retry_after)

    left = math.inf if request.deadline is None else request.deadline - now
    if service_s >= left:
        return reject(RejectReason.DEADLINE_TOO_SHORT, None)
    bounded = _queue_bounds(request, backlog, limits, wait, rate)
    if bounded is not None:
        return reject(*bounded)
    typical = service_s if typical_service_s is None else typical_service_s
    budget = min(limits.headroom * (left - typical), left - service_s)
    if wait > budget:
        fresh = _wait(others, request, 0.0, rate, wc)
        if fresh > budget:
            return reject(RejectReason.POOL_OVERLOADED, fresh - budget)
        return reject(RejectReason.TENANT_OVER_SHARE, wait - budget)
    return Decision(True, wait)
