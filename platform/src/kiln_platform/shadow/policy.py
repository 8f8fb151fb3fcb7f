"""Shadow traffic decisions, pure: which requests are copied, when a copy is dropped, and how
a candidate's answer compares with the primary's."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

import numpy as np

from kiln_platform.registry.routes import bucket_of, in_share

COSINE_AGREES = 0.9999
"""An embedding agrees when every row's cosine with the primary's is at least this."""
TENSOR_AGREES = 1e-5
"""A tensor answer agrees when no element differs from the primary's by more than this."""
SCORE_AGREES = 1e-3
"""A cross-encoder's scores or a classifier's probabilities agree when none differs by more
than this: a direction means nothing for one number, so they are not compared by cosine."""


@dataclass(frozen=True, slots=True)
class Shadow:
    """A model's shadow: the candidate version and the share of requests copied to it."""

    version: str
    percent: int


def sampled(request_id: str, percent: int) -> bool:
    """Whether the request is copied (a hash of its id: the same answer on every call)."""
    return percent > 0 and in_share(bucket_of(request_id), percent)


class Drop(StrEnum):
    """Why a copy was not sent."""

    NOT_READY = "not_ready"
    """The candidate has no ready worker (a copy never starts one)."""
    QUEUED = "queued"
    """Requests wait in the candidate's queue: it is not idle enough for extra work."""
    BUSY = "busy"
    """Every worker credit of the candidate is in use."""
    BOUND = "bound"
    """This gateway already has its most copies in flight."""
    PRIMARY_QUEUED = "primary_queued"
    """Requests wait in the primary's queue: the served version has no spare capacity."""
    PRIMARY_BUSY = "primary_busy"
    """The primary's average load is over its spare-capacity bound."""


@dataclass(frozen=True, slots=True)
class CandidateLoad:
    """The candidate pool and this gateway's copies, as they stand now."""

    slots: int
    """Worker credits of its ready workers (0: none ready)."""
    in_flight: int
    queued: int
    copies: int
    """Copies this gateway has sent and not yet seen answered (every candidate)."""
    primary_busy: float = 0.0
    """Requests in flight or queued in the pool of the version that answered, averaged over its
    recent answers (``smoothed``): one moment's count, read when a batch's answers come back,
    would see the pool empty between two batches."""
    primary_queued: int = 0


@dataclass(frozen=True, slots=True)
class DropLimits:
    """How much shadow work a gateway takes on."""

    max_copies: int = 4
    max_queued: int = 0
    max_primary_busy: float = 1.0
    """The primary's spare capacity: a copy goes only while its average load (``primary_busy``)
    is at most this. On CPU the copies' compute shares the cores with the answering worker.
    ``bench/shadow.py`` (docs/benchmarks.md) measured the client's p99 with 20% copied at
    1.10-1.18x of none at 4 clients without this averaged bound, 0.95x with it (copies go only
    in the load's dips); at 2 clients the load stays under it, every sampled request is copied
    and the p99 was 1.17x (two rounds); 1 client was not run. A deployment whose candidate has
    hardware of its own raises it."""


def drop_reason(load: CandidateLoad, limits: DropLimits = DropLimits()) -> Drop | None:
    """``None`` to send the copy, else why it is dropped: copies only use idle capacity, the
    primary's (nothing queued, few in flight) and the candidate's."""
    checks = (
        (load.slots <= 0, Drop.NOT_READY),
        (load.copies >= limits.max_copies, Drop.BOUND),
        (load.primary_queued > 0, Drop.PRIMARY_QUEUED),
        (load.primary_busy > limits.max_primary_busy, Drop.PRIMARY_BUSY),
        (load.queued > limits.max_queued, Drop.QUEUED),
        (load.in_flight >= load.slots, Drop.BUSY),
    )
    return next((reason for dropped, reason in checks if dropped), None)


SMOOTHING = 0.1
"""The weight of the newest reading in ``smoothed`` (about the last ten answers count)."""


def smoothed(previous: float | None, now: float, weight: float = SMOOTHING) -> float:
    """An exponentially weighted average of a pool's load (the first reading starts it)."""
    return now if previous is None else previous + weight * (now - previous)


@dataclass(frozen=True, slots=True)
class Agreement:
    """One comparison: whether the answers agree, and the figure for the kind of answer."""

    agrees: bool
    cosine_mean: float | None = None
    cosine_min: float | None = None
    max_abs_diff: float | None = None


def compare_embeddings(primary: np.ndarray, shadow: np.ndarray) -> Agreement:
    """Row-wise cosine of two ``[n, d]`` arrays (a shape mismatch disagrees)."""
    if primary.shape != shadow.shape:
        return Agreement(False, cosine_mean=0.0, cosine_min=0.0)
    a, b = primary.astype(np.float64), shadow.astype(np.float64)
    norms = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
    cos = np.einsum("ij,ij->i", a, b) / np.where(norms == 0, 1.0, norms)
    low = float(cos.min())
    return Agreement(low >= COSINE_AGREES, cosine_mean=float(cos.mean()), cosine_min=low)


def compare_scores(primary: np.ndarray, shadow: np.ndarray) -> Agreement:
    """A cross-encoder's ``[n, 1]`` scores or a classifier's ``[n, labels]`` probabilities: the
    largest absolute difference (a shape mismatch, or a NaN, disagrees)."""
    worst = _largest_difference({"scores": primary}, {"scores": shadow})
    return Agreement(worst <= SCORE_AGREES, max_abs_diff=worst)


def compare_tensors(primary: dict[str, np.ndarray], shadow: dict[str, np.ndarray]) -> Agreement:
    """The largest absolute difference over every output (missing or reshaped: infinite)."""
    worst = _largest_difference(primary, shadow)
    return Agreement(worst <= TENSOR_AGREES, max_abs_diff=worst)


def _largest_difference(primary: dict[str, np.ndarray], shadow: dict[str, np.ndarray]) -> float:
    worst = 0.0
    for name, a in primary.items():
        b = shadow.get(name)
        if b is None or b.shape != a.shape:
            return float("inf")
        if a.size:
            diff = np.abs(a.astype(np.float64) - b.astype(np.float64))
            worst = max(worst, float(np.nan_to_num(diff, nan=np.inf).max()))
    return worst


def compare_tokens(primary: list[int], shadow: list[int]) -> Agreement:
    """Greedy generations agree when they produced exactly the same tokens."""
    return Agreement(primary == shadow)
