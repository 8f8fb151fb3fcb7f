"""Stored chat completions in PostgreSQL: a tenant lists and reads only its own, sealed at rest;
the list pages in creation order, filtered by model and metadata; a completion kept twice (a
batch line run again) keeps its first; an expired one is gone (dropped when the tenant stores
the next); one the database refuses is answered anyway, counted."""

from __future__ import annotations

import asyncio
import uuid
from types import SimpleNamespace
from typing import Any

import pytest
from prometheus_client import REGISTRY
from sqlalchemy import select

from kiln_platform.db.database import Database
from kiln_platform.errors import NotFound
from kiln_platform.gateway import chat_kept
from kiln_platform.gateway.chat_store import ChatStore, StoredChat
from kiln_platform.gateway.llm_schemas import (
    AssistantMessage,
    ChatChoice,
    ChatCompletion,
    ChatCompletionRequest,
    Message,
    Usage,
)
from tests.factories import make_tenant

SECRET = b"a server secret for tests"
ASKED = [{"role": "user", "content": "A colour?"}]


def _body(ident: str, model: str = "m", metadata: dict[str, str] | None = None) -> dict[str, Any]:
    return {"id": ident, "object": "chat.completion", "model": model, "created": 1,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": ident}}],
            "metadata": metadata or {}}  # fmt: skip


async def _tenant(db: Database) -> uuid.UUID:
    async with db.sessions.begin() as session:
        return await make_tenant(session)


async def test_a_tenant_reads_lists_and_tags_only_its_own_sealed(db: Database) -> None:
    owner, other = await _tenant(db), await _tenant(db)
    store = ChatStore(db.sessions, SECRET, 30)
    await store.save(owner, _body("chatcmpl-own", metadata={"team": "a"}), ASKED)
    assert (await store.fetch(owner, "chatcmpl-own"))["choices"][0]["message"]["content"] == (
        "chatcmpl-own"
    )
    for call in (store.fetch, store.remove):
        with pytest.raises(NotFound):
            await call(other, "chatcmpl-own")
    with pytest.raises(NotFound):
        await store.update(other, "chatcmpl-own", {"team": "b"})
    listed = await store.page(other, model=None, metadata={}, after=None, limit=20, order="asc")
    assert listed["data"] == []
    tagged = await store.update(owner, "chatcmpl-own", {"team": "b"})
    assert (await store.fetch(owner, "chatcmpl-own"))["metadata"] == tagged["metadata"]
    async with db.sessions.begin() as session:  # the platform's scope: every tenant's rows
        sealed = await session.scalar(
            select(StoredChat.sealed).where(StoredChat.id == "chatcmpl-own")
        )
    assert sealed is not None
    assert b"A colour?" not in sealed
    assert b"team" not in sealed


async def test_the_list_pages_in_order_by_model_and_metadata(db: Database) -> None:
    tenant = await _tenant(db)
    store = ChatStore(db.sessions, SECRET, 30)
    for i in range(7):
        tags = {"even": "yes"} if i % 2 == 0 else {}
        await store.save(tenant, _body(f"chatcmpl-{i}", "big" if i == 6 else "m", tags), ASKED)

    async def ids(**how: Any) -> tuple[list[str], bool]:
        given = {"model": None, "metadata": {}, "after": None, "limit": 20, "order": "asc"} | how
        found = await store.page(tenant, **given)
        return [c["id"] for c in found["data"]], found["has_more"]

    assert await ids() == ([f"chatcmpl-{i}" for i in range(7)], False)
    assert await ids(limit=2, after="chatcmpl-1") == (["chatcmpl-2", "chatcmpl-3"], True)
    assert await ids(order="desc", limit=2) == (["chatcmpl-6", "chatcmpl-5"], True)
    assert await ids(model="big") == (["chatcmpl-6"], False)
    assert await ids(metadata={"even": "yes"}, limit=2) == (["chatcmpl-0", "chatcmpl-2"], True)
    even = await ids(metadata={"even": "yes"}, limit=2, after="chatcmpl-2")
    assert even == (["chatcmpl-4", "chatcmpl-6"], False)
    assert await ids(metadata={"even": "no"}) == ([], False)
    with pytest.raises(NotFound) as unknown:
        await ids(after="chatcmpl-nope")
    assert unknown.value.param == "after"
    messages = await store.messages(tenant, "chatcmpl-0", after=None, limit=20, order="asc")
    assert [(m["id"], m["content"]) for m in messages["data"]] == [("chatcmpl-0-0", "A colour?")]


async def test_kept_twice_keeps_the_first_and_expired_ones_go(db: Database) -> None:
    tenant = await _tenant(db)
    store = ChatStore(db.sessions, SECRET, 30)
    await store.save(tenant, _body("chatcmpl-again", metadata={"run": "1"}), ASKED)
    await store.save(tenant, _body("chatcmpl-again", metadata={"run": "2"}), ASKED)
    assert (await store.fetch(tenant, "chatcmpl-again"))["metadata"] == {"run": "1"}
    brief = ChatStore(db.sessions, SECRET, ttl_days=0.2 / 86_400)
    await brief.save(tenant, _body("chatcmpl-brief"), ASKED)
    await asyncio.sleep(0.3)
    with pytest.raises(NotFound):
        await store.fetch(tenant, "chatcmpl-brief")
    await store.save(tenant, _body("chatcmpl-next"), ASKED)
    async with db.sessions.begin() as session:
        kept = await session.scalars(select(StoredChat.id).where(StoredChat.tenant_id == tenant))
        assert sorted(kept) == ["chatcmpl-again", "chatcmpl-next"]


async def test_an_answer_that_cannot_be_stored_is_sent_and_counted(db: Database) -> None:
    """It is made and billed already: failing it would bill the client's retry again."""
    nobody = SimpleNamespace(principal=SimpleNamespace(tenant_id=uuid.uuid4()))  # no such tenant
    gen: Any = SimpleNamespace(kiln=SimpleNamespace(chats=ChatStore(db.sessions, SECRET, 30)),
                               admission=nobody, name="m-orphan-chat")  # fmt: skip
    asked = ChatCompletionRequest(model="m-orphan-chat", messages=[Message(role="user")], keep=True)
    usage = Usage(prompt_tokens=1, completion_tokens=1, total_tokens=2)
    answer = ChatChoice(message=AssistantMessage(content="Red."), finish_reason="stop")
    completion = ChatCompletion(id="chatcmpl-orphan", created=1, model="m-orphan-chat",
                                choices=[answer], usage=usage)  # fmt: skip
    await chat_kept.keep(gen, asked, completion)
    counted = REGISTRY.get_sample_value(
        "kiln_chat_completions_not_stored_total", {"model": "m-orphan-chat"}
    )
    assert counted == 1.0
