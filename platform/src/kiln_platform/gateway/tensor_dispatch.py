"""Calls from the gateway to tensor workers (``POST /infer``) over the msgpack protocol."""

from __future__ import annotations

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
from kiln_runtimes.protocol import CONTENT_TYPE, ErrorReply, InferRequest, InferResult

if TYPE_CHECKING:
    from kiln_platform.gateway.dispatch import Ticket
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
_result = msgspec.msgpack.Decoder(InferResult)
_error = msgspec.msgpack.Decoder(ErrorReply)


class TensorClient:
    """Queues each request in its pool's scheduler, then sends it to the worker it is given."""

    def __init__(self, pools: PoolManager, http: aiohttp.ClientSession, timeout_s: float) -> None:
        self._pools = pools
        self._http = http
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)

    async def infer(
        self, model: str, request: InferRequest, ticket: Ticket, rows: int
    ) -> InferResult:
        """Run a request on a worker of ``model``; its fair-share cost is its batch rows."""
        runner = self._pools.runner(model)
        queued = runner.request(
            request.request_id, ticket.tenant, rows, timeout_s=ticket.timeout_s,
            priority=ticket.priority, weight=ticket.weight,
        )  # fmt: skip
        async with runner.slot(queued) as lease:
            worker = self._pools.worker(model, lease.worker)
            body, status = await self._post(worker, model, request)
        if status == 200:
            return _result.decode(body)
        reply = _error.decode(body)
        raise _ERRORS[reply.code](reply.message, retry_after=reply.retry_after_s)

    async def _post(self, worker: Worker, model: str, request: InferRequest) -> tuple[bytes, int]:
        try:
            async with self._http.post(
                f"{worker.url}/infer",
                data=_encoder.encode(request),
                headers={"content-type": CONTENT_TYPE, "x-request-id": request.request_id},
                timeout=self._timeout,
            ) as resp:
                return await resp.read(), resp.status
        except (aiohttp.ClientConnectionError, ConnectionError) as exc:
            self._pools.mark_unreachable(worker)
            raise ServiceUnavailable(
                f"The worker for `{model}` went away; retry shortly.", retry_after=1.0
            ) from exc
        except TimeoutError as exc:
            raise DeadlineExceeded("The model did not answer in time.") from exc
