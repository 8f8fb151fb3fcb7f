"""Many gateways, one fleet (issue 21): three ``kiln up`` gateways with ``KILN_SHARED_WORKERS``
on one PostgreSQL and an ``s3://`` store on moto's loopback server share the leader's workers.

The openai SDK works through each; only the leader runs workers; no worker ever holds more
requests than its slots (its own gauges, read during and after load); two tenants of equal
weight share the workers evenly across the three gateways; a rate limit holds across them; a
fourth gateway that joins the serving fleet answers its first request at once; and when the
leader is SIGKILLed another takes the pool manager over within 5 s and serves again.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import time
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import openai
import psutil
import pytest
from pydantic import SecretStr

from kiln_platform.cli._base import cli_actor
from kiln_platform.db.database import open_database
from kiln_platform.keys.schemas import KeyCreate
from kiln_platform.keys.services import create_key
from kiln_platform.pools.backend import worker_headers
from kiln_platform.settings import Settings
from kiln_platform.tenants.schemas import TenantCreate
from kiln_platform.tenants.services import create_tenant
from tests.e2e.conftest import KilnProcess, register_model, up_gateway, wait_for

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

pytestmark = pytest.mark.slow
MODEL = "all-minilm-l6-v2"
SECRET = "one-secret-for-three-gateways"
SLOTS = 4
"""``KILN_WORKER_SLOTS``: each gateway keeps ceil(4 / 3) = 2 in flight per worker; the worker
admits 4 + 3 (the express lane's) and refuses more ``busy``."""
SENTENCES = [f"sentence {i} about three gateways sharing one worker" for i in range(8)]


@pytest.fixture(scope="module")
def fleet(
    database_uri: str, s3_server: dict[str, str], new_bucket: Callable[[], str],
    kiln_data_dir: Callable[[], Any], minilm_dir: Path,
) -> Iterator[list[KilnProcess]]:  # fmt: skip
    env = {**os.environ, **s3_server, "KILN_DATABASE_URL": database_uri,
           "KILN_ARTIFACT_STORE": new_bucket(), "KILN_SECRET_KEY": SECRET,
           "KILN_SHARED_WORKERS": "true", "KILN_WORKER_SLOTS": str(SLOTS),
           "KILN_LOG_LEVEL": "warning", "KILN_WARM_STANDBY": "false"}  # fmt: skip
    with kiln_data_dir() as d0, kiln_data_dir() as d1, kiln_data_dir() as d2:
        with pytest.MonkeyPatch.context() as patch:  # boto3 here reads the store's AWS_*
            for name, value in s3_server.items():
                patch.setenv(name, value)
            settings = Settings(data_dir=d0, database_url=database_uri,
                                artifact_store=env["KILN_ARTIFACT_STORE"],
                                secret_key=SecretStr(SECRET))  # fmt: skip
            keys = asyncio.run(_seed(settings, minilm_dir))
        gateways = [up_gateway(d, env) for d in (d0, d1, d2)]
        try:
            for kiln in gateways:
                kiln.wait_ready()
            for kiln in gateways:
                kiln.env.update(keys, TEST_KEY=keys["KEY_a"])
                kiln.wait_until_serving(MODEL, timeout=120)
            yield gateways
        finally:
            for kiln in gateways:
                if kiln.proc.poll() is None:
                    kiln.stop()


async def _seed(settings: Settings, model_dir: Path) -> dict[str, str]:
    """The model in the shared database and store; tenants of weight 1 and a key of each (in
    process: a ``kiln`` CLI call costs seconds), as ``KEY_<tenant>``."""
    await register_model(settings, model_dir)
    keys = {}
    async with open_database(settings) as db, db.sessions.begin() as session:
        for name in ("a", "b", "limited"):
            tenant = await create_tenant(session, cli_actor(), TenantCreate(name=name))
            made = await create_key(session, cli_actor(), tenant.id,
                                    KeyCreate(name="fleet", scopes=["inference"]),
                                    settings.hmac_key())  # fmt: skip
            keys[f"KEY_{name}"] = made.secret
    return keys


def _leader(kiln: KilnProcess) -> bool:
    try:
        return "kiln_fleet_leader 1.0" in kiln.metrics()
    except httpx.HTTPError:
        return False


def _sdk(kiln: KilnProcess, key: str | None = None) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{kiln.base_url}/v1", api_key=key or kiln.key, max_retries=0)


def _worker_gauges(url: str, headers: dict[str, str]) -> dict[str, float]:
    text = httpx.get(f"{url}/metrics", headers=headers, timeout=5).text
    found = re.findall(r"^(kiln_worker_(?:slots|in_flight|in_flight_peak)) (\S+)$", text, re.M)
    return {name: float(value) for name, value in found}


def test_each_gateway_serves_on_the_one_leaders_workers(fleet: list[KilnProcess]) -> None:
    for kiln in fleet:
        out = _sdk(kiln).embeddings.create(model=MODEL, input=["one fleet", "three gateways"])
        assert len(out.data) == 2
        assert len(out.data[0].embedding) == 384
    leaders = [kiln for kiln in fleet if _leader(kiln)]
    assert len(leaders) == 1
    assert [bool(kiln.workers()) for kiln in fleet] == [kiln in leaders for kiln in fleet]
    ready = httpx.get(f"{fleet[1].base_url}/readyz", timeout=5).json()
    assert ready["fleet"]["gateways"] == 3
    assert ready["fleet"]["leader"] == (fleet[1] in leaders)


async def _load(fleet: list[KilnProcess], seconds: float, warmup: float) -> Counter[str]:
    """Closed-loop SDK clients, 4 per tenant on each gateway; completed items per tenant (and
    failed requests under ``<tenant>!``), counted after the warm-up."""
    done: Counter[str] = Counter()
    start = time.monotonic()

    async def client(kiln: KilnProcess, tenant: str) -> None:
        sdk = openai.AsyncOpenAI(base_url=f"{kiln.base_url}/v1", api_key=kiln.env[f"KEY_{tenant}"],
                                 max_retries=0, timeout=30)  # fmt: skip
        async with sdk:
            while (now := time.monotonic()) < start + warmup + seconds:
                try:
                    await sdk.embeddings.create(model=MODEL, input=SENTENCES)
                    label, count = tenant, len(SENTENCES)
                except openai.APIStatusError:
                    label, count = f"{tenant}!", 1
                if now >= start + warmup and time.monotonic() <= start + warmup + seconds:
                    done[label] += count

    await asyncio.gather(*(client(k, t) for k in fleet for t in ("a", "b") for _ in range(4)))
    return done


def test_equal_weights_share_evenly_across_gateways_and_no_worker_exceeds_its_slots(
    fleet: list[KilnProcess],
) -> None:
    (leader,) = [kiln for kiln in fleet if _leader(kiln)]
    (process,) = leader.workers()
    port = process.cmdline()[process.cmdline().index("--port") + 1]
    url = f"http://127.0.0.1:{port}"
    headers = worker_headers(Settings(data_dir=Path("/x"), secret_key=SecretStr(SECRET)))
    samples: list[dict[str, float]] = []

    async def sample() -> None:
        while True:
            samples.append(await asyncio.to_thread(_worker_gauges, url, headers))
            await asyncio.sleep(0.2)

    async def run() -> Counter[str]:
        sampler = asyncio.create_task(sample())
        try:
            return await _load(fleet, seconds=8, warmup=2)
        finally:
            sampler.cancel()

    done = asyncio.run(run())
    share = done["a"] / (done["a"] + done["b"])
    peak = _worker_gauges(url, headers)["kiln_worker_in_flight_peak"]
    print(f"tenant a's share {share:.3f} of {dict(done)}; worker peak {peak} of its slots")
    assert abs(share - 0.5) <= 0.07, done
    assert done["a!"] + done["b!"] <= 0.02 * (done["a"] + done["b"]) / len(SENTENCES), done
    slots = samples[-1]["kiln_worker_slots"]
    assert slots == SLOTS + 3
    assert max(s["kiln_worker_in_flight"] for s in samples) > 1  # it was under load
    assert all(s["kiln_worker_in_flight"] <= slots for s in samples)
    assert peak <= slots


def test_a_rate_limit_holds_across_the_three_gateways(fleet: list[KilnProcess]) -> None:
    out = fleet[1].cli("quotas", "set", "--tenant", "limited", "--rpm", "30")
    assert "rpm=30" in out
    if time.time() % 60 > 40:  # keep all requests inside one fixed window
        time.sleep(61 - time.time() % 60)
    ok = 0
    for n in range(45):
        kiln = fleet[n % 3]
        try:
            _sdk(kiln, kiln.env["KEY_limited"]).models.list()
            ok += 1
        except openai.RateLimitError:
            pass
    print(f"{ok} of 45 requests answered under rpm=30")
    assert 29 <= ok <= 31, ok


def test_a_gateway_joining_a_serving_fleet_answers_its_first_request_within_3s(
    fleet: list[KilnProcess], kiln_data_dir: Callable[[], Any]
) -> None:
    with kiln_data_dir() as late_dir:
        late = up_gateway(late_dir, fleet[0].env)
        try:
            late.wait_ready()
            sdk = openai.OpenAI(base_url=f"{late.base_url}/v1", api_key=late.key,
                                max_retries=0, timeout=10)  # fmt: skip
            started = time.monotonic()
            out = sdk.embeddings.create(model=MODEL, input=["a late joiner"])
            took = time.monotonic() - started
            print(f"the late gateway's first request took {took:.2f} s")
            assert len(out.data[0].embedding) == 384
            assert took < 3, took  # its first discovery comes within a second (ttl: 5 s)
            assert not late.workers()  # it dispatches to the leader's worker
        finally:
            late.stop()


def test_when_the_leader_dies_another_takes_over_within_5s_and_serves(
    fleet: list[KilnProcess],
) -> None:
    (leader,) = [kiln for kiln in fleet if _leader(kiln)]
    orphans = leader.workers()
    survivors = [kiln for kiln in fleet if kiln is not leader]
    leader.proc.send_signal(signal.SIGKILL)
    leader.proc.wait(timeout=10)
    killed = time.monotonic()
    successor = wait_for(lambda: next((k for k in survivors if _leader(k)), None), timeout=10)
    took = time.monotonic() - killed
    print(f"the pool manager changed hands {took:.2f} s after the SIGKILL")
    assert took < 5, took
    assert [_leader(kiln) for kiln in survivors].count(True) == 1
    _, alive = psutil.wait_procs(orphans, timeout=10)  # its workers exit with it
    assert not alive
    for kiln in survivors:
        kiln.wait_until_serving(MODEL, timeout=60)
    assert successor.workers()
