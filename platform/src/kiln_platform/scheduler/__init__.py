"""Per-pool scheduling: weighted fair share, priorities, deadlines, admission, and a simulator.

Everything here is sans-I/O: callers pass the time (``now``, seconds on any monotonic clock) and
the workers' free credits in, and get plain data back. The gateway drives it with the asyncio
clock (:mod:`kiln_platform.scheduler.runner`); ``kiln simulate`` drives the very same code with
a virtual clock (:mod:`kiln_platform.scheduler.simulate`).
"""

from __future__ import annotations

from kiln_platform.scheduler.admission import AdmissionLimits, Decision, RejectReason
from kiln_platform.scheduler.core import PoolScheduler, SchedulerConfig
from kiln_platform.scheduler.policy import PolicyConfig
from kiln_platform.scheduler.schemas import Credit, Dispatch, Priority, Request

__all__ = [
    "AdmissionLimits",
    "Credit",
    "Decision",
    "Dispatch",
    "PolicyConfig",
    "PoolScheduler",
    "Priority",
    "RejectReason",
    "Request",
    "SchedulerConfig",
]
