"""A tenant's logs: the chat completions its applications stored (``store: true``), newest
first, and each one's messages and answer. Prompts and answers are the tenant's: its own people
read them (``logs`` in ``authz._RULES``), an operator does not."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Annotated, Any

from litestar import Controller, get
from litestar.params import Parameter
from litestar.response import Template

from kiln_console.auth import AnyRequest, KilnDep, ViewerDep
from kiln_console.errors import is_htmx
from kiln_platform.admin.deps import transaction
from kiln_platform.gateway.chat_store import message_item
from kiln_platform.tenants.services import get_tenant

if TYPE_CHECKING:
    from kiln_platform.gateway.chat_store import Kept

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


def _row(kept: Kept) -> dict[str, Any]:
    """A list row: when, model, the last user message and the first answer, shortened."""
    body = kept.body
    asked = [m for m in kept.messages if m.get("role") == "user"]
    prompt = (message_item(body["id"], 0, asked[-1])["content"] or "") if asked else ""
    answer = _answer(body["choices"][0]) if body["choices"] else ""
    usage = body.get("usage") or {}
    return {
        "id": body["id"], "when": _when(body), "model": body["model"],
        "prompt": _short(prompt), "answer": _short(answer),
        "tokens": f"{usage.get('prompt_tokens', 0)} / {usage.get('completion_tokens', 0)}",
        "metadata": body.get("metadata") or {},
    }  # fmt: skip


def _short(text: str) -> str:
    return text if len(text) <= PREVIEW else text[: PREVIEW - 1] + "…"


class Logs(Controller):
    """``/console/tenants/{id}/logs``."""

    opt = {"resource": "logs"}  # noqa: RUF012 (auth.authorize reads it)

    @get("/tenants/{tenant_id:uuid}/logs")
    async def logs(
        self, request: AnyRequest, kiln: KilnDep, viewer: ViewerDep, tenant_id: uuid.UUID, *,
        after: Annotated[str | None, Parameter(max_length=120)] = None,
    ) -> Template:  # fmt: skip
        """A page of the tenant's stored chat completions, newest first (``after``: older
        than that one)."""
        async with transaction(kiln, viewer.actor) as session:
            tenant = await get_tenant(session, viewer.actor, tenant_id)
        found = await kiln.chats.entries(tenant_id, after=after, limit=PAGE, order="desc")
        rows = [_row(kept) for kept in found[:PAGE]]
        older = rows[-1]["id"] if len(found) > PAGE else None
        context = {"viewer": viewer, "tenant": tenant, "rows": rows, "older": older}
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
