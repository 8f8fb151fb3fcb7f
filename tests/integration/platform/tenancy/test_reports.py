"""Cost reports from ``usage_charges``: grouping, time ranges, tenant time zones, CSV that the
``csv`` module parses, and sums equal to the ledger's to the micro-unit."""

from __future__ import annotations

import csv
import io
import uuid
from datetime import datetime
from decimal import Decimal
from typing import Any

from sqlalchemy import func, select, text

from kiln_platform.billing.tables import UsageCharge
from kiln_platform.reports.schemas import COLUMNS

from .conftest import Admin

JAN = "from=2025-01-01&to=2025-02-01"


def line(tenant: str, at: str, unit: str, qty: str, costs: tuple[int, int], **kw: Any) -> Any:
    """A charge line as the ledger writes it."""
    return UsageCharge(
        request_id=kw.pop("request_id", f"req_{uuid.uuid4().hex}"), tenant_id=uuid.UUID(tenant),
        model=kw.pop("model", "m1"), version=kw.pop("version", "v1"), unit=unit,
        quantity=Decimal(qty), unit_price_micros=Decimal("0.105"), list_cost_micros=costs[0],
        cost_micros=costs[1], currency="USD", price_book_version=1,
        charged_at=datetime.fromisoformat(at), **kw,
    )  # fmt: skip


async def seed(admin: Admin, root: str) -> tuple[str, str, uuid.UUID]:
    """Tenant A (UTC) and B (UTC+14); charge lines in and around January 2025."""
    a, b = await admin.tenant(root, "costs-a"), await admin.tenant(root, "costs-b")
    key = uuid.uuid4()
    async with admin.kiln.db.sessions.begin() as session:
        await session.execute(
            text("UPDATE tenants SET timezone = 'Pacific/Kiritimati' WHERE id = :b"), {"b": b}
        )
        session.add_all([
            line(a, "2025-01-10T12:00:00Z", "input_token", "1000", (105, 100), request_id="r1"),
            line(a, "2025-01-10T12:00:00Z", "output_token", "50", (333, 300), request_id="r1"),
            line(a, "2025-01-10T13:00:00Z", "request", "1", (7, 7), api_key_id=key),
            line(a, "2025-01-11T00:00:00Z", "compute_second", "0.123456", (13, 13), model="m2"),
            line(b, "2025-01-31T12:00:00Z", "input_token", "3", (1, 1)),  # Feb 1 in Kiritimati
            line(a, "2024-12-31T23:59:59.999999Z", "input_token", "9", (999, 999)),  # before
            line(a, "2025-02-01T00:00:00Z", "input_token", "9", (888, 888)),  # at `to`: excluded
        ])  # fmt: skip
    return a, b, key


async def ledger_sum(admin: Admin, start: str, end: str) -> int:
    async with admin.kiln.db.sessions() as session:
        total = await session.scalar(
            select(func.sum(UsageCharge.cost_micros)).where(
                UsageCharge.charged_at >= datetime.fromisoformat(start),
                UsageCharge.charged_at < datetime.fromisoformat(end),
            )
        )
    return int(total or 0)


async def test_costs_json_grouped_by_tenant_model_day(admin: Admin, root: str) -> None:
    a, b, _ = await seed(admin, root)
    r = await admin.call(
        "GET", f"/admin/v1/reports/costs?{JAN}&group_by=tenant,model,version,day", root
    )
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("application/json")
    body = r.json()
    rows = [row for row in body["rows"] if row["BillingAccountId"] in (a, b)]
    assert [(x["BillingAccountName"], x["SkuId"], x["ChargePeriodStart"]) for x in rows] == [
        ("costs-a", "m1:v1:input_token", "2025-01-10T00:00:00Z"),
        ("costs-a", "m1:v1:output_token", "2025-01-10T00:00:00Z"),
        ("costs-a", "m1:v1:request", "2025-01-10T00:00:00Z"),
        ("costs-a", "m2:v1:compute_second", "2025-01-11T00:00:00Z"),
        ("costs-b", "m1:v1:input_token", "2025-01-31T10:00:00Z"),  # local Feb 1 (UTC+14)
    ]
    first = rows[0]
    assert first["ListCost"] == "0.000105"
    assert first["EffectiveCost"] == first["BilledCost"] == "0.000100"
    assert first["ConsumedQuantity"] == "1000"
    assert first["ConsumedUnit"] == "input_token"
    assert first["BillingPeriodStart"] == "2025-01-01T00:00:00Z"
    assert first["BillingPeriodEnd"] == "2025-02-01T00:00:00Z"
    assert rows[3]["ConsumedQuantity"] == "0.123456"
    assert rows[4]["BillingPeriodStart"] == "2025-01-31T10:00:00Z"
    assert rows[4]["BillingPeriodEnd"] == "2025-02-28T10:00:00Z"
    assert rows[4]["ChargeCategory"] == "Usage"
    assert set(first) == set(COLUMNS)
    [totals] = body["totals"]
    expected = await ledger_sum(admin, "2025-01-01T00:00:00Z", "2025-02-01T00:00:00Z")
    assert totals["x_BilledCostMicros"] == expected == 100 + 300 + 7 + 13 + 1
    assert totals["BilledCost"] == "0.000421"
    assert sum(x["x_BilledCostMicros"] for x in body["rows"]) == expected


async def test_costs_csv_parses_and_sums_exactly(admin: Admin, root: str) -> None:
    r = await admin.call("GET", f"/admin/v1/reports/costs?{JAN}&group_by=tenant,key", root,
                         headers={"accept": "text/csv"})  # fmt: skip
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/csv")
    assert "attachment" in r.headers["content-disposition"]
    rows = list(csv.DictReader(io.StringIO(r.text)))
    assert list(rows[0]) == list(COLUMNS)
    expected = await ledger_sum(admin, "2025-01-01T00:00:00Z", "2025-02-01T00:00:00Z")
    assert sum(Decimal(x["BilledCost"]) for x in rows) * 1_000_000 == expected
    assert sum(int(x["x_BilledCostMicros"]) for x in rows) == expected
    # unit always groups: A's input tokens of two requests... and the key column splits rows
    keyed = [x for x in rows if x["x_ApiKeyId"]]
    assert [(x["SkuId"], x["BilledCost"]) for x in keyed] == [("*:*:request", "0.000007")]
    assert all(x["x_Model"] == "" for x in rows)  # model not grouped: empty, not a guess


async def test_costs_per_request_lines_and_ranges(admin: Admin, root: str) -> None:
    r = await admin.call(
        "GET", "/admin/v1/reports/costs?from=2025-01-10&to=2025-01-10T12:30:00Z"
        "&group_by=request&format=csv", root,
    )  # fmt: skip
    rows = list(csv.DictReader(io.StringIO(r.text)))
    assert [(x["x_RequestId"], x["ConsumedUnit"], x["x_BilledCostMicros"]) for x in rows] == [
        ("r1", "input_token", "100"),
        ("r1", "output_token", "300"),
    ]
    assert rows[0]["ChargePeriodStart"] == "2025-01-10T00:00:00Z"
    assert rows[0]["ChargePeriodEnd"] == "2025-01-10T12:30:00Z"  # clipped to the range
    r = await admin.call("GET", "/admin/v1/reports/costs?from=2024-12-31&to=2025-01-01", root)
    [totals] = r.json()["totals"]
    assert totals["x_BilledCostMicros"] == 999


async def test_costs_validation_names_the_parameter(admin: Admin, root: str) -> None:
    for query, param in [
        ("from=yesterday&to=2025-02-01", "'from'"),
        ("from=2025-01-01&to=2025-13-01", "'to'"),
        ("from=2025-02-01&to=2025-01-01", "'from' must be before 'to'"),
        ("from=2025-01-01&to=2025-01-01", "'from' must be before 'to'"),
        (f"{JAN}&group_by=tenant,colour", "'group_by'"),
        (f"{JAN}&format=xlsx", "'format'"),
    ]:
        r = await admin.call("GET", f"/admin/v1/reports/costs?{query}", root)
        assert r.status_code == 400, (query, r.text)
        assert param in r.json()["detail"], (query, r.text)
    r = await admin.call("GET", "/admin/v1/reports/costs?to=2025-02-01", root)
    assert r.status_code == 400
    assert "from" in r.text


async def test_tenant_admin_sees_only_its_own_costs(admin: Admin, root: str) -> None:
    r = await admin.call("GET", "/admin/v1/tenants", root)
    a = next(t["id"] for t in r.json() if t["name"] == "costs-a")
    b = next(t["id"] for t in r.json() if t["name"] == "costs-b")
    a_admin = await admin.key(root, a, scopes=["admin:read"])
    r = await admin.call("GET", f"/admin/v1/reports/costs?{JAN}&group_by=tenant", a_admin)
    assert {x["BillingAccountId"] for x in r.json()["rows"]} == {a}
    r = await admin.call("GET", f"/admin/v1/reports/costs?{JAN}&tenant_id={b}", a_admin)
    assert r.status_code == 404
    r = await admin.call("GET", f"/admin/v1/reports/costs?{JAN}&tenant_id={b}", root)
    assert [x["BilledCost"] for x in r.json()["totals"]] == ["0.000001"]


async def test_costs_grouped_by_adapter(admin: Admin, root: str) -> None:
    tenant = await admin.tenant(root, "costs-lora")
    async with admin.kiln.db.sessions.begin() as session:
        session.add_all([
            line(tenant, "2025-03-02T10:00:00Z", "output_token", "10", (20, 20), adapter="bot"),
            line(tenant, "2025-03-02T11:00:00Z", "output_token", "5", (10, 10), adapter="bot"),
            line(tenant, "2025-03-02T12:00:00Z", "output_token", "7", (14, 14)),  # base model
        ])  # fmt: skip
    march = f"from=2025-03-01&to=2025-04-01&tenant_id={tenant}"
    r = await admin.call("GET", f"/admin/v1/reports/costs?{march}&group_by=model,adapter", root)
    assert r.status_code == 200, r.text
    rows = [
        (x["SkuId"], x["x_Adapter"], x["ConsumedQuantity"], x["x_Lines"]) for x in r.json()["rows"]
    ]
    assert rows == [("m1:*:output_token:bot", "bot", "15", 2), ("m1:*:output_token", None, "7", 1)]
    r = await admin.call("GET", f"/admin/v1/reports/costs?{march}&group_by=model", root)
    assert [x["x_Adapter"] for x in r.json()["rows"]] == [None]  # not grouped: one row
