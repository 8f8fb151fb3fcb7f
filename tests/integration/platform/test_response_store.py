"""Stored responses in PostgreSQL: a tenant reads only its own, sealed at rest (a sealed value
moved to another row does not open); an expired one is gone (and dropped when the tenant stores
the next), a deleted one is gone, and one the database refuses is answered anyway, marked not
stored."""

from __future__ import annotations

import asyncio
import uuid
from types import SimpleNamespace
from typing import Any

import pytest
from cryptography.exceptions import InvalidTag
from prometheus_client import REGISTRY
from sqlalchemy import select, update

from kiln_platform.db.database import Database
from kiln_platform.errors import NotFound
from kiln_platform.gateway import responses
from kiln_platform.gateway.response_store import ResponseStore, StoredResponse
from kiln_platform.gateway.responses_schemas import (
    OutputMessage,
    OutputText,
    ResponseObject,
    ResponsesRequest,
)
from tests.factories import make_tenant

SECRET = b"a server secret for tests"


def _response(ident: str) -> ResponseObject:
    said = OutputMessage(id=f"msg-{ident}", status="completed", content=[OutputText(text="Red.")])
    return ResponseObject(
        id=ident, created_at=0, model="m", status="completed", output=[said], instructions=None,
        max_output_tokens=None, temperature=1.0, top_p=1.0, usage=None, user=None, metadata={},
    )  # fmt: skip


def _store(db: Database, ttl_days: float = 30) -> ResponseStore:
    return ResponseStore(db.sessions, SECRET, ttl_days)


async def test_a_tenant_reads_its_own_sealed_and_goes_on_from_it(db: Database) -> None:
    async with db.sessions.begin() as session:
        owner, other = await make_tenant(session), await make_tenant(session)
    store = _store(db)
    asked = [{"type": "message", "role": "user", "content": "A colour for Zanzibar?"}]
    await store.save(owner, _response("resp-own"), asked)
    body = await store.fetch(owner, "resp-own")
    assert body["output"][0]["id"] == "msg-resp-own"
    history = await store.conversation(owner, "resp-own")
    said = [(h["type"], h["role"]) for h in history]
    assert said == [("message", "user"), ("message", "assistant")]
    for call in (store.fetch, store.remove, store.conversation):
        with pytest.raises(NotFound):
            await call(other, "resp-own")
    async with db.sessions.begin() as session:  # the platform's scope: every tenant's rows
        sealed = await session.scalar(select(StoredResponse.sealed))
    assert sealed is not None
    assert b"Zanzibar" not in sealed
    assert b"Red." not in sealed
    assert (await store.remove(owner, "resp-own"))["deleted"] is True
    with pytest.raises(NotFound) as gone:
        await store.conversation(owner, "resp-own")
    assert gone.value.param == "previous_response_id"


async def test_a_sealed_response_moved_to_another_row_does_not_open(db: Database) -> None:
    async with db.sessions.begin() as session:
        tenant = await make_tenant(session)
    store = _store(db)
    await store.save(tenant, _response("resp-a"), [])
    await store.save(tenant, _response("resp-b"), [])
    async with db.sessions.begin() as session:
        moved = await session.scalar(
            select(StoredResponse.sealed).where(StoredResponse.id == "resp-a")
        )
        await session.execute(
            update(StoredResponse).where(StoredResponse.id == "resp-b").values(sealed=moved)
        )
    with pytest.raises(InvalidTag):
        await store.fetch(tenant, "resp-b")
    assert (await store.fetch(tenant, "resp-a"))["id"] == "resp-a"


async def test_an_expired_response_is_gone_and_dropped_by_the_next_save(db: Database) -> None:
    async with db.sessions.begin() as session:
        tenant = await make_tenant(session)
    await _store(db, 0.1 / 86_400).save(tenant, _response("resp-old"), [])
    await asyncio.sleep(0.2)
    with pytest.raises(NotFound):
        await _store(db).fetch(tenant, "resp-old")
    await _store(db).save(tenant, _response("resp-new"), [])
    async with db.sessions.begin() as session:  # the platform's scope: every tenant's rows
        kept = await session.scalars(
            select(StoredResponse.id).where(StoredResponse.tenant_id == tenant)
        )
        assert list(kept) == ["resp-new"]


async def test_input_items_are_listed_in_pages_with_ids(db: Database) -> None:
    async with db.sessions.begin() as session:
        tenant = await make_tenant(session)
    store = _store(db)
    asked: list[dict[str, Any]] = [
        {"type": "message", "role": "user", "content": f"Question {i}?", "call_id": None}
        for i in range(3)
    ]
    await store.save(tenant, _response("resp-list"), asked)

    async def page(**how: Any) -> dict[str, Any]:
        return await store.input_items(
            tenant, "resp-list", **{"after": None, "limit": 20, "order": "desc"} | how
        )

    newest = await page(limit=2)
    assert [i["id"] for i in newest["data"]] == ["resp-list-in-2", "resp-list-in-1"]
    assert newest["data"][0]["content"] == [{"type": "input_text", "text": "Question 2?"}]
    assert "call_id" not in newest["data"][0]
    assert (newest["has_more"], newest["last_id"]) == (True, "resp-list-in-1")
    rest = await page(limit=2, after=newest["last_id"])
    assert ([i["id"] for i in rest["data"]], rest["has_more"]) == (["resp-list-in-0"], False)
    oldest = await page(order="asc", limit=1)
    assert oldest["first_id"] == "resp-list-in-0"
    with pytest.raises(NotFound) as unknown:
        await page(after="nope")
    assert unknown.value.param == "after"


async def test_an_answer_that_cannot_be_stored_is_sent_marked_not_stored(db: Database) -> None:
    """It is made and billed already: failing it would bill the client's retry again."""
    nobody = SimpleNamespace(principal=SimpleNamespace(tenant_id=uuid.uuid4()))  # no such tenant
    kiln = SimpleNamespace(responses=_store(db))
    gen: Any = SimpleNamespace(kiln=kiln, admission=nobody, name="m-orphan")
    asked = ResponsesRequest(model="m-orphan", input="A colour?", store=True)
    kept = await responses._kept(gen, asked, _response("resp-orphan"), [])
    assert (kept.id, kept.store) == ("resp-orphan", False)
    counted = REGISTRY.get_sample_value("kiln_responses_not_stored_total", {"model": "m-orphan"})
    assert counted == 1.0


async def test_the_console_lists_a_tenants_responses_newest_first(db: Database) -> None:
    async with db.sessions.begin() as session:
        tenant, other = await make_tenant(session), await make_tenant(session)
    store = _store(db)
    for i in range(5):
        await store.save(tenant, _response(f"resp-page-{i}"), [])
    await store.save(other, _response("resp-page-other"), [])
    first = await store.entries(tenant, after=None, limit=2)
    assert [k.body["id"] for k in first] == ["resp-page-4", "resp-page-3", "resp-page-2"]
    rest = await store.entries(tenant, after="resp-page-3", limit=5)
    assert [k.body["id"] for k in rest] == ["resp-page-2", "resp-page-1", "resp-page-0"]
    with pytest.raises(NotFound):
        await store.entries(tenant, after="resp-page-other", limit=2)
