"""One typed settings object, read once at start-up (``KILN_`` env prefix) and passed down."""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import os
import secrets
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import platformdirs
from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import SettingsConfigDict

from kiln_platform.pools.autoscale import AutoscaleConfig
from kiln_platform.worker_settings import WorkerSettings

if TYPE_CHECKING:
    from kiln_runtimes.store import ArtifactStore


CONNECT_TIMEOUT_S = 5.0
"""How long one PostgreSQL connection attempt may take by default (asyncpg's own: 60 s)."""


def _default_data_dir() -> Path:
    return Path(platformdirs.user_data_dir("kiln", appauthor=False))


GRACEFUL_SHUTDOWN_S = 30
"""How long requests and calls in flight may take to finish at shutdown (HTTP's and gRPC's)."""


class Settings(WorkerSettings):
    """Kiln configuration; every field maps to ``KILN_<FIELD>`` in the environment."""

    model_config = SettingsConfigDict(env_prefix="KILN_", frozen=True)

    data_dir: Path = Field(default_factory=_default_data_dir)
    database_url: str | None = None
    """PostgreSQL the app connects to (unset: the embedded server in ``data_dir/pg``). Its role
    must not own the tables nor bypass row-level security, unless ``database_owner_url`` is unset
    (then each connection switches to ``kiln_app`` with ``SET ROLE``: weaker, docs/security.md)."""
    database_owner_url: str | None = None
    """The tables' owner, used only to apply migrations; with it, ``database_url`` should log in
    as ``kiln_app`` (or a member of it) so the app cannot lift row-level security."""
    database_password_file: Path | None = None
    """The password of ``database_url``'s user, re-read on every new connection (a mounted
    Secret rotates without a restart: ``db.credentials``); overrides one in the URL."""
    database_owner_password_file: Path | None = None
    """The same for ``database_owner_url``'s user (migrations)."""
    database_iam: Literal["rds"] | None = None
    """``rds``: ``database_url``'s user logs in with RDS IAM tokens (boto3, the ``aws`` extra)."""
    host: str = "127.0.0.1"
    port: int = 8000
    grpc_port: int = Field(default=8001, ge=0, le=65535)
    """OIP's gRPC service (``gateway.oip_grpc``) on ``host`` (Triton's port); 0: not served."""
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    log_format: Literal["json", "console"] = "json"
    secret_key: SecretStr | None = None
    pool_min_replicas: int = Field(default=0, ge=0)
    """Workers a pool keeps even when idle (0: idle pools scale to zero)."""
    pool_max_replicas: int = Field(default=1, ge=1)
    pool_initial_replicas: int = Field(default=1, ge=0)
    """Workers a pool starts with when its model is registered or Kiln starts."""
    pool_target_utilization: float = Field(default=0.8, gt=0, le=1)
    """Share of a worker's slots that demand may fill before another worker is started."""
    pool_warm_replicas: int = Field(default=0, ge=0)
    """Workers kept beyond demand while a pool is in use (headroom for a burst)."""
    pool_scale_down_delay_s: float = Field(default=30.0, ge=0)
    """A pool shrinks to the largest size wanted over this window (no flapping)."""
    pool_idle_to_zero_s: float = Field(default=300.0, gt=0)
    """A pool without requests this long falls to ``pool_min_replicas``."""
    warm_standby: bool = True
    """Keep one preloaded standby worker process, so starts skip imports (``pools.local``)."""
    shared_workers: bool = False
    """Gateways on one PostgreSQL share one set of workers: one of them (the leader, elected
    through an advisory lock) runs and sizes the pools; the others dispatch to its workers,
    found in PostgreSQL (docs/architecture.md, "Many gateways")."""
    pool_backend: Literal["local", "kubernetes"] = "local"
    """What runs workers: ``local`` subprocesses, or ``kubernetes``, one Deployment per pool
    (docs/architecture.md, "Kubernetes backend")."""
    kubernetes_namespace: str = "kiln"
    """Namespace of the pools' Deployments and worker pods (``kubernetes`` backend)."""
    kubernetes_service_account: str = "kiln"
    """Service account of worker pods (its token is not mounted: workers call no API)."""
    kubernetes_store_claim: str | None = None
    """PersistentVolumeClaim holding the artifact store (``$KILN_DATA_DIR/store``, shared with the
    gateway, ReadWriteMany): mounted read-only at the same path in worker pods, so their
    ``--model-dir`` is the gateway's. The ``kubernetes`` backend needs it or ``artifact_store``."""
    artifact_store: str | None = None
    """``s3://bucket/prefix``: the shared artifact store (endpoint and credentials from the
    standard ``AWS_*`` settings or IRSA); ``$KILN_DATA_DIR/store`` is then its local cache, and
    workers materialize their version's tree from it at start. Unset: the local store alone."""
    artifact_cache_max_bytes: int = 0
    """Blob bytes the local cache of an ``s3://`` store keeps, least recently used trees evicted
    first (0: unbounded). Workers get the same cap for the cache they share."""
    worker_image: str | None = None
    """Container image of worker pods (``kiln-runtimes`` with the engine extras the pools'
    ``KILN_WORKER_TARGET`` needs). Required by the ``kubernetes`` backend."""
    worker_secret: SecretStr | None = None
    """What every gateway->worker call carries (``Authorization: Bearer``), handed to workers
    in their environment; unset: derived from the server secret (``worker_key``). Required by
    the ``kubernetes`` backend: the same value is in the Secret its worker pods read."""
    kubernetes_worker_secret: str = "kiln-worker-secret"  # noqa: S105 (a Secret's name)
    """Kubernetes Secret (key ``secret``) that worker pods take ``KILN_WORKER_SECRET`` from."""
    metrics_token: SecretStr | None = None
    """Bearer token of the Prometheus scraper: with it, ``/metrics`` serves every series and
    answers 401 without it; unset, ``/metrics`` serves only series without a tenant label."""
    metrics_tenant_labels: bool = True
    """Whether per-request series (latency, errors, TTFT, inter-token latency) carry a
    ``tenant`` label: one series per tenant and model; off, they are per model and version."""
    key_cache_ttl_s: float = 5.0
    """How long keys, quota limits and the JWT denylist are cached (the revocation bound)."""
    outage_bound_s: float = Field(default=300.0, ge=0)
    """While PostgreSQL is unreachable: how long keys verified before are still served past
    their cache TTL, and how long usage is spooled to local disk (from its oldest unwritten
    row) before requests answer 503 again (``docs/reliability.md``); 0: no outage mode."""
    db_connect_timeout_s: float = Field(default=CONNECT_TIMEOUT_S, gt=0)
    """How long one PostgreSQL connection attempt may take (asyncpg's default: 60 s). During a
    network partition that drops packets, requests reach the outage path after this."""
    outage_spool_max_bytes: int = Field(default=64 << 20, gt=0)
    """The most usage one gateway process spools to disk during an outage (64 MiB: ~200,000
    requests); past it requests answer 503 + Retry-After."""
    oauth_issuer: str = "urn:kiln"
    """``iss`` of the JWT access tokens (set it to the public URL; one value for every gateway)."""
    oauth_audience: str = "urn:kiln:api"
    """``aud`` the gateway issues and requires in JWT access tokens."""
    oauth_token_ttl_s: int = 900
    """Lifetime of an OAuth access token (client credentials), 15 minutes by default."""
    oidc_issuer: str | None = None
    """OpenID Connect issuer for console single sign-on (its discovery document is at
    ``<issuer>/.well-known/openid-configuration``); unset: passwords only."""
    oidc_client_id: str | None = None
    oidc_client_secret: SecretStr | None = None
    oidc_scopes: str = "openid email profile"
    oidc_label: str = "Sign in with single sign-on"
    oidc_require_verified_email: bool = True
    """Sign in only with an ID token that says ``email_verified: true``; turn off for a provider
    that never sends the claim (Azure AD) and vouches for its emails some other way."""
    console_url: str | None = None
    """The console's public base URL (``https://kiln.example.com``) for the SSO redirect URI;
    unset: taken from the request."""
    console_login_failures: int = Field(default=5, ge=1)
    """Failed console sign-ins per email (and 10x that per client address) in 15 minutes before
    sign-in answers 429 for the rest of the window."""
    forwarded_allow_ips: str = ""
    """Addresses of trusted reverse proxies, comma-separated (uvicorn's ``forwarded_allow_ips``;
    ``*``: any). Only their ``X-Forwarded-For``/``X-Forwarded-Proto`` set the client address
    (the sign-in throttle's and the audit log's source) and the scheme (OAuth's https check);
    anyone else's are ignored. Empty (the default): no proxy is trusted."""
    console_secure_cookies: bool = False
    """Mark the console's session and CSRF cookies ``Secure`` (set it when served over HTTPS)."""
    idempotency_ttl_s: float = 86_400.0
    """How long a POST's Idempotency-Key and its stored response are replayed (24 h)."""
    responses_ttl_days: float = Field(default=30.0, gt=0)
    """How long a response or chat completion created with ``store: true`` is kept (OpenAI
    keeps them 30 days)."""
    idempotency_lock_s: float = 30.0
    """A running request's claim on its key; renewed while it runs, so a killed process's lapses."""
    metering: bool = True
    """Record usage in the ledger. Off only to measure metering's overhead (``bench/``): with it
    off nothing is billed and budgets are never settled."""
    ledger_synchronous_commit: bool = True
    """The ledger's commits wait for their WAL to reach the disk before requests answer. Off:
    they answer once PostgreSQL has committed the row (visible, and safe from a gateway crash:
    ``tests/e2e/test_metering_kill.py``), and only a crash of PostgreSQL's host within
    ``wal_writer_delay`` x 3 (0.6 s by default) could lose rows already answered; on this
    machine's disk it takes ~10 ms off a lone request (docs/benchmarks.md, issue 22)."""
    max_embedding_inputs: int = 2048
    request_timeout_s: float = Field(default=60.0, gt=0)
    """Gateway -> worker timeout of a non-streamed call (and of each read of a stream)."""
    stream_timeout_s: float = Field(default=300.0, gt=0)
    """A generation's total deadline from admission (queue, generation, sending): past it the
    worker's sequence is cancelled and the response ends with ``finish_reason: "length"``."""
    header_timeout_s: float = Field(default=10.0, gt=0)
    """A request's line and headers must arrive within this of its connection opening (or of
    the first byte of a kept-alive connection's next request): else 408, connection closed."""
    body_timeout_s: float = Field(default=30.0, gt=0)
    """A request body must arrive within this plus a second per KiB (``MIN_BODY_RATE``): a
    body that stalls or trickles is answered 408 and its connection closed."""
    send_timeout_s: float = Field(default=30.0, gt=0)
    """A response's write that waits this long for the client to take bytes (it stopped
    reading) drops the connection as if the client had hung up: a stream's generation is
    cancelled, its worker slot freed, and it is billed for the tokens it made."""
    max_connections_per_client: int = Field(default=1024, ge=0)
    """Connections one client address may hold open at once (0: no limit); a request on one
    past it is answered 429 and that connection closed. Trusted proxies
    (``KILN_FORWARDED_ALLOW_IPS``) are not counted."""
    lease_ttl_s: float = Field(default=30.0, gt=0)
    """Concurrency leases and budget holds live as long as the server lets their request run plus
    this, and are renewed every third of it while it runs; a killed gateway's lapse after that."""
    max_json_body_bytes: int = Field(default=4 << 20, gt=0)
    """Largest `/v1` JSON request body (refused with 413 while it streams in)."""
    max_tensor_body_bytes: int = Field(default=256 << 20, gt=0)
    """Largest `/v2` inference request body (JSON or binary tensors)."""
    max_upload_bytes: int = Field(default=2 << 30, gt=0)
    """Largest model upload (`/admin/v1/models/{name}/versions`)."""
    max_batch_file_bytes: int = Field(default=200 << 20, gt=0)
    """Largest file `POST /v1/files` stores (OpenAI's batch input limit, 200 MB)."""
    max_batch_lines: int = Field(default=50_000, gt=0)
    """Most lines (requests) in one batch input file (OpenAI's limit)."""
    batch_file_ttl_s: int = Field(default=30 * 86400, ge=0)
    """How long a batch input file uploaded without ``expires_after``, and a batch's output and
    error files without ``output_expires_after``, are kept (OpenAI's 30 days); 0: until
    deleted."""
    batch_concurrency: int = Field(default=1, ge=0)
    """Lines of batches each gateway keeps in its pools' fair queues at once (class ``batch``,
    behind interactive work); 0: this gateway runs no batches. More lines raise interactive
    latency beside a batch (docs/benchmarks.md: on 2 cores A's p99 4.2x at 8, 1.8x at 2; with
    the background twin and grouped records 1.33x at 2, 1.1-1.18x at 1)."""
    batch_twin: bool = True
    """Batch-class work (batch lines) runs in each pool's background twin: workers of the same
    version at idle CPU priority (``SCHED_IDLE``), started when such work comes and scaled to
    zero when idle, so it takes only the CPU time interactive work leaves (local backend; on
    Kubernetes a pool's pods have CPU of their own and batch work shares them)."""
    batch_record_s: float = Field(default=0.1, ge=0)
    """How long a group of finished batch lines waits for more before its transaction is
    written (``batches.recorder``; 0: only the lines that finished during the last write):
    fewer, larger writes cost the gateway's event loop and PostgreSQL less a line."""
    batch_lease_s: float = Field(default=30.0, gt=0)
    """A gateway's claim on a running batch; renewed every third of it, so a killed gateway's
    batch is taken over by another after it lapses."""
    batch_poll_s: float = Field(default=1.0, gt=0)
    """How often an idle gateway looks for a batch to run (and a running one for a cancel)."""
    batch_window_s: float = Field(default=86400.0, gt=0)
    """How long a batch's ``24h`` completion window lasts (shorter only in tests): past it the
    batch expires, its unfinished lines written as ``batch_expired`` errors."""
    slo_eval_interval_s: float = Field(default=30.0, gt=0)
    """How often each gateway stores its SLO counts and SLOs' burn-rate alerts are evaluated."""
    slo_bucket_s: float = Field(default=60.0, gt=0)
    """Width of the time buckets SLO events are counted in (windows round up to whole ones)."""
    rollout_interval_s: float = Field(default=1.0, gt=0)
    """How often each gateway stores its counts of running rollouts and rollouts are decided
    (also at once after a canary's server error)."""
    crash_loop_restarts: int = Field(default=3, ge=1)
    """Worker restarts (summed over a pool) after which a pool whose every worker is down after
    a crash raises ``KilnPoolCrashLoop``."""
    alert_webhook_url: str | None = None
    """Where alert notifications are POSTed (Alertmanager-compatible JSON); unset: stored only."""
    alert_webhook_secret: SecretStr | None = None
    """Key of the notifications' ``x-kiln-signature`` (HMAC-SHA256); default: derived from the
    server secret (``kiln slo webhook-secret`` prints it)."""
    alert_retry_s: float = Field(default=5.0, gt=0)
    """First retry delay of a failed delivery; doubles each attempt, up to 10 attempts."""
    webhook_allow_networks: str = ""
    """Networks tenants' webhooks may target although not public (``127.0.0.0/8,::1/128``;
    comma-separated). Empty: private, loopback, link-local, multicast and reserved addresses
    are refused at registration and at every delivery (the SSRF guard, ``webhooks.guard``)."""
    webhook_retry_base_s: float = Field(default=10.0, gt=0)
    """First retry delay of a failed webhook delivery; doubles each attempt (with jitter)."""
    webhook_retry_window_s: float = Field(default=86400.0, gt=0)
    """How long a webhook delivery is retried before it is marked failed (a day)."""
    webhook_poll_s: float = Field(default=1.0, gt=0)
    """How often each gateway looks for webhook deliveries that are due."""
    webhook_timeout_s: float = Field(default=10.0, gt=0)
    """How long one webhook POST may take (connect and answer)."""
    webhook_rotation_grace_s: float = Field(default=86400.0, ge=0)
    """How long a rotated webhook secret still signs deliveries, beside the new one."""
    webhook_retention_s: float = Field(default=30 * 86400.0, gt=0)
    """How long a webhook delivery that ended (delivered, or failed for good) and its attempts
    are kept before the sender deletes them (30 days)."""
    min_opset: int = 7
    max_opset: int = 23

    @field_validator("webhook_allow_networks")
    @classmethod
    def _networks(cls, value: str) -> str:
        from kiln_platform.webhooks.guard import networks

        networks(value)  # its ValueError names the bad network
        return value

    @model_validator(mode="after")
    def _credentials(self) -> Settings:
        if self.database_iam and self.database_password_file:
            raise ValueError("set KILN_DATABASE_IAM or KILN_DATABASE_PASSWORD_FILE, not both")
        external = (self.database_iam, self.database_password_file)
        if any(external) and self.database_url is None:
            raise ValueError(
                "KILN_DATABASE_IAM and KILN_DATABASE_PASSWORD_FILE need a database URL"
            )
        if self.database_owner_password_file and self.database_owner_url is None:
            raise ValueError("KILN_DATABASE_OWNER_PASSWORD_FILE needs KILN_DATABASE_OWNER_URL")
        return self

    @model_validator(mode="after")
    def _kubernetes(self) -> Settings:
        if self.pool_backend == "kubernetes":
            needed = ("worker_image", "worker_secret")
            missing = [f"KILN_{name.upper()}" for name in needed if getattr(self, name) is None]
            if self.kubernetes_store_claim is None and self.artifact_store is None:
                missing.append("KILN_KUBERNETES_STORE_CLAIM or KILN_ARTIFACT_STORE")
            if missing:
                raise ValueError(f"the kubernetes pool backend needs {', '.join(missing)}")
        return self

    def autoscale(self) -> AutoscaleConfig:
        """The pools' autoscaling policy configuration."""
        return AutoscaleConfig(
            min_replicas=self.pool_min_replicas, max_replicas=self.pool_max_replicas,
            initial_replicas=self.pool_initial_replicas, warm_replicas=self.pool_warm_replicas,
            target_utilization=self.pool_target_utilization,
            scale_down_delay_s=self.pool_scale_down_delay_s,
            idle_to_zero_s=self.pool_idle_to_zero_s,
        )  # fmt: skip

    @property
    def store_dir(self) -> Path:
        """Content-addressed artifact store (the local cache of ``artifact_store``, if set)."""
        return self.data_dir / "store"

    def store(self) -> ArtifactStore:
        """The artifact store these settings name (``artifact_store`` cached in ``store_dir``)."""
        from kiln_runtimes.store import open_store

        return open_store(self.store_dir, self.artifact_store, self.artifact_cache_max_bytes)

    @property
    def spool_dir(self) -> Path:
        """Usage spooled while the database is unreachable (``billing.spool``)."""
        return self.data_dir / "spool"

    @property
    def pg_dir(self) -> Path:
        """Embedded PostgreSQL data directory (used when ``database_url`` is unset)."""
        return self.data_dir / "pg"

    def hmac_key(self) -> bytes:
        """Server secret for keyed hashes; generated once into the data directory if not set."""
        if self.secret_key is not None:
            return self.secret_key.get_secret_value().encode()
        path = self.data_dir / "secret.key"
        if not path.exists():
            _create_secret(path)
        return path.read_text().strip().encode()

    def worker_key(self) -> str:
        """The worker secret: ``KILN_WORKER_SECRET``, else HMAC-SHA256 of the server secret
        (one value for every gateway of a deployment, and not the server secret itself)."""
        if self.worker_secret is not None:
            return self.worker_secret.get_secret_value()
        return hmac.new(self.hmac_key(), b"kiln-worker-auth", hashlib.sha256).hexdigest()

    def alert_key(self) -> bytes:
        """The key alert notifications are signed with (``KILN_ALERT_WEBHOOK_SECRET``, else
        HMAC-SHA256 of the server secret)."""
        if self.alert_webhook_secret is not None:
            return self.alert_webhook_secret.get_secret_value().encode()
        return hmac.new(self.hmac_key(), b"kiln-alert-webhook", hashlib.sha256).hexdigest().encode()


def _create_secret(path: Path) -> None:
    """Write a new secret to ``path`` unless another process got there first.

    The file is created 0600 (never readable by others, not even for an instant), written and
    fsynced under a private name, then linked into place: ``link`` fails if ``path`` exists, so
    of two processes starting at once the first wins and both read its secret.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".secret.{os.getpid()}.{secrets.token_hex(4)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w") as out:
            out.write(secrets.token_urlsafe(48))
            out.flush()
            os.fsync(out.fileno())
        with contextlib.suppress(FileExistsError):
            os.link(tmp, path)  # atomic: the first process to link wins
    finally:
        tmp.unlink()
    with contextlib.suppress(OSError):  # the link itself is durable once its folder is
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
