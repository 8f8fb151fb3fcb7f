"""The simulator's input: a small TOML file of tenants and a pool, or a recorded trace."""

from __future__ import annotations

import csv
import heapq
import json
import math
import random
import tomllib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kiln_platform.scheduler.admission import AdmissionLimits
from kiln_platform.scheduler.core import SchedulerConfig
from kiln_platform.scheduler.policy import PolicyConfig
from kiln_platform.scheduler.schemas import Priority, Request
from kiln_platform.scheduler.service import ServiceConfig

if TYPE_CHECKING:
    from collections.abc import Collection, Iterator, Mapping
    from pathlib import Path


@dataclass(frozen=True, slots=True)
class Size:
    """Request sizes in cost units: ``fixed``, ``uniform`` (integers) or ``exponential``."""

    dist: str = "fixed"
    value: float = 1.0
    low: int = 1
    high: int = 1
    mean: float = 1.0

    def sample(self, rng: random.Random) -> float:
        """Draw one size (at least 1 for the integer distributions)."""
        if self.dist == "uniform":
            return float(rng.randint(self.low, self.high))
        if self.dist == "exponential":
            return float(max(1, round(rng.expovariate(1 / self.mean))))
        return self.value

    @property
    def average(self) -> float:
        """The distribution's mean."""
        if self.dist == "uniform":
            return (self.low + self.high) / 2
        return self.mean if self.dist == "exponential" else self.value


@dataclass(frozen=True, slots=True)
class Service:
    """Service-time model of one worker: ``a * n + b`` seconds for ``n`` cost units."""

    kind: str = "batch"
    """``batch``: one batch at a time per worker; ``per_request``: every slot runs on its own."""
    a: float = 0.01
    b: float = 0.0
    max_batch_size: float = 32.0
    max_delay_s: float = 0.0


@dataclass(frozen=True, slots=True)
class Pool:
    """Workers, credits per worker, and how they serve."""

    workers: int = 1
    slots_per_worker: int = 8
    service: Service = Service()
    unit: str = "cost"
    preempt: bool = True
    """An express request stops a normal batch with at least half left (``KILN_WORKER_PREEMPT``)."""

    def capacity(self, mean_size: float) -> float:
        """Nominal cost per second the pool serves when saturated."""
        s = self.service
        if s.kind == "per_request":
            return self.workers * self.slots_per_worker * mean_size / (s.a * mean_size + s.b)
        n = min(s.max_batch_size, self.slots_per_worker * mean_size)
        return self.workers * n / (s.a * n + s.b)


@dataclass(frozen=True, slots=True)
class Tenant:
    """One tenant's synthetic load (``rate`` in requests per second) and plan."""

    name: str
    weight: float = 1.0
    priority: Priority = Priority.INTERACTIVE
    deadline_s: float | None = None
    arrivals: str = "poisson"
    rate: float = 0.0
    size: Size = Size()
    start_s: float = 0.0
    stop_s: float = math.inf


@dataclass(frozen=True, slots=True)
class SimConfig:
    """Everything one simulation run needs."""

    duration_s: float
    warmup_s: float
    pool: Pool
    scheduler: SchedulerConfig
    tenants: tuple[Tenant, ...]
    trace: Path | None = None


def _tenant(raw: dict[str, Any], pool: Pool) -> Tenant:
    size = Size(**raw.get("size", {}))
    rate = raw.get("rate")
    if rate is None:  # ``load`` is relative to the pool's nominal capacity
        rate = raw.get("load", 0.0) * pool.capacity(size.average) / size.average
    return Tenant(
        name=raw["name"],
        weight=raw.get("weight", 1.0),
        priority=Priority[raw.get("priority", "interactive").upper()],
        deadline_s=raw.get("deadline_s"),
        arrivals=raw.get("arrivals", "poisson"),
        rate=float(rate),
        size=size,
        start_s=raw.get("start_s", 0.0),
        stop_s=raw.get("stop_s", math.inf),
    )


def parse_override(text: str) -> tuple[str, Any]:
    """``"pool.slots_per_worker=4"`` -> ``("pool.slots_per_worker", 4)``; values are TOML."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise ValueError(f"expected KEY=VALUE, got {text!r}")
    try:
        parsed = tomllib.loads(f"v = {value.strip()}")["v"]
    except tomllib.TOMLDecodeError:
        parsed = value.strip()  # a bare word: take it as a string
    return key.strip(), parsed


def _override(raw: dict[str, Any], key: str, value: Any) -> None:
    """Set a dotted ``key``; ``tenant.B.weight`` picks the tenant named B."""
    *parents, leaf = key.split(".")
    node: Any = raw
    for part in parents:
        if isinstance(node, list):
            node = next((t for t in node if t.get("name") == part), None)
            if node is None:
                raise ValueError(f"{key}: no tenant named {part!r}")
        else:
            node = node.setdefault(part, {})
    node[leaf] = value


def load(path: Path, overrides: Mapping[str, Any] | None = None) -> SimConfig:
    """Parse a simulation file (see ``docs/scheduler.md``), with dotted-key ``overrides``.

    Raises ``ValueError`` (``tomllib.TOMLDecodeError`` included) for a malformed file.
    """
    raw = tomllib.loads(path.read_text())
    for key, value in (overrides or {}).items():
        _override(raw, key, value)
    try:
        return _parse(raw, path)
    except (KeyError, TypeError) as exc:
        raise ValueError(f"{path}: bad or missing field: {exc}") from exc


_TOP = {"duration_s", "warmup_s", "pool", "scheduler", "tenant", "trace"}
_POOL = {"workers", "slots_per_worker", "service", "unit", "preempt"}
_TENANT = {"name", "weight", "priority", "deadline_s", "arrivals", "rate", "load", "size"}
_CHOICES = {"arrivals": {"poisson", "fixed"}, "dist": {"fixed", "uniform", "exponential"}}


def _check(section: dict[str, Any], allowed: set[str], where: str) -> None:
    unknown = set(section) - allowed
    if unknown:
        raise ValueError(f"unknown field(s) in {where}: {', '.join(sorted(unknown))}")
    for key, choices in _CHOICES.items():
        if key in section and section[key] not in choices:
            raise ValueError(f"{where}.{key} must be one of {', '.join(sorted(choices))}")


def _parse(raw: dict[str, Any], path: Path) -> SimConfig:
    _check(raw, _TOP, "the file")
    _check(raw.get("pool", {}), _POOL, "[pool]")
    known = {*PolicyConfig.__dataclass_fields__, *AdmissionLimits.__dataclass_fields__}
    known |= {"rate_time_constant_s", "alpha"}
    _check(raw.get("scheduler", {}), known, "[scheduler]")
    for t in raw.get("tenant", []):
        _check(t, _TENANT | {"start_s", "stop_s"}, f"[[tenant]] {t.get('name', '?')}")
        _check(t.get("size", {}), {"dist", "value", "low", "high", "mean"}, "size")
    if raw.get("pool", {}).get("service", {}).get("kind", "batch") not in {"batch", "per_request"}:
        raise ValueError("[pool] service.kind must be batch or per_request")
    p = raw.get("pool", {})
    pool = Pool(
        workers=p.get("workers", 1),
        slots_per_worker=p.get("slots_per_worker", 8),
        service=Service(**p.get("service", {})),
        unit=p.get("unit", "cost"),
        preempt=bool(p.get("preempt", True)),
    )
    s = raw.get("scheduler", {})

    def pick(cls: Any) -> dict[str, Any]:
        return {k: s[k] for k in cls.__dataclass_fields__ if k in s}

    scheduler = SchedulerConfig(
        policy=PolicyConfig(**pick(PolicyConfig)),
        limits=AdmissionLimits(**pick(AdmissionLimits)),
        service=ServiceConfig(
            **pick(ServiceConfig) | {"prior_a": pool.service.a, "prior_b": pool.service.b}
        ),
        stats_window_s=math.inf,
        max_samples=None,
    )
    trace = raw.get("trace", {}).get("path")
    return SimConfig(
        duration_s=raw.get("duration_s", 60.0),
        warmup_s=raw.get("warmup_s", 0.0),
        pool=pool,
        scheduler=scheduler,
        tenants=tuple(_tenant(t, pool) for t in raw.get("tenant", [])),
        trace=None if trace is None else path.parent / trace,
    )


def _synthetic(t: Tenant, seed: int, end: float) -> Iterator[Request]:
    rng = random.Random(f"{seed}:{t.name}")  # one stream per tenant: runs with `only` agree
    now, n = t.start_s, 0
    while t.rate > 0:
        now += rng.expovariate(t.rate) if t.arrivals == "poisson" else 1 / t.rate
        if now >= min(end, t.stop_s):
            return
        n += 1
        deadline = None if t.deadline_s is None else now + t.deadline_s
        cost = t.size.sample(rng)
        yield Request(f"{t.name}-{n}", t.name, cost, now, deadline, t.priority, t.weight)


def _recorded(config: SimConfig, path: Path) -> Iterator[Request]:
    plans = {t.name: t for t in config.tenants}
    with path.open(newline="") as f:
        if path.suffix == ".jsonl":
            rows: list[dict[str, Any]] = [json.loads(line) for line in f if line.strip()]
        else:
            rows = list(csv.DictReader(f))
    rows.sort(key=lambda row: float(row["time_s"]))
    for n, row in enumerate(rows):
        plan = plans.get(str(row["tenant"])) or Tenant(str(row["tenant"]))
        at = float(row["time_s"])
        deadline_s = row.get("deadline_s") or plan.deadline_s
        yield Request(
            f"{plan.name}-{n}",
            plan.name,
            float(row.get("cost") or 1.0),
            at,
            None if deadline_s is None else at + float(deadline_s),
            Priority[str(row.get("priority") or plan.priority.name).upper()],
            plan.weight,
        )


def arrivals(config: SimConfig, seed: int, only: Collection[str] | None) -> Iterator[Request]:
    """Every arrival of the run in time order, optionally only from the tenants in ``only``."""
    if config.trace is not None:
        stream: Iterator[Request] = _recorded(config, config.trace)
    else:
        tenants = (_synthetic(t, seed, config.duration_s) for t in config.tenants)
        stream = heapq.merge(*tenants, key=lambda r: r.arrival)
    end = config.duration_s
    return (r for r in stream if r.arrival < end and (only is None or r.tenant in only))
