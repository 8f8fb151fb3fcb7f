"""A tenant's LoRA adapters: upload PEFT's two files, list, delete (thin handlers over the
``/admin/v1`` adapter services, which check the role, the tenant and the files)."""

from __future__ import annotations

import tempfile
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

from litestar import Controller, get, post
from litestar.datastructures import UploadFile
from litestar.response import Template

from kiln_console.auth import AnyRequest, KilnDep, Viewer, ViewerDep
from kiln_platform.adapters import services as adapters
from kiln_platform.adapters.controllers import MAX_ADAPTER_BYTES
from kiln_platform.adapters.directory import slot_rank
from kiln_platform.admin.deps import transaction
from kiln_platform.errors import BadRequest
from kiln_platform.registry.services import model_names
from kiln_platform.tenants.services import get_tenant

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncSession


class Adapters(Controller):
    """``/console/tenants/{id}/adapters``."""

    opt = {"resource": "adapters"}  # noqa: RUF012 (auth.authorize reads it)

    @get("/tenants/{tenant_id:uuid}/adapters")
    async def adapters(self, kiln: KilnDep, viewer: ViewerDep, tenant_id: uuid.UUID) -> Template:
        """The tenant's adapters, and the upload form."""
        async with transaction(kiln, viewer.actor) as session:
            context = await _adapters(session, viewer, tenant_id)
        return Template("adapters.html.j2", context=context)

    @post("/tenants/{tenant_id:uuid}/adapters", request_max_body_size=MAX_ADAPTER_BYTES)
    async def upload(
        self, request: AnyRequest, kiln: KilnDep, viewer: ViewerDep, tenant_id: uuid.UUID
    ) -> Template:
        """Upload an adapter; a file that does not fit the model is named in the flash. The role
        and the tenant are checked (``auth.authorize``) before the multipart body is read."""
        form = await request.form()
        with tempfile.TemporaryDirectory(prefix="adapter-upload-") as tmp:
            weights = Path(tmp) / "weights"
            weights.write_bytes(await _file(form.get("weights"), "weights").read())
            upload = adapters.Upload(
                name=str(form.get("name", "")), model=str(form.get("model", "")),
                config=await _file(form.get("config"), "config").read(), weights=weights,
            )  # fmt: skip
            async with transaction(kiln, viewer.actor) as session:
                await adapters.create_adapter(
                    session, viewer.actor, tenant_id, upload, store=kiln.store,
                    max_rank=slot_rank(kiln.settings), directory=kiln.adapters,
                )  # fmt: skip
                context = {**await _adapters(session, viewer, tenant_id), "partial": True}
        return Template("_adapters.html.j2", context=context, status_code=201)

    @post("/tenants/{tenant_id:uuid}/adapters/{adapter_id:uuid}/delete")
    async def delete(
        self, kiln: KilnDep, viewer: ViewerDep, tenant_id: uuid.UUID, adapter_id: uuid.UUID
    ) -> Template:
        """Delete an adapter (requests naming it are refused within seconds)."""
        async with transaction(kiln, viewer.actor) as session:
            await adapters.delete_adapter(
                session, viewer.actor, tenant_id, adapter_id, kiln.adapters
            )
            context = {**await _adapters(session, viewer, tenant_id), "partial": True}
        return Template("_adapters.html.j2", context=context)


def _file(value: Any, field: str) -> UploadFile:
    if not isinstance(value, UploadFile):
        raise BadRequest("Choose a file.", param=field)
    return value


async def _adapters(session: AsyncSession, viewer: Viewer, tenant_id: uuid.UUID) -> dict[str, Any]:
    """The adapters page's context, read in the caller's transaction (after its change, if any)."""
    tenant = await get_tenant(session, viewer.actor, tenant_id)
    rows = await adapters.list_adapters(session, viewer.actor, tenant_id)
    models = await model_names(session, "generate")
    return {"viewer": viewer, "tenant": tenant, "adapters": rows, "models": models}
