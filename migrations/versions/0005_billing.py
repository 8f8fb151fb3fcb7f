"""Billing: price books, priced usage (charge lines), budgets with reservations, idempotency
keys, monthly statements; the usage ledger becomes append-only.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

_TS = sa.DateTime(timezone=True)
_MICROS = sa.BigInteger()
_PRICE = sa.Numeric(24, 6)
UNITS = "('input_token', 'output_token', 'request', 'item', 'compute_second')"
APP_ROLE = "kiln_tenant"
TENANT_TABLES = (
    "usage_charges",
    "budget_periods",
    "budget_reservations",
    "budget_events",
    "idempotency_keys",
    "statements",
)
APPEND_ONLY = ("usage_events", "usage_charges")


def _now() -> sa.Column[object]:
    return sa.Column("created_at", _TS, server_default=sa.func.now(), nullable=False)


def _tenant(table: str, ondelete: str | None = "CASCADE") -> list[sa.SchemaItem]:
    """The owning tenant; ledger rows (``ondelete=None``) keep a tenant from being deleted."""
    return [
        sa.Column("tenant_id", sa.Uuid(), nullable=False),
        sa.ForeignKeyConstraint(
            ["tenant_id"], ["tenants.id"], name=f"fk_{table}_tenant_id_tenants", ondelete=ondelete
        ),
    ]


def upgrade() -> None:
    op.add_column(
        "tenants", sa.Column("plan", sa.String(32), server_default="standard", nullable=False)
    )
    op.add_column(
        "tenants", sa.Column("timezone", sa.String(64), server_default="UTC", nullable=False)
    )
    op.add_column(
        "quotas",
        sa.Column(
            "budget_alert_percents", postgresql.ARRAY(sa.Integer()),
            server_default="{50,80,100}", nullable=False,
        ),
    )  # fmt: skip
    _price_books()
    _ledger()
    _budgets()
    op.create_table(
        "idempotency_keys",
        *_tenant("idempotency_keys"),
        sa.Column("credential", sa.String(80), nullable=False),
        sa.Column("method", sa.String(8), nullable=False),
        sa.Column("path", sa.String(300), nullable=False),
        sa.Column("key", sa.String(255), nullable=False),
        sa.Column("fingerprint", sa.LargeBinary(32), nullable=False),
        sa.Column("request_id", sa.String(64), nullable=False),
        sa.Column("locked_until", _TS, nullable=True),
        sa.Column("status", sa.Integer(), nullable=True),
        sa.Column("headers", postgresql.JSONB(), nullable=True),
        sa.Column("body", sa.LargeBinary(), nullable=True),
        _now(),
        sa.Column("expires_at", _TS, nullable=False),
        sa.PrimaryKeyConstraint(
            "tenant_id", "credential", "method", "path", "key", name="pk_idempotency_keys"
        ),
    )
    op.create_index("ix_idempotency_keys_expires_at", "idempotency_keys", ["expires_at"])
    op.create_table(
        "statements",
        sa.Column("id", sa.Uuid(), nullable=False),
        *_tenant("statements", ondelete=None),
        sa.Column("period", sa.Date(), nullable=False),
        sa.Column("currency", sa.String(3), nullable=False),
        sa.Column("list_cost_micros", _MICROS, nullable=False),
        sa.Column("cost_micros", _MICROS, nullable=False),
        sa.Column("lines", sa.Integer(), nullable=False),
        sa.Column("closed_at", _TS, server_default=sa.func.now(), nullable=False),
        sa.Column("closed_by", sa.String(200), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_statements"),
        sa.UniqueConstraint("tenant_id", "period", name="uq_statements_tenant_id"),
    )
    _append_only((*APPEND_ONLY, "statements"))
    _row_level_security()


def _price_books() -> None:
    op.create_table(
        "price_books",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("currency", sa.String(3), server_default="USD", nullable=False),
        sa.Column("effective_from", _TS, nullable=False),
        sa.Column("note", sa.Text(), nullable=True),
        _now(),
        sa.PrimaryKeyConstraint("id", name="pk_price_books"),
        sa.UniqueConstraint("version", name="uq_price_books_version"),
    )
    op.create_table(
        "prices",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("price_book_id", sa.Uuid(), nullable=False),
        sa.Column("model", sa.String(200), nullable=False),
        sa.Column("model_version", sa.String(64), server_default="*", nullable=False),
        sa.Column("unit", sa.String(16), nullable=False),
        sa.Column("unit_price_micros", _PRICE, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_prices"),
        sa.ForeignKeyConstraint(
            ["price_book_id"], ["price_books.id"],
            name="fk_prices_price_book_id_price_books", ondelete="CASCADE",
        ),
        sa.UniqueConstraint(
            "price_book_id", "model", "model_version", "unit", name="uq_prices_price_book_id"
        ),
        sa.CheckConstraint(f"unit IN {UNITS}", name="ck_prices_unit"),
        sa.CheckConstraint("unit_price_micros >= 0", name="ck_prices_non_negative"),
    )  # fmt: skip
    op.create_table(
        "plan_discounts",
        sa.Column("price_book_id", sa.Uuid(), nullable=False),
        sa.Column("plan", sa.String(32), nullable=False),
        sa.Column("discount_bps", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("price_book_id", "plan", name="pk_plan_discounts"),
        sa.ForeignKeyConstraint(
            ["price_book_id"], ["price_books.id"],
            name="fk_plan_discounts_price_book_id_price_books", ondelete="CASCADE",
        ),
        sa.CheckConstraint(
            "discount_bps BETWEEN 0 AND 10000", name="ck_plan_discounts_discount_bps"
        ),
    )  # fmt: skip


def _ledger() -> None:
    for column in (
        sa.Column("oauth_client_id", sa.Uuid(), nullable=True),
        sa.Column("adapter", sa.String(200), nullable=True),
        sa.Column("price_book_version", sa.Integer(), nullable=True),
        sa.Column("currency", sa.String(3), server_default="USD", nullable=False),
        sa.Column("list_cost_micros", _MICROS, server_default="0", nullable=False),
        sa.Column("cost_micros", _MICROS, server_default="0", nullable=False),
    ):
        op.add_column("usage_events", column)
    op.create_table(
        "usage_charges",
        sa.Column("id", sa.BigInteger(), sa.Identity(), nullable=False),
        sa.Column("kind", sa.String(16), server_default="usage", nullable=False),
        sa.Column("request_id", sa.String(64), nullable=False),
        *_tenant("usage_charges", ondelete=None),
        sa.Column("api_key_id", sa.Uuid(), nullable=True),
        sa.Column("oauth_client_id", sa.Uuid(), nullable=True),
        sa.Column("model", sa.String(200), nullable=False),
        sa.Column("version", sa.String(64), nullable=False),
        sa.Column("adapter", sa.String(200), nullable=True),
        sa.Column("unit", sa.String(16), nullable=False),
        sa.Column("quantity", _PRICE, nullable=False),
        sa.Column("unit_price_micros", _PRICE, nullable=False),
        sa.Column("list_cost_micros", _MICROS, nullable=False),
        sa.Column("cost_micros", _MICROS, nullable=False),
        sa.Column("currency", sa.String(3), nullable=False),
        sa.Column("price_book_version", sa.Integer(), nullable=True),
        sa.Column("charged_at", _TS, nullable=False),
        sa.Column("corrects_period", sa.Date(), nullable=True),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_usage_charges"),
        sa.UniqueConstraint("request_id", "unit", name="uq_usage_charges_request_id"),
        sa.CheckConstraint("kind IN ('usage', 'adjustment')", name="ck_usage_charges_kind"),
        sa.CheckConstraint(f"unit IN {UNITS}", name="ck_usage_charges_unit"),
    )
    op.create_index("ix_usage_charges_charged_at", "usage_charges", ["charged_at", "tenant_id"])


def _budgets() -> None:
    op.drop_table("budget_spend")
    op.create_table(
        "budget_periods",
        *_tenant("budget_periods"),
        sa.Column("period", sa.Date(), nullable=False),
        sa.Column("spent_micros", _MICROS, server_default="0", nullable=False),
        sa.Column("reserved_micros", _MICROS, server_default="0", nullable=False),
        sa.PrimaryKeyConstraint("tenant_id", "period", name="pk_budget_periods"),
        sa.CheckConstraint("reserved_micros >= 0", name="ck_budget_periods_reserved"),
    )
    op.create_table(
        "budget_reservations",
        sa.Column("request_id", sa.String(64), nullable=False),
        *_tenant("budget_reservations"),
        sa.Column("period", sa.Date(), nullable=False),
        sa.Column("amount_micros", _MICROS, nullable=False),
        sa.Column("expires_at", _TS, nullable=False),
        sa.PrimaryKeyConstraint("request_id", name="pk_budget_reservations"),
    )
    op.create_index("ix_budget_reservations_expires_at", "budget_reservations", ["expires_at"])
    op.create_table(
        "budget_events",
        sa.Column("id", sa.BigInteger(), sa.Identity(), nullable=False),
        *_tenant("budget_events"),
        sa.Column("period", sa.Date(), nullable=False),
        sa.Column("threshold_percent", sa.Integer(), nullable=False),
        sa.Column("spent_micros", _MICROS, nullable=False),
        sa.Column("limit_micros", _MICROS, nullable=False),
        _now(),
        sa.PrimaryKeyConstraint("id", name="pk_budget_events"),
        sa.UniqueConstraint(
            "tenant_id", "period", "threshold_percent", name="uq_budget_events_tenant_id"
        ),
    )


def _append_only(tables: tuple[str, ...]) -> None:
    """Ledger rows and closed statements never change; corrections are new rows."""
    op.execute(
        """
        CREATE FUNCTION kiln_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN RAISE EXCEPTION '% is append-only', TG_TABLE_NAME; END $$
        """
    )
    for table in tables:
        op.execute(
            f"CREATE TRIGGER {table}_append_only BEFORE UPDATE OR DELETE ON {table}"
            " FOR EACH ROW EXECUTE FUNCTION kiln_append_only()"
        )
        op.execute(
            f"CREATE TRIGGER {table}_no_truncate BEFORE TRUNCATE ON {table}"
            " FOR EACH STATEMENT EXECUTE FUNCTION kiln_append_only()"
        )


def _row_level_security() -> None:
    for table in TENANT_TABLES:
        op.execute(f"ALTER TABLE {table} ENABLE ROW LEVEL SECURITY")
        op.execute(
            f"CREATE POLICY tenant_isolation ON {table} TO {APP_ROLE} USING "
            f"(tenant_id = NULLIF(current_setting('kiln.tenant_id', true), '')::uuid)"
        )
        op.execute(f"GRANT SELECT, INSERT, UPDATE, DELETE ON {table} TO {APP_ROLE}")
    op.execute(f"GRANT USAGE ON SEQUENCE usage_charges_id_seq TO {APP_ROLE}")
    op.execute(f"GRANT USAGE ON SEQUENCE budget_events_id_seq TO {APP_ROLE}")


def downgrade() -> None:
    for table in (*APPEND_ONLY, "statements"):
        op.execute(f"DROP TRIGGER IF EXISTS {table}_append_only ON {table}")
        op.execute(f"DROP TRIGGER IF EXISTS {table}_no_truncate ON {table}")
    op.execute("DROP FUNCTION IF EXISTS kiln_append_only()")
    for table in (
        "statements", "idempotency_keys", "budget_events", "budget_reservations",
        "budget_periods", "usage_charges", "plan_discounts", "prices", "price_books",
    ):  # fmt: skip
        op.drop_table(table)
    op.create_table(
        "budget_spend",
        sa.Column("tenant_id", sa.Uuid(), nullable=False),
        sa.Column("month", sa.Date(), nullable=False),
        sa.Column("spent_micros", sa.BigInteger(), server_default="0", nullable=False),
        sa.PrimaryKeyConstraint("tenant_id", "month", name="pk_budget_spend"),
    )
    for column in (
        "cost_micros", "list_cost_micros", "currency", "price_book_version", "adapter",
        "oauth_client_id",
    ):  # fmt: skip
        op.drop_column("usage_events", column)
    op.drop_column("quotas", "budget_alert_percents")
    op.drop_column("tenants", "timezone")
    op.drop_column("tenants", "plan")
