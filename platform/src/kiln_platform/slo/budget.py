"""Budget thresholds as alerts: each ``budget_events`` row (a tenant's monthly spend crossing
50/80/100% of its budget, written once by the ledger) becomes one ``KilnBudgetThreshold`` alert
and one notification, on the same delivery path as the SLO alerts."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from sqlalchemy import exists, select

from kiln_platform.billing.budgets import period_end
from kiln_platform.billing.tables import BudgetEvent
from kiln_platform.db.tables import Tenant
from kiln_platform.slo import notify
from kiln_platform.slo.tables import Alert

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncSession

ALERT = "KilnBudgetThreshold"
RECENT = timedelta(days=7)
"""Events older than this when first seen (e.g. before alerts existed) are not announced."""


async def announce(session: AsyncSession) -> int:
    """An alert and a notification for every recent budget event without one; how many."""
    now = datetime.now(UTC)
    key = "budget-" + BudgetEvent.id.cast(Alert.fingerprint.type)
    rows = await session.execute(
        select(BudgetEvent, Tenant.name, Tenant.timezone)
        .join(Tenant, Tenant.id == BudgetEvent.tenant_id)
        .where(
            BudgetEvent.created_at > now - RECENT,
            ~exists().where(Alert.fingerprint == key, Alert.status == "firing"),
        )
        .order_by(BudgetEvent.id)
    )
    count = 0
    for event, tenant, timezone in rows:
        percent = event.threshold_percent
        alert = Alert(
            fingerprint=f"budget-{event.id}", name=ALERT, status="firing",
            starts_at=event.created_at, ends_at=period_end(timezone, event.period),
            labels={"alertname": ALERT, "tenant": tenant, "threshold": f"{percent}%",
                    "period": event.period.isoformat(), "severity": "ticket"},
            annotations={"summary": f"Tenant {tenant} spent {percent}% of its monthly budget",
                         "spent_micros": str(event.spent_micros),
                         "limit_micros": str(event.limit_micros)},
        )  # fmt: skip
        session.add(alert)
        await notify.enqueue(session, alert)
        count += 1
    return count
