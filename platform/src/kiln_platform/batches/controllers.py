"""`/v1/files`, `/v1/batches` and `/v1/messages/batches`: thin, the behaviour lives in
``files``, ``services`` and ``message_batches``."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from litestar import Request, delete, get, post
from litestar.di import Provide
from litestar.params import Parameter, SkipValidation
from litestar.response import File, Stream

from kiln_platform.batches import files, message_batches, services
from kiln_platform.batches.message_batch_schemas import (
    DeletedMessageBatch,
    MessageBatch,
    MessageBatchCreate,
    MessageBatchList,
)
from kiln_platform.batches.schemas import (
    BatchCreate,
    BatchList,
    BatchObject,
    FileDeleted,
    FileList,
    FileObject,
)
from kiln_platform.context import Kiln
from kiln_platform.errors import BadRequest
from kiln_platform.gateway.auth import authenticated, provide_principal
from kiln_platform.keys.services import Principal
from kiln_platform.openapi import ANTHROPIC_ERRORS, OPENAI_ERRORS, DocumentedController

KilnDep = SkipValidation[Kiln]
PrincipalDep = SkipValidation[Principal]
Limit = Annotated[int, Parameter(ge=1, le=10_000)]
JSONL = "application/x-jsonl"
MAX_MESSAGE_BATCH_BYTES = 32 << 20
"""A message batch's body (decoded whole, unlike a streamed file): larger than other ``/v1``
bodies, below Anthropic's 256 MB (more work goes in more batches, or ``/v1/files``)."""


class FilesController(DocumentedController):
    """OpenAI's Files API (``purpose=batch`` uploads; batch output files)."""

    errors = OPENAI_ERRORS
    path = "/v1/files"
    guards = [authenticated]  # noqa: RUF012
    dependencies = {"principal": Provide(provide_principal)}  # noqa: RUF012

    @post("/", status_code=200, request_max_body_size=None)
    async def create_file(
        self, kiln: KilnDep, principal: PrincipalDep, request: Request[Any, Any, Any]
    ) -> FileObject:
        """Upload a JSONL file (``multipart/form-data``: ``file``, ``purpose=batch``)."""
        kind, options = request.content_type
        if kind != "multipart/form-data" or not options.get("boundary"):
            raise BadRequest("Send the file as multipart/form-data.", param="file")
        boundary = options["boundary"].encode()
        return await files.upload(kiln, principal.tenant_id, request.stream(), boundary)

    @get("/")
    async def list_files(
        self, kiln: KilnDep, principal: PrincipalDep, *, purpose: str | None = None,
        after: str | None = None, limit: Limit = 10_000, order: Literal["asc", "desc"] = "desc",
    ) -> FileList:  # fmt: skip
        """The tenant's files, newest first (``order=asc``: oldest first)."""
        return await files.listed(kiln, principal.tenant_id, purpose, after, limit, order=order)

    @get("/{file_id:str}")
    async def get_file(self, kiln: KilnDep, principal: PrincipalDep, file_id: str) -> FileObject:
        """One file."""
        return files.file_object(await files.find(kiln, principal.tenant_id, file_id))

    @get("/{file_id:str}/content", media_type="application/octet-stream")
    async def file_content(self, kiln: KilnDep, principal: PrincipalDep, file_id: str) -> File:
        """The file's bytes."""
        row = await files.find(kiln, principal.tenant_id, file_id)
        return File(path=files.content_path(kiln, row), filename=row.filename,
                    media_type="application/jsonl")  # fmt: skip

    @delete("/{file_id:str}", status_code=200)
    async def delete_file(
        self, kiln: KilnDep, principal: PrincipalDep, file_id: str
    ) -> FileDeleted:
        """Delete a file (and its bytes, unless another file has the same)."""
        return await files.remove(kiln, principal.tenant_id, file_id)


class BatchesController(DocumentedController):
    """OpenAI's Batch API, run on Kiln's own pools in the ``batch`` class."""

    errors = OPENAI_ERRORS
    path = "/v1/batches"
    guards = [authenticated]  # noqa: RUF012
    dependencies = {"principal": Provide(provide_principal)}  # noqa: RUF012

    @post("/", status_code=200)
    async def create_batch(
        self, kiln: KilnDep, principal: PrincipalDep, data: BatchCreate
    ) -> BatchObject:
        """Create a batch from an uploaded ``purpose=batch`` file."""
        return await services.create(kiln, principal, data)

    @get("/")
    async def list_batches(
        self, kiln: KilnDep, principal: PrincipalDep, after: str | None = None,
        limit: Annotated[int, Parameter(ge=1, le=100)] = 20,
    ) -> BatchList:  # fmt: skip
        """The tenant's batches, newest first."""
        return await services.listed(kiln, principal.tenant_id, after, limit)

    @get("/{batch_id:str}")
    async def get_batch(self, kiln: KilnDep, principal: PrincipalDep, batch_id: str) -> BatchObject:
        """One batch, with its request counts."""
        return await services.retrieve(kiln, principal.tenant_id, batch_id)

    @post("/{batch_id:str}/cancel", status_code=200)
    async def cancel_batch(
        self, kiln: KilnDep, principal: PrincipalDep, batch_id: str
    ) -> BatchObject:
        """Cancel: no new line starts; ``cancelling`` until the running ones are done."""
        return await services.cancel(kiln, principal.tenant_id, batch_id)


class MessageBatchesController(DocumentedController):
    """Anthropic's Message Batches API (``message_batches``), on the same batches."""

    errors = ANTHROPIC_ERRORS
    path = "/v1/messages/batches"
    guards = [authenticated]  # noqa: RUF012
    dependencies = {"principal": Provide(provide_principal)}  # noqa: RUF012

    @post("/", status_code=200, request_max_body_size=MAX_MESSAGE_BATCH_BYTES)
    async def create_message_batch(
        self, request: Request[Any, Any, Any], kiln: KilnDep, principal: PrincipalDep,
        data: MessageBatchCreate,
    ) -> MessageBatch:  # fmt: skip
        """Create a batch of Messages requests (one model; each checked now)."""
        return await message_batches.create(kiln, principal, data, _base(request))

    @get("/")
    async def list_message_batches(
        self, request: Request[Any, Any, Any], kiln: KilnDep, principal: PrincipalDep, *,
        limit: Annotated[int, Parameter(ge=1, le=1000)] = 20, after_id: str | None = None,
        before_id: str | None = None,
    ) -> MessageBatchList:  # fmt: skip
        """The tenant's message batches, newest first."""
        return await message_batches.listed(kiln, principal.tenant_id, _base(request),
                                            limit=limit, after_id=after_id,
                                            before_id=before_id)  # fmt: skip

    @get("/{message_batch_id:str}")
    async def get_message_batch(
        self, request: Request[Any, Any, Any], kiln: KilnDep, principal: PrincipalDep,
        message_batch_id: str,
    ) -> MessageBatch:  # fmt: skip
        """One message batch, its requests counted by outcome."""
        return await message_batches.retrieve(kiln, principal.tenant_id, message_batch_id,
                                              _base(request))  # fmt: skip

    @post("/{message_batch_id:str}/cancel", status_code=200)
    async def cancel_message_batch(
        self, request: Request[Any, Any, Any], kiln: KilnDep, principal: PrincipalDep,
        message_batch_id: str,
    ) -> MessageBatch:  # fmt: skip
        """Cancel: no new request starts; ``canceling`` until the running ones are done."""
        return await message_batches.cancel(kiln, principal.tenant_id, message_batch_id,
                                            _base(request))  # fmt: skip

    @delete("/{message_batch_id:str}", status_code=200)
    async def delete_message_batch(
        self, kiln: KilnDep, principal: PrincipalDep, message_batch_id: str
    ) -> DeletedMessageBatch:
        """Delete an ended batch with its results."""
        return await message_batches.delete(kiln, principal.tenant_id, message_batch_id)

    @get("/{message_batch_id:str}/results", media_type=JSONL)
    async def message_batch_results(
        self, kiln: KilnDep, principal: PrincipalDep, message_batch_id: str
    ) -> Stream:
        """An ended batch's results: a JSON line a request."""
        lines = await message_batches.result_lines(kiln, principal.tenant_id, message_batch_id)
        return Stream(lines, media_type=JSONL)


def _base(request: Request[Any, Any, Any]) -> str:
    return str(request.base_url).rstrip("/")
