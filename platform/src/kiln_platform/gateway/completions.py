"""Response and SSE stream builders for chat and text completions."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from litestar.response import Stream

from kiln_platform.errors import KilnError
from kiln_platform.gateway.llm import Generation, sse
from kiln_platform.gateway.llm_schemas import (
    AssistantMessage,
    ChatChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChunkChoice,
    Delta,
    TextChoice,
    TextCompletion,
    Usage,
)
from kiln_platform.gateway.schemas import ErrorBody, ErrorResponse
from kiln_platform.registry import lifecycle
from kiln_platform.registry.lifecycle import fingerprint

if TYPE_CHECKING:
    from collections.abc import AsyncGenerator

DONE = b"data: [DONE]\n\n"
SSE = "text/event-stream"


def streamed(gen: Generation, events: AsyncGenerator[bytes, None]) -> Stream:
    """An event stream (held to the generation's deadline by its admission), closed when the
    admission is left however the response ends (a send cut at the deadline leaves it
    suspended: closing it cancels the worker's sequence)."""
    gen.admission.closers.append(events.aclose)
    return Stream(events, media_type=SSE, headers=lifecycle.headers(gen.version))


def _usage(gen: Generation) -> Usage:
    prompt, completion, total = gen.usage_counts()
    return Usage(prompt_tokens=prompt, completion_tokens=completion, total_tokens=total)


def _id(prefix: str, gen: Generation) -> str:
    return f"{prefix}-{gen.request.request_id.removeprefix('req_')}"


async def _collect(gen: Generation) -> tuple[str, str]:
    parts, finish = [], "stop"
    async for piece in gen.pieces():
        parts.append(piece.text)
        finish = piece.finish_reason or finish
    return "".join(parts), finish


async def complete_chat(gen: Generation) -> ChatCompletion:
    """A non-streamed chat completion."""
    text, finish = await _collect(gen)
    return ChatCompletion(
        id=_id("chatcmpl", gen),
        created=int(time.time()),
        model=gen.name,
        system_fingerprint=fingerprint(gen.version),
        choices=[ChatChoice(message=AssistantMessage(content=text), finish_reason=finish)],
        usage=_usage(gen),
    )


async def complete_text(gen: Generation) -> TextCompletion:
    """A non-streamed text completion."""
    text, finish = await _collect(gen)
    return TextCompletion(
        id=_id("cmpl", gen),
        created=int(time.time()),
        model=gen.name,
        system_fingerprint=fingerprint(gen.version),
        choices=[TextChoice(text=text, finish_reason=finish)],
        usage=_usage(gen),
    )


def _error_event(exc: KilnError) -> bytes:
    return sse(
        ErrorResponse(
            error=ErrorBody(message=exc.message, type=exc.type, param=exc.param, code=exc.code)
        )
    )


async def stream_chat(gen: Generation, include_usage: bool) -> AsyncGenerator[bytes, None]:
    """``chat.completion.chunk`` events, then usage (if asked) and ``[DONE]``."""
    cid, created, model = _id("chatcmpl", gen), int(time.time()), gen.name
    mark = fingerprint(gen.version)

    def chunk(delta: Delta, finish: str | None = None) -> bytes:
        choice = ChunkChoice(delta=delta, finish_reason=finish)
        return sse(ChatCompletionChunk(id=cid, created=created, model=model, choices=[choice],
                                       system_fingerprint=mark))  # fmt: skip

    yield chunk(Delta(role="assistant", content=""))
    try:
        async for piece in gen.pieces():
            if piece.text:
                yield chunk(Delta(content=piece.text))
            if piece.finish_reason:
                yield chunk(Delta(), piece.finish_reason)
    except KilnError as exc:
        yield _error_event(exc)
    if include_usage:
        yield sse(
            ChatCompletionChunk(id=cid, created=created, model=model, choices=[], usage=_usage(gen))
        )
    yield DONE


async def stream_text(gen: Generation, include_usage: bool) -> AsyncGenerator[bytes, None]:
    """``text_completion`` events, then usage (if asked) and ``[DONE]``."""
    cid, created, model = _id("cmpl", gen), int(time.time()), gen.name
    try:
        async for piece in gen.pieces():
            if piece.text or piece.finish_reason:
                choice = TextChoice(text=piece.text, finish_reason=piece.finish_reason)
                yield sse(TextCompletion(id=cid, created=created, model=model, choices=[choice]))
    except KilnError as exc:
        yield _error_event(exc)
    if include_usage:
        yield sse(
            TextCompletion(id=cid, created=created, model=model, choices=[], usage=_usage(gen))
        )
    yield DONE
