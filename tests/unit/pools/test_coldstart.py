"""Cold-start phases: observed once per start from zero, never for a start nobody waited for."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import REGISTRY

from kiln_platform.pools.backend import PoolSpec, PoolWorker
from kiln_platform.pools.coldstart import PHASES, ColdStarts, start_phases
from kiln_runtimes.protocol import WorkerInfo

pytestmark = pytest.mark.unit
SPEC = PoolSpec("cold-unit", "v1", Path("/nowhere"))


def _count(phase: str) -> float:
    labels = {"model": "cold-unit", "version": "v1", "phase": phase}
    return REGISTRY.get_sample_value("kiln_cold_start_phase_seconds_count", labels) or 0.0


def _ready_worker(started_at: float) -> PoolWorker:
    info = WorkerInfo(
        model="cold-unit", version="v1", task="embeddings", ready=True, draining=False,
        in_flight=0, queued=0, free_slots=1, max_batch_size=1, load_s=0.25, warmup_s=0.05,
    )  # fmt: skip
    return PoolWorker(SPEC, ready=True, started_at=started_at, info=info)


def test_the_phases_before_readiness_add_up_to_arrival_to_ready() -> None:
    phases = start_phases(arrived=10.0, started=10.01, ready=11.0, load_s=0.6, warmup_s=0.1)
    assert phases["scheduling"] == pytest.approx(0.01)
    assert phases["process_start"] == pytest.approx(0.29)
    assert sum(phases.values()) == pytest.approx(1.0)


def test_each_phase_is_observed_once_per_cold_start() -> None:
    before = {p: _count(p) for p in PHASES}
    starts = ColdStarts()
    starts.ready(_ready_worker(0.0))  # started with nobody waiting: not a cold start
    starts.responded("cold-unit", "v1", SPEC.key)
    assert {p: _count(p) for p in PHASES} == before
    starts.arrived(SPEC.key)
    starts.ready(_ready_worker(0.0))
    starts.ready(_ready_worker(0.0))  # a second worker of the same start
    starts.responded("cold-unit", "v1", SPEC.key)
    starts.responded("cold-unit", "v1", SPEC.key)  # a later response: the start is over
    assert {p: _count(p) - before[p] for p in PHASES} == dict.fromkeys(PHASES, 1.0)


def test_a_start_interrupted_before_ready_is_timed_from_its_first_arrival() -> None:
    starts = ColdStarts()
    starts._now = lambda: 101.0  # the clock
    starts.arrived(SPEC.key, since=100.0)
    starts.arrived(SPEC.key, since=100.5)  # its worker was taken away; the start goes on
    before = (
        REGISTRY.get_sample_value(
            "kiln_cold_start_phase_seconds_sum",
            {"model": "cold-unit", "version": "v1", "phase": "scheduling"},
        )
        or 0.0
    )
    starts.ready(_ready_worker(started_at=100.75))
    after = REGISTRY.get_sample_value(
        "kiln_cold_start_phase_seconds_sum",
        {"model": "cold-unit", "version": "v1", "phase": "scheduling"},
    )
    assert after == pytest.approx(before + 0.75)
