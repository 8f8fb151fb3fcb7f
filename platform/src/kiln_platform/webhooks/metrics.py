"""Webhook delivery series on the gateway's ``/metrics``."""

from __future__ import annotations

from prometheus_client import Counter, Histogram

ATTEMPTS = Counter(
    "kiln_webhook_attempts", "Webhook POSTs by outcome (delivered, error, refused).", ["outcome"]
)
DELIVERIES = Counter(
    "kiln_webhook_deliveries", "Webhook deliveries ended, by outcome (delivered, failed).",
    ["outcome"],
)  # fmt: skip
LATENCY = Histogram(
    "kiln_webhook_attempt_seconds", "Duration of one webhook POST (to its answer or error).",
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)  # fmt: skip
