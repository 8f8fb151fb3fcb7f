"""What ``kiln simulate`` reports: per-tenant outcomes as data, and the table it prints."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kiln_platform.scheduler.admission import RejectReason

if TYPE_CHECKING:
    from collections.abc import Mapping

    from kiln_platform.scheduler._simconfig import SimConfig
    from kiln_platform.scheduler.stats import StatsSnapshot


@dataclass(frozen=True, slots=True)
class TenantReport:
    """One tenant's outcome over the measured part of a run."""

    name: str
    weight: float
    priority: str
    load: float
    """Offered cost per second, as a multiple of the pool's nominal capacity."""
    offered: int
    completed: int
    rejected: Mapping[str, int]
    latency_p50_s: float
    latency_p99_s: float
    wait_p99_s: float
    share: float
    fair_share: float
    alone_p99_s: float | None = None
    """p99 latency when the tenant runs alone on the same arrivals (``baseline=True``)."""


@dataclass(frozen=True, slots=True)
class SimulationReport:
    """What ``kiln simulate`` prints, as data (tests and ``bench/fairness.py`` read it)."""

    source: str
    seed: int
    measured_s: float
    warmup_s: float
    workers: int
    slots_per_worker: int
    unit: str
    capacity: float
    throughput_rps: float
    throughput_cost: float
    tenants: tuple[TenantReport, ...]
    jain: float

    def tenant(self, name: str) -> TenantReport:
        """The report of tenant ``name``."""
        return next(t for t in self.tenants if t.name == name)


def build(
    config: SimConfig,
    snap: StatsSnapshot,
    at_end: StatsSnapshot,
    *,
    seed: int,
    source: str,
    done: tuple[int, float],
) -> SimulationReport:
    """The report of a run from its final stats and those taken as arrivals stopped."""
    pool = config.pool
    sizes = [t.size.average for t in config.tenants] or [1.0]
    capacity = pool.capacity(sum(sizes) / len(sizes))
    span = max(config.duration_s - config.warmup_s, 1e-9)
    plans = {t.name: t for t in config.tenants}
    weights = {s.tenant: plans[s.tenant].weight if s.tenant in plans else 1.0 for s in snap.tenants}
    shares = {s.tenant: s for s in at_end.tenants}
    tenants = tuple(
        TenantReport(
            name=s.tenant,
            weight=weights[s.tenant],
            priority=plans[s.tenant].priority.name.lower() if s.tenant in plans else "interactive",
            load=shares[s.tenant].offered_cost / span / capacity if s.tenant in shares else 0.0,
            offered=s.admitted + sum(n for r, n in s.rejected.items() if r != "deadline_expired"),
            completed=s.completed,
            rejected=s.rejected,
            latency_p50_s=s.latency_p50_s,
            latency_p99_s=s.latency_p99_s,
            wait_p99_s=s.wait_p99_s,
            share=shares[s.tenant].share if s.tenant in shares else 0.0,
            fair_share=shares[s.tenant].fair_share if s.tenant in shares else 0.0,
        )
        for s in snap.tenants
    )
    return SimulationReport(
        source=source,
        seed=seed,
        measured_s=max(config.duration_s - config.warmup_s, 0.0),
        warmup_s=config.warmup_s,
        workers=pool.workers,
        slots_per_worker=pool.slots_per_worker,
        unit=pool.unit,
        capacity=capacity,
        throughput_rps=done[0] / span,
        throughput_cost=done[1] / span,
        tenants=tenants,
        jain=at_end.jain,
    )


def _ms(seconds: float) -> str:
    return "-" if math.isnan(seconds) else f"{seconds * 1000:.0f}"


def format_report(report: SimulationReport) -> str:
    """The table ``kiln simulate`` prints."""
    r = report
    baseline = any(t.alone_p99_s is not None for t in r.tenants)
    lines = [
        f"{r.source}: seed {r.seed}, {r.measured_s:g} s measured after {r.warmup_s:g} s warm-up",
        f"pool: {r.workers} workers x {r.slots_per_worker} slots, "
        f"nominal capacity {r.capacity:.0f} {r.unit}/s",
        f"throughput: {r.throughput_rps:.1f} req/s, {r.throughput_cost:.0f} {r.unit}/s "
        f"({r.throughput_cost / r.capacity:.0%} of nominal)",
        "",
        f"{'tenant':<10} {'weight':>6} {'class':<11} {'load':>6} {'offered':>8} {'done':>7} "
        f"{'p50 ms':>7} {'p99 ms':>7} {'wait p99':>8} {'share':>6} {'fair':>6} {'rejected':>8}"
        + (f" {'alone p99':>9} {'ratio':>6}" if baseline else ""),
    ]
    for t in r.tenants:
        rejected = sum(t.rejected.values())
        row = (
            f"{t.name:<10} {t.weight:>6g} {t.priority:<11} {t.load:>5.2f}x "
            f"{t.offered:>8} {t.completed:>7} "
            f"{_ms(t.latency_p50_s):>7} {_ms(t.latency_p99_s):>7} {_ms(t.wait_p99_s):>8} "
            f"{t.share:>6.1%} {t.fair_share:>6.1%} {rejected:>8}"
        )
        if t.alone_p99_s is not None:
            row += f" {_ms(t.alone_p99_s):>9} {t.latency_p99_s / t.alone_p99_s:>5.2f}x"
        lines.append(row)
    lines.append("")
    lines.append("rejections by reason (HTTP status):")
    any_rejected = False
    for t in r.tenants:
        for reason, n in sorted(t.rejected.items()):
            any_rejected = True
            status = RejectReason(reason).status
            share = n / max(t.offered, 1)
            lines.append(f"  {t.name:<10} {reason:<20} {status}  {n:>8} ({share:.1%})")
    if not any_rejected:
        lines.append("  none")
    lines.append(f"Jain's fairness index (served / weighted max-min fair share): {r.jain:.3f}")
    return "\n".join(lines)
