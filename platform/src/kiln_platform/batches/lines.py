"""One batch line: run through the same admission, scheduler and handlers as an online request
(class ``batch``), then recorded with its ledger row in one transaction keyed by
(batch, ``custom_id``), with the other lines that finished meanwhile (``recorder``): a line is
billed once and written once, whoever runs it how often."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import msgspec
import structlog
from sqlalchemy.dialects.postgresql import insert as pg_insert

from kiln_platform.admission.services import Admissions
from kiln_platform.batches.tables import BatchLine
from kiln_platform.errors import (
    BadRequest,
    Conflict,
    DeadlineExceeded,
    KilnError,
    Overloaded,
    ServiceUnavailable,
)
from kiln_platform.gateway import chat_kept, completions, llm, messages, responses, services
from kiln_platform.gateway.conversation_items import metadata_of
from kiln_platform.gateway.llm_schemas import ChatCompletionRequest, CompletionRequest
from kiln_platform.gateway.responses_schemas import ResponsesRequest
from kiln_platform.gateway.schemas import EmbeddingsRequest

if TYPE_CHECKING:
    from kiln_platform.billing.ledger import Usage
    from kiln_platform.context import Kiln
    from kiln_platform.keys.services import Principal

log = structlog.get_logger("kiln.batches")
TRANSIENT = (Overloaded, ServiceUnavailable, DeadlineExceeded, Conflict)
"""Errors after which a line is tried again later (a full queue, a pool starting, a hold a
killed gateway left behind); ``Overloaded`` includes rate limits, not the monthly budget."""

EXPIRED = {
    "code": "batch_expired",
    "message": "This request could not be executed before the completion window expired.",
}
"""The error of a line the window ended before (OpenAI's words)."""
REVOKED = {
    "code": "api_key_revoked",
    "message": "The API key that created this batch was revoked: the request was not executed.",
}
"""The error of a line not started because the batch's API key was revoked."""
CLIENT_REVOKED = {
    "code": "oauth_client_revoked",
    "message": "The OAuth client that created this batch was revoked: the request was not "
    "executed.",
}
"""The error of a line not started because the batch's OAuth client was revoked."""


def revoked(principal: dict[str, Any]) -> dict[str, str]:
    """The error of the lines a batch's revoked creator (``principal``, as stored) left."""
    return REVOKED if principal.get("key_id") is not None else CLIENT_REVOKED


class LineLedger:
    """The usage sink of a line's admission: it keeps the usage for the line's transaction."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.usage: Usage | None = None

    def record(self, usage: Usage) -> None:
        """Keep the line's usage (the first one: an admission records once), priced as a batch
        line (the price book's batch discount)."""
        if self.enabled and self.usage is None:
            self.usage = replace(usage, batch=True)

    async def commit(self, usage: Usage) -> None:
        """Keep it; the runner makes it durable with the line's result."""
        self.record(usage)


@dataclass(frozen=True, slots=True)
class Outcome:
    """A line's output line (``ok``) or error line, and what the ledger records for it."""

    ok: bool
    output: str
    usage: Usage | None


@dataclass(frozen=True, slots=True)
class Line:
    """A line to run: its batch, number (1-based), ``custom_id`` and request body."""

    batch_id: uuid.UUID
    tenant_id: uuid.UUID
    endpoint: str
    n: int
    custom_id: str
    body: dict[str, Any]

    @property
    def request_id(self) -> str:
        """The same on every run of the line, so its ledger row is written once."""
        return f"batch_{self.batch_id.hex}_{self.n}"


_SHAPES: dict[str, type[ChatCompletionRequest | CompletionRequest | ResponsesRequest]] = {
    "/v1/chat/completions": ChatCompletionRequest,
    "/v1/completions": CompletionRequest,
    "/v1/responses": ResponsesRequest,
}


async def _message(kiln: Kiln, admission: Any, body: dict[str, Any]) -> Any:
    """An Anthropic message (``/v1/messages``), as the online handler answers it."""
    try:
        data = msgspec.convert(body, messages.MessagesRequest)
    except msgspec.ValidationError as exc:
        raise BadRequest(f"{exc} (in 'body').", param="body") from None
    if data.stream:
        raise BadRequest("'stream' is not supported in a batch.", param="body.stream")
    chat = messages.chat_request(data)
    gen = await llm.prepare(kiln, admission, chat)
    gen.endpoint = "messages"
    completion = await completions.complete_chat(gen, reasoning=chat.include_reasoning)
    return messages.answered(gen, completion)


async def _call(kiln: Kiln, admission: Any, endpoint: str, body: dict[str, Any]) -> Any:
    """The online handler's response to ``body``."""
    if endpoint == "/v1/messages":
        return await _message(kiln, admission, body)
    try:
        if endpoint == "/v1/embeddings":
            embed = msgspec.convert(body, EmbeddingsRequest)
            return (await services.embed(kiln, admission, embed))[0]
        request = msgspec.convert(body, _SHAPES[endpoint])
    except msgspec.ValidationError as exc:
        raise BadRequest(f"{exc} (in 'body').", param="body") from None
    if request.stream:
        raise BadRequest("'stream' is not supported in a batch.", param="body.stream")
    if isinstance(request, ResponsesRequest):
        if request.background:
            raise BadRequest("'background' is not supported in a batch.", param="body.background")
        gen, history = await responses.prepare(kiln, admission, request)
        return await responses.complete(gen, request, history)
    if isinstance(request, CompletionRequest):
        gen = await llm.prepare(kiln, admission, request)
        return await completions.complete_text(gen, request.prompt_logprobs)
    metadata_of(request.metadata, "body.metadata")
    gen = await llm.prepare(kiln, admission, request)
    completion = await completions.complete_chat(
        gen, request.prompt_logprobs, reasoning=request.include_reasoning
    )
    await chat_kept.keep(gen, request, completion)  # a line run again keeps its first answer
    return completion


async def run(kiln: Kiln, principal: Principal, line: Line, timeout_s: float) -> Outcome:
    """Run one line; a transient error propagates (try again later), any other is its result."""
    rid = line.request_id
    sink = LineLedger(kiln.ledger.enabled)
    desk = Admissions(kiln.quotas, kiln.budgets, sink)
    admission = desk.open({"request_id": rid})
    admission.run_for(principal, timeout_s)
    try:
        async with admission:
            payload = msgspec.to_builtins(await _call(kiln, admission, line.endpoint, line.body))
        status = 200
    except TRANSIENT:
        await kiln.budgets.release(rid)  # its retry holds again, under the same request id
        raise
    except Exception as exc:  # what the online API would answer: an error object
        if not isinstance(exc, KilnError):
            log.exception("batch line failed", request_id=rid)
            exc = KilnError("Internal server error.")
        status = exc.status_code
        error = {"message": exc.message, "type": exc.type, "param": exc.param, "code": exc.code}
        payload = {"error": error}
    response = {"status_code": status, "request_id": rid, "body": payload}
    output = {"id": f"batch_req_{uuid.uuid4().hex}", "custom_id": line.custom_id,
              "response": response, "error": None}  # fmt: skip
    return Outcome(status == 200, msgspec.json.encode(output).decode(), sink.usage)


async def unrun(kiln: Kiln, batch_id: uuid.UUID, tenant_id: uuid.UUID,
                unfinished: list[tuple[int, str]], error: dict[str, str]) -> None:  # fmt: skip
    """Record the lines (number, ``custom_id``) that will not run as error lines in OpenAI's
    shape for a line the window ended before: no response, ``error`` (``EXPIRED``,
    ``REVOKED``), nothing billed. A line recorded meanwhile keeps its result."""
    rows = [{"batch_id": batch_id, "custom_id": custom_id, "tenant_id": tenant_id, "line": n,
             "ok": False, "output": msgspec.json.encode({
                 "id": f"batch_req_{uuid.uuid4().hex}", "custom_id": custom_id,
                 "response": None, "error": error}).decode()}
            for n, custom_id in unfinished]  # fmt: skip
    if rows:
        async with kiln.db.sessions.begin() as session:
            await session.execute(pg_insert(BatchLine).on_conflict_do_nothing(), rows)


async def record(kiln: Kiln, done: list[tuple[Line, Outcome]]) -> list[bool]:
    """Write finished lines' results and their ledger rows in one transaction; for each line,
    False if it was recorded before (its ledger row too: this run's usage is dropped, and its
    budget hold given back now rather than at the expiry sweep)."""
    rows = [{"batch_id": line.batch_id, "custom_id": line.custom_id, "tenant_id": line.tenant_id,
             "line": line.n, "ok": outcome.ok, "output": outcome.output}
            for line, outcome in done]  # fmt: skip
    inserted: list[dict[str, Any]] = []
    async with kiln.db.sessions.begin() as session:
        stmt = pg_insert(BatchLine).values(rows).on_conflict_do_nothing()
        new = set((await session.execute(
            stmt.returning(BatchLine.batch_id, BatchLine.custom_id)
        )).tuples())  # fmt: skip
        firsts = [(line.batch_id, line.custom_id) in new for line, _ in done]
        usages = [o.usage for (_, o), first in zip(done, firsts, strict=True)
                  if first and o.usage is not None]  # fmt: skip
        if usages:
            inserted = await kiln.ledger.write_in(session, usages)
    for (line, outcome), first in zip(done, firsts, strict=True):
        if not first and (outcome.usage is None or outcome.usage.held):
            await kiln.budgets.release(line.request_id)
    kiln.ledger.counted(inserted)
    return firsts
