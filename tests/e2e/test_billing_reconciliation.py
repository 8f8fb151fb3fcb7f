"""Reconciliation: a real ``kiln up`` serving both bundled models, a price book with a plan
discount, and a mixed workload through the official ``openai`` SDK (embeddings, chat, streams,
streams the client cuts, errors, idempotent replays, an adjustment). The finance report's total
equals the ledger's to the micro-unit, and every request is in the ledger exactly once."""

from __future__ import annotations

import asyncio
import csv
import io
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam
from sqlalchemy import func, select

from kiln_platform.billing.tables import UsageCharge
from kiln_platform.db.database import open_database
from kiln_platform.db.tables import UsageEvent
from kiln_platform.settings import Settings

from .conftest import MINILM, SMOLLM2, KilnProcess

CHAT: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Name a colour."}]
LONG: list[ChatCompletionMessageParam] = [
    {"role": "user", "content": "Tell me a very long story about dragons and castles."}
]
PRICES = [
    {"model": MINILM, "unit": "input_token", "unit_price_micros": "0.35"},
    {"model": MINILM, "unit": "request", "unit_price_micros": "3"},
    {"model": SMOLLM2, "unit": "input_token", "unit_price_micros": "0.15"},
    {"model": SMOLLM2, "unit": "output_token", "unit_price_micros": "0.6"},
    {"model": "*", "unit": "compute_second", "unit_price_micros": "137.5"},
]


@pytest.fixture(scope="module")
def kiln(both_models: Callable[..., AbstractContextManager[KilnProcess]]) -> Iterator[KilnProcess]:
    with both_models({"KILN_KEY_CACHE_TTL_S": "0.5"}) as kiln:
        kiln.cli("tenants", "create", "ops")
        root = kiln.cli("keys", "create", "--tenant", "ops", "--scope", "admin:write",
                        "--role", "platform-admin")  # fmt: skip
        kiln.env["ROOT_KEY"] = root.strip().splitlines()[-1]
        for tenant, env in (("warm-up", "TEST_KEY"), ("recon", "RECON_KEY")):
            kiln.cli("tenants", "create", tenant)
            made = kiln.cli("keys", "create", "--tenant", tenant)
            kiln.env[env] = made.strip().splitlines()[-1]
        kiln.wait_until_serving(MINILM)  # as "warm-up": the ledger of "recon" starts empty
        kiln.wait_until_serving(SMOLLM2, path="completions")
        yield kiln


def _admin(kiln: KilnProcess, method: str, path: str, **kw: Any) -> httpx.Response:
    headers = {"authorization": f"Bearer {kiln.env['ROOT_KEY']}"}
    return httpx.request(method, f"{kiln.base_url}{path}", headers=headers, timeout=30, **kw)


Ledger = tuple[dict[str, tuple[int, int, int, int]], int, int]


def _ledger(kiln: KilnProcess, tenant: str) -> Ledger:
    """(request id -> (rows, cost, status, output tokens)), summed event cost, summed line cost."""

    async def read() -> Ledger:
        settings = Settings(data_dir=Path(kiln.env["KILN_DATA_DIR"]))
        async with open_database(settings, upgrade=False) as db, db.sessions() as s:
            tid = uuid.UUID(tenant)
            rows = await s.execute(
                select(UsageEvent.request_id, func.count(), func.sum(UsageEvent.cost_micros),
                       func.max(UsageEvent.status), func.max(UsageEvent.output_tokens))
                .where(UsageEvent.tenant_id == tid).group_by(UsageEvent.request_id)
            )  # fmt: skip
            events = await s.scalar(
                select(func.sum(UsageEvent.cost_micros)).where(UsageEvent.tenant_id == tid)
            )
            lines = await s.scalar(
                select(func.sum(UsageCharge.cost_micros)).where(UsageCharge.tenant_id == tid)
            )
            seen = {rid: (n, int(cost), status, out) for rid, n, cost, status, out in rows}
            return seen, int(events or 0), int(lines or 0)

    return asyncio.run(read())


def _workload(client: openai.OpenAI) -> tuple[list[str], list[str], list[str]]:
    """Run the mix; returns the request ids that must be metered, of cut streams, of errors."""
    metered: list[str] = []
    cuts: list[str] = []
    for inputs in (["a cat sits on the mat"], ["one", "two", "three " * 40]):
        raw = client.embeddings.with_raw_response.create(model=MINILM, input=inputs)
        metered.append(raw.headers["x-request-id"])
    for seed in (1, 2):
        chat = client.chat.completions.with_raw_response.create(
            model=SMOLLM2, messages=CHAT, max_tokens=8, seed=seed
        )
        usage = chat.parse().usage
        assert usage is not None
        assert usage.completion_tokens > 0
        metered.append(chat.headers["x-request-id"])
    stream = client.chat.completions.with_raw_response.create(
        model=SMOLLM2, messages=CHAT, max_tokens=12, stream=True,
        stream_options={"include_usage": True},
    )  # fmt: skip
    chunks = list(stream.parse())
    assert chunks[-1].usage is not None
    metered.append(stream.headers["x-request-id"])
    for _ in range(2):  # streams cut by the client after a few chunks
        with client.chat.completions.with_streaming_response.create(
            model=SMOLLM2, messages=LONG, max_tokens=300, stream=True
        ) as cut:
            cuts.append(cut.headers["x-request-id"])
            for n, _line in enumerate(cut.iter_lines()):
                if n >= 6:
                    break
    for create, body in (
        (client.embeddings.with_raw_response.create, {"model": MINILM, "input": ["replayed"]}),
        (client.chat.completions.with_raw_response.create,
         {"model": SMOLLM2, "messages": CHAT, "max_tokens": 6, "seed": 3}),
    ):  # fmt: skip
        key = f"recon-{uuid.uuid4()}"
        first = create(**body, extra_headers={"Idempotency-Key": key})
        again = create(**body, extra_headers={"Idempotency-Key": key})
        assert again.headers["idempotent-replayed"] == "true"
        assert again.http_response.content == first.http_response.content
        metered.append(first.headers["x-request-id"])
    errors: list[str] = []
    for call in (
        lambda: client.embeddings.create(model="no-such-model", input=["x"]),
        lambda: client.chat.completions.create(model=SMOLLM2, messages=CHAT, n=20),
        lambda: client.chat.completions.create(model=SMOLLM2, messages=CHAT, max_tokens=10**6),
    ):
        with pytest.raises(openai.APIStatusError) as failed:
            call()
        assert 400 <= failed.value.status_code < 500
        errors.append(failed.value.response.headers["x-request-id"])
    return metered + cuts, cuts, errors


def test_report_equals_ledger_to_the_micro_unit(kiln: KilnProcess) -> None:
    start = datetime.now(UTC) - timedelta(minutes=1)
    r = _admin(kiln, "POST", "/admin/v1/price-books", json={
        "prices": PRICES, "effective_from": start.isoformat(), "discounts": {"standard": 1250},
    })  # fmt: skip
    assert r.status_code == 201, r.text
    time.sleep(1.5)  # every cache (keys, price books) has expired
    tenants = _admin(kiln, "GET", "/admin/v1/tenants").json()
    tenant = next(t["id"] for t in tenants if t["name"] == "recon")
    key = kiln.env["RECON_KEY"]
    client = openai.OpenAI(base_url=f"{kiln.base_url}/v1", api_key=key, max_retries=0)
    metered, cuts, errors = _workload(client)
    body = {"amount_micros": -1234, "reason": "goodwill", "corrects_period": "2026-01"}
    r = _admin(kiln, "POST", f"/admin/v1/tenants/{tenant}/adjustments", json=body)
    assert r.status_code == 201, r.text
    adjustment = r.json()["request_id"]
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        seen, events, lines = _ledger(kiln, tenant)
        if set(metered) <= set(seen):
            break
        time.sleep(0.5)
    time.sleep(1.0)  # a late duplicate would show up now
    seen, events, lines = _ledger(kiln, tenant)
    assert {rid: seen[rid][0] for rid in metered if rid in seen} == dict.fromkeys(metered, 1)
    assert set(seen) <= set(metered) | set(errors), "rows for requests nobody made"
    assert all(seen.get(rid, (1, 0))[:2] == (1, 0) for rid in errors)  # unbilled, if recorded
    assert all(seen[rid][1] > 0 for rid in metered)  # cut streams too: what was generated
    # cut streams are recorded as cut (499) with what was generated before the cut, not 300
    assert all(seen[rid][2] == 499 and 0 < seen[rid][3] < 300 for rid in cuts)
    assert lines == events - 1234  # charge lines = the events' costs, plus the adjustment
    end = (datetime.now(UTC) + timedelta(minutes=1)).isoformat()
    params = {"from": start.isoformat(), "to": end, "tenant_id": tenant,
              "group_by": "tenant,model,version,key,day"}  # fmt: skip
    report = _admin(kiln, "GET", "/admin/v1/reports/costs", params=params).json()
    [total] = report["totals"]
    assert total["x_BilledCostMicros"] == events - 1234
    assert total["x_ListCostMicros"] > total["x_BilledCostMicros"]  # the plan's discount
    assert {row["ChargeCategory"] for row in report["rows"]} == {"Usage", "Adjustment"}
    assert {row["x_Model"] for row in report["rows"]} >= {MINILM, SMOLLM2}
    per_line = _admin(kiln, "GET", "/admin/v1/reports/costs",
                      params={**params, "group_by": "request", "format": "csv"})  # fmt: skip
    rows = list(csv.DictReader(io.StringIO(per_line.text)))
    assert {row["x_RequestId"] for row in rows} <= set(seen) | {adjustment}
    assert sum(int(row["x_BilledCostMicros"]) for row in rows) == events - 1234
