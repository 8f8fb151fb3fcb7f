"""Conversations on PostgreSQL: a tenant's conversation and items are found by no other tenant
(404, as an unknown id), stay sealed at rest, and go with their conversation when it is
deleted."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from kiln_platform.db.database import Database
from kiln_platform.errors import NotFound
from kiln_platform.gateway.conversation_items import items_of
from kiln_platform.gateway.conversations import ConversationItem, ConversationStore
from tests.factories import make_tenant

SECRET = b"a server secret for tests"


async def test_a_conversation_is_its_tenants_alone_and_sealed(db: Database) -> None:
    async with db.sessions.begin() as session:
        mine, theirs = await make_tenant(session), await make_tenant(session)
    store = ConversationStore(db.sessions, SECRET)
    conv = await store.create(mine, {"k": "v"}, items_of([{"role": "user", "content": "secret"}]))
    await store.append(mine, conv["id"], items_of([{"role": "user", "content": "more"}]), "c")
    assert [i["content"][0]["text"] for i in await store.items(mine, conv["id"], "c")] == [
        "secret", "more",
    ]  # fmt: skip
    for attempt in (
        store.fetch(theirs, conv["id"]),
        store.items(theirs, conv["id"], "conversation"),
        store.append(theirs, conv["id"], [], "conversation"),
        store.remove(theirs, conv["id"]),
    ):
        with pytest.raises(NotFound):
            await attempt
    async with db.sessions.begin() as session:  # platform scope: the rows, as stored
        rows = (await session.scalars(select(ConversationItem))).all()
    assert len(rows) == 2
    assert all(b"secret" not in row.sealed and b"more" not in row.sealed for row in rows)
    assert (await store.remove(mine, conv["id"]))["deleted"]
    async with db.sessions.begin() as session:
        assert (await session.scalars(select(ConversationItem))).all() == []
    with pytest.raises(NotFound):
        await store.fetch(mine, conv["id"])


async def test_items_page_from_an_item_either_way(db: Database) -> None:
    async with db.sessions.begin() as session:
        tenant = await make_tenant(session)
    store = ConversationStore(db.sessions, SECRET)
    given = [{"role": "user", "content": str(i)} for i in range(5)]
    conv = await store.create(tenant, {}, items_of(given))
    ident = conv["id"]
    first = await store.page(tenant, ident, after=None, limit=2, order="asc")
    texts = [i["content"][0]["text"] for i in first["data"]]
    assert (texts, first["has_more"]) == (["0", "1"], True)
    rest = await store.page(tenant, ident, after=first["last_id"], limit=5, order="asc")
    assert [i["content"][0]["text"] for i in rest["data"]] == ["2", "3", "4"]
    assert rest["has_more"] is False
    back = await store.page(tenant, ident, after=rest["data"][1]["id"], limit=5, order="desc")
    assert [i["content"][0]["text"] for i in back["data"]] == ["2", "1", "0"]
    with pytest.raises(NotFound):
        await store.page(tenant, ident, after="msg_nothing", limit=5, order="asc")
