"""Per-request series: tenant-labelled only when the setting says so, and then only for the
scraper holding the token (``scrape.exposition``); errors counted by their code."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry
from pydantic import SecretStr

from kiln_platform.gateway.metrics import RequestMetrics
from kiln_platform.scrape import exposition

pytestmark = pytest.mark.unit
TENANT = "6a0d3c2e-1f4b-4e8a-9c7d-5b2a1e0f9d8c"
TOKEN = SecretStr("scraper-token")


def _metrics(tenant_labels: bool) -> tuple[RequestMetrics, CollectorRegistry]:
    registry = CollectorRegistry()
    metrics = RequestMetrics(tenant_labels, registry)
    who = metrics.labels("minilm", "v2", TENANT)
    metrics.finished(who, "embeddings", 0.02, 200, None)
    metrics.finished(who, "embeddings", 0.5, 429, "rate_limit_exceeded")
    metrics.finished(who, "chat.completions", 3.0, 499, None)
    metrics.ttft.labels(*who).observe(0.08)
    metrics.observe_wait("minilm", "v2", TENANT, 0.004)
    return metrics, registry


def test_tenant_labels_reach_only_the_token_scrape() -> None:
    _, registry = _metrics(tenant_labels=True)
    scraped = exposition(registry, f"Bearer {TOKEN.get_secret_value()}", TOKEN).decode()
    assert f'tenant="{TENANT}"' in scraped
    assert 'type="rate_limit_exceeded"' in scraped
    assert 'type="client_closed"' in scraped
    anonymous = exposition(registry, None, None).decode()
    assert "kiln_model_request_duration_seconds_count" not in anonymous
    assert TENANT not in anonymous


def test_without_tenant_labels_the_series_are_per_model_for_anyone() -> None:
    metrics, registry = _metrics(tenant_labels=False)
    anonymous = exposition(registry, None, None).decode()
    assert TENANT not in anonymous
    labels = 'endpoint="embeddings",model="minilm",version="v2"'
    count = f"kiln_model_request_duration_seconds_count{{{labels}}}"
    assert f"{count} 2.0" in anonymous
    assert (
        'kiln_llm_time_to_first_token_seconds_count{model="minilm",version="v2"} 1.0' in anonymous
    )
    wait = 'kiln_scheduler_queue_wait_seconds_count{model="minilm",version="v2"} 1.0'
    assert wait in anonymous  # queue wait per pool, for anyone
    errors = [x for x in anonymous.splitlines() if x.startswith("kiln_model_request_errors_total")]
    assert len(errors) == 2  # 429 and 499; the 200 is no error
    metrics.close()
    assert exposition(registry, None, None) == b""
