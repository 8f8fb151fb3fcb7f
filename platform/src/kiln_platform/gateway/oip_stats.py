"""Triton's statistics extension for one tenant: ``GET /v2/models[/{name}[/versions/{v}]]/stats``.

Counted from the tenant's own ledger rows (``usage_events`` of endpoint ``infer``; an LLM's of
endpoint ``generate``, its tensor face's and the generate extension's: one inference a row) since
00:00 UTC, in a transaction confined to the tenant: a tenant sees its own traffic, never the model's
other callers' (Prometheus has the totals, for operators). The counters start again at midnight
UTC, as a Triton server's do when it restarts.
"""

from __future__ import annotations

from datetime import UTC, datetime
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from sqlalchemy import Select, case, func, select

from kiln_platform.db.engine import tenant_transaction
from kiln_platform.db.tables import UsageEvent
from kiln_platform.gateway.oip_schemas import DurationStat, InferenceStats, ModelStat, ModelStats

if TYPE_CHECKING:
    import uuid

    from kiln_platform.context import Kiln
    from kiln_platform.registry.services import ResolvedVersion

NS_PER_MS = 1_000_000
_NONE = SimpleNamespace(ok=0, items=0, queue_ms=0, compute_ms=0, failed=0, failed_ms=0, last=None)
"""A version the tenant did not call today."""


async def model_stats(
    kiln: Kiln, tenant: uuid.UUID, versions: list[ResolvedVersion], *, only: bool = False
) -> ModelStats:
    """Today's statistics of the models of ``versions`` for ``tenant``: each of ``versions``
    (zeros if not called) and each other version of those models it called, unless ``only``."""
    since = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    names = sorted({v.model for v in versions})
    async with tenant_transaction(kiln.db.sessions, tenant) as session:
        rows = (await session.execute(_query(tenant, names, since))).all()
    found = {(row.model, row.version): row for row in rows}
    keys = {(v.model, v.version) for v in versions}
    if not only:
        keys |= found.keys()
    ordered = sorted(keys, key=lambda k: (k[0], len(k[1]), k[1]))  # version 10 after 9
    return ModelStats(model_stats=[_stat(name, v, found.get((name, v))) for name, v in ordered])


def _query(tenant: uuid.UUID, names: list[str], since: datetime) -> Select[Any]:
    """Per (model, version): successes, their rows, queue and compute time; failures and their
    time; the last request. One range of ``ix_usage_events_tenant_created``."""
    e = UsageEvent
    ok, failed = e.status < 400, e.status >= 400

    def total(column: Any, where: Any, label: str) -> Any:
        return func.coalesce(func.sum(column).filter(where), 0).label(label)

    return (
        select(
            e.model,
            e.version,
            func.count().filter(ok).label("ok"),
            total(case((e.endpoint == "generate", 1), else_=e.items), ok, "items"),
            total(e.queue_ms, ok, "queue_ms"),
            total(e.compute_ms, ok, "compute_ms"),
            func.count().filter(failed).label("failed"),
            total(e.queue_ms + e.compute_ms, failed, "failed_ms"),
            func.max(e.created_at).label("last"),
        )
        .where(e.tenant_id == tenant, e.created_at >= since)
        .where(e.endpoint.in_(("infer", "generate")))
        .where(e.model.in_(names))
        .group_by(e.model, e.version)
    )


def _stat(name: str, version: str, row: Any) -> ModelStat:
    """One version's ``$model_stat``. A request is one execution here (the worker's batches
    mix tenants' rows, so a tenant's share of one is not its own); ``compute_infer`` is the
    worker's whole compute, input and output copies included (their ``ns`` is 0)."""
    row = row or _NONE
    ok, queue, compute = int(row.ok), _ns(row.queue_ms), _ns(row.compute_ms)
    stats = InferenceStats(
        success=DurationStat(count=ok, ns=queue + compute),
        fail=DurationStat(count=int(row.failed), ns=_ns(row.failed_ms)),
        queue=DurationStat(count=ok, ns=queue),
        compute_input=DurationStat(count=ok),
        compute_infer=DurationStat(count=ok, ns=compute),
        compute_output=DurationStat(count=ok),
        cache_hit=DurationStat(),
        cache_miss=DurationStat(),
    )
    return ModelStat(name=name, version=version, inference_stats=stats,
                     last_inference=int(row.last.timestamp() * 1000) if row.last else 0,
                     inference_count=int(row.items), execution_count=ok)  # fmt: skip


def _ns(ms: float) -> int:
    return round(float(ms) * NS_PER_MS)
