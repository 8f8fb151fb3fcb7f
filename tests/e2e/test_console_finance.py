"""Finance in a real browser against a real ``kiln up``: usage shows before any price book (the
console, the API report and the CSV list quantities at zero cost), and the costs table adds up
(last month, grouped by tenant and model: its total equals the downloaded CSV's sum)."""

from __future__ import annotations

import asyncio
import csv
import io
import re
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path

import httpx
import openai
import pytest
from playwright.sync_api import Page, expect
from sqlalchemy import text

from kiln_console.reportform import month_of
from kiln_platform.db.database import open_database
from kiln_platform.settings import Settings

from .conftest import MINILM, PASSWORD, KilnProcess, minilm_up, settled, sign_in

FINANCE = "money@kiln.test"
LINE = """
INSERT INTO usage_charges (kind, request_id, tenant_id, model, version, unit, quantity,
    unit_price_micros, list_cost_micros, cost_micros, currency, charged_at)
SELECT 'usage', 'seed_' || i || '_' || t.name, t.id, (ARRAY['emb', 'chat'])[1 + i % 2], '1',
    'input_token', i, 0.5, i * 50 + 1, i * 37 + 1, 'USD',
    CAST(:at AS timestamptz) + i * interval '1 hour'
FROM generate_series(1, 40) AS i, tenants AS t
"""


@pytest.fixture(scope="module")
def kiln(minilm_dir: Path) -> Iterator[KilnProcess]:
    """``kiln up`` serving all-MiniLM-L6-v2 with no price book, and a finance user."""
    for kiln in minilm_up(minilm_dir, {}):
        kiln.cli("users", "create", "--email", FINANCE, "--role", "finance",
                 "--password", PASSWORD)  # fmt: skip
        yield kiln


def _csv(page: Page) -> list[dict[str, str]]:
    with page.expect_download() as download:
        page.click("#csv")
    return list(csv.DictReader(io.StringIO(Path(download.value.path()).read_text())))


def test_usage_without_a_price_book_shows_at_zero_cost(
    kiln: KilnProcess, page: Page, tmp_path: Path
) -> None:
    kiln.cli("tenants", "create", "fresh")
    client = openai.OpenAI(base_url=f"{kiln.base_url}/v1", api_key=kiln.new_key("fresh"))
    tokens = sum(client.embeddings.create(model=MINILM, input=f"hello number {i}").usage
                 .prompt_tokens for i in range(3))  # fmt: skip
    admin = kiln.new_key("acme", "--role", "platform-admin", "--scope", "admin:read")
    first, after = month_of(datetime.now(UTC).date())
    query = {"from": str(first), "to": str(after), "group_by": "tenant,model"}
    r = httpx.get(f"{kiln.base_url}/admin/v1/reports/costs", params=query,
                  headers={"authorization": f"Bearer {admin}"})  # fmt: skip
    assert r.status_code == 200, r.text
    used = {row["ConsumedUnit"]: row for row in r.json()["rows"]
            if row["BillingAccountName"] == "fresh"}  # fmt: skip
    assert used["input_token"]["ConsumedQuantity"] == str(tokens)
    assert used["request"]["ConsumedQuantity"] == "3"
    assert {row["BilledCost"] for row in used.values()} == {"0.000000"}

    sign_in(page, FINANCE)
    expect(page).to_have_url(re.compile(r"/console/finance$"))
    page.goto("/console/costs")
    rows = page.locator("#costs > tbody:not(.subtotals) > tr", has_text="fresh")
    row = rows.filter(has_text="input_token")
    expect(row).to_contain_text(f"{MINILM}:*:input_token")
    expect(row.locator("td.num").first).to_have_text(str(tokens))
    expect(row.locator("td.num").last).to_have_text("0.000000")
    page.screenshot(path=tmp_path / "costs-unpriced.png", full_page=True)
    lines = [line for line in _csv(page) if line["BillingAccountName"] == "fresh"]
    assert {(line["ConsumedUnit"], line["ConsumedQuantity"], line["BilledCost"])
            for line in lines} >= {("input_token", str(tokens), "0.000000"),
                                   ("request", "3", "0.000000")}  # fmt: skip


async def _seed_last_month(data_dir: Path) -> None:
    last = month_of(datetime.now(UTC).date(), 1)[0]
    async with open_database(Settings(data_dir=data_dir)) as db, db.sessions.begin() as s:
        await s.execute(text(LINE), {"at": datetime(last.year, last.month, 2, tzinfo=UTC)})


def test_finance_picks_last_month_and_the_csv_adds_up_to_the_total(
    kiln: KilnProcess, page: Page, tmp_path: Path
) -> None:
    data_dir = Path(kiln.env["KILN_DATA_DIR"])
    with ThreadPoolExecutor(1) as pool:  # Playwright's loop runs in this thread
        pool.submit(asyncio.run, _seed_last_month(data_dir)).result()
    sign_in(page, FINANCE)
    expect(page.locator("#spend-by-day")).to_be_visible()
    page.goto("/console/finance?period=last-month")
    expect(page.locator("#spend-by-tenant .bar")).to_have_count(2)  # acme and fresh
    page.screenshot(path=tmp_path / "finance-overview.png", full_page=True)

    page.click("header nav >> text=Costs")
    page.check("#period input[value=last-month]")
    for group in ("tenant", "model"):
        page.check(f"#groups input[value={group}]")
    for group in ("version", "day"):
        page.uncheck(f"#groups input[value={group}]")
    page.click("#report-form button[type=submit]")
    settled(page)
    expect(page).to_have_url(re.compile(r"period=last-month"))
    last = month_of(datetime.now(UTC).date(), 1)[0]
    expect(page.locator("#report-form input[name=from]")).to_have_value(str(last))
    expect(page.locator("tr.subtotal")).to_have_count(2)
    total = Decimal(page.locator("tr.total td[data-currency=USD]").inner_text())
    assert total > 0
    page.screenshot(path=tmp_path / "costs-last-month.png", full_page=True)
    lines = _csv(page)
    assert len(lines) == page.locator("#costs > tbody:not(.subtotals) > tr").count() == 4
    assert sum(Decimal(line["BilledCost"]) for line in lines) == total
    assert {line["BillingAccountName"] for line in lines} == {"acme", "fresh"}
    assert {line["x_Model"] for line in lines} == {"emb", "chat"}
