"""Anthropic's Message Batches (``/v1/messages/batches``) on Kiln's batches.

A batch's requests become a ``purpose=batch`` file of ``/v1/messages`` lines and a batch of
them (``services.create``: the quotas, runner, window and ledger row per line of OpenAI's Batch
API, where the batch shows too, as ``batch_<hex>``). It is read back in Anthropic's shapes:
``msgbatch_<hex>``, ``processing_status``, its requests counted by outcome, and results of
``succeeded`` messages, ``errored`` ones (Anthropic's error object), ``canceled`` and
``expired``. Every request is checked when the batch is made (a 400 naming
``requests[i]…``; nothing stored), and names the same model (one model a batch, as Kiln's)."""

from __future__ import annotations

import contextlib
import re
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Literal

import msgspec

from kiln_platform.batches import files, services
from kiln_platform.batches.message_batch_results import failures, results
from kiln_platform.batches.message_batch_schemas import (
    DeletedMessageBatch,
    MessageBatch,
    MessageBatchCreate,
    MessageBatchList,
    MessageRequestCounts,
)
from kiln_platform.batches.schemas import OPEN, BatchCreate, BatchObject
from kiln_platform.errors import BadRequest, NotFound
from kiln_platform.gateway import messages
from kiln_platform.quotas.batch_policy import line_tokens

if TYPE_CHECKING:
    import uuid
    from collections.abc import AsyncIterator

    from kiln_platform.context import Kiln
    from kiln_platform.keys.services import Principal

PREFIX, OPENAI_PREFIX, ENDPOINT = "msgbatch_", "batch_", "/v1/messages"
CUSTOM_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")
ENDED_AT = ("completed_at", "failed_at", "expired_at", "cancelled_at")


def _time(epoch: int | None) -> str | None:
    if epoch is None:
        return None
    return datetime.fromtimestamp(epoch, UTC).isoformat().replace("+00:00", "Z")


def _status(batch: BatchObject) -> Literal["in_progress", "canceling", "ended"]:
    if batch.status == "cancelling":
        return "canceling"
    return "in_progress" if batch.status in OPEN else "ended"


def shaped(batch: BatchObject, expired: int, base_url: str) -> MessageBatch:
    """An OpenAI batch of ``/v1/messages`` lines (``expired`` of them past its window) in
    Anthropic's shape; ``base_url``: where its results are fetched."""
    counts, status = batch.request_counts, _status(batch)
    done = counts.completed + counts.failed
    left = counts.total - done
    tally = MessageRequestCounts(
        succeeded=counts.completed, expired=expired, errored=counts.failed - expired,
        processing=left if status != "ended" else 0,
        canceled=left if batch.status == "cancelled" else 0,
    )  # fmt: skip
    if batch.status == "failed":  # its lines were refused before any ran
        tally.errored += left
    ident = PREFIX + batch.id.removeprefix(OPENAI_PREFIX)
    ended = next((at for name in ENDED_AT if (at := getattr(batch, name)) is not None), None)
    return MessageBatch(
        id=ident, processing_status=status, request_counts=tally,
        created_at=_time(batch.created_at) or "", expires_at=_time(batch.expires_at) or "",
        ended_at=_time(ended), cancel_initiated_at=_time(batch.cancelling_at),
        results_url=f"{base_url}/v1/messages/batches/{ident}/results" if ended else None,
    )  # fmt: skip


async def _shaped_all(
    kiln: Kiln, tenant_id: uuid.UUID, batches: list[BatchObject], base_url: str
) -> list[MessageBatch]:
    """``shaped`` of each batch, their expired lines counted in one query."""
    expired = await failures(kiln, tenant_id, batches)
    return [shaped(b, expired.get(b.id, 0), base_url) for b in batches]


def _params(params: dict[str, Any], where: str) -> None:
    """A request's ``params``, checked as ``/v1/messages`` checks its body."""
    try:
        data = msgspec.convert(params, messages.MessagesRequest)
    except msgspec.ValidationError as exc:
        raise BadRequest(f"'{where}': {exc}", param=where) from None
    if data.stream:
        raise BadRequest(f"'{where}.stream' is not supported in a batch.",
                         param=f"{where}.stream")  # fmt: skip
    try:
        messages.chat_request(data)
    except BadRequest as exc:
        field = f"{where}.{exc.param}" if exc.param else where
        raise BadRequest(f"'{field}': {exc.message}", param=field) from None


def lines_of(data: MessageBatchCreate, most: int) -> tuple[list[str], int]:
    """The batch file's lines and their estimated tokens; a bad request is a 400 naming it."""
    if not 1 <= len(data.requests) <= most:
        raise BadRequest(f"'requests' takes 1 to {most} requests.", param="requests")
    seen: set[str] = set()
    lines, tokens, model = [], 0, None
    for i, asked in enumerate(data.requests):
        where = f"requests[{i}]"
        if not CUSTOM_ID.fullmatch(asked.custom_id) or asked.custom_id in seen:
            raise BadRequest(f"'{where}.custom_id' must be 1-64 letters, digits, '_' or '-', "
                             "each once in the batch.", param=f"{where}.custom_id")  # fmt: skip
        seen.add(asked.custom_id)
        _params(asked.params, f"{where}.params")
        if model is not None and asked.params["model"] != model:
            raise BadRequest(f"'{where}.params.model' is {asked.params['model']!r}; every "
                             f"request of a batch names the same model ({model!r}).",
                             param=f"{where}.params.model")  # fmt: skip
        model = asked.params["model"]
        line = {"custom_id": asked.custom_id, "method": "POST", "url": ENDPOINT,
                "body": asked.params}  # fmt: skip
        lines.append(msgspec.json.encode(line).decode())
        tokens += line_tokens(asked.params)
    return lines, tokens


async def create(
    kiln: Kiln, principal: Principal, data: MessageBatchCreate, base_url: str
) -> MessageBatch:
    """A new batch of the requests (refused whole, storing nothing, if one is bad or a batch
    quota has no room: ``services.create``)."""
    lines, tokens = lines_of(data, kiln.settings.max_batch_lines)
    tenant = principal.tenant_id
    stored = await files.store_input(kiln, tenant, "message_batch.jsonl", lines, tokens)
    file_id = files.public_id("file-", stored.id)
    try:
        made = await services.create(kiln, principal, BatchCreate(
            input_file_id=file_id, endpoint=ENDPOINT, completion_window="24h"))  # fmt: skip
    except BaseException:
        await files.remove(kiln, tenant, file_id)
        raise
    return shaped(made, 0, base_url)


def _openai_id(batch_id: str) -> str:
    uid = files.parse_id(PREFIX, batch_id, "message batch", "message_batch_id")
    return files.public_id(OPENAI_PREFIX, uid)


async def _batch(kiln: Kiln, tenant_id: uuid.UUID, batch_id: str) -> BatchObject:
    """The tenant's batch of messages (a batch of another endpoint is as missing)."""
    batch = await services.retrieve(kiln, tenant_id, _openai_id(batch_id))
    if batch.endpoint != ENDPOINT:
        raise NotFound(f"No such message batch: '{batch_id}'.", param="message_batch_id")
    return batch


async def retrieve(kiln: Kiln, tenant_id: uuid.UUID, batch_id: str, base_url: str) -> MessageBatch:
    """One of the tenant's message batches."""
    batch = await _batch(kiln, tenant_id, batch_id)
    return (await _shaped_all(kiln, tenant_id, [batch], base_url))[0]


async def listed(
    kiln: Kiln, tenant_id: uuid.UUID, base_url: str, *, limit: int,
    after_id: str | None = None, before_id: str | None = None,
) -> MessageBatchList:  # fmt: skip
    """The tenant's message batches, newest first, paged as Anthropic's list."""
    if after_id is not None and before_id is not None:
        raise BadRequest("Give 'after_id' or 'before_id', not both.", param="before_id")
    after, before = (
        None if at is None else files.parse_id(PREFIX, at, "message batch", name)
        for at, name in ((after_id, "after_id"), (before_id, "before_id"))
    )
    found, more = await services.page(kiln, tenant_id, ENDPOINT, limit=limit, after=after,
                                      before=before)  # fmt: skip
    data = await _shaped_all(kiln, tenant_id, found, base_url)
    return MessageBatchList(data=data, has_more=more, first_id=data[0].id if data else None,
                            last_id=data[-1].id if data else None)  # fmt: skip


async def cancel(kiln: Kiln, tenant_id: uuid.UUID, batch_id: str, base_url: str) -> MessageBatch:
    """Cancel: no new request starts; ``canceling`` until the running ones are done."""
    await _batch(kiln, tenant_id, batch_id)
    batch = await services.cancel(kiln, tenant_id, _openai_id(batch_id))
    return (await _shaped_all(kiln, tenant_id, [batch], base_url))[0]


async def delete(kiln: Kiln, tenant_id: uuid.UUID, batch_id: str) -> DeletedMessageBatch:
    """Delete an ended batch, its results and its files (one still processing: a 400)."""
    batch = await _batch(kiln, tenant_id, batch_id)
    if _status(batch) != "ended":
        raise BadRequest(f"The batch is {_status(batch)}: cancel it, and delete it once it "
                         "has ended.", param="message_batch_id")  # fmt: skip
    await services.remove(kiln, tenant_id, batch.id)
    for file_id in (batch.input_file_id, batch.output_file_id, batch.error_file_id):
        if file_id is not None:
            with contextlib.suppress(NotFound):  # expired, or deleted through /v1/files
                await files.remove(kiln, tenant_id, file_id)
    return DeletedMessageBatch(id=batch_id)


async def result_lines(kiln: Kiln, tenant_id: uuid.UUID, batch_id: str) -> AsyncIterator[bytes]:
    """The ended batch's results, a JSON line each (``message_batch_results``)."""
    batch = await _batch(kiln, tenant_id, batch_id)
    if _status(batch) != "ended":
        raise BadRequest(f"The batch is {_status(batch)}: its results are ready once it has "
                         "ended.", param="message_batch_id")  # fmt: skip
    return results(kiln, tenant_id, batch)
