"""A tenant's logs: the chat completions and the responses its applications stored (``store:
true``), newest first, and each one's messages and answer. Prompts and answers are the
tenant's: its own people read them (``logs`` in ``authz._RULES``), an operator does not."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Annotated, Any, Literal
from urllib.parse import urlencode

from litestar import Controller, get, post
from litestar.params import Parameter
from litestar.response import Redirect, Template

from kiln_console.auth import AnyRequest, KilnDep, ViewerDep
from kiln_console.errors import is_htmx
from kiln_platform.admin.deps import transaction
from kiln_platform.audit.services import record
from kiln_platform.errors import BadRequest
from kiln_platform.gateway._items import text_of
from kiln_platform.gateway.chat_store import message_item
from kiln_platform.tenants.services import get_tenant

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from kiln_console.auth import Viewer
    from kiln_platform.context import Kiln
    from kiln_platform.gateway import chat_store, response_store

PAGE = 20
PREVIEW = 120
"""Characters of a prompt or an answer the list shows."""


def _when(body: dict[str, Any]) -> datetime:
    return datetime.fromtimestamp(body["created"], UTC)


def _answer(choice: dict[str, Any]) -> str:
    """A choice's text, or the calls it made."""
    message = choice["message"]
    calls = message.get("tool_calls") or []
    if calls:
        return "; ".join(f"{c['function']['name']}({c['function']['arguments']})" for c in calls)
    return message.get("content") or ""


def _chat_row(kept: chat_store.Kept) -> dict[str, Any]:
    """A list row: when, model, the last user message and the first answer, shortened."""
    body = kept.body
    asked = [m for m in kept.messages if m.get("role") == "user"]
    prompt = item_text(asked[-1]) if asked else ""
    answer = _answer(body["choices"][0]) if body["choices"] else ""
    usage = body.get("usage") or {}
    return {
        "id": body["id"], "when": _when(body), "model": body["model"], "status": None,
        "href": body["id"], "prompt": _short(prompt), "answer": _short(answer),
        "tokens": f"{usage.get('prompt_tokens', 0)} / {usage.get('completion_tokens', 0)}",
        "metadata": body.get("metadata") or {},
    }  # fmt: skip


def item_text(item: dict[str, Any]) -> str:
    """A Responses item as text: a message's (its parts joined), a call, a call's output."""
    if item.get("type") == "function_call":
        return f"{item.get('name')}({item.get('arguments')})"
    if item.get("type") == "function_call_output":
        return str(item.get("output", ""))
    return text_of(item.get("content"))


def _lines(items: list[dict[str, Any]]) -> list[dict[str, str]]:
    """Items as the page shows them: who (a message's role, else the item's type) and text."""
    return [{"role": i.get("role") or i.get("type") or "", "text": item_text(i)} for i in items]


def _response_row(kept: response_store.Kept) -> dict[str, Any]:
    """A list row of a stored response, as ``_chat_row``."""
    body = kept.body
    asked = [i for i in kept.history if i.get("role") == "user"]
    usage = body.get("usage") or {}
    return {
        "id": body["id"], "when": datetime.fromtimestamp(body["created_at"], UTC),
        "model": body["model"], "status": body["status"], "href": f"responses/{body['id']}",
        "prompt": _short(item_text(asked[-1]) if asked else ""),
        "answer": _short(" ".join(item_text(i) for i in body.get("output") or [])),
        "tokens": f"{usage.get('input_tokens', 0)} / {usage.get('output_tokens', 0)}",
        "metadata": body.get("metadata") or {},
    }  # fmt: skip


async def _delete(
    kiln: Kiln, viewer: Viewer, tenant_id: uuid.UUID, kind: str, ident: str, *,
    remove: Callable[[uuid.UUID, str], Awaitable[Any]],
) -> Redirect:  # fmt: skip
    """Delete one stored item, audited (``log.delete``: the record commits only if the delete
    did, a 404 leaving none), and go back to its list."""
    async with transaction(kiln, viewer.actor) as session:
        await get_tenant(session, viewer.actor, tenant_id)
        await record(session, viewer.actor, "log.delete", kind, ident, tenant_id)
        await remove(tenant_id, ident)
    which = "responses" if kind == "response" else "chat"
    return Redirect(f"/console/tenants/{tenant_id}/logs?kind={which}", status_code=303)


def _pair(tag: str | None) -> dict[str, str] | None:
    """The Logs page's metadata filter, ``key=value``; a 400 naming ``tag`` otherwise."""
    if not tag:
        return None
    key, _, value = tag.partition("=")
    if not key.strip() or not _:
        raise BadRequest("'tag' is a metadata pair: key=value.", param="tag")
    return {key.strip(): value.strip()}


def _short(text: str) -> str:
    return text if len(text) <= PREVIEW else text[: PREVIEW - 1] + "…"


class Logs(Controller):
    """``/console/tenants/{id}/logs``."""

    opt = {"resource": "logs"}  # noqa: RUF012 (auth.authorize reads it)

    @get("/tenants/{tenant_id:uuid}/logs")
    async def logs(
        self, request: AnyRequest, kiln: KilnDep, viewer: ViewerDep, tenant_id: uuid.UUID, *,
        kind: Literal["chat", "responses"] = "chat",
        after: Annotated[str | None, Parameter(max_length=120)] = None,
        model: Annotated[str | None, Parameter(max_length=200)] = None,
        tag: Annotated[str | None, Parameter(max_length=600)] = None,
    ) -> Template:  # fmt: skip
        """A page of the tenant's stored chat completions (or ``kind=responses``: responses),
        newest first (``after``: older than that one); those of one ``model`` and carrying the
        metadata pair ``tag`` (``key=value``) if given."""
        async with transaction(kiln, viewer.actor) as session:
            tenant = await get_tenant(session, viewer.actor, tenant_id)
        found: list[Any]
        shown = {k: v for k, v in (("model", model), ("tag", tag)) if v}  # the page's filters
        which, pair = model or None, _pair(tag)
        if kind == "responses":
            found = await kiln.responses.entries(
                tenant_id, after=after, limit=PAGE, model=which, metadata=pair
            )
            rows = [_response_row(kept) for kept in found[:PAGE]]
        else:
            found = await kiln.chats.entries(
                tenant_id, after=after, limit=PAGE, model=which, metadata=pair
            )
            rows = [_chat_row(kept) for kept in found[:PAGE]]
        older = {"kind": kind, "after": rows[-1]["id"], **shown} if len(found) > PAGE else None
        context = {"viewer": viewer, "tenant": tenant, "rows": rows, "kind": kind,
                   "filters": shown, "older": older and urlencode(older)}  # fmt: skip
        return Template("_logs.html.j2" if is_htmx(request) else "logs.html.j2", context=context)

    @get("/tenants/{tenant_id:uuid}/logs/{completion_id:str}")
    async def log(
        self, kiln: KilnDep, viewer: ViewerDep, tenant_id: uuid.UUID, completion_id: str
    ) -> Template:
        """One stored chat completion: its messages, its answers, usage and metadata."""
        async with transaction(kiln, viewer.actor) as session:
            tenant = await get_tenant(session, viewer.actor, tenant_id)
        kept = await kiln.chats.kept(tenant_id, completion_id)
        body = kept.body
        messages = [message_item(body["id"], i, m) for i, m in enumerate(kept.messages)]
        answers = [{"index": c["index"], "text": _answer(c), "finish": c.get("finish_reason")}
                   for c in body["choices"]]  # fmt: skip
        context = {"viewer": viewer, "tenant": tenant, "body": body, "when": _when(body),
                   "messages": messages, "answers": answers}  # fmt: skip
        return Template("log.html.j2", context=context)

    @get("/tenants/{tenant_id:uuid}/logs/responses/{response_id:str}")
    async def response_log(
        self, kiln: KilnDep, viewer: ViewerDep, tenant_id: uuid.UUID, response_id: str
    ) -> Template:
        """One stored response: its input items (those it went on from first), its output,
        status, usage and metadata."""
        async with transaction(kiln, viewer.actor) as session:
            tenant = await get_tenant(session, viewer.actor, tenant_id)
        kept = await kiln.responses.kept(tenant_id, response_id)
        body = kept.body
        said, made = _lines(kept.history), _lines(body.get("output") or [])
        context = {"viewer": viewer, "tenant": tenant, "body": body, "said": said, "made": made,
                   "when": datetime.fromtimestamp(body["created_at"], UTC)}  # fmt: skip
        return Template("response_log.html.j2", context=context)

    @post("/tenants/{tenant_id:uuid}/logs/{completion_id:str}/delete")
    async def delete_log(
        self, kiln: KilnDep, viewer: ViewerDep, tenant_id: uuid.UUID, completion_id: str
    ) -> Redirect:
        """Delete a stored chat completion (a tenant-admin), back to the list."""
        return await _delete(kiln, viewer, tenant_id, "chat.completion", completion_id,
                             remove=kiln.chats.remove)  # fmt: skip

    @post("/tenants/{tenant_id:uuid}/logs/responses/{response_id:str}/delete")
    async def delete_response_log(
        self, kiln: KilnDep, viewer: ViewerDep, tenant_id: uuid.UUID, response_id: str
    ) -> Redirect:
        """Delete a stored response (a tenant-admin), back to the list."""
        return await _delete(kiln, viewer, tenant_id, "response", response_id,
                             remove=kiln.responses.remove)  # fmt: skip
