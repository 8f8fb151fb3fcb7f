"""``/v1/conversations`` handlers (OpenAI's Conversations API): thin, the store in
``gateway.conversations``."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from litestar import delete, get, post
from litestar.di import Provide
from litestar.params import Parameter

from kiln_platform.admission.deps import provide_admission
from kiln_platform.errors import BadRequest
from kiln_platform.gateway._items import page
from kiln_platform.gateway.auth import authenticated, provide_principal
from kiln_platform.gateway.controllers import AdmissionDep, KilnDep
from kiln_platform.gateway.conversation_items import items_of, metadata_of
from kiln_platform.openapi import OPENAI_ERRORS, DocumentedController

Limit = Annotated[int, Parameter(ge=1, le=100)]


class ConversationCreate(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """``POST /v1/conversations``: up to 20 items to start from, and metadata."""

    items: Any = None
    metadata: Any = None


class ConversationUpdate(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """``POST /v1/conversations/{id}``: the metadata that replaces its own."""

    metadata: Any


class ItemsCreate(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """``POST /v1/conversations/{id}/items``: up to 20 items to add."""

    items: Any


class ConversationsController(DocumentedController):
    """Conversations: a tenant's lasting history that ``/v1/responses`` reads and adds to."""

    errors = OPENAI_ERRORS
    path = "/v1/conversations"
    guards = [authenticated]  # noqa: RUF012
    dependencies = {  # noqa: RUF012
        "principal": Provide(provide_principal),
        "admission": Provide(provide_admission),
    }

    @post("/", status_code=200)
    async def create(
        self, kiln: KilnDep, admission: AdmissionDep, data: ConversationCreate
    ) -> dict[str, Any]:
        """Create a conversation (with up to 20 items)."""
        items = items_of(data.items) if data.items is not None else []
        return await kiln.conversations.create(
            admission.principal.tenant_id, metadata_of(data.metadata), items
        )

    @get("/{conversation_id:str}")
    async def fetch(self, kiln: KilnDep, admission: AdmissionDep, conversation_id: str) -> Any:
        """A conversation."""
        return await kiln.conversations.fetch(admission.principal.tenant_id, conversation_id)

    @post("/{conversation_id:str}", status_code=200)
    async def update(
        self, kiln: KilnDep, admission: AdmissionDep, conversation_id: str,
        data: ConversationUpdate,
    ) -> dict[str, Any]:  # fmt: skip
        """Replace a conversation's metadata."""
        tenant, metadata = admission.principal.tenant_id, metadata_of(data.metadata)
        return await kiln.conversations.update(tenant, conversation_id, metadata)

    @delete("/{conversation_id:str}", status_code=200)
    async def remove(
        self, kiln: KilnDep, admission: AdmissionDep, conversation_id: str
    ) -> dict[str, Any]:
        """Delete a conversation and its items."""
        return await kiln.conversations.remove(admission.principal.tenant_id, conversation_id)

    @post("/{conversation_id:str}/items", status_code=200)
    async def add_items(
        self, kiln: KilnDep, admission: AdmissionDep, conversation_id: str, data: ItemsCreate
    ) -> dict[str, Any]:
        """Add 1 to 20 items after the conversation's others."""
        tenant, items = admission.principal.tenant_id, items_of(data.items)
        if not items:
            raise BadRequest("'items' must hold at least one item to add.", param="items")
        added = await kiln.conversations.append(tenant, conversation_id, items, "conversation_id")
        return page(added, None, len(added), f"'{conversation_id}'")

    @get("/{conversation_id:str}/items")
    async def list_items(
        self, kiln: KilnDep, admission: AdmissionDep, conversation_id: str, *,
        after: str | None = None, limit: Limit = 20, order: Literal["asc", "desc"] = "desc",
    ) -> dict[str, Any]:  # fmt: skip
        """A page of the conversation's items, newest first unless ``order`` is ``asc``."""
        return await kiln.conversations.page(admission.principal.tenant_id, conversation_id,
                                             after=after, limit=limit, order=order)  # fmt: skip

    @get("/{conversation_id:str}/items/{item_id:str}")
    async def item(
        self, kiln: KilnDep, admission: AdmissionDep, conversation_id: str, item_id: str
    ) -> dict[str, Any]:
        """One item of a conversation."""
        return await kiln.conversations.item(admission.principal.tenant_id, conversation_id,
                                             item_id)  # fmt: skip

    @delete("/{conversation_id:str}/items/{item_id:str}", status_code=200)
    async def remove_item(
        self, kiln: KilnDep, admission: AdmissionDep, conversation_id: str, item_id: str
    ) -> dict[str, Any]:
        """Delete one item; the conversation is returned."""
        tenant = admission.principal.tenant_id
        return await kiln.conversations.remove_item(tenant, conversation_id, item_id)
