"""``/metrics`` without the token serves no tenant-labelled sample; with a token configured, only
the scraper holding it gets them (and anyone else a 401)."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from pydantic import SecretStr

from kiln_platform.errors import Unauthorized
from kiln_platform.scrape import exposition

TENANT = "9b2f6c1e-5d4a-4f7e-8a3b-2c1d0e9f8a7b"
TOKEN = SecretStr("scraper-token")


@pytest.fixture
def registry() -> CollectorRegistry:
    registry = CollectorRegistry()
    requests = Counter("kiln_requests", "By route.", ["path"], registry=registry)
    requests.labels("/v1/embeddings").inc()
    admitted = Counter("kiln_scheduler_admitted", "By tenant.", ["model", "tenant"],
                       registry=registry)  # fmt: skip
    admitted.labels("m", TENANT).inc(3)
    wait = Histogram("kiln_scheduler_queue_wait_seconds", "By tenant.", ["tenant"],
                     registry=registry)  # fmt: skip
    wait.labels(TENANT).observe(0.01)
    mixed = Gauge("kiln_mixed", "Both kinds.", ["tenant"], registry=registry)
    mixed.labels(TENANT).set(1)
    mixed.labels("").set(2)  # an empty label value is still a tenant label
    Gauge("kiln_pool_replicas", "No tenant.", ["state"], registry=registry).labels("desired").set(1)
    return registry


def test_anonymous_scrapes_get_no_tenant_label_and_no_tenant_id(
    registry: CollectorRegistry,
) -> None:
    text = exposition(registry, None, None).decode()
    assert TENANT not in text
    assert "tenant=" not in text
    assert 'kiln_requests_total{path="/v1/embeddings"} 1.0' in text
    assert 'kiln_pool_replicas{state="desired"} 1.0' in text
    assert "kiln_scheduler_admitted" not in text  # a family with nothing left is left out
    assert "kiln_scheduler_queue_wait_seconds" not in text
    # the unfiltered registry still has them: the filter, not the source, took them out
    assert TENANT in exposition(registry, f"Bearer {TOKEN.get_secret_value()}", TOKEN).decode()


@pytest.mark.parametrize(
    "authorization",
    [None, "", "Bearer", "Bearer scraper-toke", "Bearer scraper-tokenx", "scraper-token",
     "Basic c2NyYXBlci10b2tlbg==", "Bearer sc\u00e9raper"],
)  # fmt: skip
def test_with_a_token_anyone_else_is_refused(
    registry: CollectorRegistry, authorization: str | None
) -> None:
    with pytest.raises(Unauthorized):
        exposition(registry, authorization, TOKEN)


def test_the_scraper_with_the_token_gets_every_series(registry: CollectorRegistry) -> None:
    text = exposition(registry, "Bearer scraper-token", TOKEN).decode()
    assert f'kiln_scheduler_admitted_total{{model="m",tenant="{TENANT}"}} 3.0' in text
    assert f'kiln_scheduler_queue_wait_seconds_count{{tenant="{TENANT}"}} 1.0' in text
    assert 'kiln_requests_total{path="/v1/embeddings"} 1.0' in text
