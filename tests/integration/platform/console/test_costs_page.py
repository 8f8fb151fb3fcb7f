"""The costs page and the finance overview over HTTP: usage lines priced or not, totals and
subtotals that equal the CSV's sums, the tenant filter, period presets and statement states."""

from __future__ import annotations

import csv
import io
import re
from datetime import UTC, date, datetime
from decimal import Decimal
from zoneinfo import ZoneInfo

from sqlalchemy import text

from kiln_console.reportform import month_of
from kiln_platform.reports.statements import close_statement
from tests.factories import CLI

from .conftest import App

LINE = """
INSERT INTO usage_charges (kind, request_id, tenant_id, model, version, unit, quantity,
    unit_price_micros, list_cost_micros, cost_micros, currency, charged_at)
VALUES ('usage', :rid, :tenant, :model, '1', :unit, :qty, 0, :cost, :cost, :currency, :at)
"""


async def _seed(app: App) -> tuple[str, str, str]:
    """Two tenants' lines last month (one of them unpriced), and a closed statement."""
    a, b = await app.tenant(), await app.tenant()
    last = month_of(datetime.now(UTC).date(), 1)[0]
    at = datetime(last.year, last.month, 3, 12, tzinfo=UTC)
    lines = [(a, "emb", "input_token", 70, 1_250_000), (a, "chat", "output_token", 5, 0),
             (b, "emb", "input_token", 9, 2_000_001), (b, "emb", "request", 3, 0)]  # fmt: skip
    async with app.kiln.db.sessions.begin() as session:
        for i, (tenant, model, unit, qty, cost) in enumerate(lines):
            await session.execute(text(LINE), {"rid": f"r{i}-{tenant}", "tenant": tenant,
                                               "model": model, "unit": unit, "qty": qty,
                                               "cost": cost, "at": at,
                                               "currency": "USD"})  # fmt: skip
        await close_statement(session, CLI, a, f"{last:%Y-%m}")
    return str(a), str(b), f"{last:%Y-%m}"


def _total(page: str) -> Decimal:
    found = re.search(r'<td class="num" data-currency="USD">([0-9.]+)</td>', page)
    assert found, page
    return Decimal(found[1])


async def test_totals_equal_the_csv_and_unpriced_usage_is_listed(app: App) -> None:
    a, b, month = await _seed(app)
    async with app.signed_in(await app.user("finance")) as (http, _):
        query = f"period=last-month&group=tenant&group=model&tenant={a}"
        page = (await http.get(f"/console/costs?{query}")).text
        assert _total(page) == Decimal("1.250000")  # tenant filter: only a's lines
        assert "chat:*:output_token" in page  # a zero-cost line is a line
        rows = list(
            csv.DictReader(io.StringIO((await http.get(f"/console/costs.csv?{query}")).text))
        )
        assert {r["BillingAccountId"] for r in rows} == {a}
        assert f'<option value="{b}"' in page  # the filter still offers every tenant
        assert sum(Decimal(r["BilledCost"]) for r in rows) == _total(page)
        assert ("5", "0.000000") in {(r["ConsumedQuantity"], r["BilledCost"]) for r in rows}

        page = (await http.get("/console/costs?period=last-month&group=tenant&group=model")).text
        assert _total(page) >= Decimal("3.250001")
        assert page.count('class="subtotal"') >= 2  # one per tenant
        assert re.search(rf'data-month="{month}">\s*<td>[^<]*</td><td>{month}</td>.*?Closed',
                         page, re.S)  # a's month is closed  # fmt: skip
        assert 'class="open">Open' in page  # b's is still open

        overview = await http.get("/console/finance?period=last-month")
        assert overview.status_code == 200
        assert len(re.findall(r'<rect class="bar"[^>]*><title>', overview.text)) >= 3  # 2+1 bars
        assert ": 1.250000 USD</title>" in overview.text  # a's bar, its exact amount as tooltip
        assert ": 2.000001 USD</title>" in overview.text


async def test_the_finance_overview_never_adds_two_currencies(app: App) -> None:
    tenant = await app.tenant()
    last = month_of(datetime.now(UTC).date(), 1)[0]
    at = datetime(last.year, last.month, 4, 12, tzinfo=UTC)
    async with app.kiln.db.sessions.begin() as session:
        for currency, cost in (("USD", 300_003), ("EUR", 700_007)):
            line = dict(rid=f"fx-{currency}-{tenant}", tenant=tenant, model="emb", unit="request",
                        qty=1, cost=cost, currency=currency, at=at)  # fmt: skip
            await session.execute(text(LINE), line)
    async with app.signed_in(await app.user("finance")) as (http, _):
        page = (await http.get("/console/finance?period=last-month")).text
    assert ": 0.300003 USD</title>" in page  # the tenant's bar in the dollar chart
    assert ": 0.700007 EUR</title>" in page  # and in the euro chart
    assert "1.000010" not in page  # never their sum
    assert 'id="spend-by-tenant-eur"' in page
    assert 'id="spend-by-day-eur"' in page
    euros = re.search(r'id="mtd-eur".*?class="mtd-last">([0-9.]+)<', page, re.S)
    assert euros, page
    assert Decimal(euros[1]) >= Decimal("0.700007")


async def _tokyo_tenant(app: App, day: int, cost: int) -> tuple[str, date]:
    """A Tokyo tenant with one line at 01:00 local on ``day`` of last month (16:00 UTC the day
    before); its id and last month's first day."""
    tenant = await app.tenant()
    last = month_of(datetime.now(UTC).date(), 1)[0]
    at = datetime(last.year, last.month, day, 1, tzinfo=ZoneInfo("Asia/Tokyo"))
    line = dict(rid=f"tokyo-{tenant}", tenant=tenant, model="emb", unit="request", qty=1,
                cost=cost, currency="JPY", at=at)  # fmt: skip
    async with app.kiln.db.sessions.begin() as session:
        await session.execute(text("UPDATE tenants SET timezone = 'Asia/Tokyo' WHERE id = :t"),
                              {"t": tenant})  # fmt: skip
        await session.execute(text(LINE), line)
    return str(tenant), last


async def test_a_day_is_the_tenants_local_day(app: App) -> None:
    """A Tokyo tenant's first local day of last month is charted as that day and counted in
    last month, although its local midnight is on the previous UTC date."""
    _, last = await _tokyo_tenant(app, 1, 400_004)
    async with app.signed_in(await app.user("finance")) as (http, _):
        page = (await http.get("/console/finance?period=last-month")).text
    assert f"{last:%Y-%m-%d}: 0.400004 JPY</title>" in page
    yen = re.search(r'id="mtd-jpy".*?class="mtd-last">([0-9.]+)<', page, re.S)
    assert yen, page
    assert Decimal(yen[1]) == Decimal("0.400004")


async def test_rows_and_subtotals_by_day_are_labelled_with_the_local_day(app: App) -> None:
    """A Tokyo tenant's day starts at 15:00 UTC the day before: its row (month and day) and its
    day's subtotal are labelled with its own dates, not the UTC dates of those instants."""
    tenant, last = await _tokyo_tenant(app, 2, 500_005)
    async with app.signed_in(await app.user("finance")) as (http, _):
        query = f"period=last-month&group=version&group=day&tenant={tenant}"
        page = (await http.get(f"/console/costs?{query}")).text
    day = f"{last:%Y-%m}-02"
    assert re.search(rf"<tr>\s*<td>{last:%Y-%m}</td>\s*<td>{day}</td>", page), page  # its month
    assert f"Subtotal {day}</th>" in page
    assert f"Subtotal {last:%Y-%m}-01" not in page
