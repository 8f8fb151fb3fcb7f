"""Calls from the gateway to runtime workers over the msgpack protocol."""

from __future__ import annotations

from typing import TYPE_CHECKING

import aiohttp
import msgspec
from kiln_runtimes.protocol import CONTENT_TYPE, EmbedRequest, EmbedResult, ErrorReply

from kiln_platform.errors import (
    BadRequest,
    DeadlineExceeded,
    KilnError,
    Overloaded,
    ServiceUnavailable,
)

if TYPE_CHECKING:
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
_error = msgspec.msgpack.Decoder(ErrorReply)


class WorkerClient:
    """Sends requests to the worker the pool manager routes to; maps worker errors to Kiln's."""

    def __init__(self, pools: PoolManager, http: aiohttp.ClientSession, timeout_s: float) -> None:
        self._pools = pools
        self._http = http
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)

    async def embed(self, model: str, request: EmbedRequest) -> EmbedResult:
        """Embed token ids on a worker of ``model``."""
        worker = self._pools.route(model)
        try:
            async with self._http.post(
                f"{worker.url}/embed",
                data=_encoder.encode(request),
                headers={"content-type": CONTENT_TYPE, "x-request-id": request.request_id},
                timeout=self._timeout,
            ) as resp:
                body = await resp.read()
                status = resp.status
        except (aiohttp.ClientConnectionError, ConnectionError) as exc:
            self._pools.mark_unreachable(worker)
            raise ServiceUnavailable(
                f"The worker for `{model}` went away; retry shortly.", retry_after=1.0
            ) from exc
        except TimeoutError as exc:
            raise DeadlineExceeded("The model did not answer in time.") from exc
        if status == 200:
            return _result.decode(body)
        reply = _error.decode(body)
        raise _ERRORS[reply.code](reply.message, retry_after=reply.retry_after_s)
