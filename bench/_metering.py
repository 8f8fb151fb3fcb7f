"""The request-path cost of metering: embeddings requests/s of ``kiln up`` with the usage ledger
on (a price book in effect, every request priced and group-committed before it is answered) and
with ``KILN_METERING=0``, at the same concurrency, alternating between the two over rounds.

    from _metering import metering_ratio
    on, off, ratio = metering_ratio(model_dir, concurrency=16, seconds=10)
"""

from __future__ import annotations

import asyncio
import statistics
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _corpus import embedding_bodies, sentences
from _kiln import Kiln
from embeddings import measure_kiln


async def _price_book(data_dir: Path) -> None:
    from kiln_platform.admin.authz import Actor, Role
    from kiln_platform.billing.pricebooks import create_book
    from kiln_platform.billing.schemas import PriceBookCreate, PriceIn
    from kiln_platform.db.database import open_database
    from kiln_platform.settings import Settings

    book = PriceBookCreate(
        prices=[PriceIn("*", "input_token", "0.02"), PriceIn("*", "request", "5"),
                PriceIn("*", "compute_second", "40")],
        effective_from=datetime.now(UTC) - timedelta(days=1),
        discounts={"standard": 500},
    )  # fmt: skip
    async with open_database(Settings(data_dir=data_dir)) as db, db.sessions.begin() as session:
        await create_book(session, Actor("cli:bench", Role.PLATFORM_ADMIN, None), book)


def metering_ratio(
    model_dir: Path, *, concurrency: int = 16, seconds: float = 10.0, rounds: int = 3
) -> tuple[float, float, float]:
    """(requests/s with metering, requests/s without, their ratio): medians over ``rounds``."""
    kilns: dict[str, Kiln] = {}
    try:
        kilns["on"] = Kiln.start(model_dir)
        asyncio.run(_price_book(kilns["on"].data_dir))
        kilns["off"] = Kiln.start(model_dir, {"KILN_METERING": "0"})
        corpus = sentences(512)
        rates: dict[str, list[float]] = {"on": [], "off": []}
        for r in range(rounds):
            for name in ("on", "off") if r % 2 == 0 else ("off", "on"):
                kiln = kilns[name]
                bodies = embedding_bodies(kiln.model, corpus)
                result = measure_kiln(bodies, concurrency, warmup=2.0, duration=seconds, kiln=kiln)
                rates[name].append(result.per_s)
                print(f"  metering {name:>3}, round {r + 1}: {result.per_s:.1f} req/s "
                      f"(p50 {result.p50_ms:.1f} ms, other CPU {result.foreign_cores:.2f} cores)",
                      flush=True)  # fmt: skip
    finally:
        for kiln in kilns.values():
            kiln.stop()
    on, off = statistics.median(rates["on"]), statistics.median(rates["off"])
    return on, off, on / off


if __name__ == "__main__":
    from embeddings import _model_dir

    on, off, ratio = metering_ratio(_model_dir(None))
    print(f"metering: {on:.1f} req/s with, {off:.1f} without -> ratio {ratio:.3f}")
