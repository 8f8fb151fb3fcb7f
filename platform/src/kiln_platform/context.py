"""The composition root: every long-lived service, built once from the settings."""

from __future__ import annotations

from contextlib import asynccontextmanager
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Protocol

import aiohttp
from prometheus_client import REGISTRY

from kiln_platform.adapters.directory import AdapterDirectory
from kiln_platform.admission.services import Admissions
from kiln_platform.billing.ledger import LedgerWriter, Usage
from kiln_platform.billing.pricebooks import PriceBooks
from kiln_platform.billing.reservations import Budgets
from kiln_platform.billing.rollup import Rollups
from kiln_platform.billing.spool import UsageSpool
from kiln_platform.compiler.runner import CompileRunner
from kiln_platform.db.database import Database, open_database
from kiln_platform.db.engine import fill, writer_engine, writer_sessions
from kiln_platform.gateway.background import BackgroundResponses
from kiln_platform.gateway.chat_store import ChatStore
from kiln_platform.gateway.conversations import ConversationStore
from kiln_platform.gateway.dispatch import WorkerClient
from kiln_platform.gateway.metrics import RequestMetrics
from kiln_platform.gateway.response_store import ResponseStore
from kiln_platform.idempotency.services import IdempotencyStore
from kiln_platform.keys.services import KeyVerifier
from kiln_platform.oauth.keys import Keyring
from kiln_platform.oauth.verifier import TokenVerifier
from kiln_platform.pools.connections import worker_session
from kiln_platform.pools.engine_metrics import EngineMetrics
from kiln_platform.pools.fleet import Fleet
from kiln_platform.pools.leader import LeaderElector
from kiln_platform.pools.local import LocalPoolBackend
from kiln_platform.pools.services import PoolManager
from kiln_platform.pools.shared import SharedBackend
from kiln_platform.quotas.enforcer import QuotaEnforcer
from kiln_platform.registry.outcomes import RolloutOutcomes
from kiln_platform.registry.resolver import Resolver
from kiln_platform.registry.rollout_monitor import RolloutMonitor
from kiln_platform.scheduler.core import SchedulerConfig
from kiln_platform.scheduler.policy import PolicyConfig
from kiln_platform.shadow.mirror import Mirror
from kiln_platform.slo import crashloop
from kiln_platform.slo.monitor import SloMonitor
from kiln_platform.slo.sli import SliRecorder
from kiln_platform.webhooks.sender import WebhookSender
from kiln_runtimes.store import ArtifactStore

if TYPE_CHECKING:
    import uuid
    from collections.abc import AsyncIterator

    from sqlalchemy.ext.asyncio import AsyncEngine

    from kiln_platform.pools.backend import PoolBackend
    from kiln_platform.settings import Settings


class Background(Protocol):
    """A service that runs requests through all the others (the batch runner): built by the app,
    since it imports the gateway, which imports this module; started last, stopped first."""

    def start(self, kiln: Kiln) -> None: ...

    async def stop(self) -> None: ...

    def cancelled(self, batch_id: uuid.UUID) -> None: ...


@dataclass(frozen=True, slots=True)
class Kiln:
    """What request handlers need, passed down from the app's lifespan."""

    settings: Settings
    db: Database
    store: ArtifactStore
    keys: KeyVerifier
    resolver: Resolver
    pools: PoolManager
    workers: WorkerClient
    ledger: LedgerWriter
    compiler: CompileRunner
    quotas: QuotaEnforcer
    books: PriceBooks
    """Every price-book version, cached (pricing and budget holds cost no query)."""
    budgets: Budgets
    """Monthly budgets: worst-case holds at admission, released or settled by the ledger."""
    admissions: Admissions
    """Opens each request's admission: quotas, budget hold, usage record, release."""
    tokens: TokenVerifier
    """OAuth JWT access tokens: signing keys, local verification, the jti denylist."""
    idempotency: IdempotencyStore
    """Idempotency-Key claims and stored responses (``kiln_platform.idempotency``)."""
    responses: ResponseStore
    """``/v1/responses`` answers kept with ``store: true`` (``gateway.response_store``)."""
    conversations: ConversationStore
    """Conversations, their items sealed (``gateway.conversations``)."""
    chats: ChatStore
    """Chat completions kept with ``store: true`` (``gateway.chat_store``)."""
    background: BackgroundResponses
    """This gateway's running background responses (``gateway.background``)."""
    adapters: AdapterDirectory
    """Tenants' LoRA adapters by ``<model>:<adapter>`` name, cached."""
    slos: SloMonitor
    """SLO counts, burn-rate alerts and their delivery (``kiln_platform.slo``)."""
    rollouts: RolloutMonitor
    """Canary rollouts: counts per step, decisions, their alert events (``registry``)."""
    metrics: RequestMetrics
    """Per-request series by model, version (and tenant: ``KILN_METRICS_TENANT_LABELS``)."""
    engine_metrics: EngineMetrics
    """The workers' key series, summed per pool on the gateway's ``/metrics``."""
    shadows: Mirror
    """Shadow traffic: copies of a share of requests to a candidate version, compared."""
    batches: Background
    """Runs the Batches API's batches: started last and stopped first (its lines use the rest)."""
    webhooks: WebhookSender
    """Tenants' outbound webhooks: the outbox's delivery loop (``kiln_platform.webhooks``)."""
    fleet: Fleet | None = None
    """The gateway registry and the pool manager's leadership (``KILN_SHARED_WORKERS``)."""


def _pool_backend(settings: Settings, http: aiohttp.ClientSession) -> PoolBackend:
    """The backend ``KILN_POOL_BACKEND`` names (the kubernetes client is imported only for it),
    shared with other gateways under ``KILN_SHARED_WORKERS``."""
    if settings.pool_backend == "kubernetes":
        from kiln_platform.pools.kubernetes import KubernetesPoolBackend

        backend: PoolBackend = KubernetesPoolBackend(settings, http)
    else:
        backend = LocalPoolBackend(settings, http)
    return SharedBackend(backend) if settings.shared_workers else backend


def _pool_manager(
    settings: Settings, http: aiohttp.ClientSession, resolver: Resolver, store: ArtifactStore,
    metrics: RequestMetrics,
) -> PoolManager:  # fmt: skip
    """The pool manager on the deployment's backend (background twins with ``local`` only,
    and not in a shared fleet: a twin is made on demand, by one gateway)."""
    scheduler = SchedulerConfig(policy=PolicyConfig(express=settings.scheduler_express))
    pools = PoolManager(
        _pool_backend(settings, http), resolver, store, scheduler, scaling=settings.autoscale(),
        observe_wait=metrics.observe_wait,
        twins=settings.batch_twin and settings.pool_backend == "local"
        and not settings.shared_workers,
    )  # fmt: skip
    if isinstance(pools.backend, SharedBackend):  # it publishes what this gateway wants
        pools.backend.own = pools.desired
        pools.express = pools.backend.express
    resolver.warming = pools.warming  # a canary's draws wait for its pool on stable
    return pools


def _fleet(settings: Settings, db: Database, backend: PoolBackend) -> Fleet | None:
    """This gateway's part in a shared fleet: leadership on a connection of its own."""
    if not isinstance(backend, SharedBackend):
        return None
    lock_db = writer_engine(db.engine, db.set_role, settings.db_connect_timeout_s)
    fleet = Fleet(db.sessions, LeaderElector(lock_db, "gateway"), backend, lock_db)
    fleet.elector.gateway = str(fleet.id)
    return fleet


def _spool(settings: Settings) -> UsageSpool[Usage] | None:
    """Where usage goes while the database is unreachable (none with the bound at 0)."""
    if settings.outage_bound_s <= 0:
        return None
    return UsageSpool(settings.spool_dir, Usage, max_age_s=settings.outage_bound_s,
                      max_bytes=settings.outage_spool_max_bytes)  # fmt: skip


def _keys(settings: Settings, db: Database) -> KeyVerifier:
    """API keys, cached for their TTL, and served from the cache through a database outage."""
    return KeyVerifier(db.sessions, settings.hmac_key(), settings.key_cache_ttl_s,
                       settings.outage_bound_s)  # fmt: skip


def _build(
    settings: Settings, db: Database, http: aiohttp.ClientSession, ledger_db: AsyncEngine,
    batches: Background,
) -> Kiln:  # fmt: skip
    """Every service, wired to the database, the workers' session and the ledger's engine."""
    store, outcomes = settings.store(), RolloutOutcomes()
    resolver = Resolver(db.sessions, deferred=outcomes.deferred)
    metrics = RequestMetrics(settings.metrics_tenant_labels)
    try:
        pools = _pool_manager(settings, http, resolver, store, metrics)
    except BaseException:
        metrics.close()  # registered process-wide: a gateway that cannot start leaves none
        raise
    quotas = QuotaEnforcer(
        db.sessions, ttl=settings.key_cache_ttl_s, lease_ttl_s=settings.lease_ttl_s,
        timeout_s=settings.request_timeout_s,
    )  # fmt: skip
    books = PriceBooks(db.sessions, settings.key_cache_ttl_s)
    budgets = Budgets(
        db.sessions, quotas, books, timeout_s=settings.request_timeout_s,
        ttl_s=settings.lease_ttl_s,
    )  # fmt: skip
    ledger = LedgerWriter(writer_sessions(ledger_db), books, enabled=settings.metering,
                          rollups=Rollups(db.sessions), spool=_spool(settings))  # fmt: skip
    slis = SliRecorder(settings.slo_bucket_s)
    slos = SloMonitor(db.sessions, slis, settings, partial(crashloop.health, pools.backend))
    workers = WorkerClient(pools, http, settings.request_timeout_s)
    idempotency, responses = _sealing_stores(settings, db)
    return Kiln(
        settings=settings,
        db=db,
        store=store,
        keys=_keys(settings, db),
        resolver=resolver,
        pools=pools,
        workers=workers,
        ledger=ledger,
        compiler=CompileRunner(db, settings),
        quotas=quotas,
        books=books,
        budgets=budgets,
        admissions=Admissions(quotas, budgets, ledger, slis, metrics, outcomes=outcomes),
        tokens=_tokens(settings, db),
        adapters=AdapterDirectory(db.sessions, settings.key_cache_ttl_s),
        idempotency=idempotency,
        responses=responses,
        conversations=ConversationStore(db.sessions, settings.hmac_key()),
        chats=ChatStore(db.sessions, settings.hmac_key(), settings.responses_ttl_days),
        background=BackgroundResponses(responses),
        slos=slos,
        rollouts=RolloutMonitor(
            db.sessions, outcomes, settings.rollout_interval_s, pools.reconcile, slos.deliver
        ),
        metrics=metrics,
        engine_metrics=EngineMetrics(pools.backend, http),
        shadows=Mirror(resolver, pools, workers, settings.request_timeout_s),
        batches=batches,
        webhooks=WebhookSender(db.sessions, settings),
        fleet=_fleet(settings, db, pools.backend),
    )


def _sealing_stores(settings: Settings, db: Database) -> tuple[IdempotencyStore, ResponseStore]:
    """The stores that seal what they keep under the server secret."""
    secret = settings.hmac_key()
    idempotency = IdempotencyStore(
        db.sessions, secret, ttl_s=settings.idempotency_ttl_s, lock_s=settings.idempotency_lock_s
    )
    return idempotency, ResponseStore(db.sessions, secret, settings.responses_ttl_days)


def _tokens(settings: Settings, db: Database) -> TokenVerifier:
    """The OAuth access-token verifier, with the keyring that signs and rotates its keys."""
    return TokenVerifier(
        db.sessions,
        Keyring(db.sessions, settings.oauth_token_ttl_s, settings.hmac_key()),
        issuer=settings.oauth_issuer,
        audience=settings.oauth_audience,
        ttl=settings.key_cache_ttl_s,
    )


async def _start(kiln: Kiln) -> None:
    """Start the background tasks: ledger, quotas, budgets, pools, compiler, idempotency, ...;
    the batch runner last (its lines use all of them)."""
    await kiln.ledger.start()
    await kiln.quotas.start()
    await kiln.budgets.start()
    if kiln.fleet is not None:  # leadership known before the pools are made
        await kiln.fleet.start()
    await kiln.pools.start()
    REGISTRY.register(kiln.engine_metrics)
    kiln.compiler.start()
    kiln.idempotency.start()
    await kiln.slos.start()
    await kiln.rollouts.start()
    kiln.shadows.start(kiln.db.sessions)
    kiln.webhooks.start()
    kiln.batches.start(kiln)  # its lines use every service above, the pools' workers too


async def _stop(kiln: Kiln, ledger_db: AsyncEngine) -> None:
    """Stop them in reverse order: the ledger flushes before budgets and quotas let go."""
    await kiln.batches.stop()  # first: its lines in flight still hold pools and the ledger
    await kiln.background.stop()  # as the batches: its responses fail, named
    await kiln.webhooks.stop()
    await kiln.shadows.stop()
    await kiln.rollouts.stop()
    await kiln.slos.stop()
    await kiln.idempotency.stop()
    await kiln.compiler.stop()
    REGISTRY.unregister(kiln.engine_metrics)
    await kiln.engine_metrics.close()
    if kiln.fleet is not None:  # hand leadership over now: another gateway takes the pools
        await kiln.fleet.stop()
    await kiln.pools.stop()
    await kiln.ledger.stop()
    await ledger_db.dispose()
    await kiln.budgets.stop()
    await kiln.quotas.stop()
    await kiln.quotas.drain()
    kiln.metrics.close()


@asynccontextmanager
async def running(settings: Settings, batches: Background) -> AsyncIterator[Kiln]:
    """Start every service for serving (``batches``: the batch runner); stop them in reverse
    order."""
    if settings.pool_backend == "kubernetes":
        from kiln_platform.pools.kubernetes import check_store

        check_store(settings)  # the gateway's store must be the one its pods read
    async with open_database(settings) as db, worker_session(settings) as http:
        await fill(db.engine)  # every connection its pool keeps, opened now
        ledger_db = writer_engine(
            db.engine, db.set_role, settings.db_connect_timeout_s, db.password,
            synchronous_commit=settings.ledger_synchronous_commit, platform_scope=True,
        )  # fmt: skip
        kiln = _build(settings, db, http, ledger_db, batches)
        await _start(kiln)
        try:
            yield kiln
        finally:
            await _stop(kiln, ledger_db)
