"""The generation path: relay the backend's ``GenerateChunk`` stream as length-prefixed frames."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import structlog
from aiohttp import web

from kiln_runtimes._errors import BadRequest, Internal, Overloaded
from kiln_runtimes._spans import stream_spans
from kiln_runtimes.protocol import CONTENT_TYPE, GenerateChunk, GenerateRequest, frame
from kiln_runtimes.store import tree_hex

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from kiln_runtimes.backends.base import StreamBackend

log = structlog.get_logger(__name__)


def validate(request: GenerateRequest, context_length: int) -> None:
    """Raise ``BadRequest`` unless the prompt fits the model and asks for at least one token,
    and its adapter (if any) is a tree digest, not a path."""
    if not request.prompt_ids:
        raise BadRequest("prompt_ids is empty")
    if len(request.prompt_ids) >= context_length:
        raise BadRequest(
            f"prompt has {len(request.prompt_ids)} tokens; the model's context is {context_length}"
        )
    if request.max_tokens < 1:
        raise BadRequest("max_tokens must be at least 1")
    if request.adapter is not None:
        try:
            tree_hex(request.adapter)
        except ValueError as exc:
            raise BadRequest(f"adapter: {exc}") from None


async def stream(
    http: web.Request, backend: StreamBackend, request: GenerateRequest, max_waiting: int
) -> tuple[web.StreamResponse, str]:
    """Stream one sequence; closing the backend's iterator is how cancellation reaches it.

    A failure before the first chunk raises (and becomes an ``ErrorReply``); after it, the stream
    ends with a ``finish_reason="error"`` chunk. A client that went away is noticed at the next
    write, one decode step at most, and the iterator is closed right then.
    """
    if backend.health().waiting >= max_waiting:
        raise Overloaded("too many sequences waiting", retry_after_s=1.0)
    received = time.time_ns()
    try:
        chunks = backend.stream(request)
    except ValueError as exc:
        raise BadRequest(str(exc), param=getattr(exc, "param", None)) from None
    try:
        try:
            first = await anext(chunks)
        except StopAsyncIteration:
            raise Internal("generation ended without a chunk") from None
        except ValueError as exc:  # an adapter this model cannot use
            raise BadRequest(str(exc), param=getattr(exc, "param", None)) from None
        response = web.StreamResponse(headers={"Content-Type": CONTENT_TYPE})
        running = backend.health().running
        try:
            await response.prepare(http)
            outcome, last = await _relay(response, first, chunks)
            stream_spans(received, last, running)
            await response.write_eof()
        except ConnectionResetError:
            log.info("client disconnected; sequence cancelled")
            outcome = "cancelled"
        return response, outcome
    finally:
        await _close(chunks)


async def _relay(
    response: web.StreamResponse, chunk: GenerateChunk, chunks: AsyncIterator[GenerateChunk]
) -> tuple[str, GenerateChunk]:
    """Write every chunk; the outcome and the last chunk."""
    outcome = "ok"
    while True:
        await response.write(frame(chunk))
        if chunk.finish_reason is not None:
            return outcome, chunk
        try:
            chunk = await anext(chunks)
        except StopAsyncIteration:
            return outcome, chunk
        except Exception:
            log.exception("generation failed mid-stream")
            chunk = GenerateChunk(request_id=chunk.request_id, token_ids=[], finish_reason="error")
            outcome = "internal"


async def _close(chunks: AsyncIterator[GenerateChunk]) -> None:
    """Close the backend's iterator (async generators have ``aclose``), cancelling the sequence."""
    aclose = getattr(chunks, "aclose", None)
    if aclose is not None:
        await aclose()
