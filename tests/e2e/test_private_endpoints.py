"""A real ``kiln up`` with ``KILN_METRICS_TOKEN``: after tenant traffic, ``/metrics`` names the
tenant only to the scraper holding the token; its worker answers only the gateway's calls."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import msgspec
import openai
import psutil
import pytest

from kiln_runtimes.protocol import CONTENT_TYPE, EmbedRequest, EmbedResult, WorkerInfo

from .conftest import MINILM, KilnProcess, minilm_up, wait_for

TOKEN = "e2e-metrics-token-4f1c"


@pytest.fixture(scope="module")
def kiln(minilm_dir: Path) -> Iterator[KilnProcess]:
    yield from minilm_up(minilm_dir, {"KILN_METRICS_TOKEN": TOKEN})


def _traffic(kiln: KilnProcess) -> None:
    sdk = openai.OpenAI(base_url=f"{kiln.base_url}/v1", api_key=kiln.key, max_retries=0)
    for n in range(3):
        assert len(sdk.embeddings.create(model=MINILM, input=[f"tenant traffic {n}"]).data) == 1


def _worker_port(kiln: KilnProcess) -> tuple[psutil.Process, str]:
    (worker,) = kiln.workers()
    args = worker.cmdline()
    return worker, args[args.index("--port") + 1]


def test_only_the_token_scrape_names_the_tenant(kiln: KilnProcess) -> None:
    _traffic(kiln)
    tenant = kiln.env["TEST_TENANT_ID"]
    for headers in ({}, {"authorization": "Bearer wrong"}, {"authorization": f"Bearer {kiln.key}"}):
        refused = httpx.get(f"{kiln.base_url}/metrics", headers=headers)
        assert refused.status_code == 401, headers
        assert tenant not in refused.text
    scraped = kiln.metrics(TOKEN)
    assert f'tenant="{tenant}"' in scraped
    admitted = [x for x in scraped.splitlines() if x.startswith("kiln_scheduler_admitted_total")]
    assert any(tenant in x and float(x.split()[-1]) >= 3 for x in admitted), admitted
    latency = [
        x for x in scraped.splitlines() if x.startswith("kiln_model_request_duration_seconds_count")
    ]
    mine = [x for x in latency if f'tenant="{tenant}"' in x and f'model="{MINILM}"' in x]
    assert mine, latency
    assert 'endpoint="embeddings"' in mine[0]
    assert float(mine[0].split()[-1]) >= 3
    items = [x for x in scraped.splitlines() if x.startswith("kiln_embeddings_items_total")]
    assert any(f'model="{MINILM}"' in x and float(x.split()[-1]) >= 3 for x in items), items


def test_the_gateway_sums_its_workers_engine_series(kiln: KilnProcess) -> None:
    _traffic(kiln)
    wanted = f'kiln_pool_engine_batch_size_count{{model="{MINILM}"'

    def batches() -> float:
        lines = [x for x in kiln.metrics(TOKEN).splitlines() if x.startswith(wanted)]
        return float(lines[0].split()[-1]) if lines else 0.0

    assert wait_for(lambda: batches() >= 3, 20)  # a scrape refreshes the next one's snapshot


def test_a_worker_refuses_calls_without_the_secret(kiln: KilnProcess) -> None:
    worker, port = _worker_port(kiln)
    url = f"http://127.0.0.1:{port}"
    body = msgspec.msgpack.encode(EmbedRequest(request_id="direct", input_ids=[[101, 2023, 102]]))
    strangers = [{}, {"authorization": "Bearer wrong"}, {"authorization": f"Bearer {kiln.key}"},
                 {"authorization": f"Bearer {TOKEN}"}]  # fmt: skip
    for headers in strangers:
        posted = httpx.post(f"{url}/embed", content=body,
                            headers={"content-type": CONTENT_TYPE, **headers})  # fmt: skip
        assert posted.status_code == 401, headers
        for path in ("/health", "/metrics"):
            assert httpx.get(f"{url}{path}", headers=headers).status_code == 401, (path, headers)
    assert httpx.get(f"{url}/readyz").status_code == 200  # the probe: a status, no body
    # the gateway's secret opens it (what the gateway's own calls carry) ...
    gateway = kiln.worker_headers()
    health = httpx.get(f"{url}/health", headers=gateway)
    assert msgspec.msgpack.decode(health.content, type=WorkerInfo).ready
    direct = httpx.post(f"{url}/embed", content=body,
                        headers={"content-type": CONTENT_TYPE, **gateway})  # fmt: skip
    assert direct.status_code == 200
    assert msgspec.msgpack.decode(direct.content, type=EmbedResult).dimensions == 384
    # ... and the gateway's calls go through
    _traffic(kiln)
    # the worker got the secret from its environment, and nothing of the gateway's own
    env = worker.environ()
    assert f"Bearer {env['KILN_WORKER_SECRET']}" == gateway["authorization"]
    assert [k for k in env if k.startswith("KILN_")] == ["KILN_WORKER_SECRET"]
    assert TOKEN not in "".join(env.values())
    assert env["KILN_WORKER_SECRET"] not in " ".join(worker.cmdline())
