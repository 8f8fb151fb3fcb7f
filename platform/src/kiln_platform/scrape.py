"""The gateway's ``GET /metrics``: every series for the scraper holding ``KILN_METRICS_TOKEN``,
only the series without a tenant label for anyone else.

Some series name tenants (``tenant="<tenant id>"``: the schedulers' admitted and rejected counts,
service shares, queue waits; ``pools.metrics``), which is who uses the platform and how much. With
a token configured, a scrape without ``Authorization: Bearer <token>`` answers 401; without one,
``/metrics`` stays open (health checks, KEDA's ``kiln_pool_replicas`` query) but drops every
sample that carries a ``tenant`` label.
"""

from __future__ import annotations

import hmac
from typing import TYPE_CHECKING, Any

from litestar import Request, Response, get
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from kiln_platform.errors import Unauthorized

if TYPE_CHECKING:
    from collections.abc import Iterator

    from litestar.handlers import HTTPRouteHandler
    from pydantic import SecretStr

TENANT_LABEL = "tenant"


class WithoutTenants(Collector):
    """``source``'s metric families with the samples that name a tenant taken out."""

    def __init__(self, source: Collector) -> None:
        self._source = source

    def collect(self) -> Iterator[Metric]:
        """Each family that keeps a sample, with only those samples."""
        for family in self._source.collect():
            kept = [s for s in family.samples if TENANT_LABEL not in s.labels]
            if kept:
                copy = Metric(family.name, family.documentation, family.type, family.unit)
                copy.samples = kept
                yield copy


def allowed(authorization: str, token: SecretStr) -> bool:
    """Whether an ``Authorization`` header is ``Bearer <token>`` (in constant time)."""
    expected = f"Bearer {token.get_secret_value()}".encode()
    return hmac.compare_digest(authorization.encode("utf-8", "replace"), expected)


def exposition(source: Collector, authorization: str | None, token: SecretStr | None) -> bytes:
    """The text format for this caller: everything, tenant-free series, or ``Unauthorized``."""
    if token is None:
        return generate_latest(WithoutTenants(source))
    if authorization is None or not allowed(authorization, token):
        raise Unauthorized("Scraping /metrics needs the bearer token (KILN_METRICS_TOKEN).")
    return generate_latest(source)


def metrics_route(token: SecretStr | None, source: Collector = REGISTRY) -> HTTPRouteHandler:
    """``GET /metrics`` for ``create_app`` (the token is read once, from the settings)."""

    @get("/metrics", include_in_schema=False, sync_to_thread=False)
    def metrics(request: Request[Any, Any, Any]) -> Response[bytes]:
        body = exposition(source, request.headers.get("authorization"), token)
        return Response(body, headers={"content-type": CONTENT_TYPE_LATEST})

    return metrics
