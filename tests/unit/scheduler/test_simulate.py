"""The simulator: noisy neighbour, fair shares, priorities, traces, and the report."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import pytest

from kiln_platform.scheduler.simulate import format_report, parse_override, run_simulation

if TYPE_CHECKING:
    from pathlib import Path

    from tests.unit.scheduler.conftest import WriteToml

NOISY = """
duration_s = 40
warmup_s = 10
[pool]
workers = 2
slots_per_worker = 8
service = { kind = "per_request", a = 0.02, b = 0.2 }
[[tenant]]
name = "A"
load = 10.0
deadline_s = 4.0
size = { dist = "uniform", low = 1, high = 8 }
[[tenant]]
name = "B"
load = 0.2
deadline_s = 4.0
size = { dist = "uniform", low = 1, high = 8 }
"""

SATURATED = """
duration_s = 30
warmup_s = 5
[pool]
workers = 1
slots_per_worker = 4
service = {{ kind = "per_request", a = 0.0, b = 0.1 }}
[[tenant]]
name = "a"
load = 2.0
weight = {wa}
priority = "{pa}"
[[tenant]]
name = "b"
load = {lb}
weight = 1
priority = "{pb}"
{deadline_b}
"""


def test_noisy_neighbour_is_contained(write_toml: WriteToml) -> None:
    path = write_toml(NOISY)
    report = run_simulation(path)
    alone = run_simulation(path, only={"B"}).tenant("B")  # the very same arrivals of B
    a, b = report.tenant("A"), report.tenant("B")
    assert b.latency_p99_s <= 1.5 * alone.latency_p99_s
    assert b.rejected == {}
    assert b.completed == b.offered
    assert sum(a.rejected.values()) > 0.85 * a.offered  # A's excess (90% of it) is turned away
    assert a.rejected.get("deadline_expired", 0) <= 0.001 * a.offered  # at arrival, not late
    assert set(a.rejected) <= {"tenant_over_share", "tenant_queue_full", "deadline_expired"}
    assert report.throughput_cost > 0.9 * report.capacity
    assert b.share == pytest.approx(b.fair_share, abs=0.02)
    assert report.jain > 0.99


@pytest.mark.parametrize(("weight", "share"), [(1, 0.5), (3, 0.75)])
def test_saturating_tenants_share_the_pool_by_weight(
    write_toml: WriteToml, weight: int, share: float
) -> None:
    text = SATURATED.format(wa=weight, pa="interactive", pb="interactive", lb=2.0, deadline_b="")
    report = run_simulation(write_toml(text))
    assert report.tenant("a").share == pytest.approx(share, abs=0.05)
    assert report.jain > 0.99


def test_an_interactive_flood_leaves_batch_its_minimum_share(
    write_toml: WriteToml,
) -> None:
    text = SATURATED.format(wa=1, pa="interactive", pb="batch", lb=5.0, deadline_b="")
    report = run_simulation(write_toml(text))
    assert report.tenant("b").share == pytest.approx(0.10, abs=0.03)
    assert report.tenant("b").fair_share == pytest.approx(0.10, abs=0.01)
    assert report.jain > 0.99


def test_a_batch_flood_does_not_delay_interactive_past_its_deadline(
    write_toml: WriteToml,
) -> None:
    text = SATURATED.format(
        wa=1, pa="batch", pb="interactive", lb=0.5, deadline_b="deadline_s = 0.5"
    )
    report = run_simulation(write_toml(text), overrides={"tenant.a.load": 10.0})
    b = report.tenant("b")
    assert b.rejected == {}
    assert b.latency_p99_s < 0.5
    assert report.tenant("a").share > 0.4  # batch still uses what interactive leaves


def test_runs_are_deterministic_per_seed(write_toml: WriteToml) -> None:
    path = write_toml(
        SATURATED.format(wa=1, pa="interactive", pb="interactive", lb=0.5, deadline_b="")
    )
    assert run_simulation(path, seed=3) == run_simulation(path, seed=3)
    assert run_simulation(path, seed=3) != run_simulation(path, seed=4)


@pytest.mark.parametrize("suffix", ["csv", "jsonl"])
def test_recorded_traces_replay(write_toml: WriteToml, tmp_path: Path, suffix: str) -> None:
    rows = [
        {"time_s": 0.0, "tenant": "a", "cost": 2},
        {"time_s": 0.1, "tenant": "b", "cost": 1, "deadline_s": 0.05},  # shorter than service
        {"time_s": 0.05, "tenant": "c", "cost": 1, "priority": "batch"},
    ]
    trace = tmp_path / f"trace.{suffix}"
    if suffix == "csv":
        header = "time_s,tenant,cost,deadline_s,priority\n"
        cells = ("time_s", "tenant", "cost", "deadline_s", "priority")
        lines = [",".join(str(r.get(c, "")) for c in cells) for r in rows]
        trace.write_text(header + "\n".join(lines) + "\n")
    else:
        trace.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    text = f"""
duration_s = 1
[trace]
path = "trace.{suffix}"
[pool]
workers = 1
slots_per_worker = 1
service = {{ kind = "per_request", a = 0.1, b = 0.0 }}
[[tenant]]
name = "a"
weight = 2
"""
    report = run_simulation(write_toml(text))
    assert [t.name for t in report.tenants] == ["a", "b", "c"]
    assert report.tenant("a").weight == 2
    assert report.tenant("a").completed == report.tenant("c").completed == 1
    assert report.tenant("b").rejected == {"deadline_too_short": 1}


def test_the_report_prints_the_table(write_toml: WriteToml) -> None:
    path = write_toml(SATURATED.format(wa=1, pa="interactive", pb="batch", lb=0.5, deadline_b=""))
    short = {"duration_s": 8.0, "warmup_s": 1.0}
    text = format_report(run_simulation(path, baseline=True, overrides=short))
    for heading in ("throughput", "p50 ms", "p99 ms", "share", "fair", "alone p99", "Jain"):
        assert heading in text
    assert "rejections by reason" in text


def test_overrides_set_dotted_keys(write_toml: WriteToml) -> None:
    path = write_toml(
        SATURATED.format(wa=1, pa="interactive", pb="interactive", lb=2.0, deadline_b="")
    )
    report = run_simulation(
        path,
        overrides=dict([parse_override("tenant.b.weight=3"), parse_override("pool.workers = 2")]),
    )
    assert report.workers == 2
    assert report.tenant("b").share == pytest.approx(0.75, abs=0.05)
    with pytest.raises(ValueError, match="no tenant named"):
        run_simulation(path, overrides={"tenant.zz.weight": 1})


def test_parse_override_reads_toml_values() -> None:
    assert parse_override("pool.slots_per_worker=4") == ("pool.slots_per_worker", 4)
    assert parse_override("pool.service.kind = batch") == ("pool.service.kind", "batch")
    assert parse_override("tenant.B.deadline_s=0.5") == ("tenant.B.deadline_s", 0.5)
    with pytest.raises(ValueError, match="KEY=VALUE"):
        parse_override("nonsense")


def test_the_documented_example_shows_the_noisy_neighbour(repo_root: Path) -> None:
    path = repo_root / "docs" / "examples" / "noisy-neighbour.toml"
    report = run_simulation(path, overrides={"duration_s": 6.0, "warmup_s": 3.0})
    a, b = report.tenant("A"), report.tenant("B")
    assert a.load == pytest.approx(10.0, rel=0.05)
    assert b.load == pytest.approx(0.2, rel=0.3)
    assert b.rejected == {}
    assert set(a.rejected) == {"tenant_over_share"}


def test_the_cpu_example_shows_the_express_lane_and_preemption(repo_root: Path) -> None:
    """On a CPU-like worker (no batch gain) the lane takes B's p99 under the flood well down,
    and preemption throws away at most a few percent of the pool's work."""
    path = repo_root / "docs" / "examples" / "noisy-neighbour-cpu.toml"
    short = {"duration_s": 30.0}
    b_p99 = {
        name: run_simulation(path, overrides=short | extra).tenant("B").latency_p99_s
        for name, extra in (("lane", {}), ("off", {"scheduler.express": False}))
    }
    assert b_p99["lane"] < 0.75 * b_p99["off"]
    report = run_simulation(path, overrides=short)
    assert report.throughput_cost > 0.95 * report.capacity
    assert report.tenant("B").rejected == {}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[pool]\nslot_per_worker = 4\n", "unknown field"),
        ("[[tenant]]\nname = 'a'\narrivals = 'bursty'\n", "arrivals must be one of"),
        ("[[tenant]]\nname = 'a'\nsize = { dist = 'normal' }\n", "dist must be one of"),
        ("[[tenant]]\nweight = 2\n", "bad or missing field"),
        ("[[tenant]]\nname = 'a'\npriority = 'urgent'\n", "bad or missing field"),
        ("[pool]\nservice = { kind = 'magic' }\n", "service.kind"),
        ("duration_s = [", "Invalid"),
    ],
)
def test_malformed_files_raise_value_errors(write_toml: WriteToml, text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        run_simulation(write_toml(text))
