"""SQLAlchemy 2 table mappings. Money is integer micro-units; times are UTC."""

from __future__ import annotations

import uuid
from datetime import datetime

from sqlalchemy import (
    BigInteger,
    CheckConstraint,
    DateTime,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    SmallInteger,
    String,
    Text,
    UniqueConstraint,
    func,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

NAMING = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    """Declarative base with a stable constraint naming convention (for Alembic)."""

    metadata = MetaData(naming_convention=NAMING)


def _uuid_pk() -> Mapped[uuid.UUID]:
    return mapped_column(primary_key=True, default=uuid.uuid4)


def _created() -> Mapped[datetime]:
    return mapped_column(DateTime(timezone=True), server_default=func.now())


class Tenant(Base):
    """A customer organisation; every tenant-owned row points here."""

    __tablename__ = "tenants"
    id: Mapped[uuid.UUID] = _uuid_pk()
    name: Mapped[str] = mapped_column(String(100), unique=True)
    weight: Mapped[float] = mapped_column(server_default="1")
    """Fair-share weight of the tenant's requests in every pool."""
    plan: Mapped[str] = mapped_column(String(32), server_default="standard")
    """The plan: selects the price book's discount."""
    timezone: Mapped[str] = mapped_column(String(64), server_default="UTC")
    """IANA zone whose calendar months are the tenant's budget and statement periods."""
    created_at: Mapped[datetime] = _created()


class ApiKey(Base):
    """An API key: the display prefix is the lookup index, the secret survives only as an HMAC."""

    __tablename__ = "api_keys"
    __table_args__ = (Index("ix_api_keys_tenant_created", "tenant_id", "created_at", "id"),)  # 0027
    id: Mapped[uuid.UUID] = _uuid_pk()
    tenant_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(String(100), default="")
    prefix: Mapped[str] = mapped_column(String(32), unique=True)
    digest: Mapped[bytes] = mapped_column(LargeBinary(32))
    scopes: Mapped[list[str]] = mapped_column(ARRAY(String(32)))
    created_at: Mapped[datetime] = _created()
    expires_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    revoked_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    last_used_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    role: Mapped[str] = mapped_column(String(32), server_default="tenant-member")
    """What the key may do besides its scopes (``kiln_platform.admin.authz``)."""


class Model(Base):
    """A served model name (what clients put in ``model``)."""

    __tablename__ = "models"
    id: Mapped[uuid.UUID] = _uuid_pk()
    name: Mapped[str] = mapped_column(String(200), unique=True)
    task: Mapped[str] = mapped_column(String(20))
    created_at: Mapped[datetime] = _created()


class ModelVersion(Base):
    """An immutable build of a model: a content-addressed artifact plus its manifest."""

    __tablename__ = "model_versions"
    __table_args__ = (UniqueConstraint("model_id", "version"),)
    id: Mapped[uuid.UUID] = _uuid_pk()
    model_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("models.id", ondelete="CASCADE"))
    version: Mapped[str] = mapped_column(String(64))
    artifact_digest: Mapped[str] = mapped_column(String(71))
    manifest: Mapped[dict[str, object]] = mapped_column(JSONB)
    engine_settings: Mapped[dict[str, object]] = mapped_column(JSONB, server_default="{}")
    """``registry.engine.EngineSettings``: what this version's workers run with (``0011``)."""
    accuracy: Mapped[dict[str, object] | None] = mapped_column(JSONB)
    """The build's ``AccuracyReport`` (imported versions; ``0011``)."""
    source_digest: Mapped[str | None] = mapped_column(String(71))
    """The source tree an imported version was built from (``0011``)."""
    state: Mapped[str] = mapped_column(String(16), server_default="active")
    """``registry.lifecycle``: staging, active, deprecated or retired (``0016``)."""
    deprecated_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    sunset: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    successor: Mapped[str | None] = mapped_column(String(64))
    parent_version: Mapped[str | None] = mapped_column(String(200))
    imported_by: Mapped[str | None] = mapped_column(String(200))
    extra: Mapped[dict[str, object]] = mapped_column("metadata", JSONB, server_default="{}")
    """Free-form lineage (training data, eval results)."""
    created_at: Mapped[datetime] = _created()


class ModelRoute(Base):
    """Which versions of a model serve: the stable one, and a canary taking a share of tenants.

    A model without a route serves its newest version.
    """

    __tablename__ = "model_routes"
    model_id: Mapped[uuid.UUID] = mapped_column(
        ForeignKey("models.id", ondelete="CASCADE"), primary_key=True
    )
    stable_version: Mapped[str] = mapped_column(String(64))
    canary_version: Mapped[str | None] = mapped_column(String(64))
    canary_percent: Mapped[int] = mapped_column(SmallInteger, server_default="0")
    canary_split: Mapped[str] = mapped_column(String(8), server_default="tenant")
    """``tenant`` (sticky) or ``request`` (a rollout's split)."""
    updated_at: Mapped[datetime] = _created()


class ModelAlias(Base):
    """A model's named pointer to one of its versions (``model@prod``; ``0016``)."""

    __tablename__ = "model_aliases"
    model_id: Mapped[uuid.UUID] = mapped_column(
        ForeignKey("models.id", ondelete="CASCADE"), primary_key=True
    )
    alias: Mapped[str] = mapped_column(String(64), primary_key=True)
    version: Mapped[str] = mapped_column(String(64))
    updated_at: Mapped[datetime] = _created()


class ModelPin(Base):
    """An operator's pin of one tenant to a version or alias of a model (``0016``, RLS ``0017``)."""

    __tablename__ = "model_pins"
    model_id: Mapped[uuid.UUID] = mapped_column(
        ForeignKey("models.id", ondelete="CASCADE"), primary_key=True
    )
    tenant_id: Mapped[uuid.UUID] = mapped_column(
        ForeignKey("tenants.id", ondelete="CASCADE"), primary_key=True
    )
    target: Mapped[str] = mapped_column(String(64))
    """A version, an alias, ``stable`` or ``canary``."""
    updated_at: Mapped[datetime] = _created()


class Adapter(Base):
    """A tenant's LoRA adapter of a generation model: PEFT files, a tree in the artifact store."""

    __tablename__ = "adapters"
    __table_args__ = (UniqueConstraint("tenant_id", "model_id", "name"),)
    id: Mapped[uuid.UUID] = _uuid_pk()
    tenant_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    model_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("models.id", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(String(64))
    digest: Mapped[str] = mapped_column(String(71))
    rank: Mapped[int] = mapped_column(Integer)
    modules: Mapped[list[str]] = mapped_column(ARRAY(String(16)))
    size_bytes: Mapped[int] = mapped_column(BigInteger)
    created_at: Mapped[datetime] = _created()


class SignInFailure(Base):
    """A failed console sign-in, under ``email:<address>`` and ``source:<client address>``."""

    __tablename__ = "signin_failures"
    __table_args__ = (Index("ix_signin_failures_key_failed_at", "key", "failed_at"),)
    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    key: Mapped[str] = mapped_column(String(400))
    failed_at: Mapped[datetime] = _created()


class CompileJob(Base):
    """Compiling a model version for one target (``kind`` compile; ``cache_key``, the engine
    key, makes it unique), or building an imported source into a new version (``kind`` build:
    no version until it succeeds; migration ``0011``)."""

    __tablename__ = "compile_jobs"
    __table_args__ = (
        CheckConstraint("status IN ('queued', 'running', 'done', 'failed')", name="status"),
        CheckConstraint("kind IN ('compile', 'build')", name="kind"),
        CheckConstraint("kind = 'build' OR model_version_id IS NOT NULL", name="version_or_build"),
        Index("ix_compile_jobs_status_created", "status", "created_at"),
    )
    id: Mapped[uuid.UUID] = _uuid_pk()
    kind: Mapped[str] = mapped_column(String(16), server_default="compile")
    model_version_id: Mapped[uuid.UUID | None] = mapped_column(
        ForeignKey("model_versions.id", ondelete="CASCADE")
    )
    model_name: Mapped[str | None] = mapped_column(String(200))
    """Build jobs: the model the build registers a version of."""
    version_name: Mapped[str | None] = mapped_column(String(64))
    """Build jobs: the version it registers."""
    task: Mapped[str | None] = mapped_column(String(20))
    source_digest: Mapped[str | None] = mapped_column(String(71))
    engine_settings: Mapped[dict[str, object] | None] = mapped_column(JSONB)
    phase: Mapped[str | None] = mapped_column(String(32))
    """Build jobs: received, validating, converting, quantizing, optimizing, checking accuracy,
    ready (or failed)."""
    percent: Mapped[int] = mapped_column(SmallInteger, server_default="0")
    error_file: Mapped[str | None] = mapped_column(Text)
    error_field: Mapped[str | None] = mapped_column(Text)
    cache_key: Mapped[str] = mapped_column(String(71), unique=True)
    target: Mapped[str] = mapped_column(String(16))
    precision: Mapped[str] = mapped_column(String(8))
    hardware: Mapped[str] = mapped_column(String(200))
    status: Mapped[str] = mapped_column(String(16))
    reason: Mapped[str | None] = mapped_column(Text)
    engine_digest: Mapped[str | None] = mapped_column(String(71))
    report: Mapped[dict[str, object] | None] = mapped_column(JSONB)
    attempts: Mapped[int] = mapped_column(Integer, server_default="0")
    created_at: Mapped[datetime] = _created()
    started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class UsageEvent(Base):
    """One immutable record per API request, whatever its outcome."""

    __tablename__ = "usage_events"
    __table_args__ = (
        Index("ix_usage_events_tenant_created", "tenant_id", "created_at"),
        Index("ix_usage_events_key_created", "api_key_id", "created_at"),  # keys page, 0014
        Index("ix_usage_events_client_created", "oauth_client_id", "created_at"),
    )
    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    request_id: Mapped[str] = mapped_column(String(64), unique=True)
    tenant_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("tenants.id"))
    api_key_id: Mapped[uuid.UUID | None] = mapped_column(ForeignKey("api_keys.id"))
    model: Mapped[str] = mapped_column(String(200))
    version: Mapped[str] = mapped_column(String(64))
    endpoint: Mapped[str] = mapped_column(String(64))
    status: Mapped[int] = mapped_column(Integer)
    input_tokens: Mapped[int] = mapped_column(Integer, default=0)
    output_tokens: Mapped[int] = mapped_column(Integer, default=0)
    items: Mapped[int] = mapped_column(Integer, default=0)
    queue_ms: Mapped[float] = mapped_column(default=0.0)
    compute_ms: Mapped[float] = mapped_column(default=0.0)
    created_at: Mapped[datetime] = _created()
    oauth_client_id: Mapped[uuid.UUID | None]
    adapter: Mapped[str | None] = mapped_column(String(200))
    price_book_version: Mapped[int | None] = mapped_column(Integer)
    currency: Mapped[str] = mapped_column(String(3), server_default="USD")
    list_cost_micros: Mapped[int] = mapped_column(BigInteger, server_default="0")
    cost_micros: Mapped[int] = mapped_column(BigInteger, server_default="0")


class User(Base):
    """A console user: a local account (argon2 hash) with one role, in a tenant or platform-wide."""

    __tablename__ = "users"
    __table_args__ = (
        UniqueConstraint("oidc_issuer", "oidc_subject", name="uq_users_oidc_issuer_subject"),
    )
    id: Mapped[uuid.UUID] = _uuid_pk()
    email: Mapped[str] = mapped_column(String(320), unique=True)
    password_hash: Mapped[str] = mapped_column(Text)
    role: Mapped[str] = mapped_column(String(32))
    tenant_id: Mapped[uuid.UUID | None] = mapped_column(
        ForeignKey("tenants.id", ondelete="CASCADE")
    )
    created_at: Mapped[datetime] = _created()
    last_login_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    session_version: Mapped[int] = mapped_column(Integer, server_default="0")
    """Console sessions carry it; signing out, or a password, role or tenant change (a trigger,
    migration 0009), bumps it, so every older session is signed out."""
    oidc_issuer: Mapped[str | None] = mapped_column(String(400))
    oidc_subject: Mapped[str | None] = mapped_column(String(400))
    """The SSO identity (``iss``, ``sub``) bound at the first single sign-on."""


class Quota(Base):
    """Limits of a tenant (``api_key_id`` null) or a per-key override; null fields: no limit."""

    __tablename__ = "quotas"
    id: Mapped[uuid.UUID] = _uuid_pk()
    tenant_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    api_key_id: Mapped[uuid.UUID | None] = mapped_column(
        ForeignKey("api_keys.id", ondelete="CASCADE")
    )
    rpm: Mapped[int | None] = mapped_column(Integer)
    tpm: Mapped[int | None] = mapped_column(Integer)
    concurrency: Mapped[int | None] = mapped_column(Integer)
    monthly_budget_micros: Mapped[int | None] = mapped_column(BigInteger)
    batch_tokens_per_day: Mapped[int | None] = mapped_column(BigInteger)
    batch_enqueued_tokens: Mapped[int | None] = mapped_column(BigInteger)
    budget_alert_percents: Mapped[list[int]] = mapped_column(
        ARRAY(Integer), server_default="{50,80,100}"
    )
    updated_at: Mapped[datetime] = _created()


class QuotaCounter(Base):
    """Requests and tokens of one subject (tenant or key) in one fixed one-minute window."""

    __tablename__ = "quota_counters"
    subject: Mapped[str] = mapped_column(String(80), primary_key=True)
    window_start: Mapped[datetime] = mapped_column(DateTime(timezone=True), primary_key=True)
    requests: Mapped[int] = mapped_column(Integer, server_default="0")
    tokens: Mapped[int] = mapped_column(BigInteger, server_default="0")


class QuotaLease(Base):
    """One request in flight against a concurrency cap; expires if its process dies."""

    __tablename__ = "quota_leases"
    id: Mapped[uuid.UUID] = _uuid_pk()
    subject: Mapped[str] = mapped_column(String(80), index=True)
    expires_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class AuditRecord(Base):
    """One append-only audit entry (a trigger refuses UPDATE, DELETE and TRUNCATE)."""

    __tablename__ = "audit_log"
    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    created_at: Mapped[datetime] = _created()
    actor: Mapped[str] = mapped_column(String(200))
    actor_role: Mapped[str] = mapped_column(String(32))
    tenant_id: Mapped[uuid.UUID | None]
    action: Mapped[str] = mapped_column(String(64))
    target_type: Mapped[str] = mapped_column(String(32))
    target_id: Mapped[str] = mapped_column(String(64))
    before: Mapped[dict[str, object] | None] = mapped_column(JSONB)
    after: Mapped[dict[str, object] | None] = mapped_column(JSONB)
    request_id: Mapped[str | None] = mapped_column(String(64))
    source: Mapped[str | None] = mapped_column(String(64))


class OAuthClient(Base):
    """An OAuth2 client-credentials client of a tenant; the secret survives only as an HMAC."""

    __tablename__ = "oauth_clients"
    id: Mapped[uuid.UUID] = _uuid_pk()
    tenant_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    client_id: Mapped[str] = mapped_column(String(64), unique=True)
    secret_digest: Mapped[bytes] = mapped_column(LargeBinary(32))
    name: Mapped[str] = mapped_column(String(100))
    scopes: Mapped[list[str]] = mapped_column(ARRAY(String(32)))
    created_at: Mapped[datetime] = _created()
    revoked_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class SigningKey(Base):
    """A JWT signing key (RS256); retired keys stay published until their tokens expire."""

    __tablename__ = "oauth_signing_keys"
    kid: Mapped[str] = mapped_column(String(64), primary_key=True)
    private_sealed: Mapped[bytes] = mapped_column(LargeBinary)
    """The private key's PEM sealed under the server secret (``oauth.keys``): never in clear."""
    created_at: Mapped[datetime] = _created()
    retired_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class RevokedToken(Base):
    """The jti denylist (RFC 7009 revocation); rows can go once the token has expired."""

    __tablename__ = "oauth_revoked_tokens"
    jti: Mapped[str] = mapped_column(String(64), primary_key=True)
    expires_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


__all__ = [
    "ApiKey",
    "AuditRecord",
    "Base",
    "CompileJob",
    "Model",
    "ModelVersion",
    "OAuthClient",
    "Quota",
    "QuotaCounter",
    "QuotaLease",
    "RevokedToken",
    "SigningKey",
    "Tenant",
    "UsageEvent",
    "User",
]
