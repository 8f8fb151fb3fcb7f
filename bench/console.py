"""Console pages at scale: p95 per page with 1,000,000 usage rows and 1,000 tenants
(docs/benchmarks.md).

Starts a fresh embedded PostgreSQL (pgserver, as the tests do), migrates it, and inserts
``--tenants`` tenants (two keys each) and ``--events`` usage events spread over the last 30 days
with ``INSERT … SELECT generate_series`` (and a charge line for each, what finance's pages
read; migration 0023's trigger rolls those up per tenant and local day as they are inserted),
then rolls the usage up with the statements migration 0015 uses for existing usage (the seed
bypasses the ledger writer, which keeps that rollup for live traffic). Then it starts ``kiln
up`` on that database, creates a tenant-admin (of the first tenant), a platform-admin and a
finance user with the CLI, signs in as each, and loads each of their pages ``--loads`` times
(after 3 warm-ups), one at a time, printing p50/p95.
Goal: < 300 ms p95 per page.

    python bench/console.py                     # ~5 minutes on 2 cores
    python bench/console.py --events 100000 --tenants 100 --loads 20
    python bench/console.py --roles finance     # finance's pages only
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import text

from kiln_platform.db import migrate
from kiln_platform.db.engine import asyncpg_url, create_engine, embedded_server

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _kiln import free_port

PASSWORD = "correct horse battery"  # noqa: S105 (the bench users' throw-away password)
_CSRF = re.compile(r'name="_csrf_token" value="([^"]+)"')
SEED = [
    """INSERT INTO tenants (id, name) SELECT gen_random_uuid(), 'bench-' || i
       FROM generate_series(1, :tenants) AS i""",
    """INSERT INTO api_keys (id, tenant_id, name, prefix, digest, scopes, role)
       SELECT gen_random_uuid(), t.id, 'bench', 'kiln_' || substr(md5(t.id::text || k), 1, 8),
              sha256(convert_to(t.id::text || k, 'UTF8')), ARRAY['inference'], 'tenant-member'
       FROM tenants t, generate_series(1, 2) AS k""",
    """CREATE TEMP TABLE bench_keys AS
       SELECT row_number() OVER (ORDER BY k.id) - 1 AS n, k.id, k.tenant_id FROM api_keys k""",
    # The last 30 days up to now; one request in 50 an error; latency 2..600 ms.
    """INSERT INTO usage_events (request_id, tenant_id, api_key_id, model, version, endpoint,
           status, input_tokens, output_tokens, items, queue_ms, compute_ms, created_at,
           currency, list_cost_micros, cost_micros)
       SELECT 'req_' || i, k.tenant_id, k.id, m.model, 'v1', m.endpoint,
              CASE WHEN i % 50 = 0 THEN 500 ELSE 200 END, i % 700 + 1, m.out * (i % 300), 0,
              0.4, 2 + (i::bigint * 7919) % 600,
              now() - (i - 1) * (interval '30 days' / :events),
              'USD', (i % 700 + 1) * 2, (i % 700 + 1) * 2
       FROM generate_series(1, :events) AS i
       JOIN bench_keys k ON k.n = i % (SELECT count(*) FROM bench_keys)
       JOIN (VALUES (0, 'all-minilm-l6-v2', 'embeddings', 0),
                    (1, 'smollm2-135m-instruct', 'chat', 1)) AS m(n, model, endpoint, out)
         ON m.n = i % 2""",
    # What finance reads: one charge line per event (its input tokens, at its cost).
    """INSERT INTO usage_charges (kind, request_id, tenant_id, api_key_id, model, version, unit,
           quantity, unit_price_micros, list_cost_micros, cost_micros, currency, charged_at)
       SELECT 'usage', request_id, tenant_id, api_key_id, model, version, 'input_token',
              input_tokens, 2, list_cost_micros, cost_micros, currency, created_at
       FROM usage_events""",
]


def _migration_0015() -> Any:
    """Migration 0015, whose statements roll up existing usage."""
    path = Path(__file__).resolve().parents[1] / "migrations" / "versions" / "0015_overview.py"
    spec = importlib.util.spec_from_file_location("migration_0015", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


async def seed(uri: str, tenants: int, events: int) -> tuple[int, str]:
    """Migrate and insert; returns the rollup's rows and tenant ``bench-1``'s id."""
    engine = create_engine(asyncpg_url(uri))
    try:
        await migrate.upgrade(engine)
        async with engine.begin() as conn:
            await conn.execute(text("SET LOCAL synchronous_commit = off"))
            await conn.execute(text("SET LOCAL kiln.scope = 'platform'"))
            for sql in SEED:
                await conn.execute(text(sql), {"tenants": tenants, "events": events})
            for sql in _migration_0015().ROLLUP_SQL.values():  # as the ledger would have
                await conn.execute(text(sql))
        async with engine.connect() as conn:
            await conn.execute(text("ANALYZE"))
            await conn.commit()  # statistics are transactional: rolled back, they were lost
            await conn.execute(text("SET kiln.scope = 'platform'"))
            rollup = int(await conn.scalar(text("SELECT count(*) FROM usage_hourly")) or 0)
            first = await conn.scalar(text("SELECT id FROM tenants WHERE name = 'bench-1'"))
            return rollup, str(first)
    finally:
        await engine.dispose()


def cli(env: dict[str, str], *args: str) -> str:
    """Run a ``kiln`` admin command against the bench's database."""
    cmd = [sys.executable, "-m", "kiln_console", *args]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120,
                          check=True).stdout  # fmt: skip


def signed_in(base: str, email: str) -> httpx.Client:
    """A client with a console session."""
    http = httpx.Client(base_url=base, timeout=180)
    token = _CSRF.search(http.get("/console/login").text)
    assert token, "no CSRF token on the sign-in page"
    r = http.post("/console/login", data={"email": email, "password": PASSWORD,
                                           "_csrf_token": token.group(1)})  # fmt: skip
    assert r.status_code == 303, r.status_code
    return http


def measure(http: httpx.Client, path: str, loads: int, budget_s: float) -> tuple[float, float, int]:
    """(p50, p95) milliseconds of ``loads`` sequential GETs after 3 warm-ups, and how many were
    made: a page slower than ``budget_s`` in all stops early (after at least 5)."""
    for _ in range(3):
        http.get(path).raise_for_status()
    times: list[float] = []
    stop = time.perf_counter() + budget_s
    while len(times) < loads and (len(times) < 5 or time.perf_counter() < stop):
        started = time.perf_counter()
        http.get(path).raise_for_status()
        times.append((time.perf_counter() - started) * 1000)
    times.sort()
    p95 = times[min(len(times) - 1, round(0.95 * len(times)) - 1)]
    return statistics.median(times), p95, len(times)


TENANT_PAGES = ["keys", "clients", "adapters", "users", "quotas"]
"""The tenant-admin's pages under ``/console/tenants/{id}/``."""
COSTS_BY_DAY = "/console/costs?period=last-month&group=tenant&group=model&group=day"
PAGES = {
    "admin@bench.test": ["/console/overview?range=today", "/console/overview?range=7d",
                         "/console/overview?range=30d", *TENANT_PAGES, "/console/costs",
                         "/console/audit"],
    "ops@bench.test": ["/console/overview?range=today", "/console/overview?range=7d",
                       "/console/overview?range=30d", "/console/tenants", "/console/models",
                       "/console/slos", "/console/alerts", "/console/audit"],
    "money@bench.test": ["/console/finance", "/console/finance?period=last-month",
                         "/console/costs", COSTS_BY_DAY],
}  # fmt: skip
ROLES = {"admin@bench.test": ("tenant-admin", ["--tenant", "bench-1"]),
         "ops@bench.test": ("platform-admin", []), "money@bench.test": ("finance", [])}  # fmt: skip


def _path(path: str, tenant: str) -> str:
    """A page's path: a tenant page's name under ``/console/tenants/{tenant}/``."""
    return path if path.startswith("/") else f"/console/tenants/{tenant}/{path}"


def serve_and_measure(
    uri: str, work: Path, loads: int, tenant: str, budget_s: float, *, roles: list[str]
) -> None:
    """``kiln up`` on the seeded database; the pages' p50/p95 of each role in ``roles``."""
    env = {**os.environ, "KILN_DATABASE_URL": uri, "KILN_DATA_DIR": str(work),
           "KILN_LOG_LEVEL": "warning"}  # fmt: skip
    for email, (role, where) in ROLES.items():
        cli(env, "users", "create", "--email", email, "--role", role, *where,
            "--password", PASSWORD)  # fmt: skip
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen([sys.executable, "-m", "kiln_console", "up", "--no-import",
                             "--port", str(port)], env=env, stdout=subprocess.DEVNULL)  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{base}/console/login", timeout=2).status_code == 200:
                    break
            time.sleep(0.3)
        for email, paths in PAGES.items():
            if ROLES[email][0] not in roles:
                continue
            http = signed_in(base, email)
            try:
                for path in paths:
                    p50, p95, n = measure(http, _path(path, tenant), loads, budget_s)
                    ok = "ok" if p95 < 300 else "OVER"
                    print(f"{email:16} {path:40} p50 {p50:7.1f} ms  p95 {p95:7.1f} ms  "
                          f"n {n:3}  (goal < 300 ms: {ok})", flush=True)  # fmt: skip
            finally:
                http.close()
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def main(argv: list[str] | None = None) -> None:
    """Seed, serve, measure."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--events", type=int, default=1_000_000, help="usage events to insert")
    p.add_argument("--tenants", type=int, default=1000, help="tenants (2 API keys each)")
    p.add_argument("--loads", type=int, default=50, help="loads per page")
    p.add_argument("--budget", type=float, default=20.0,
                   help="seconds per page: a slower page stops early (after 5 loads)")  # fmt: skip
    p.add_argument("--roles", default="tenant-admin,platform-admin,finance",
                   help="whose pages to load (comma-separated)")  # fmt: skip
    args = p.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="kiln-bench-console-"))  # /tmp: pgserver's user reads it
    try:
        with embedded_server(work / "pg") as uri:
            started = time.perf_counter()
            rollup, tenant = asyncio.run(seed(uri, args.tenants, args.events))
            print(f"seeded {args.events:,} usage events, {args.tenants:,} tenants, "
                  f"{rollup:,} rollup rows in {time.perf_counter() - started:.1f} s "
                  "(goal < 120 s)")  # fmt: skip
            roles = args.roles.split(",")
            serve_and_measure(uri, work, args.loads, tenant, args.budget, roles=roles)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
