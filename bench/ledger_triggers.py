"""What the charge rollups' triggers cost the ledger: usage rows written per second with and
without them, in the same run (docs/benchmarks.md, issue 18).

Starts a fresh embedded PostgreSQL (pgserver, as ``kiln up`` does), migrates it, adds
``--tenants`` tenants in four time zones (two keys each), then runs ``--writers`` concurrent
flushers, each writing batches of ``--batch`` requests with the ledger's own code
(``ledger.write``: the ``usage_events`` rows, then their charge lines, an input- and an
output-token line each, one transaction a batch, as ``LedgerWriter`` flushes) for ``--seconds``
per round. Each round runs every configuration, in a rotating order: both rollup triggers
(migrations 0023 and 0025), 0023's only, and none (``ALTER TABLE … DISABLE TRIGGER``).
Prints requests/s per configuration (median of the rounds), the ratio to none, and how many
batches PostgreSQL aborted as deadlocked (retried with new requests).

    python bench/ledger_triggers.py                     # ~3 minutes on 2 cores
    python bench/ledger_triggers.py --batch 1,16 --rounds 5 --seconds 4
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import time
import uuid
from pathlib import Path
from tempfile import mkdtemp
from typing import Any

from sqlalchemy import text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine

from kiln_platform.billing.ledger import Usage, write
from kiln_platform.db import migrate
from kiln_platform.db.engine import asyncpg_url, create_engine, embedded_server, sessionmaker

ZONES = ("UTC", "Europe/Paris", "America/New_York", "Asia/Tokyo")
TRIGGERS = {  # configuration -> the rollup triggers enabled on usage_charges
    "0023+0025": ("usage_charges_daily", "usage_charges_model_daily"),
    "0023 only": ("usage_charges_daily",),
    "none": (),
}
ALL = TRIGGERS["0023+0025"]


SEED = [
    """INSERT INTO tenants (id, name, timezone)
       SELECT gen_random_uuid(), 'bench-' || i, (CAST(:zones AS text[]))[1 + i % 4]
       FROM generate_series(1, :n) AS i""",
    """INSERT INTO api_keys (id, tenant_id, name, prefix, digest, scopes, role)
       SELECT gen_random_uuid(), t.id, 'bench', 'kiln_' || substr(md5(t.id::text || k), 1, 8),
              sha256(convert_to(t.id::text || k, 'UTF8')), ARRAY['inference'], 'tenant-member'
       FROM tenants t, generate_series(1, 2) AS k""",
]
KEYS = "SELECT k.tenant_id, k.id, t.timezone FROM api_keys k JOIN tenants t ON t.id = k.tenant_id"


async def seed(engine: AsyncEngine, tenants: int) -> list[tuple[uuid.UUID, uuid.UUID, str]]:
    """Migrate, add the tenants and their keys; each key as (tenant, key, zone)."""
    await migrate.upgrade(engine)
    async with engine.begin() as conn:
        for sql in SEED:
            await conn.execute(text(sql), {"n": tenants, "zones": list(ZONES)})
        return [(r[0], r[1], r[2]) for r in await conn.execute(text(KEYS))]


def _usage(key: tuple[uuid.UUID, uuid.UUID, str], i: int) -> Usage:
    tenant, key_id, zone = key
    return Usage(request_id=f"b-{uuid.uuid4().hex}", tenant_id=tenant, api_key_id=key_id,
                 model=("all-minilm-l6-v2", "smollm2-135m-instruct")[i % 2], version="v1",
                 endpoint="chat", status=200, input_tokens=1 + i % 700,
                 output_tokens=1 + i % 300, timezone=zone, held=False)  # fmt: skip


async def writer(
    engine: AsyncEngine, keys: list[Any], batch: int, until: float, n: int
) -> tuple[int, int]:
    """Write batches until ``until``; how many requests were written, and how many batches
    PostgreSQL aborted as deadlocked (the ledger would answer their requests 503)."""
    sessions = sessionmaker(engine)
    done = deadlocks = 0
    while time.monotonic() < until:
        usages = [_usage(keys[(n * 7919 + done + j) % len(keys)], done + j) for j in range(batch)]
        try:
            async with sessions.begin() as session:
                await session.execute(text("SET LOCAL kiln.scope = 'platform'"))
                await write(session, usages, [])
        except DBAPIError as exc:
            if "deadlock" not in str(exc):
                raise
            deadlocks += 1
            continue
        done += batch
    return done, deadlocks


async def configure(engine: AsyncEngine, name: str) -> None:
    """Enable exactly the configuration's triggers."""
    async with engine.begin() as conn:
        for trigger in ALL:
            verb = "ENABLE" if trigger in TRIGGERS[name] else "DISABLE"
            await conn.execute(text(f"ALTER TABLE usage_charges {verb} TRIGGER {trigger}"))


async def measure(uri: str, args: argparse.Namespace) -> None:
    engine = create_engine(asyncpg_url(uri), pool_size=args.writers + 1)
    try:
        keys = await seed(engine, args.tenants)
        names = list(TRIGGERS)
        for batch in (int(b) for b in args.batch.split(",")):
            rates: dict[str, list[float]] = {name: [] for name in names}
            deadlocks = dict.fromkeys(names, 0)
            for r in range(args.rounds):
                for name in names[r % 3 :] + names[: r % 3]:
                    await configure(engine, name)
                    started = time.monotonic()
                    until = started + args.seconds
                    counts = await asyncio.gather(*(writer(engine, keys, batch, until, n)
                                                    for n in range(args.writers)))  # fmt: skip
                    rates[name].append(sum(c[0] for c in counts) / (time.monotonic() - started))
                    deadlocks[name] += sum(c[1] for c in counts)
            base = statistics.median(rates["none"])
            for name in names:
                rate = statistics.median(rates[name])
                rounds = ", ".join(f"{x:.0f}" for x in rates[name])
                print(f"batch {batch:4}  {name:10} {rate:8.0f} requests/s  "
                      f"÷ none {rate / base:5.3f}  deadlocks {deadlocks[name]:3}  "
                      f"rounds: {rounds}", flush=True)  # fmt: skip
        await configure(engine, "0023+0025")
    finally:
        await engine.dispose()


def main(argv: list[str] | None = None) -> None:
    """Seed, then write with and without the triggers."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--tenants", type=int, default=1000)
    p.add_argument("--writers", type=int, default=4, help="concurrent flushers")
    p.add_argument("--batch", default="1,16,128", help="requests per transaction (list)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--seconds", type=float, default=5.0, help="per configuration and round")
    on_embedded(measure, p.parse_args(argv))


def on_embedded(measure: Any, args: argparse.Namespace) -> None:
    """Run ``measure(uri, args)`` on a fresh embedded PostgreSQL, removed afterwards."""
    work = Path(mkdtemp(prefix="kiln-bench-ledger-"))
    try:
        with embedded_server(work / "pg") as uri:
            asyncio.run(measure(uri, args))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
