"""``kiln reports export`` in a subprocess: a range of 30,000 charge lines streamed to CSV and
JSON straight from the database, equal to the ledger to the micro-unit."""

from __future__ import annotations

import asyncio
import csv
import json
import os
import subprocess
import sys
from decimal import Decimal
from pathlib import Path

from sqlalchemy import text

from kiln_platform.db.database import open_database
from kiln_platform.settings import Settings

LINES = 30_000
SEED = """
INSERT INTO usage_charges (kind, request_id, tenant_id, model, version, unit, quantity,
    unit_price_micros, list_cost_micros, cost_micros, currency, charged_at)
SELECT 'usage', 'req_' || i, :tenant, 'm' || (i % 3), 'v1',
    (ARRAY['input_token', 'output_token'])[1 + i % 2], i % 500, 0.35, (i % 500) * 35 / 100 + 1,
    (i % 500) * 3 / 10 + 1, 'USD', timestamptz '2025-06-01' + i * interval '80 seconds'
FROM generate_series(1, :n) AS i
"""


async def _seed(data_dir: Path) -> int:
    async with open_database(Settings(data_dir=data_dir)) as db, db.sessions.begin() as s:
        tenant = await s.scalar(text("SELECT id FROM tenants WHERE name = 'acme'"))
        await s.execute(text(SEED), {"tenant": tenant, "n": LINES})
        return int(await s.scalar(text("SELECT sum(cost_micros) FROM usage_charges")))


def _kiln(data_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "KILN_DATA_DIR": str(data_dir), "KILN_LOG_LEVEL": "warning"}
    env.pop("KILN_DATABASE_URL", None)
    return subprocess.run(
        [sys.executable, "-m", "kiln_console", *args],
        env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def test_export_streams_csv_and_json_that_reconcile(fresh_data_dir: Path) -> None:
    assert _kiln(fresh_data_dir, "tenants", "create", "acme").returncode == 0
    ledger = asyncio.run(_seed(fresh_data_dir))
    out = fresh_data_dir / "costs.csv"
    export = ("reports", "export", "--from", "2025-06-01", "--to", "2025-08-01")
    done = _kiln(fresh_data_dir, *export, "--group-by", "tenant,request", "--output", str(out))
    assert done.returncode == 0, done.stderr
    with out.open(newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == LINES
    assert len({r["x_RequestId"] for r in rows}) == LINES
    assert {r["BillingAccountName"] for r in rows} == {"acme"}
    assert sum(int(r["x_BilledCostMicros"]) for r in rows) == ledger
    assert sum(Decimal(r["BilledCost"]) for r in rows) == Decimal(ledger) / 1_000_000
    done = _kiln(fresh_data_dir, *export, "--format", "json", "--group-by", "tenant,day")
    assert done.returncode == 0, done.stderr
    body = json.loads(done.stdout)
    [total] = body["totals"]
    assert total["x_BilledCostMicros"] == ledger
    assert total["x_Lines"] == LINES
    days = {r["ChargePeriodStart"][:10] for r in body["rows"]}
    assert len(days) == 28  # 30,000 lines 80 s apart: June 1 to June 28
    bad = _kiln(fresh_data_dir, "reports", "export", "--from", "June", "--to", "2025-08-01")
    assert bad.returncode == 1
    assert "'from'" in bad.stderr
