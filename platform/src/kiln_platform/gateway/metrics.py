"""Gateway-side Prometheus metrics (the default registry, served at ``/metrics``)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)

TIME_TO_FIRST_TOKEN = Histogram(
    "kiln_llm_time_to_first_token_seconds", "Request start to first token.", ["model"],
    buckets=_LATENCY_BUCKETS,
)  # fmt: skip
INTER_TOKEN_LATENCY = Histogram(
    "kiln_llm_inter_token_latency_seconds", "Gap between streamed token chunks.", ["model"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28),
)  # fmt: skip
PROMPT_TOKENS = Counter("kiln_llm_prompt_tokens", "Prompt tokens admitted.", ["model"])
COMPLETION_TOKENS = Counter("kiln_llm_completion_tokens", "Tokens generated.", ["model"])
DEADLINE_CUTS = Counter(
    "kiln_llm_deadline_cuts", "Generations ended by KILN_STREAM_TIMEOUT_S.", ["model"]
)
ACTIVE_STREAMS = Gauge("kiln_llm_active_generations", "Generations in flight.", ["model"])
EMBEDDED_ITEMS = Counter("kiln_embeddings_items", "Inputs embedded.", ["model"])
