"""The batch runner in the real app on a real PostgreSQL with a real all-MiniLM-L6-v2 worker,
driven with the official openai SDK: a batch whose completion window ends mid-run expires
with its finished lines kept and the rest as ``batch_expired`` error lines; a batch whose API
key or OAuth client is revoked starts no more lines; the runner's Prometheus series count
both; and a line is priced with the price book's batch discount, an online request without
it."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import timedelta
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import openai
import pytest
from prometheus_client import REGISTRY
from sqlalchemy import func, select, update

from kiln_platform.batches import files
from kiln_platform.batches.tables import StoredFile
from kiln_platform.billing.pricing import micros
from kiln_platform.context import Kiln
from kiln_platform.db.tables import UsageEvent
from kiln_platform.keys.services import revoke_key
from kiln_platform.oauth.schemas import ClientCreate
from kiln_platform.oauth.services import create_client, revoke_client
from tests.asgi import asgi
from tests.e2e.conftest import MINILM
from tests.factories import CLI, make_key, make_tenant

from .support import BATCH_BPS, finished, line_texts, minilm_app, sdk, settings_for, submit, warm

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncSession

WINDOW_S = 5.0
"""The module's ``KILN_BATCH_WINDOW_S``: every batch here must finish within it, but one."""


@pytest.fixture(scope="module")
async def app(
    database_uri: str, model_cache: Path, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Any]:
    """The app serving MiniLM (its worker up), with a tenant and an inference key."""
    settings = settings_for(
        tmp_path_factory, database_uri, "batches-secret", batch_window_s=WINDOW_S,
        batch_concurrency=1,
        batch_record_s=0.0,  # a cancel's count is exact: no finished line waits for its group
        batch_twin=False,  # lines race a 5 s window: no twin starting meanwhile (test_twin.py)
    )  # fmt: skip
    async with minilm_app(settings, model_cache) as made:
        async with made.state.kiln.db.sessions.begin() as session:
            tenant = await make_tenant(session)
            key = await make_key(session, settings.hmac_key(), tenant)
        made.state.key, made.state.tenant = key, tenant
        yield made


@pytest.fixture(scope="module")
async def client(app: Any) -> AsyncIterator[openai.AsyncOpenAI]:
    """The SDK on the app in-process, once MiniLM answers."""
    http = httpx.AsyncClient(transport=httpx.ASGITransport(app=asgi(app)), timeout=60)
    client = sdk(http, app.state.key.secret)
    await warm(client)
    yield client
    await http.aclose()


def _sample(name: str, **labels: str) -> float:
    """A sample of the process's Prometheus registry (what ``/metrics`` serves), 0 if none."""
    return REGISTRY.get_sample_value(name, labels) or 0.0


async def _billed(app: Any, batch_id: str) -> int:
    """The batch's usage rows."""
    kiln: Kiln = app.state.kiln
    async with kiln.db.sessions() as session:
        billed = await session.scalar(
            select(func.count()).where(UsageEvent.request_id.like(f"{batch_id}_%"))
        )
    return int(billed or 0)


async def _lines(client: openai.AsyncOpenAI, file_id: str | None) -> list[dict[str, Any]]:
    if file_id is None:
        return []
    text = (await client.files.content(file_id)).text
    return [json.loads(line) for line in text.splitlines()]


async def test_an_expired_batch_keeps_its_finished_lines(
    app: Any, client: openai.AsyncOpenAI
) -> None:
    ended, expired = (
        _sample("kiln_batches_ended_total", status="expired"),
        _sample("kiln_batch_lines_total", outcome="expired"),
    )
    total = 400  # far more than one worker thread embeds in WINDOW_S
    batch = await submit(client, [{"model": MINILM, "input": line_texts(16)}] * total)
    done = await finished(client, batch.id)
    counts = done.request_counts
    assert (done.status, counts.total) == ("expired", total)
    assert done.expired_at is not None
    assert 1 <= counts.completed < total
    assert counts.completed + counts.failed == total
    output = await _lines(client, done.output_file_id)
    errors = await _lines(client, done.error_file_id)
    assert len(output) == counts.completed
    assert {o["response"]["status_code"] for o in output} == {200}
    assert len(errors) == counts.failed
    assert all(e["response"] is None for e in errors)
    assert {e["error"]["code"] for e in errors} == {"batch_expired"}
    ids = [o["custom_id"] for o in output + errors]
    assert sorted(ids) == sorted(f"r{i}" for i in range(total))
    assert await _billed(app, batch.id) == counts.completed  # expired lines: nothing billed
    assert _sample("kiln_batches_ended_total", status="expired") == ended + 1
    assert _sample("kiln_batch_lines_total", outcome="expired") == expired + counts.failed


async def test_a_revoked_key_starts_no_more_lines(app: Any, client: openai.AsyncOpenAI) -> None:
    kiln: Kiln = app.state.kiln
    async with kiln.db.sessions.begin() as session:
        made = await make_key(session, kiln.settings.hmac_key(), app.state.tenant, name="revoked")

    async def revoke(session: AsyncSession) -> None:
        await revoke_key(session, CLI, str(made.key.id), kiln.settings.hmac_key(), None)

    await _revoked_mid_batch(app, client, client.with_options(api_key=made.secret), revoke,
                             "api_key_revoked")  # fmt: skip


async def test_a_revoked_oauth_client_starts_no_more_lines(
    app: Any, client: openai.AsyncOpenAI
) -> None:
    """A batch created with a client-credentials token runs as its client: revoking the client
    (not just the token) stops it like a revoked key."""
    kiln: Kiln = app.state.kiln
    data = ClientCreate(name="batches", scopes=["inference"])
    async with kiln.db.sessions.begin() as session:
        made = await create_client(session, CLI, app.state.tenant, data, kiln.settings.hmac_key())
    http = httpx.AsyncClient(transport=httpx.ASGITransport(app=asgi(app)))
    async with http:  # authlib takes plain http on loopback only
        r = await http.post(
            "http://127.0.0.1/oauth/token",
            data={"grant_type": "client_credentials"},
            auth=(made.client.client_id, made.client_secret),
        )
    sdk = client.with_options(api_key=r.raise_for_status().json()["access_token"])

    async def revoke(session: AsyncSession) -> None:
        await revoke_client(session, CLI, app.state.tenant, made.client.id)

    await _revoked_mid_batch(app, client, sdk, revoke, "oauth_client_revoked")


async def _revoked_mid_batch(
    app: Any, client: openai.AsyncOpenAI, sdk: openai.AsyncOpenAI,
    revoke: Callable[[AsyncSession], Awaitable[None]], code: str,
) -> None:  # fmt: skip
    """A batch ``sdk`` creates is revoked (``revoke``) after 2 lines: it completes, its other
    lines are ``code`` error lines, unbilled; the runner's series count the lines it ran."""
    kiln: Kiln = app.state.kiln
    ok, latencies = (
        _sample("kiln_batch_lines_total", outcome="ok"),
        _sample("kiln_batch_line_duration_seconds_count"),
    )
    total = 60
    batch = await submit(sdk, [{"model": MINILM, "input": line_texts(8)}] * total)
    deadline = time.monotonic() + WINDOW_S
    while (await client.batches.retrieve(batch.id)).request_counts.completed < 2:  # type: ignore[union-attr]
        assert time.monotonic() < deadline, "no line done"
        await asyncio.sleep(0.05)
    while _sample("kiln_batches_open", status="in_progress") < 1:  # refreshed every poll
        assert time.monotonic() < deadline + 1, "kiln_batches_open never counted the batch"
        await asyncio.sleep(0.05)
    async with kiln.db.sessions.begin() as session:
        await revoke(session)
    done = await finished(client, batch.id)
    counts = done.request_counts
    assert (done.status, counts.total) == ("completed", total)
    assert 2 <= counts.completed < total
    errors = await _lines(client, done.error_file_id)
    assert len(errors) == counts.failed == total - counts.completed
    assert {e["error"]["code"] for e in errors} == {code}
    assert "revoked" in errors[0]["error"]["message"]
    assert await _billed(app, batch.id) == counts.completed
    assert _sample("kiln_batch_lines_total", outcome="ok") == ok + counts.completed
    assert _sample("kiln_batch_line_duration_seconds_count") == latencies + counts.completed


async def test_a_line_is_priced_with_the_batch_discount(
    app: Any, client: openai.AsyncOpenAI
) -> None:
    texts = line_texts(2)
    online = await client.embeddings.with_raw_response.create(model=MINILM, input=texts)
    batch = await submit(client, [{"model": MINILM, "input": texts}] * 3)
    done = await finished(client, batch.id)
    assert (done.status, done.request_counts.completed) == ("completed", 3)
    kiln: Kiln = app.state.kiln
    async with kiln.db.sessions() as session:
        rows = (await session.execute(
            select(UsageEvent.request_id, UsageEvent.list_cost_micros, UsageEvent.cost_micros)
            .where(UsageEvent.request_id.like(f"{done.id}_%")
                   | (UsageEvent.request_id == online.headers["x-request-id"]))
        )).all()  # fmt: skip
    costs = {rid.startswith(done.id): (listed, cost) for rid, listed, cost in rows}
    assert len(rows) == 4
    listed, cost = costs[False]  # online: the list price (no plan discount here)
    assert listed > 0
    assert cost == listed
    assert costs[True] == (listed, micros(Decimal(listed) * (10_000 - BATCH_BPS) / 10_000))


async def test_a_cancel_stops_new_lines_at_once(app: Any, client: openai.AsyncOpenAI) -> None:
    """The gateway that takes the cancel holds the batch: no line starts after the cancel
    returns, though the runner reads the batch's status only every poll (0.2 s here, in which
    dozens of these lines would start)."""
    total = 300
    batch = await submit(client, [{"model": MINILM, "input": line_texts(1)}] * total)
    deadline = time.monotonic() + 30
    while (await client.batches.retrieve(batch.id)).request_counts.completed < 3:  # type: ignore[union-attr]
        assert time.monotonic() < deadline, "no line done"
        await asyncio.sleep(0.01)
    cancelling = await client.batches.cancel(batch.id)
    at_cancel = cancelling.request_counts.completed  # type: ignore[union-attr]
    done = await finished(client, batch.id)
    assert done.status == "cancelled"
    # the line in flight, and those that ran before the cancel, waiting for their group's write
    assert at_cancel <= done.request_counts.completed <= at_cancel + 3


async def test_files_expire_when_asked_and_the_prune_deletes_them(
    app: Any, client: openai.AsyncOpenAI
) -> None:
    """OpenAI's ``expires_after`` (an upload's) and ``output_expires_after`` (a batch's files):
    the file says when; past it, it reads as gone (404, not listed) and ``prune`` deletes its
    row and its bytes. Seconds out of OpenAI's range are a 400 naming the field."""
    kiln: Kiln = app.state.kiln
    hour: Any = {"anchor": "created_at", "seconds": 3600}
    body = {"model": MINILM, "input": "an expiring line"}
    data = json.dumps({"custom_id": "a", "method": "POST", "url": "/v1/embeddings", "body": body})
    kept = await client.files.create(file=("a.jsonl", data.encode()), purpose="batch",
                                     expires_after=hour)  # fmt: skip
    assert kept.expires_at is not None
    assert abs(kept.expires_at - kept.created_at - 3600) <= 1
    plain = await client.files.create(file=("b.jsonl", f"{data}\n".encode()), purpose="batch")
    assert plain.expires_at is not None  # OpenAI's default for batch files: 30 days
    assert abs(plain.expires_at - plain.created_at - 30 * 86400) <= 1
    bads: list[Any] = [
        {"anchor": "created_at", "seconds": 60},
        {"anchor": "last_active_at", "seconds": 3600},
    ]
    for bad in bads:
        with pytest.raises(openai.BadRequestError) as err:
            await client.files.create(file=("c.jsonl", data.encode()), purpose="batch",
                                      expires_after=bad)  # fmt: skip
        assert str(err.value.body["param"]).startswith("expires_after")  # type: ignore[index]
    with pytest.raises(openai.BadRequestError) as err:
        await submit(client, [{"model": MINILM, "input": "x"}],
                     output_expires_after={"anchor": "created_at", "seconds": 10**8})  # fmt: skip
    assert err.value.body["param"] == "output_expires_after.seconds"  # type: ignore[index]
    batch = await submit(client, [{"model": MINILM, "input": "x"}], output_expires_after=hour)
    done = await finished(client, batch.id)
    output = await client.files.retrieve(done.output_file_id)
    assert output.expires_at is not None
    assert abs(output.expires_at - output.created_at - 3600) <= 1

    hourly = [_uuid(kept.id), _uuid(output.id)]
    async with kiln.db.sessions.begin() as session:  # an hour on
        await session.execute(
            update(StoredFile).where(StoredFile.id.in_(hourly))
            .values(expires_at=func.now() - timedelta(seconds=1))
        )  # fmt: skip
        digest = await session.scalar(
            select(StoredFile.digest).where(StoredFile.id == _uuid(kept.id))
        )
    assert digest is not None
    with pytest.raises(openai.NotFoundError):
        await client.files.retrieve(kept.id)
    with pytest.raises(openai.NotFoundError):
        await client.files.content(output.id)
    newest = [f.id async for f in client.files.list(limit=2)]  # pages of two
    assert plain.id in newest
    assert not {kept.id, output.id} & set(newest)
    assert [f.id async for f in client.files.list(order="asc", limit=2)] == newest[::-1]
    assert await files.prune(kiln) >= 2
    async with kiln.db.sessions() as session:
        left = await session.scalar(
            select(func.count()).select_from(StoredFile).where(StoredFile.id.in_(hourly))
        )  # fmt: skip
    assert left == 0
    assert not kiln.store.blob(digest).exists()  # "b.jsonl" differs by a byte: its own bytes
    assert (await client.files.retrieve(plain.id)).id == plain.id


async def test_an_open_batchs_input_outlives_its_expiry(
    app: Any, client: openai.AsyncOpenAI
) -> None:
    """The prune keeps an expired file an open batch reads its lines from (it reads as gone
    to the API at once), and deletes it once the batch ended."""
    kiln: Kiln = app.state.kiln
    batch = await submit(client, [{"model": MINILM, "input": line_texts(1)}] * 300)
    expire = update(StoredFile).where(StoredFile.id == _uuid(batch.input_file_id))
    async with kiln.db.sessions.begin() as session:
        await session.execute(expire.values(expires_at=func.now() - timedelta(seconds=1)))
    assert await files.prune(kiln) == 0
    with pytest.raises(openai.NotFoundError):
        await client.files.retrieve(batch.input_file_id)
    await client.batches.cancel(batch.id)
    assert (await finished(client, batch.id)).status == "cancelled"
    assert await files.prune(kiln) == 1


async def test_removing_bytes_waits_for_a_file_being_added_with_them(
    app: Any, client: openai.AsyncOpenAI, tmp_path: Path
) -> None:
    """Files with the same bytes share a blob. A delete of one, while another with the same
    bytes is being added (its bytes adopted, its row not yet committed), waits for the add
    and keeps the bytes; the new file reads whole."""
    kiln: Kiln = app.state.kiln
    line = {"custom_id": "s", "method": "POST", "url": "/v1/embeddings",
            "body": {"model": MINILM, "input": "shared bytes"}}  # fmt: skip
    data = (json.dumps(line) + "\n").encode()
    first = await client.files.create(file=("a.jsonl", data), purpose="batch")
    async with kiln.db.sessions() as session:
        row = await session.get(StoredFile, _uuid(first.id))
    assert row is not None
    copy = tmp_path / "copy"
    copy.write_bytes(data)
    twin = StoredFile(tenant_id=row.tenant_id, filename="b.jsonl", purpose="batch",
                      bytes=len(data), lines=1, digest=row.digest)  # fmt: skip
    async with kiln.db.sessions.begin() as session:
        await files.add(kiln, session, twin, copy)
        deleting = asyncio.create_task(client.files.delete(first.id))
        await asyncio.sleep(0.5)
        assert not deleting.done()  # the row is gone; its bytes wait for this transaction
    assert (await deleting).deleted
    assert kiln.store.blob(row.digest).read_bytes() == data
    assert (await client.files.content(f"file-{twin.id.hex}")).content == data


def _uuid(public: str) -> uuid.UUID:
    return uuid.UUID(hex=public.split("-", 1)[1])
