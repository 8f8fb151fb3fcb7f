"""`/admin/v1/tenants/{id}/adapters`: thin handlers, behaviour in ``adapters.services``."""

from __future__ import annotations

import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

from litestar import delete, get, post
from litestar.datastructures import UploadFile
from litestar.enums import RequestEncodingType
from litestar.params import Body

from kiln_platform.adapters import services
from kiln_platform.adapters.directory import slot_rank
from kiln_platform.adapters.schemas import AdapterView
from kiln_platform.admin.deps import AdminController, CallDep, transaction

MAX_ADAPTER_BYTES = 256 << 20


@dataclass
class AdapterForm:
    """``multipart/form-data``: PEFT's ``adapter_config.json`` and ``adapter_model.safetensors``."""

    name: str
    model: str
    config: UploadFile
    weights: UploadFile


class AdaptersController(AdminController):
    """A tenant's LoRA adapters; requests use one as ``model: "<base model>:<name>"``."""

    opt = {"resource": "adapters"}  # noqa: RUF012 (admin.deps.authorize reads it)

    @get("/tenants/{tenant_id:uuid}/adapters")
    async def list_adapters(self, call: CallDep, tenant_id: uuid.UUID) -> list[AdapterView]:
        """The tenant's adapters."""
        return await services.list_adapters(await call.session(), call.actor, tenant_id)

    @post(
        "/tenants/{tenant_id:uuid}/adapters", status_code=201,
        request_max_body_size=MAX_ADAPTER_BYTES,
    )  # fmt: skip
    async def create_adapter(
        self, call: CallDep, tenant_id: uuid.UUID,
        data: Annotated[AdapterForm, Body(media_type=RequestEncodingType.MULTI_PART)],
    ) -> AdapterView:  # fmt: skip
        """Upload an adapter of a generation model; 400 names the field that does not fit (the
        role is checked before the multipart body is read: ``admin.deps.authorize``)."""
        with tempfile.TemporaryDirectory(prefix="adapter-upload-") as tmp:
            weights = Path(tmp) / "weights"
            weights.write_bytes(await data.weights.read())
            upload = services.Upload(
                name=data.name, model=data.model, config=await data.config.read(), weights=weights
            )
            async with transaction(call.kiln, call.actor) as session:
                return await services.create_adapter(
                    session, call.actor, tenant_id, upload, store=call.kiln.store,
                    max_rank=slot_rank(call.kiln.settings), directory=call.kiln.adapters,
                )  # fmt: skip

    @delete("/tenants/{tenant_id:uuid}/adapters/{adapter_id:uuid}", status_code=204)
    async def delete_adapter(
        self,
        call: CallDep,
        tenant_id: uuid.UUID,
        adapter_id: uuid.UUID,
    ) -> None:
        """Delete an adapter; requests naming it are refused at once through this gateway and
        within the cache TTL (5 s) through others."""
        await services.delete_adapter(
            await call.session(), call.actor, tenant_id, adapter_id, call.kiln.adapters
        )
