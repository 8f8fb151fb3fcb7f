"""Monthly statements (closed once, immutable, in the tenant's time zone), adjustments as
separate charge lines, and the finance role: reads costs and statements, nothing else."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from kiln_platform.admin.authz import Actor, Role
from kiln_platform.errors import Forbidden
from kiln_platform.reports import services, statements

from .conftest import Admin
from .test_reports import line


async def test_close_statement_once_in_the_tenant_time_zone(admin: Admin, root: str) -> None:
    t = await admin.tenant(root, "stmt-kiritimati")
    async with admin.kiln.db.sessions.begin() as session:
        await session.execute(
            text("UPDATE tenants SET timezone = 'Pacific/Kiritimati' WHERE id = :t"), {"t": t}
        )
        session.add_all([
            line(t, "2025-03-31T09:59:59Z", "input_token", "10", (11, 10)),  # Mar 31 23:59 local
            line(t, "2025-03-31T10:00:00Z", "input_token", "10", (22, 20)),  # Apr 1 00:00 local
            line(t, "2025-02-28T10:00:00Z", "output_token", "1", (44, 40)),  # Mar 1 00:00 local
            line(t, "2025-02-28T09:59:59Z", "output_token", "1", (88, 80)),  # Feb 28 23:59 local
        ])  # fmt: skip
    base = f"/admin/v1/tenants/{t}/statements"
    r = await admin.call("POST", f"{base}/2025-03/close", root)
    assert r.status_code == 201, r.text
    march = r.json()
    assert (march["period"], march["cost_micros"], march["list_cost_micros"]) == (
        "2025-03", 50, 55,
    )  # fmt: skip
    assert (march["cost"], march["lines"], march["currency"]) == ("0.000050", 2, "USD")
    assert (await admin.call("POST", f"{base}/2025-03/close", root)).status_code == 409
    # The tenant's month, not UTC's: Kiritimati (UTC+14) starts a month 14 hours before UTC does.
    this_month = datetime.now(ZoneInfo("Pacific/Kiritimati")).strftime("%Y-%m")
    r = await admin.call("POST", f"{base}/{this_month}/close", root)
    assert r.status_code == 409
    assert "not over" in r.json()["detail"]
    assert (await admin.call("POST", f"{base}/2025-13/close", root)).status_code == 400
    assert (await admin.call("POST", f"{base}/2025-04/close", root)).json()["cost_micros"] == 20
    listed = (await admin.call("GET", base, root)).json()
    assert [s["period"] for s in listed] == ["2025-04", "2025-03"]
    assert (await admin.call("GET", f"{base}/2025-03", root)).json() == march
    assert (await admin.call("GET", f"{base}/2025-05", root)).status_code == 404
    async with admin.kiln.db.sessions() as session:
        for sql in ("UPDATE statements SET cost_micros = 0", "DELETE FROM statements"):
            with pytest.raises(DBAPIError, match="append-only"):
                await session.execute(text(sql))
            await session.rollback()


async def test_adjustments_are_separate_lines_reported_as_adjustment(
    admin: Admin, root: str
) -> None:
    t = await admin.tenant(root, "adjusted")
    url = f"/admin/v1/tenants/{t}/adjustments"
    body = {"amount_micros": -1_500_000, "reason": "outage credit", "corrects_period": "2025-03"}
    r = await admin.call("POST", url, root, json=body)
    assert r.status_code == 201, r.text
    made = r.json()
    assert (made["amount"], made["corrects_period"], made["request_id"][:4]) == (
        "-1.500000", "2025-03", "adj_",
    )  # fmt: skip
    r = await admin.call("POST", url, root, json={**body, "amount_micros": 0})
    assert r.status_code == 400
    r = await admin.call("POST", url, root, json={**body, "corrects_period": "March"})
    assert r.status_code == 400
    now = datetime.now(UTC)
    r = await admin.call(
        "GET", f"/admin/v1/reports/costs?from={now:%Y-%m-01}&to=2999-01-01&tenant_id={t}", root
    )
    [row] = r.json()["rows"]
    assert (row["ChargeCategory"], row["SkuId"], row["BilledCost"]) == (
        "Adjustment", "adjustment", "-1.500000",
    )  # fmt: skip
    assert row["ConsumedQuantity"] is None
    r = await admin.call("GET", f"/admin/v1/audit?tenant_id={t}&action=adjustment.create", root)
    assert r.json()["data"][0]["after"]["amount_micros"] == -1_500_000


async def test_finance_reads_costs_and_statements_and_nothing_else(admin: Admin, root: str) -> None:
    t = await admin.tenant(root, "finance-co")
    fin = await admin.key(root, t, role="finance",
                          scopes=["admin:read", "admin:write", "inference"])  # fmt: skip
    member = (await admin.call("POST", f"/admin/v1/tenants/{t}/keys", root, json={})).json()
    reads_ok = [
        "/admin/v1/reports/costs?from=2025-01-01&to=2025-02-01",
        "/admin/v1/reports/costs?from=2025-01-01&to=2025-02-01&format=csv",
        f"/admin/v1/tenants/{t}/statements",
        "/admin/v1/price-books",
    ]
    for path in reads_ok:
        assert (await admin.call("GET", path, fin)).status_code == 200, path
    key_id = member["key"]["id"]
    refused: list[tuple[str, str, dict[str, Any] | None]] = [
        ("GET", "/admin/v1/tenants", None),
        ("GET", f"/admin/v1/tenants/{t}", None),
        ("GET", f"/admin/v1/tenants/{t}/keys", None),
        ("GET", f"/admin/v1/quotas/{t}", None),
        ("GET", "/admin/v1/users", None),
        ("GET", "/admin/v1/audit", None),
        ("GET", "/admin/v1/compile-jobs", None),
        ("POST", "/admin/v1/tenants", {"name": "nope"}),
        ("PATCH", f"/admin/v1/tenants/{t}", {"weight": 2}),
        ("DELETE", f"/admin/v1/tenants/{t}", None),
        ("POST", f"/admin/v1/tenants/{t}/keys", {}),
        ("DELETE", f"/admin/v1/tenants/{t}/keys/{key_id}", None),
        ("PUT", f"/admin/v1/quotas/{t}", {"rpm": 1}),
        ("POST", "/admin/v1/users", {"email": "f@x.co", "password": "12345678",
                                     "role": "tenant-member", "tenant_id": t}),
        ("POST", f"/admin/v1/tenants/{t}/statements/2025-01/close", None),
        ("POST", f"/admin/v1/tenants/{t}/adjustments",
         {"amount_micros": 1, "reason": "x", "corrects_period": "2025-01"}),
        ("POST", "/admin/v1/models/m/versions", None),
        ("POST", "/admin/v1/price-books", {"prices": [], "effective_from": "2030-01-01T00:00:00Z"}),
        ("GET", "/v1/models", None),
        ("POST", "/v1/embeddings", {"model": "all-minilm-l6-v2", "input": "hi"}),
        ("POST", "/v1/chat/completions", {"model": "m", "messages": []}),
        ("POST", "/v2/models/m/infer", {"inputs": []}),
    ]  # fmt: skip
    for method, path, body in refused:
        r = await admin.call(method, path, fin, json=body)
        assert r.status_code == 403, (method, path, r.status_code, r.text)
    user = Actor("user:finance@x.co", Role.FINANCE, None)  # a finance user: every tenant
    services.cost_query(user, "2025-01-01", "2025-02-01", "tenant", uuid.UUID(t))
    async with admin.kiln.db.sessions.begin() as session:
        assert await statements.list_statements(session, user, uuid.UUID(t)) == []
        with pytest.raises(Forbidden):
            await statements.close_statement(session, user, uuid.UUID(t), "2025-01")
