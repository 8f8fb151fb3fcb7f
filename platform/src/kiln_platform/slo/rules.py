"""Prometheus recording and alerting rules for the SLOs (``kiln slo rules``): the same windows
and burn rates as ``policy``, over the gateway's ``kiln_sli_*`` series (``slo.sli``).

Per SLO and SLI, ``kiln_slo:sli_error:ratio_rate<w>{slo,sli}`` records the bad fraction in each
window, named by its workbook name (``1h``, ``5m``, …) and computed over the window scaled to the
SLO's period; ``KilnSLOBurnRate`` fires, per severity, when either of its window pairs burns.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import yaml

from kiln_platform.slo.policy import RULES, BurnRule, Objective, Sli
from kiln_platform.slo.sli import LATENCY_BUCKETS

ALERT = "KilnSLOBurnRate"


@dataclass(frozen=True, slots=True)
class NamedObjective:
    """An SLO as the rules name it."""

    name: str
    objective: Objective
    plan: str | None = None


def duration(seconds: float) -> str:
    """A Prometheus duration, whole seconds (at least one)."""
    return f"{max(1, math.ceil(seconds))}s"


def workbook_name(seconds: float) -> str:
    """``3600`` -> ``1h``, ``300`` -> ``5m``, ``86400`` -> ``1d``."""
    for unit, size in (("d", 86_400), ("h", 3600), ("m", 60)):
        if seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{int(seconds)}s"


def latency_bound(latency_ms: float) -> float:
    """The histogram bound a request must fall under: the largest not above the threshold
    (its ``le`` label is the float's ``repr``, as prometheus_client writes it: ``1.0``)."""
    index = bisect.bisect_right(LATENCY_BUCKETS, latency_ms / 1000.0)
    return LATENCY_BUCKETS[max(0, index - 1)]


def _selector(slo: NamedObjective, extra: str = "") -> str:
    plan = f',plan="{slo.plan}"' if slo.plan else ""
    return f'{{model="{slo.objective.model}"{plan}{extra}}}'


def _ratio(slo: NamedObjective, sli: Sli, window: str) -> str:
    if sli is Sli.AVAILABILITY:
        errors, served = _selector(slo, ',code="5xx"'), _selector(slo, ',code!="4xx"')
        bad = f"sum(rate(kiln_sli_requests_total{errors}[{window}]))"
        total = f"sum(rate(kiln_sli_requests_total{served}[{window}]))"
        return f"(({bad}) or vector(0)) / {total}"
    under = _selector(slo, f',le="{float(latency_bound(slo.objective.latency_ms))!r}"')
    fast = f"sum(rate(kiln_sli_latency_seconds_bucket{under}[{window}]))"
    total = f"sum(rate(kiln_sli_latency_seconds_count{_selector(slo)}[{window}]))"
    return f"1 - ({fast} / {total})"


def _pair(rule: BurnRule, labels: str, target: float) -> str:
    long_name, short_name = workbook_name(rule.long_s), workbook_name(rule.short_s)
    limit = f"{rule.burn * (1 - target):.10g}"
    return (
        f"(kiln_slo:sli_error:ratio_rate{long_name}{labels} > {limit}"
        f" and kiln_slo:sli_error:ratio_rate{short_name}{labels} > {limit})"
    )


def _rules_of(slo: NamedObjective, sli: Sli, target: float) -> list[dict[str, Any]]:
    labels = {"slo": slo.name, "sli": str(sli)}
    matcher = f'{{slo="{slo.name}",sli="{sli}"}}'
    windows = {w for rule in RULES for w in (rule.long_s, rule.short_s)}
    factor = slo.objective.period_s / (30 * 86_400)
    out: list[dict[str, Any]] = [
        {
            "record": f"kiln_slo:sli_error:ratio_rate{workbook_name(w)}",
            "expr": _ratio(slo, sli, duration(w * factor)),
            "labels": dict(labels),
        }
        for w in sorted(windows)
    ]
    for severity in ("page", "ticket"):
        pairs = [_pair(r, matcher, target) for r in RULES if r.severity == severity]
        out.append({
            "alert": ALERT,
            "expr": " or ".join(pairs),
            "labels": {**labels, "model": slo.objective.model, "severity": severity},
            "annotations": {
                "summary": f"SLO {slo.name}: the {sli} error budget is burning too fast",
            },
        })  # fmt: skip
    return out


def rules(slos: Sequence[NamedObjective]) -> str:
    """The rule file (YAML) for every SLO: one group per SLO."""
    groups = []
    for slo in slos:
        items: list[dict[str, Any]] = []
        for sli in Sli:
            target = slo.objective.target(sli)
            if target is not None:
                items += _rules_of(slo, sli, target)
        groups.append({"name": f"kiln-slo-{slo.name}", "rules": items})
    text: str = yaml.safe_dump({"groups": groups}, sort_keys=False, width=1000)
    return text
