"""Calls from the gateway to runtime workers over the msgpack protocol."""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING

import aiohttp
import msgspec

from kiln_platform.errors import (
    BadRequest,
    DeadlineExceeded,
    KilnError,
    Overloaded,
    ServiceUnavailable,
)
from kiln_runtimes.protocol import (
    CONTENT_TYPE,
    EmbedRequest,
    EmbedResult,
    ErrorReply,
    GenerateChunk,
    GenerateRequest,
)

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from kiln_platform.pools.local import Worker
    from kiln_platform.pools.services import PoolManager

_ERRORS: dict[str, type[KilnError]] = {
    "bad_request": BadRequest,
    "overloaded": Overloaded,
    "deadline_exceeded": DeadlineExceeded,
    "draining": ServiceUnavailable,
    "internal": KilnError,
}
_encoder = msgspec.msgpack.Encoder()
_result = msgspec.msgpack.Decoder(EmbedResult)
_chunk = msgspec.msgpack.Decoder(GenerateChunk)
_error_decoder = msgspec.msgpack.Decoder(ErrorReply)


class WorkerClient:
    """Sends requests to the worker the pool manager routes to; maps worker errors to Kiln's."""

    def __init__(self, pools: PoolManager, http: aiohttp.ClientSession, timeout_s: float) -> None:
        self._pools = pools
        self._http = http
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._stream_timeout = aiohttp.ClientTimeout(total=None, sock_read=timeout_s)

    async def embed(self, model: str, request: EmbedRequest) -> EmbedResult:
        """Embed token ids on a worker of ``model``."""
        worker = self._pools.route(model)
        async with self._post(worker, model, "/embed", request, self._timeout) as resp:
            body = await resp.read()
            if resp.status == 200:
                return _result.decode(body)
        raise _error(body)

    async def generate(self, model: str, request: GenerateRequest) -> AsyncIterator[GenerateChunk]:
        """Stream chunks of a generation; closing the iterator cancels it on the worker."""
        worker = self._pools.route(model)
        async with self._post(worker, model, "/generate", request, self._stream_timeout) as resp:
            if resp.status != 200:
                raise _error(await resp.read())
            try:
                while True:
                    header = await resp.content.readexactly(4)
                    chunk = _chunk.decode(await resp.content.readexactly(int.from_bytes(header)))
                    yield chunk
                    if chunk.finish_reason is not None:
                        return
            except (asyncio.IncompleteReadError, aiohttp.ClientPayloadError) as exc:
                raise ServiceUnavailable(f"The worker for `{model}` went away.") from exc
            finally:
                resp.close()  # drops the connection: the worker sees it and cancels

    @contextlib.asynccontextmanager
    async def _post(
        self,
        worker: Worker,
        model: str,
        path: str,
        message: EmbedRequest | GenerateRequest,
        limit: aiohttp.ClientTimeout,
    ) -> AsyncIterator[aiohttp.ClientResponse]:
        try:
            async with self._http.post(
                f"{worker.url}{path}",
                data=_encoder.encode(message),
                headers={"content-type": CONTENT_TYPE, "x-request-id": message.request_id},
                timeout=limit,
            ) as resp:
                yield resp
        except (aiohttp.ClientConnectionError, ConnectionError) as exc:
            self._pools.mark_unreachable(worker)
            raise ServiceUnavailable(
                f"The worker for `{model}` went away; retry shortly.", retry_after=1.0
            ) from exc
        except TimeoutError as exc:
            raise DeadlineExceeded("The model did not answer in time.") from exc


def _error(body: bytes) -> KilnError:
    reply = _error_decoder.decode(body)
    return _ERRORS[reply.code](reply.message, retry_after=reply.retry_after_s)
