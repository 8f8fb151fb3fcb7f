"""Gateway-side Prometheus metrics (the default registry, served at ``/metrics``).

``RequestMetrics`` holds the per-request series labelled by model, version and, unless
``KILN_METRICS_TENANT_LABELS`` is off, tenant (one series per tenant and model: turn it off when
tenants are many). Built once per app and unregistered when the app stops.
"""

from __future__ import annotations

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
_REQUEST_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
"""Whole requests: embeddings in milliseconds, a cold start in seconds, a long stream minutes."""
_QUEUE_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
_TOKEN_GAP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28)

PROMPT_TOKENS = Counter("kiln_llm_prompt_tokens", "Prompt tokens admitted.", ["model"])
COMPLETION_TOKENS = Counter("kiln_llm_completion_tokens", "Tokens generated.", ["model"])
DEADLINE_CUTS = Counter(
    "kiln_llm_deadline_cuts", "Generations ended by KILN_STREAM_TIMEOUT_S.", ["model"]
)
ACTIVE_STREAMS = Gauge("kiln_llm_active_generations", "Generations in flight.", ["model"])
GRPC_CALLS = Counter(
    "kiln_grpc_requests", "OIP gRPC calls, by method and status code.", ["method", "code"]
)
GRPC_SECONDS = Histogram(
    "kiln_grpc_request_duration_seconds", "OIP gRPC call latency.", ["method"],
    buckets=_REQUEST_BUCKETS,
)  # fmt: skip
EMBEDDED_ITEMS = Counter("kiln_embeddings_items", "Inputs embedded.", ["model"])
RESPONSES_NOT_STORED = Counter(
    "kiln_responses_not_stored",
    "Responses asked to be stored that the database did not take (sent with store: false).",
    ["model"],
)
CHATS_NOT_STORED = Counter(
    "kiln_chat_completions_not_stored",
    "Chat completions asked to be stored that the database did not take (sent all the same).",
    ["model"],
)


class RequestMetrics:
    """Latency, errors, TTFT and inter-token latency by model, version (and tenant)."""

    def __init__(self, tenant_labels: bool, registry: CollectorRegistry = REGISTRY) -> None:
        self.tenant_labels = tenant_labels
        self._registry = registry
        who = ["model", "version", *(["tenant"] if tenant_labels else [])]
        self.duration = Histogram(
            "kiln_model_request_duration_seconds",
            "Arrival at the gateway to the response's last byte, per request to a model.",
            [*who, "endpoint"], buckets=_REQUEST_BUCKETS, registry=registry,
        )  # fmt: skip
        self.errors = Counter(
            "kiln_model_request_errors",
            "Requests to a model that failed, by error code (499 client_closed included).",
            [*who, "endpoint", "type"], registry=registry,
        )  # fmt: skip
        self.ttft = Histogram(
            "kiln_llm_time_to_first_token_seconds", "Generation start to first token.", who,
            buckets=_LATENCY_BUCKETS, registry=registry,
        )  # fmt: skip
        self.queue_wait = Histogram(
            "kiln_scheduler_queue_wait_seconds", "Arrival in a pool's fair queue to dispatch.",
            who, buckets=_QUEUE_BUCKETS, registry=registry,
        )  # fmt: skip
        self.inter_token = Histogram(
            "kiln_llm_inter_token_latency_seconds", "Gap between streamed token chunks.", who,
            buckets=_TOKEN_GAP_BUCKETS, registry=registry,
        )  # fmt: skip

    def labels(self, model: str, version: str, tenant: str) -> tuple[str, ...]:
        """The ``who`` label values (the tenant dropped when tenant labels are off)."""
        return (model, version, tenant) if self.tenant_labels else (model, version)

    def observe_wait(self, model: str, version: str, tenant: str, seconds: float) -> None:
        """One request's wait in its pool's fair queue."""
        self.queue_wait.labels(*self.labels(model, version, tenant)).observe(seconds)

    def finished(
        self, who: tuple[str, ...], endpoint: str, seconds: float, status: int, error: str | None
    ) -> None:
        """One request to a model ended (``error``: its Kiln error code, if it raised one)."""
        self.duration.labels(*who, endpoint).observe(seconds)
        if status >= 400:
            kind = error or ("client_closed" if status == 499 else f"status_{status}")
            self.errors.labels(*who, endpoint, kind).inc()

    def close(self) -> None:
        """Stop exporting (so a test process can build another app)."""
        for metric in (self.duration, self.errors, self.ttft, self.inter_token, self.queue_wait):
            self._registry.unregister(metric)
