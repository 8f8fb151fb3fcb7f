"""Quotas in one process: headers, tokens/min, the budget view, per-key overrides, audit."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime
from zoneinfo import ZoneInfo

import pytest

from kiln_platform.admission.services import Admissions
from kiln_platform.batches.lines import LineLedger
from kiln_platform.billing.budgets import Settled, settle
from kiln_platform.billing.ledger import Usage
from kiln_platform.errors import RateLimited
from kiln_platform.keys.services import Principal
from kiln_platform.quotas.enforcer import QuotaGrant
from kiln_platform.scheduler.schemas import Priority

from .conftest import Admin


async def _models(admin: Admin, key: str) -> int:
    r = await admin.client.get("/v1/models", headers={"authorization": f"Bearer {key}"})
    return r.status_code


async def _setup(admin: Admin, root: str, name: str, **limits: object) -> tuple[str, str]:
    tenant = await admin.tenant(root, name)
    r = await admin.call("PUT", f"/admin/v1/quotas/{tenant}", root, json=limits)
    assert r.status_code == 200, r.text
    return tenant, await admin.key(root, tenant)


async def test_rpm_headers_and_429(admin: Admin, root: str) -> None:
    _, key = await _setup(admin, root, "q-rpm", rpm=3)
    got = [
        await admin.client.get("/v1/models", headers={"authorization": f"Bearer {key}"})
        for _ in range(4)
    ]
    assert [r.status_code for r in got] == [200, 200, 200, 429]
    assert [r.headers["x-ratelimit-remaining-requests"] for r in got] == ["2", "1", "0", "0"]
    body = got[-1].json()["error"]
    assert (body["code"], body["type"]) == ("rate_limit_exceeded", "requests")
    assert int(got[-1].headers["retry-after"]) >= 1


async def test_tokens_per_minute(admin: Admin, root: str) -> None:
    _, key = await _setup(admin, root, "q-tpm", tpm=100)
    assert await _models(admin, key) == 200
    kiln = admin.kiln
    principal = await kiln.keys.verify(key)
    kiln.quotas.charge(principal.tenant_id, principal.key_id, 150)
    await kiln.quotas.drain()
    r = await admin.client.get("/v1/models", headers={"authorization": f"Bearer {key}"})
    assert r.status_code == 429
    assert r.json()["error"]["type"] == "tokens"
    assert r.headers["x-ratelimit-limit-tokens"] == "100"
    assert r.headers["x-ratelimit-remaining-tokens"] == "0"


async def test_batch_lines_tokens_are_not_charged_to_tokens_per_minute(
    admin: Admin, root: str
) -> None:
    _, key = await _setup(admin, root, "q-tpm-batch", tpm=100)
    assert await _models(admin, key) == 200
    kiln = admin.kiln
    principal = await kiln.keys.verify(key)
    line = Admissions(kiln.quotas, kiln.budgets, LineLedger(False)).open({"request_id": "b_1"})
    line.run_for(principal, 10.0)  # what a batch line's admission is entered with
    usage = Usage("b_1", principal.tenant_id, principal.key_id, "m", "1", "/v1/embeddings", 200,
                  input_tokens=150)  # fmt: skip
    async with line:
        line.record(usage)
    await kiln.quotas.drain()
    assert await _models(admin, key) == 200  # 150 tokens of a batch line: not its tokens/min


async def test_a_clients_batch_class_request_is_charged_to_tokens_per_minute(
    admin: Admin, root: str
) -> None:
    """``x-kiln-priority: batch`` (or ``service_tier: flex``) lowers a request's class; it must
    not take its tokens out of the tenant's tokens/min, as a batch line's are."""
    _, key = await _setup(admin, root, "q-tpm-flex", tpm=100)
    kiln = admin.kiln
    principal = await kiln.keys.verify(key)
    online = Admissions(kiln.quotas, kiln.budgets, LineLedger(False)).open({"request_id": "f_1"})
    async with online:
        await online.enter(principal)
        online.schedule(Priority.BATCH, 10.0)
        online.record(Usage("f_1", principal.tenant_id, principal.key_id, "m", "1",
                            "/v1/chat/completions", 200, input_tokens=150))  # fmt: skip
    await kiln.quotas.drain()
    assert await _models(admin, key) == 429


class _Sink:
    """A ledger that keeps what it is given, as given."""

    enabled = False

    def __init__(self) -> None:
        self.usages: list[Usage] = []

    def record(self, usage: Usage) -> None:
        self.usages.append(usage)

    async def commit(self, usage: Usage) -> None:
        self.record(usage)


async def test_service_tier_flex_is_the_batch_class_priced_as_a_batch_line(
    admin: Admin, root: str
) -> None:
    _, key = await _setup(admin, root, "q-flex")
    principal = await admin.kiln.keys.verify(key)
    sink = _Sink()
    desk = Admissions(admin.kiln.quotas, admin.kiln.budgets, sink)
    served = []
    for header, tier in ((Priority.INTERACTIVE, None), (Priority.BATCH, "auto"),
                         (Priority.INTERACTIVE, "flex"), (Priority.BATCH, "default"),
                         (Priority.BATCH, "priority")):  # fmt: skip
        async with desk.open({"request_id": f"t_{tier}"}) as online:
            await online.enter(principal)
            online.schedule(header, 10.0)  # as x-kiln-priority set it
            online.serve_as(tier)
            served.append((online.terms.priority, online.service_tier))
            online.record(Usage(online.request_id, principal.tenant_id, principal.key_id, "m",
                                "1", "/v1/chat/completions", 200))  # fmt: skip
    assert served == [(Priority.INTERACTIVE, "default"), (Priority.BATCH, "flex"),
                      (Priority.BATCH, "flex"), (Priority.INTERACTIVE, "default"),
                      (Priority.INTERACTIVE, "default")]  # fmt: skip
    assert [u.batch for u in sink.usages] == [False, True, True, False, False]
    async with desk.open({"request_id": "b_2"}) as line:
        line.run_for(principal, 10.0)
        line.serve_as("default")  # a batch line's body cannot take it out of the batch class
        assert (line.terms.priority, line.service_tier) == (Priority.BATCH, "flex")


async def test_budget_view_alerts_and_tenant_zone(admin: Admin, root: str) -> None:
    limits = {"monthly_budget_micros": 1000, "budget_alert_percents": [60, 10, 60]}
    tenant, _ = await _setup(admin, root, "q-budget", **limits)
    view = (await admin.call("GET", f"/admin/v1/quotas/{tenant}", root)).json()
    assert view["limits"]["budget_alert_percents"] == [10, 60]
    r = await admin.call("PATCH", f"/admin/v1/tenants/{tenant}", root,
                         json={"timezone": "Mars/Olympus_Mons"})  # fmt: skip
    assert r.status_code == 400
    assert "'timezone'" in r.json()["detail"]
    r = await admin.call("PATCH", f"/admin/v1/tenants/{tenant}", root,
                         json={"timezone": "Pacific/Auckland", "plan": "enterprise"})  # fmt: skip
    assert r.status_code == 200, r.text
    assert (r.json()["timezone"], r.json()["plan"]) == ("Pacific/Auckland", "enterprise")
    now = datetime.now(UTC)
    async with admin.kiln.db.sessions.begin() as session:  # what the ledger does per request
        await settle(session, [Settled("req_q1", uuid.UUID(tenant), "Pacific/Auckland", 700, now)])
    budget = (await admin.call("GET", f"/admin/v1/quotas/{tenant}", root)).json()["budget"]
    assert budget["period"] == str(
        now.astimezone(ZoneInfo("Pacific/Auckland")).date().replace(day=1)
    )
    assert (budget["spent_micros"], budget["reserved_micros"], budget["limit_micros"]) == (
        700, 0, 1000,
    )  # fmt: skip
    assert [(e["threshold_percent"], e["spent_micros"]) for e in budget["events"]] == [
        (10, 700), (60, 700),
    ]  # fmt: skip
    key = (await admin.call("POST", f"/admin/v1/tenants/{tenant}/keys", root, json={})).json()
    r = await admin.call("PUT", f"/admin/v1/quotas/{tenant}/keys/{key['key']['id']}", root,
                         json={"budget_alert_percents": [50]})  # fmt: skip
    assert r.status_code == 400


async def test_per_key_override(admin: Admin, root: str) -> None:
    tenant, key = await _setup(admin, root, "q-key", rpm=1000)
    special = (await admin.call("POST", f"/admin/v1/tenants/{tenant}/keys", root, json={})).json()
    r = await admin.call(
        "PUT", f"/admin/v1/quotas/{tenant}/keys/{special['key']['id']}", root, json={"rpm": 1}
    )
    assert r.status_code == 200
    assert [await _models(admin, special["secret"]) for _ in range(2)] == [200, 429]
    assert [await _models(admin, key) for _ in range(2)] == [200, 200]
    other = str(uuid.uuid4())
    r = await admin.call("PUT", f"/admin/v1/quotas/{tenant}/keys/{other}", root, json={"rpm": 1})
    assert r.status_code == 404


async def test_concurrency_lease_is_released(admin: Admin, root: str) -> None:
    _, key = await _setup(admin, root, "q-conc", concurrency=2)
    statuses = await asyncio.gather(*(_models(admin, key) for _ in range(6)))
    assert 200 in statuses
    assert set(statuses) <= {200, 429}
    assert [await _models(admin, key) for _ in range(3)] == [200, 200, 200]  # leases released


async def test_tokens_per_minute_counts_oauth_callers_too(admin: Admin, root: str) -> None:
    tenant, _ = await _setup(admin, root, "q-tpm-oauth", tpm=100)
    quotas = admin.kiln.quotas
    client = Principal(uuid.UUID(tenant), None, frozenset({"inference"}), name="oauth:c1")
    await quotas.admit(client, QuotaGrant())  # caches the tenant's limits for this caller
    quotas.charge(client.tenant_id, client.key_id, 150)
    await quotas.drain()
    refused = QuotaGrant()
    with pytest.raises(RateLimited):
        await quotas.admit(client, refused)
    assert refused.headers["x-ratelimit-remaining-tokens"] == "0"


async def test_batch_limits_are_set_and_shown_per_tenant_and_key(admin: Admin, root: str) -> None:
    tenant, _ = await _setup(admin, root, "q-batch", batch_tokens_per_day=2_000_000_000_000,
                             batch_enqueued_tokens=90_000)  # fmt: skip
    key = (await admin.call("POST", f"/admin/v1/tenants/{tenant}/keys", root, json={})).json()
    r = await admin.call("PUT", f"/admin/v1/quotas/{tenant}/keys/{key['key']['id']}", root,
                         json={"batch_enqueued_tokens": 1000})  # fmt: skip
    assert r.status_code == 200, r.text
    view = (await admin.call("GET", f"/admin/v1/quotas/{tenant}", root)).json()
    assert view["limits"]["batch_tokens_per_day"] == 2_000_000_000_000  # past a 32-bit column
    assert view["limits"]["batch_enqueued_tokens"] == 90_000
    (override,) = view["keys"]
    assert override["limits"]["batch_enqueued_tokens"] == 1000
    assert override["limits"]["batch_tokens_per_day"] is None
    r = await admin.call("PUT", f"/admin/v1/quotas/{tenant}", root,
                         json={"batch_enqueued_tokens": 0})  # fmt: skip
    assert r.status_code == 400
