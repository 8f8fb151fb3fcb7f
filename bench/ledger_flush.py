"""What one lone request's ledger flush costs: the time of ``LedgerWriter``'s write of a single
usage row (its ``usage_events`` row, its charge lines, its budget period, one transaction), as
an embeddings request at concurrency 1 waits for it (docs/benchmarks.md, issue 22).

Starts a fresh embedded PostgreSQL (pgserver, as ``kiln up`` does), migrates it, seeds tenants
(``ledger_triggers.seed``) and a price book, then flushes one request at a time through the
ledger's own code, on the app role's one writer connection as ``kiln up`` opens it, two ways in
alternating rounds: ``declared`` (each transaction declares the platform scope, a statement of
its own, as before) and ``start-up`` (the connection carries the scope from its start-up
packet: ``writer_engine(..., platform_scope=True)``, ``writer_sessions``). Prints the p50 and
p99 per way.

    python bench/ledger_flush.py                    # ~1 minute on 2 cores
    python bench/ledger_flush.py --flushes 1000 --rounds 5
"""

from __future__ import annotations

import argparse
import statistics
import time
from datetime import UTC, datetime
from typing import Any

from ledger_triggers import _usage, on_embedded, seed

from kiln_platform.admin.authz import Actor, Role
from kiln_platform.billing.ledger import LedgerWriter
from kiln_platform.billing.pricebooks import PriceBooks, create_book
from kiln_platform.billing.schemas import PriceBookCreate, PriceIn
from kiln_platform.db.engine import (
    APP_ROLE,
    asyncpg_url,
    create_engine,
    sessionmaker,
    writer_engine,
    writer_sessions,
)

BOOK = PriceBookCreate(
    prices=[PriceIn("*", "input_token", "0.5"), PriceIn("*", "output_token", "2"),
            PriceIn("*", "request", "100")],
    effective_from=datetime(2020, 1, 1, tzinfo=UTC),
)  # fmt: skip


async def flushes(ledger: LedgerWriter, keys: list[Any], n: int) -> list[float]:
    """Milliseconds of ``n`` lone flushes (``LedgerWriter._write`` of one row, as its loop
    calls it when one request waits)."""
    times = []
    for i in range(n):
        usage = _usage(keys[i % len(keys)], i)
        start = time.perf_counter()
        await ledger._write([usage])
        times.append(1000 * (time.perf_counter() - start))
    return times


async def measure(uri: str, args: argparse.Namespace) -> None:
    owner = create_engine(asyncpg_url(uri), pool_size=1)
    try:
        keys = await seed(owner, args.tenants)
        async with sessionmaker(owner).begin() as session:
            await create_book(session, Actor("cli:bench", Role.PLATFORM_ADMIN, None), BOOK)
        books = PriceBooks(sessionmaker(owner), 3600)
        ways = {
            "declared": sessionmaker(writer_engine(owner, APP_ROLE)),
            "start-up": writer_sessions(writer_engine(owner, APP_ROLE, platform_scope=True)),
        }
        times: dict[str, list[float]] = {name: [] for name in ways}
        for r in range(args.rounds):
            for name in list(ways)[r % 2 :] + list(ways)[: r % 2]:
                ledger = LedgerWriter(ways[name], books)
                await flushes(ledger, keys, 20)  # warm: connection, statement caches
                times[name] += await flushes(ledger, keys, args.flushes)
        for name, t in times.items():
            q = statistics.quantiles(t, n=100)
            print(f"{name:9} p50 {statistics.median(t):6.2f} ms  p99 {q[98]:6.2f} ms  "
                  f"({len(t)} flushes)", flush=True)  # fmt: skip
    finally:
        await owner.dispose()


def main(argv: list[str] | None = None) -> None:
    """Seed, then flush one request at a time both ways."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--tenants", type=int, default=100)
    p.add_argument("--flushes", type=int, default=400, help="per way and round")
    p.add_argument("--rounds", type=int, default=4)
    on_embedded(measure, p.parse_args(argv))


if __name__ == "__main__":
    main()
