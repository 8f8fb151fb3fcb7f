"""The Responses API on the chat path: input items become chat messages, the generation is
the chat completion's, and its text comes back as one assistant message (or the Responses
stream's typed events)."""

from __future__ import annotations

import itertools
import re
import time
from typing import TYPE_CHECKING, Any

import msgspec

from kiln_platform.errors import BadRequest, KilnError
from kiln_platform.gateway import llm
from kiln_platform.gateway._prompts import ROLES
from kiln_platform.gateway.completions import collect, ident
from kiln_platform.gateway.llm_schemas import ChatCompletionRequest, ContentPart, Message
from kiln_platform.gateway.responses_schemas import (
    UNSUPPORTED,
    IncompleteDetails,
    InputItem,
    InputTokensDetails,
    OutputMessage,
    OutputText,
    ResponseError,
    ResponseObject,
    ResponsesRequest,
    ResponseUsage,
)
from kiln_platform.registry.lifecycle import fingerprint

if TYPE_CHECKING:
    from collections.abc import AsyncGenerator

    from kiln_platform.admission.services import Admission
    from kiln_platform.context import Kiln
    from kiln_platform.gateway.llm import Generation

TEXT_PARTS = {"input_text", "output_text", "text"}
# The chat path's names for the Responses API's fields, in its error messages.
_RENAMED = {
    "max_completion_tokens": "max_output_tokens", "messages": "input",
    "response_format.json_schema": "text.format", "response_format": "text.format",
}  # fmt: skip
_NAMES = re.compile(r"\b(max_completion_tokens|messages|response_format(?:\.json_schema)?)\b")


def _reject_unsupported(request: ResponsesRequest) -> None:
    if request.store not in UNSUPPORTED["store"]:
        raise BadRequest(
            "Kiln keeps no responses: set 'store' to false (or leave it out) and send the "
            "conversation so far as input items.",
            param="store",
        )
    for field, unused in UNSUPPORTED.items():
        if getattr(request, field) not in unused:
            raise BadRequest(f"The parameter '{field}' is not supported by Kiln.", param=field)


def _content(i: int, item: InputItem) -> str | list[ContentPart]:
    if isinstance(item.content, str):
        return item.content
    if item.content is None:
        raise BadRequest(f"'input[{i}].content' is required.", param=f"input[{i}].content")
    parts = []
    for j, part in enumerate(item.content):
        if part.type not in TEXT_PARTS or part.text is None:
            raise BadRequest(
                f"'input[{i}].content[{j}]' has type '{part.type}'; only text is supported.",
                param=f"input[{i}].content[{j}].type",
            )
        parts.append(ContentPart(type="text", text=part.text))
    return parts


def _message(i: int, item: InputItem) -> Message:
    if item.type != "message":
        raise BadRequest(
            f"'input[{i}]' has type '{item.type}'; Kiln serves message items only.",
            param=f"input[{i}].type",
        )
    if item.role not in ROLES:
        raise BadRequest(
            f"'input[{i}].role' is '{item.role}'; Kiln supports system, developer, user and "
            "assistant.",
            param=f"input[{i}].role",
        )
    return Message(role=item.role, content=_content(i, item))


def _response_format(text: dict[str, Any] | None) -> dict[str, Any] | None:
    """``text.format`` as chat's ``response_format`` (a ``json_schema`` format is flat here)."""
    if text is None:
        return None
    if set(text) - {"format", "verbosity"} or text.get("verbosity") not in (None, "medium"):
        raise BadRequest(
            "'text' takes 'format' and 'verbosity' (medium only) in Kiln.", param="text"
        )
    given = text.get("format")
    if not isinstance(given, dict) or given.get("type") != "json_schema":
        return given
    return {"type": "json_schema", "json_schema": {"schema": given.get("schema", {})}}


def to_chat(request: ResponsesRequest) -> ChatCompletionRequest:
    """The chat completion a response is: ``instructions`` as the first (system) message, then
    the input (a string is one user message)."""
    _reject_unsupported(request)
    if not request.input:
        raise BadRequest("'input' must not be empty.", param="input")
    given = request.input
    messages = [Message(role="user", content=given)] if isinstance(given, str) else [
        _message(i, item) for i, item in enumerate(given)
    ]  # fmt: skip
    if request.instructions:
        messages.insert(0, Message(role="system", content=request.instructions))
    return ChatCompletionRequest(
        model=request.model, messages=messages, max_completion_tokens=request.max_output_tokens,
        temperature=request.temperature, top_p=request.top_p, stream=request.stream,
        user=request.user or request.safety_identifier,
        response_format=_response_format(request.text),
    )  # fmt: skip


async def prepare(kiln: Kiln, admission: Admission, request: ResponsesRequest) -> Generation:
    """The chat path's ``prepare``, its errors naming the Responses API's fields; usage is
    recorded under the ``responses`` endpoint."""
    try:
        gen = await llm.prepare(kiln, admission, to_chat(request))
    except BadRequest as exc:
        message = _NAMES.sub(lambda m: _RENAMED[m.group(1)], exc.message)
        param = exc.param and _NAMES.sub(lambda m: _RENAMED[m.group(1)], exc.param)
        raise BadRequest(message, param=param) from exc
    gen.endpoint = "responses"
    return gen


def _usage(gen: Generation) -> ResponseUsage:
    prompt, completion, total = gen.usage_counts()
    return ResponseUsage(
        input_tokens=prompt, output_tokens=completion, total_tokens=total,
        input_tokens_details=InputTokensDetails(cached_tokens=gen.cached_tokens),
    )  # fmt: skip


def _response(
    gen: Generation, request: ResponsesRequest, created: int, **fields: Any
) -> ResponseObject:
    return ResponseObject(
        id=ident("resp", gen), created_at=created, model=gen.name,
        instructions=request.instructions, max_output_tokens=request.max_output_tokens,
        temperature=1.0 if request.temperature is None else request.temperature,
        top_p=1.0 if request.top_p is None else request.top_p, user=request.user,
        metadata=request.metadata or {}, system_fingerprint=fingerprint(gen.version),
        text=request.text or {"format": {"type": "text"}},
        **{"status": "in_progress", "output": [], "usage": None, **fields},
    )  # fmt: skip


def _answered(
    gen: Generation, request: ResponsesRequest, created: int, text: str, finish: str
) -> ResponseObject:
    """The finished response: ``incomplete`` if the text was cut at the token limit."""
    status = "completed" if finish == "stop" else "incomplete"
    message = OutputMessage(id=ident("msg", gen), status=status, content=[OutputText(text=text)])
    details = None if status == "completed" else IncompleteDetails(reason="max_output_tokens")
    return _response(
        gen, request, created, status=status, output=[message], usage=_usage(gen),
        incomplete_details=details, completed_at=int(time.time()),
    )  # fmt: skip


async def complete(gen: Generation, request: ResponsesRequest) -> ResponseObject:
    """A non-streamed response."""
    created = int(time.time())
    (answer,) = await collect(gen)
    return _answered(gen, request, created, "".join(answer.parts), answer.finish)


async def stream(gen: Generation, request: ResponsesRequest) -> AsyncGenerator[bytes, None]:
    """The Responses stream: ``response.created``, ``response.in_progress``, the message's item
    and part, its ``response.output_text.delta`` events, their ``done`` events, then
    ``response.completed`` (or ``response.incomplete``); a failure after the start is an
    ``error`` event and ``response.failed``."""
    created, numbers, item = int(time.time()), itertools.count(), ident("msg", gen)
    at = {"item_id": item, "output_index": 0, "content_index": 0}

    def event(kind: str, **fields: Any) -> bytes:
        body = msgspec.json.encode({"type": kind, "sequence_number": next(numbers), **fields})
        return b"event: " + kind.encode() + b"\ndata: " + body + b"\n\n"

    shell = _response(gen, request, created)
    yield event("response.created", response=shell)
    yield event("response.in_progress", response=shell)
    opened = OutputMessage(id=item, status="in_progress", content=[])
    yield event("response.output_item.added", output_index=0, item=opened)
    yield event("response.content_part.added", **at, part=OutputText(text=""))
    parts, finish = [], "stop"
    try:
        async for piece in gen.pieces():
            if piece.text:
                parts.append(piece.text)
                yield event("response.output_text.delta", **at, delta=piece.text, logprobs=[])
            finish = piece.finish_reason or finish
    except KilnError as exc:
        yield event("error", code=exc.code, message=exc.message, param=exc.param)
        failure = ResponseError(code="server_error", message=exc.message)
        failed = _response(gen, request, created, status="failed", error=failure)
        yield event("response.failed", response=failed)
        return
    done = _answered(gen, request, created, "".join(parts), finish)
    message = done.output[0]
    yield event("response.output_text.done", **at, text=message.content[0].text, logprobs=[])
    yield event("response.content_part.done", **at, part=message.content[0])
    yield event("response.output_item.done", output_index=0, item=message)
    yield event(f"response.{done.status}", response=done)
