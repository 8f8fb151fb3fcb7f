"""An ended message batch's results, in Anthropic's shape: a JSON line a request (those that ran
in the order of the requests, then those that never ran, as Anthropic's come in no set order),
``{"custom_id", "result": {"type": "succeeded", "message"}}``, ``errored``
(with Anthropic's error object), ``canceled`` (never started: the batch was canceled) or
``expired`` (never started within its window). Read from the batch's recorded lines, a page at
a time, then its input file for the requests that never ran."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

import msgspec
from sqlalchemy import cast, func, select
from sqlalchemy.dialects.postgresql import JSONB

from kiln_platform.batches import files
from kiln_platform.batches._tenant import tenant_tx
from kiln_platform.batches.tables import BatchLine
from kiln_platform.batches.validation import read_lines
from kiln_platform.errors import NotFound
from kiln_platform.gateway import messages

if TYPE_CHECKING:
    import uuid
    from collections.abc import AsyncIterator

    from kiln_platform.batches.schemas import BatchObject
    from kiln_platform.context import Kiln

PAGE = 1000
EXPIRED = "batch_expired"
"""The error code of a line its batch's window ended before (``lines.EXPIRED``)."""


def _uid(batch: BatchObject) -> uuid.UUID:
    return files.parse_id("batch_", batch.id, "batch")


def _code() -> Any:
    return cast(BatchLine.output, JSONB)["error"]["code"].astext


async def failures(kiln: Kiln, tenant_id: uuid.UUID, batches: list[BatchObject]) -> dict[str, int]:
    """Per batch (its ``batch_…`` id): how many of its lines expired unrun."""
    ids = {_uid(b): b.id for b in batches}
    query = (select(BatchLine.batch_id, func.count())
             .where(BatchLine.batch_id.in_(ids), ~BatchLine.ok, _code() == EXPIRED)
             .group_by(BatchLine.batch_id))  # fmt: skip
    async with tenant_tx(kiln, tenant_id) as session:
        return {ids[uid]: n for uid, n in await session.execute(query)}


def result(custom_id: str, output: dict[str, Any]) -> dict[str, Any]:
    """A recorded line (OpenAI's output or error line) as Anthropic's result."""
    response, error = output.get("response"), output.get("error") or {}
    if response is not None and response.get("status_code") == 200:
        return {"custom_id": custom_id, "result": {"type": "succeeded",
                                                   "message": response["body"]}}  # fmt: skip
    if response is None and error.get("code") == EXPIRED:
        return {"custom_id": custom_id, "result": {"type": "expired"}}
    if response is not None:
        status, said = response["status_code"], response["body"]["error"]["message"]
    else:  # not run: its creator's key was revoked
        status, said = 401, error.get("message", "")
    failed = {"type": "errored", "error": messages.error_body(status, said)}
    return {"custom_id": custom_id, "result": failed}


def _unrun(batch: BatchObject, custom_id: str, n: int) -> dict[str, Any]:
    """A request that never ran: canceled, or refused with the batch (``failed``)."""
    if batch.status != "failed" or batch.errors is None:
        return {"custom_id": custom_id, "result": {"type": "canceled"}}
    said = next((e.message for e in batch.errors.data if e.line == n),
                f"The batch was refused: {batch.errors.data[0].message}")  # fmt: skip
    failed = {"type": "errored", "error": messages.error_body(400, said)}
    return {"custom_id": custom_id, "result": failed}


def _line(item: dict[str, Any]) -> bytes:
    return msgspec.json.encode(item) + b"\n"


async def results(kiln: Kiln, tenant_id: uuid.UUID, batch: BatchObject) -> AsyncIterator[bytes]:
    """The batch's results, a line each (recorded ones, then those that never ran)."""
    uid, last, done = _uid(batch), 0, set()
    while True:
        query = (select(BatchLine.line, BatchLine.custom_id, BatchLine.output)
                 .where(BatchLine.batch_id == uid, BatchLine.line > last)
                 .order_by(BatchLine.line).limit(PAGE))  # fmt: skip
        async with tenant_tx(kiln, tenant_id) as session:
            page = (await session.execute(query)).all()
        for n, custom_id, output in page:
            done.add(n)
            yield _line(result(custom_id, msgspec.json.decode(output)))
        if len(page) < PAGE:
            break
        last = page[-1][0]
    if batch.input_file_id is None or len(done) >= batch.request_counts.total:
        return
    try:
        source = await files.find(kiln, tenant_id, batch.input_file_id)
    except NotFound:  # expired or deleted: those requests' ids are gone with it
        return
    path = files.content_path(kiln, source)

    def unrun() -> list[tuple[int, str]]:
        return [(n, msgspec.json.decode(raw)["custom_id"]) for n, raw in read_lines(path)
                if n not in done]  # fmt: skip

    for n, custom_id in await asyncio.to_thread(unrun):
        yield _line(_unrun(batch, custom_id, n))
