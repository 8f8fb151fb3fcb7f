"""Price books: versioned price lists (admin service), and the per-process cache pricing reads.

A version is never changed once created: a new price applies by publishing a new version with a
later ``effective_from``. The cache holds every version and refreshes every ``ttl`` seconds (like
the key cache), so pricing a request costs no query.
"""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal, InvalidOperation
from typing import TYPE_CHECKING

from sqlalchemy import func, select, text

from kiln_platform._ttlcache import TTLCache
from kiln_platform.admin.authz import Actor, require
from kiln_platform.audit import services as audit
from kiln_platform.billing.pricing import UNITS, PriceList, book_at
from kiln_platform.billing.schemas import PriceBookCreate, PriceBookView, PriceView
from kiln_platform.billing.tables import PlanDiscount, Price, PriceBook
from kiln_platform.db.outage import unreachable
from kiln_platform.errors import BadRequest, NotFound

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

MAX_PRICE = Decimal(10) ** 18  # NUMERIC(24, 6)


def _price(raw: str, param: str) -> Decimal:
    try:
        value = Decimal(raw)
    except InvalidOperation:
        value = Decimal("NaN")
    exponent = value.normalize().as_tuple().exponent if value.is_finite() else None
    if not isinstance(exponent, int) or exponent < -6 or not 0 <= value < MAX_PRICE:
        raise BadRequest(
            f"'{param}' must be a decimal string of micro-units, at least 0, with at most 6 "
            f"decimal places (got {raw!r}).",
            param=param,
        )
    return value


def _validate(data: PriceBookCreate) -> list[Price]:
    if not data.prices:
        raise BadRequest("'prices' must list at least one price.", param="prices")
    if data.effective_from.tzinfo is None:
        raise BadRequest(
            "'effective_from' must carry a time zone (e.g. 2026-01-01T00:00:00Z).",
            param="effective_from",
        )
    rows, seen = [], set()
    for i, p in enumerate(data.prices):
        if p.unit not in UNITS:
            raise BadRequest(
                f"'prices[{i}].unit' is '{p.unit}'; one of {', '.join(UNITS)}.",
                param=f"prices[{i}].unit",
            )
        key = (p.model, p.model_version, p.unit)
        if key in seen:
            raise BadRequest(f"'prices[{i}]' repeats {key}.", param=f"prices[{i}]")
        seen.add(key)
        price = _price(p.unit_price_micros, f"prices[{i}].unit_price_micros")
        rows.append(Price(model=p.model, model_version=p.model_version, unit=p.unit,
                          unit_price_micros=price))  # fmt: skip
    return rows


def _view(book: PriceBook, prices: list[Price], discounts: list[PlanDiscount]) -> PriceBookView:
    return PriceBookView(
        version=book.version,
        currency=book.currency,
        effective_from=book.effective_from,
        note=book.note,
        created_at=book.created_at,
        prices=[
            PriceView(p.model, p.model_version, p.unit, str(p.unit_price_micros.normalize()))
            for p in sorted(prices, key=lambda p: (p.model, p.model_version, p.unit))
        ],
        discounts={d.plan: d.discount_bps for d in discounts},
        batch_discount_bps=book.batch_discount_bps,
    )


async def create_book(session: AsyncSession, actor: Actor, data: PriceBookCreate) -> PriceBookView:
    """Publish a new version (platform-admin): its number is the highest so far plus one."""
    require(actor, "price-books", write=True)
    prices = _validate(data)
    await session.execute(text("LOCK TABLE price_books IN SHARE ROW EXCLUSIVE MODE"))
    version = int(await session.scalar(select(func.max(PriceBook.version))) or 0) + 1
    book = PriceBook(version=version, currency=data.currency, effective_from=data.effective_from,
                     note=data.note, batch_discount_bps=data.batch_discount_bps)  # fmt: skip
    session.add(book)
    await session.flush()
    discounts = [PlanDiscount(price_book_id=book.id, plan=p, discount_bps=bps)
                 for p, bps in data.discounts.items()]  # fmt: skip
    for price in prices:
        price.price_book_id = book.id
    session.add_all([*prices, *discounts])
    await session.flush()
    await session.refresh(book)
    view = _view(book, prices, discounts)
    after = {"currency": view.currency, "effective_from": view.effective_from.isoformat(),
             "prices": len(view.prices), "discounts": view.discounts,
             "batch_discount_bps": view.batch_discount_bps}  # fmt: skip
    await audit.record(session, actor, "price_book.create", "price_book", version, None,
                       after=after)  # fmt: skip
    return view


async def _load(session: AsyncSession, version: int | None = None) -> list[PriceBookView]:
    query = select(PriceBook).order_by(PriceBook.version)
    if version is not None:
        query = query.where(PriceBook.version == version)
    books = list(await session.scalars(query))
    ids = [b.id for b in books]
    prices = list(await session.scalars(select(Price).where(Price.price_book_id.in_(ids))))
    discounts = list(
        await session.scalars(select(PlanDiscount).where(PlanDiscount.price_book_id.in_(ids)))
    )
    return [
        _view(
            b,
            [p for p in prices if p.price_book_id == b.id],
            [d for d in discounts if d.price_book_id == b.id],
        )
        for b in books
    ]


async def list_books(session: AsyncSession, actor: Actor) -> list[PriceBookView]:
    """Every version, oldest first (platform-admin, finance)."""
    require(actor, "price-books")
    return await _load(session)


async def get_book(session: AsyncSession, actor: Actor, version: int) -> PriceBookView:
    """One version (platform-admin, finance)."""
    require(actor, "price-books")
    found = await _load(session, version) if 0 < version < 2**31 else []
    if not found:
        raise NotFound(f"No price book version {version}.")
    return found[0]


def price_list(view: PriceBookView) -> PriceList:
    """The pricing policy's view of a version."""
    return PriceList(
        version=view.version,
        effective_from=view.effective_from,
        currency=view.currency,
        prices={
            (p.model, p.model_version, p.unit): Decimal(p.unit_price_micros) for p in view.prices
        },
        discounts_bps=dict(view.discounts),
        batch_discount_bps=view.batch_discount_bps,
    )


class PriceBooks:
    """Every price-book version of the database, cached for ``ttl`` seconds."""

    def __init__(self, sessions: async_sessionmaker[AsyncSession], ttl: float) -> None:
        self._sessions = sessions
        self._cache: TTLCache[None, list[PriceList]] = TTLCache(ttl)

    async def all(self) -> list[PriceList]:
        """Every version, sorted by effective date (ties: the higher version wins); with the
        database unreachable, the versions last loaded."""
        try:
            return await self._cache.get(None, self._load)
        except Exception as exc:
            held = self._cache.peek(None)
            if held is None or not unreachable(exc):
                raise
            return held

    async def _load(self) -> list[PriceList]:
        async with self._sessions() as session:
            books = [price_list(v) for v in await _load(session)]
        return sorted(books, key=lambda b: (b.effective_from, b.version))

    async def current(self, now: datetime | None = None) -> PriceList | None:
        """The version in effect at ``now`` (default: this instant), or None before any."""
        return book_at(await self.all(), now or datetime.now(UTC))
