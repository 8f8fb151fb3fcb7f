"""Billing at scale: cost reports and exports over 1,000,000 usage events (docs/benchmarks.md).

Starts a fresh embedded PostgreSQL (pgserver, as the tests do), migrates it, and inserts
``--events`` synthetic usage events for one month with their charge lines (an input-token and an
output-token line each) server-side with ``INSERT … SELECT generate_series``. Then it measures:

1. a one-month cost report grouped by tenant and day (``reports.services.stream_json``, the code
   behind ``GET /admin/v1/reports/costs``), target < 5 s;
2. ``kiln reports export --format csv --group-by tenant,model,version,key,request`` (one CSV row
   per charge line) in a subprocess, for a tenth of the month and then the whole month: wall time
   and peak RSS (``getrusage(RUSAGE_CHILDREN).ru_maxrss``, and psutil samples every 50 ms),
   target < 200 MB and flat; the CSV is checked against the ledger to the micro-unit;
3. the request-path overhead of metering: ``bench/_metering.py``'s ``metering_ratio`` (requests/s
   of ``kiln up`` with metering ÷ without), target ≥ 0.95.

    python bench/billing.py                     # ~3 minutes on 2 cores
    python bench/billing.py --events 100000 --no-metering
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
from sqlalchemy import text

from kiln_platform.cli._base import cli_actor
from kiln_platform.db import migrate
from kiln_platform.db.engine import asyncpg_url, create_engine, embedded_server, sessionmaker
from kiln_platform.reports import services

sys.path.insert(0, str(Path(__file__).resolve().parent))

MONTH_START, MONTH_END = "2025-06-01", "2025-07-01"
SEED = [
    """INSERT INTO tenants (id, name, timezone, plan)
       SELECT gen_random_uuid(), 'bench-' || i,
              (ARRAY['UTC', 'Europe/Paris', 'America/New_York', 'Asia/Tokyo'])[1 + i % 4],
              (ARRAY['standard', 'pro'])[1 + i % 2]
       FROM generate_series(1, :tenants) AS i""",
    """INSERT INTO api_keys (id, tenant_id, name, prefix, digest, scopes, role)
       SELECT gen_random_uuid(), t.id, 'bench', 'kiln_' || substr(md5(t.id::text || k), 1, 8),
              sha256(convert_to(t.id::text || k, 'UTF8')), ARRAY['inference'], 'tenant-member'
       FROM tenants t, generate_series(1, 2) AS k""",
    """CREATE TEMP TABLE bench_keys AS
       SELECT row_number() OVER (ORDER BY k.id) - 1 AS n, k.id, k.tenant_id FROM api_keys k""",
    # One event per request, spread evenly over the month; costs are the sums of its lines.
    """INSERT INTO usage_events (request_id, tenant_id, api_key_id, model, version, endpoint,
           status, input_tokens, output_tokens, items, queue_ms, compute_ms, created_at,
           price_book_version, currency, list_cost_micros, cost_micros)
       SELECT 'req_' || i, k.tenant_id, k.id, m.model, 'v1', m.endpoint, 200, i % 700 + 1,
              m.out * (i % 300), 0, 0.4, 3.5,
              timestamptz '2025-06-01' + (i - 1) * (interval '30 days' / :events),
              1, 'USD', (i % 700 + 1) * 2 + m.out * (i % 300) * 8,
              round((i % 700 + 1) * 2 * 0.9) + round(m.out * (i % 300) * 8 * 0.9)
       FROM generate_series(1, :events) AS i
       JOIN bench_keys k ON k.n = i % (SELECT count(*) FROM bench_keys)
       JOIN (VALUES (0, 'all-minilm-l6-v2', 'embeddings', 0),
                    (1, 'smollm2-135m-instruct', 'chat', 1)) AS m(n, model, endpoint, out)
         ON m.n = i % 2""",
    """INSERT INTO usage_charges (kind, request_id, tenant_id, api_key_id, model, version, unit,
           quantity, unit_price_micros, list_cost_micros, cost_micros, currency,
           price_book_version, charged_at)
       SELECT 'usage', e.request_id, e.tenant_id, e.api_key_id, e.model, e.version, l.unit,
              l.qty, l.price, l.qty * l.price, round(l.qty * l.price * 0.9), 'USD', 1,
              e.created_at
       FROM usage_events e CROSS JOIN LATERAL (VALUES
           ('input_token', e.input_tokens, 2), ('output_token', e.output_tokens, 8)
       ) AS l(unit, qty, price)
       WHERE l.qty > 0""",
]


async def seed(uri: str, tenants: int, events: int) -> tuple[int, int]:
    """Migrate and insert; returns (charge lines, their summed cost in micro-units)."""
    engine = create_engine(asyncpg_url(uri))
    try:
        await migrate.upgrade(engine)
        async with engine.begin() as conn:
            await conn.execute(text("SET LOCAL synchronous_commit = off"))
            for sql in SEED:
                await conn.execute(text(sql), {"tenants": tenants, "events": events})
        async with engine.connect() as conn:
            await conn.execute(text("ANALYZE"))
            lines, total = (
                await conn.execute(text("SELECT count(*), sum(cost_micros) FROM usage_charges"))
            ).one()
        return int(lines), int(total)
    finally:
        await engine.dispose()


async def month_report(uri: str) -> tuple[float, int, int]:
    """Seconds for the one-month report by tenant and day, its bytes and its billed total."""
    engine = create_engine(asyncpg_url(uri))
    try:
        query = services.cost_query(cli_actor(), MONTH_START, MONTH_END, "tenant,day", None)
        started = time.perf_counter()
        chunks = [c async for c in services.stream_json(sessionmaker(engine).begin, query)]
        elapsed = time.perf_counter() - started
        size = sum(len(c) for c in chunks)
        totals = json.loads(b"".join(chunks))["totals"]
        return elapsed, size, sum(t["x_BilledCostMicros"] for t in totals)
    finally:
        await engine.dispose()


def export(uri: str, until: str, out: Path) -> tuple[float, float, float]:
    """``kiln reports export`` in a subprocess: (seconds, peak RSS MB sampled, ru_maxrss MB)."""
    env = {**os.environ, "KILN_DATABASE_URL": uri, "KILN_DATA_DIR": str(out.parent),
           "KILN_LOG_LEVEL": "warning"}  # fmt: skip
    cmd = [sys.executable, "-m", "kiln_console", "reports", "export", "--from", MONTH_START,
           "--to", until, "--format", "csv", "--group-by", "tenant,model,version,key,request",
           "--output", str(out)]  # fmt: skip
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env)
    peak, watched = 0, psutil.Process(proc.pid)
    while proc.poll() is None:
        try:
            peak = max(peak, watched.memory_info().rss)
        except psutil.Error:
            break
        time.sleep(0.05)
    if proc.wait() != 0:
        raise RuntimeError(f"kiln reports export exited with {proc.returncode}")
    elapsed = time.perf_counter() - started
    maxrss_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    return elapsed, peak / 2**20, maxrss_mb


def check_csv(path: Path) -> tuple[int, int]:
    """(rows, sum of x_BilledCostMicros) of an exported CSV, read as a stream."""
    rows = total = 0
    with path.open(newline="") as f:
        for row in csv.DictReader(f):
            rows += 1
            total += int(row["x_BilledCostMicros"])
    return rows, total


def metering(model_dir: Path | None, concurrency: int, seconds: float, rounds: int) -> None:
    """Requests/s with metering ÷ without, from ENGINEER LEDGER's ``bench/_metering.py``."""
    try:
        from _metering import metering_ratio  # type: ignore[import-not-found]
    except ImportError:
        print("metering overhead: bench/_metering.py is not there yet; skipped")
        return
    from embeddings import _model_dir  # type: ignore[import-not-found]

    on, off, ratio = metering_ratio(_model_dir(model_dir), concurrency=concurrency,
                                    seconds=seconds, rounds=rounds)  # fmt: skip
    print(f"metering: {on:.1f} req/s with, {off:.1f} req/s without -> ratio {ratio:.3f} "
          f"(overhead {100 * (1 - ratio):.1f}%; target < 5%)")  # fmt: skip


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--events", type=int, default=1_000_000, help="usage events to insert")
    p.add_argument("--tenants", type=int, default=50, help="tenants (2 API keys each)")
    p.add_argument("--no-metering", action="store_true", help="skip the metering overhead run")
    p.add_argument("--model-dir", type=Path, help="all-MiniLM-L6-v2 (default: the test cache)")
    p.add_argument("--concurrency", type=int, default=16, help="metering run: senders")
    p.add_argument("--seconds", type=float, default=10.0, help="metering run: seconds each")
    p.add_argument("--rounds", type=int, default=5, help="metering run: rounds (medians)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    """Run every measurement and print the figures."""
    args = parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="kiln-bench-billing-"))  # /tmp: pgserver's user reads it
    try:
        with embedded_server(work / "pg") as uri:
            started = time.perf_counter()
            lines, ledger = asyncio.run(seed(uri, args.tenants, args.events))
            print(f"seeded {args.events:,} usage events, {lines:,} charge lines, "
                  f"{args.tenants} tenants in {time.perf_counter() - started:.1f} s")  # fmt: skip
            elapsed, size, billed = asyncio.run(month_report(uri))
            assert billed == ledger, (billed, ledger)
            print(f"one-month report by tenant and day: {elapsed:.2f} s ({size:,} bytes JSON; "
                  f"total {billed:,} micro-units = ledger; target < 5 s)")  # fmt: skip
            for until in ("2025-06-04", MONTH_END):
                out = work / "costs.csv"
                secs, peak, maxrss = export(uri, until, out)
                rows, total = check_csv(out)
                print(f"export [{MONTH_START}, {until}): {rows:,} rows, "
                      f"{out.stat().st_size / 2**20:.0f} MB CSV in {secs:.1f} s "
                      f"({rows / secs:,.0f} rows/s); peak RSS {peak:.0f} MB sampled, "
                      f"ru_maxrss (children so far) {maxrss:.0f} MB; target < 200 MB")  # fmt: skip
                if until == MONTH_END:
                    assert (rows, total) == (lines, ledger), (rows, total, lines, ledger)
                    print("export = ledger: every charge line once, sums equal to the micro-unit")
                out.unlink()
        if not args.no_metering:
            metering(args.model_dir, args.concurrency, args.seconds, args.rounds)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
