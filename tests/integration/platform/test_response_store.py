"""Stored responses in PostgreSQL: a tenant reads only its own, an expired one is gone (and
dropped when the tenant stores the next), a deleted one is gone."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest
from sqlalchemy import select

from kiln_platform.db.database import Database
from kiln_platform.errors import NotFound
from kiln_platform.gateway import response_store
from kiln_platform.gateway.response_store import StoredResponse
from kiln_platform.gateway.responses_schemas import OutputMessage, OutputText, ResponseObject
from tests.factories import make_tenant


def _response(ident: str) -> ResponseObject:
    said = OutputMessage(id=f"msg-{ident}", status="completed", content=[OutputText(text="Red.")])
    return ResponseObject(
        id=ident, created_at=0, model="m", status="completed", output=[said], instructions=None,
        max_output_tokens=None, temperature=1.0, top_p=1.0, usage=None, user=None, metadata={},
    )  # fmt: skip


def _kiln(db: Database, ttl_days: float) -> Any:
    return SimpleNamespace(db=db, settings=SimpleNamespace(responses_ttl_days=ttl_days))


async def test_a_tenant_reads_its_own_and_goes_on_from_it(db: Database) -> None:
    async with db.sessions.begin() as session:
        owner, other = await make_tenant(session), await make_tenant(session)
    kiln = _kiln(db, 30)
    asked = [{"type": "message", "role": "user", "content": "A colour?"}]
    await response_store.save(kiln, owner, _response("resp-own"), asked)
    assert (await response_store.fetch(kiln, owner, "resp-own"))["output"][0][
        "id"
    ] == "msg-resp-own"
    history = await response_store.conversation(kiln, owner, "resp-own")
    assert [(h["type"], h["role"]) for h in history] == [
        ("message", "user"),
        ("message", "assistant"),
    ]
    for call in (response_store.fetch, response_store.remove, response_store.conversation):
        with pytest.raises(NotFound):
            await call(kiln, other, "resp-own")
    assert (await response_store.remove(kiln, owner, "resp-own"))["deleted"] is True
    with pytest.raises(NotFound) as gone:
        await response_store.conversation(kiln, owner, "resp-own")
    assert gone.value.param == "previous_response_id"


async def test_an_expired_response_is_gone_and_dropped_by_the_next_save(db: Database) -> None:
    async with db.sessions.begin() as session:
        tenant = await make_tenant(session)
    await response_store.save(_kiln(db, 0.1 / 86_400), tenant, _response("resp-old"), [])
    await asyncio.sleep(0.2)
    with pytest.raises(NotFound):
        await response_store.fetch(_kiln(db, 30), tenant, "resp-old")
    await response_store.save(_kiln(db, 30), tenant, _response("resp-new"), [])
    async with db.sessions.begin() as session:  # the platform's scope: every tenant's rows
        kept = await session.scalars(
            select(StoredResponse.id).where(StoredResponse.tenant_id == tenant)
        )
        assert list(kept) == ["resp-new"]
