"""Billing tables: price books, charge lines, budget periods and reservations, idempotency
keys, statements. Money is integer micro-units; unit prices are exact decimals of micro-units."""

from __future__ import annotations

import uuid
from datetime import date, datetime
from decimal import Decimal

from sqlalchemy import (
    BigInteger,
    Date,
    DateTime,
    ForeignKey,
    Identity,
    Index,
    Integer,
    LargeBinary,
    Numeric,
    SmallInteger,
    String,
    Text,
    func,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Mapped, mapped_column

from kiln_platform.db.tables import Base

PRICE = Numeric(24, 6)


def _ts(**kw: object) -> Mapped[datetime]:
    return mapped_column(DateTime(timezone=True), **kw)  # type: ignore[arg-type]


class PriceBook(Base):
    """One version of the price list; it applies from ``effective_from`` until the next one."""

    __tablename__ = "price_books"
    id: Mapped[uuid.UUID] = mapped_column(primary_key=True, default=uuid.uuid4)
    version: Mapped[int] = mapped_column(Integer, unique=True)
    currency: Mapped[str] = mapped_column(String(3), server_default="USD")
    effective_from: Mapped[datetime] = _ts()
    note: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = _ts(server_default=func.now())
    batch_discount_bps: Mapped[int] = mapped_column(Integer, server_default="0")
    """Off a Batches API line's cost, after the plan's discount, in basis points."""


class Price(Base):
    """The price of one unit of a model (``*``: any model / any version) in a price book."""

    __tablename__ = "prices"
    id: Mapped[uuid.UUID] = mapped_column(primary_key=True, default=uuid.uuid4)
    price_book_id: Mapped[uuid.UUID] = mapped_column(
        ForeignKey("price_books.id", ondelete="CASCADE")
    )
    model: Mapped[str] = mapped_column(String(200))
    model_version: Mapped[str] = mapped_column(String(64), server_default="*")
    unit: Mapped[str] = mapped_column(String(16))
    unit_price_micros: Mapped[Decimal] = mapped_column(PRICE)


class PlanDiscount(Base):
    """A plan's discount off list prices in one price book, in basis points."""

    __tablename__ = "plan_discounts"
    price_book_id: Mapped[uuid.UUID] = mapped_column(
        ForeignKey("price_books.id", ondelete="CASCADE"), primary_key=True
    )
    plan: Mapped[str] = mapped_column(String(32), primary_key=True)
    discount_bps: Mapped[int] = mapped_column(Integer)


class UsageCharge(Base):
    """One priced line of a request (per unit), or a correction (``kind='adjustment'``).

    Append-only; what finance reports aggregate.
    """

    __tablename__ = "usage_charges"
    id: Mapped[int] = mapped_column(BigInteger, Identity(), primary_key=True)
    kind: Mapped[str] = mapped_column(String(16), server_default="usage")
    request_id: Mapped[str] = mapped_column(String(64))
    tenant_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("tenants.id"))
    api_key_id: Mapped[uuid.UUID | None]
    oauth_client_id: Mapped[uuid.UUID | None]
    model: Mapped[str] = mapped_column(String(200))
    version: Mapped[str] = mapped_column(String(64))
    adapter: Mapped[str | None] = mapped_column(String(200))
    unit: Mapped[str] = mapped_column(String(16))
    quantity: Mapped[Decimal] = mapped_column(PRICE)
    unit_price_micros: Mapped[Decimal] = mapped_column(PRICE)
    list_cost_micros: Mapped[int] = mapped_column(BigInteger)
    cost_micros: Mapped[int] = mapped_column(BigInteger)
    currency: Mapped[str] = mapped_column(String(3))
    price_book_version: Mapped[int | None] = mapped_column(Integer)
    charged_at: Mapped[datetime] = _ts()
    corrects_period: Mapped[date | None] = mapped_column(Date)
    reason: Mapped[str | None] = mapped_column(Text)


class BudgetPeriod(Base):
    """A tenant's spend and open reservations in one calendar month of its time zone."""

    __tablename__ = "budget_periods"
    tenant_id: Mapped[uuid.UUID] = mapped_column(
        ForeignKey("tenants.id", ondelete="CASCADE"), primary_key=True
    )
    period: Mapped[date] = mapped_column(Date, primary_key=True)
    spent_micros: Mapped[int] = mapped_column(BigInteger, server_default="0")
    reserved_micros: Mapped[int] = mapped_column(BigInteger, server_default="0")


class BudgetReservation(Base):
    """The worst-case cost held for one admitted request until it is settled or expires."""

    __tablename__ = "budget_reservations"
    request_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    tenant_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    period: Mapped[date] = mapped_column(Date)
    amount_micros: Mapped[int] = mapped_column(BigInteger)
    expires_at: Mapped[datetime] = _ts()


class BudgetEvent(Base):
    """A soft threshold crossed (once per tenant, period and threshold): an alert to send."""

    __tablename__ = "budget_events"
    id: Mapped[int] = mapped_column(BigInteger, Identity(), primary_key=True)
    tenant_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    period: Mapped[date] = mapped_column(Date)
    threshold_percent: Mapped[int] = mapped_column(Integer)
    spent_micros: Mapped[int] = mapped_column(BigInteger)
    limit_micros: Mapped[int] = mapped_column(BigInteger)
    created_at: Mapped[datetime] = _ts(server_default=func.now())


class IdempotencyKey(Base):
    """A POST's Idempotency-Key: locked while the first request runs, then its stored answer."""

    __tablename__ = "idempotency_keys"
    tenant_id: Mapped[uuid.UUID] = mapped_column(
        ForeignKey("tenants.id", ondelete="CASCADE"), primary_key=True
    )
    credential: Mapped[str] = mapped_column(String(80), primary_key=True)
    method: Mapped[str] = mapped_column(String(8), primary_key=True)
    path: Mapped[str] = mapped_column(String(300), primary_key=True)
    key: Mapped[str] = mapped_column(String(255), primary_key=True)
    fingerprint: Mapped[bytes] = mapped_column(LargeBinary(32))
    request_id: Mapped[str] = mapped_column(String(64))
    locked_until: Mapped[datetime | None] = _ts()
    status: Mapped[int | None] = mapped_column(Integer)
    headers: Mapped[dict[str, str] | None] = mapped_column(JSONB)
    body: Mapped[bytes | None] = mapped_column(LargeBinary)
    created_at: Mapped[datetime] = _ts(server_default=func.now())
    expires_at: Mapped[datetime] = _ts()


class Statement(Base):
    """A closed monthly statement (immutable): the period's totals when it was closed."""

    __tablename__ = "statements"
    id: Mapped[uuid.UUID] = mapped_column(primary_key=True, default=uuid.uuid4)
    tenant_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("tenants.id"))
    period: Mapped[date] = mapped_column(Date)
    currency: Mapped[str] = mapped_column(String(3))
    list_cost_micros: Mapped[int] = mapped_column(BigInteger)
    cost_micros: Mapped[int] = mapped_column(BigInteger)
    lines: Mapped[int] = mapped_column(Integer)
    closed_at: Mapped[datetime] = _ts(server_default=func.now())
    closed_by: Mapped[str] = mapped_column(String(200))


class UsageHourly(Base):
    """Usage of one tenant and model in one hour whose latency fell in one bucket
    (``billing.rollup``): what the console overview reads instead of ``usage_events``."""

    __tablename__ = "usage_hourly"
    __table_args__ = (Index("ix_usage_hourly_hour", "hour"),)
    tenant_id: Mapped[uuid.UUID] = mapped_column(
        ForeignKey("tenants.id", ondelete="CASCADE"), primary_key=True
    )
    hour: Mapped[datetime] = mapped_column(DateTime(timezone=True), primary_key=True)
    model: Mapped[str] = mapped_column(String(200), primary_key=True)
    latency_bucket: Mapped[int] = mapped_column(SmallInteger, primary_key=True)
    requests: Mapped[int] = mapped_column(BigInteger)
    errors: Mapped[int] = mapped_column(BigInteger)
    input_tokens: Mapped[int] = mapped_column(BigInteger)
    output_tokens: Mapped[int] = mapped_column(BigInteger)
    cost_micros: Mapped[int] = mapped_column(BigInteger)


class UsageFleetHourly(Base):
    """Every tenant's usage of one model in one hour, per latency bucket: the fleet view's."""

    __tablename__ = "usage_fleet_hourly"
    hour: Mapped[datetime] = mapped_column(DateTime(timezone=True), primary_key=True)
    model: Mapped[str] = mapped_column(String(200), primary_key=True)
    latency_bucket: Mapped[int] = mapped_column(SmallInteger, primary_key=True)
    requests: Mapped[int] = mapped_column(BigInteger)
    errors: Mapped[int] = mapped_column(BigInteger)
    input_tokens: Mapped[int] = mapped_column(BigInteger)
    output_tokens: Mapped[int] = mapped_column(BigInteger)
    cost_micros: Mapped[int] = mapped_column(BigInteger)


class UsageTenantDaily(Base):
    """A tenant's requests, errors and cost on one UTC day: the busiest tenants, read fast."""

    __tablename__ = "usage_tenant_daily"
    day: Mapped[date] = mapped_column(Date, primary_key=True)
    tenant_id: Mapped[uuid.UUID] = mapped_column(
        ForeignKey("tenants.id", ondelete="CASCADE"), primary_key=True
    )
    requests: Mapped[int] = mapped_column(BigInteger)
    errors: Mapped[int] = mapped_column(BigInteger)
    cost_micros: Mapped[int] = mapped_column(BigInteger)


class UsageChargeDaily(Base):
    """Charge lines summed per tenant, tenant-local day and the report's dimensions (kind,
    model, version, adapter, key, OAuth client, unit, currency): what finance's pages read.

    Kept by triggers (migration 0023) in the transaction that inserts the lines; a tenant's days
    are rebuilt from its lines when its time zone changes."""

    __tablename__ = "usage_charge_daily"
    id: Mapped[int] = mapped_column(BigInteger, Identity(), primary_key=True)
    tenant_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    day: Mapped[date] = mapped_column(Date)
    kind: Mapped[str] = mapped_column(String(16))
    model: Mapped[str] = mapped_column(String(200))
    version: Mapped[str] = mapped_column(String(64))
    adapter: Mapped[str | None] = mapped_column(String(200))
    api_key_id: Mapped[uuid.UUID | None]
    oauth_client_id: Mapped[uuid.UUID | None]
    unit: Mapped[str] = mapped_column(String(16))
    currency: Mapped[str] = mapped_column(String(3))
    quantity: Mapped[Decimal] = mapped_column(Numeric)
    list_cost_micros: Mapped[int] = mapped_column(BigInteger)
    cost_micros: Mapped[int] = mapped_column(BigInteger)
    lines: Mapped[int] = mapped_column(BigInteger)


class UsageChargeModelDaily(Base):
    """Charge lines summed per tenant, tenant-local day, kind, model, unit and currency: the
    rollup of ``usage_charge_daily`` without version, adapter, key and OAuth client, one row a
    group of a report by tenant, model and day. Kept by triggers (migration 0025) like it."""

    __tablename__ = "usage_charge_model_daily"
    tenant_id: Mapped[uuid.UUID] = mapped_column(
        ForeignKey("tenants.id", ondelete="CASCADE"), primary_key=True
    )
    day: Mapped[date] = mapped_column(Date, primary_key=True)
    kind: Mapped[str] = mapped_column(String(16), primary_key=True)
    model: Mapped[str] = mapped_column(String(200), primary_key=True)
    unit: Mapped[str] = mapped_column(String(16), primary_key=True)
    currency: Mapped[str] = mapped_column(String(3), primary_key=True)
    quantity: Mapped[Decimal] = mapped_column(Numeric)
    list_cost_micros: Mapped[int] = mapped_column(BigInteger)
    cost_micros: Mapped[int] = mapped_column(BigInteger)
    lines: Mapped[int] = mapped_column(BigInteger)
