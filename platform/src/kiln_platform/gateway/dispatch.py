"""Calls from the gateway to runtime workers over the msgpack protocol."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

import aiohttp
import msgspec
import structlog

from kiln_platform.errors import (
    BadRequest,
    DeadlineExceeded,
    KilnError,
    Overloaded,
    ServiceUnavailable,
)
from kiln_platform.observability import timing
from kiln_runtimes import tracing
from kiln_runtimes.protocol import (
    CONTENT_TYPE,
    EmbedRequest,
    EmbedResult,
    ErrorReply,
    GenerateChunk,
    GenerateRequest,
    InferRequest,
    InferResult,
)

if TYPE_CHECKING:
    from collections.abc import AsyncGenerator, AsyncIterator

    from kiln_platform.admission.services import QueueTerms
    from kiln_platform.pools.backend import PoolWorker
    from kiln_platform.pools.services import PoolManager
    from kiln_platform.scheduler.runner import Lease, PoolRunner
    from kiln_platform.scheduler.schemas import Request

_ERRORS: dict[str, type[KilnError]] = {
    "bad_request": BadRequest,
    "overloaded": Overloaded,
    "deadline_exceeded": DeadlineExceeded,
    "draining": ServiceUnavailable,
    "busy": Overloaded,
    "unsupported": ServiceUnavailable,  # a worker older than this gateway: retry shortly
    "internal": KilnError,
    "unauthorized": KilnError,  # the worker does not know this gateway's secret: a 500
}
_encoder = msgspec.msgpack.Encoder()
_result = msgspec.msgpack.Decoder(EmbedResult)
_infer_result = msgspec.msgpack.Decoder(InferResult)
_chunk = msgspec.msgpack.Decoder(GenerateChunk)
_error_decoder = msgspec.msgpack.Decoder(ErrorReply)
log = structlog.get_logger(__name__)
BUSY_BACKOFF_S = 0.02
"""A ``busy`` refusal's request waits this long before it is queued for a credit again."""


class WorkerClient:
    """Queues each request in its pool's scheduler, then sends it to the worker it is given."""

    def __init__(self, pools: PoolManager, http: aiohttp.ClientSession, timeout_s: float) -> None:
        self._pools = pools
        self._http = http
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._stream = aiohttp.ClientTimeout(total=None, sock_read=timeout_s)

    def screen(self, pool: str, request_id: str, terms: QueueTerms, cost: float) -> None:
        """Raise the scheduler's rejection now if the pool (``model@version``) would turn the
        request away (cheap: before tokenizing); admitted requests are decided again later."""
        try:
            runner = self._pools.runner(self._pools.route(pool, terms.priority))
        except ServiceUnavailable:  # no ready worker: the request's own call answers that
            return
        runner.screen(_queued(runner, request_id, terms, cost))

    async def embed(self, pool: str, request: EmbedRequest, terms: QueueTerms) -> EmbedResult:
        """Embed token ids on a worker of ``pool``; fair-share cost is the number of inputs."""
        cost = len(request.input_ids)
        async with self._dispatch(
            pool, "/embed", request, terms, cost=cost, limit=self._timeout
        ) as sent:
            body = await sent.response.read()
            if sent.response.status == 200:
                return _worker_timed(_result.decode(body))
        raise _error(body)

    async def generate(
        self, pool: str, request: GenerateRequest, terms: QueueTerms
    ) -> AsyncGenerator[GenerateChunk, None]:
        """Stream a generation; closing the iterator cancels it on the worker.

        The fair-share cost is prompt + max tokens at admission, settled to the tokens actually
        processed when the stream ends. The deadline checks hold only what it surely takes
        against its deadline (``PREFILL_SHARE``): an answer may end at its first token.
        """
        cost = len(request.prompt_ids) + request.max_tokens
        least = len(request.prompt_ids) * PREFILL_SHARE + 1
        async with self._dispatch(
            pool, "/generate", request, terms, cost=cost, least=least, limit=self._stream
        ) as sent:
            resp = sent.response
            if resp.status != 200:
                raise _error(await resp.read())
            generated = 0
            try:
                async for chunk in _frames(resp, pool):
                    generated = chunk.completion_tokens or generated + len(chunk.token_ids)
                    yield chunk
            finally:
                sent.lease.actual_cost = len(request.prompt_ids) + generated
                resp.close()  # drops the connection: the worker sees it and cancels

    async def infer(
        self, pool: str, request: InferRequest, terms: QueueTerms, rows: int
    ) -> InferResult:
        """Run tensors on a worker of ``pool``; fair-share cost is the request's batch rows."""
        async with self._dispatch(
            pool, "/infer", request, terms, cost=rows, limit=self._timeout
        ) as sent:
            body = await sent.response.read()
            if sent.response.status == 200:
                return _worker_timed(_infer_result.decode(body))
        raise _error(body)

    @contextlib.asynccontextmanager
    async def _dispatch(
        self, pool: str, path: str, message: M, terms: QueueTerms, *, cost: float,
        limit: aiohttp.ClientTimeout, least: float | None = None,
    ) -> AsyncIterator[Sent]:  # fmt: skip
        """Lease a worker of ``pool`` in its fair queue and send it ``message``.

        A worker that turns the request away unrun (draining: a scale-down retired it between
        the lease and the request), is not listening any more, or dies holding it before its
        answer began (SIGKILL, the OOM killer) charges nothing, and the request is leased
        again, once, to another worker. Nothing of it reached the client, so nothing is sent
        or billed twice; once the answer began, the worker's death is a 503. A worker whose
        every slot is taken (``busy``: gateways share it) charges nothing either; the request
        goes back to the fair queue for its next credit, after ``BUSY_BACKOFF_S``, within its
        deadline.
        """
        pool = self._pools.route(pool, terms.priority)  # batch work: the background twin
        runner = self._pools.runner(pool)
        post = self._traced_post if tracing.enabled() else self._post
        relet = False
        """Leased again once already after a draining or vanished worker."""
        while True:
            queued = _queued(runner, message.request_id, terms, cost, least)
            async with runner.slot(queued) as lease:
                worker = self._pools.worker(pool, lease.worker)
                refused: str | None = "gone"
                sent, bound = _bounded(_leased(message, lease), limit, terms.left_s())
                try:
                    async with post(
                        worker, pool, path, sent, bound, connect_retry=not relet
                    ) as resp:
                        refused = await _refused(resp, relet)
                        if refused is None:
                            yield Sent(lease, resp)
                            return
                    if refused == "draining":  # out of rotation while it drains
                        self._pools.mark_unreachable(worker)
                except _Unreached:
                    pass
                lease.actual_cost = 0.0
                relet = relet or refused != "busy"
                log.info("worker did not take the request; leasing it again",
                         worker=worker.url, reason=refused)  # fmt: skip
            if refused == "busy":
                await asyncio.sleep(BUSY_BACKOFF_S)

    @contextlib.asynccontextmanager
    async def _traced_post(
        self, worker: PoolWorker, pool: str, path: str, message: M,
        limit: aiohttp.ClientTimeout, *, connect_retry: bool,
    ) -> AsyncIterator[aiohttp.ClientResponse]:  # fmt: skip
        """``_post`` in a ``dispatch`` span whose ``traceparent`` the message carries: the
        worker's spans are its children."""
        with tracing.span("dispatch", {"kiln.pool": pool, "kiln.worker": worker.url}):
            parent = tracing.traceparent()
            if parent is not None:
                message = msgspec.structs.replace(message, traceparent=parent)
            async with self._post(
                worker, pool, path, message, limit, connect_retry=connect_retry
            ) as resp:
                yield resp

    @contextlib.asynccontextmanager
    async def _post(
        self,
        worker: PoolWorker,
        pool: str,
        path: str,
        message: EmbedRequest | GenerateRequest | InferRequest,
        limit: aiohttp.ClientTimeout,
        *,
        connect_retry: bool = False,
    ) -> AsyncIterator[aiohttp.ClientResponse]:
        """POST to a worker; with ``connect_retry`` a worker gone before it answered (not
        listening, or killed holding the request: nothing of it was delivered to the client
        or billed) raises ``_Unreached`` instead of answering 503."""
        answered = False
        try:
            async with self._http.post(
                f"{worker.url}{path}",
                data=_encoder.encode(message),
                headers={"content-type": CONTENT_TYPE, "x-request-id": message.request_id},
                timeout=limit,
            ) as resp:
                answered = True
                yield resp
        except (aiohttp.SocketTimeoutError, aiohttp.ConnectionTimeoutError) as exc:
            # a slow read, or the deadline's bound while connecting: the worker is not gone
            raise DeadlineExceeded("The pool did not answer in time.") from exc
        except (aiohttp.ClientConnectionError, ConnectionError) as exc:
            self._pools.mark_unreachable(worker)
            if connect_retry and not answered:
                raise _Unreached from exc
            raise ServiceUnavailable(
                f"The worker for `{pool}` went away; retry shortly.", retry_after=1.0
            ) from exc
        except TimeoutError as exc:
            raise DeadlineExceeded("The pool did not answer in time.") from exc


@dataclass(frozen=True, slots=True)
class Sent:
    """A request delivered to a worker: its lease and the worker's response."""

    lease: Lease
    response: aiohttp.ClientResponse


class _Unreached(Exception):
    """The worker was not listening, or died before it answered: nothing was delivered."""


async def _refused(resp: aiohttp.ClientResponse, relet: bool) -> str | None:
    """Why the worker turned the request away unrun, if for a reason another lease may not
    meet: every slot taken (``busy``: other gateways share it), draining, or older than this
    gateway (``unsupported``: a rolling upgrade), the last two unless the request was leased
    again once already; its body stays readable."""
    if resp.status not in (429, 503):
        return None
    code = _reply(await resp.read()).code
    again = code in ("draining", "unsupported") and not relet
    return code if code == "busy" or again else None


async def _frames(resp: aiohttp.ClientResponse, model: str) -> AsyncIterator[GenerateChunk]:
    """Decode length-prefixed ``GenerateChunk`` frames up to the one that finishes."""
    try:
        while True:
            size = int.from_bytes(await resp.content.readexactly(4))
            chunk = _chunk.decode(await resp.content.readexactly(size))
            yield chunk
            if chunk.finish_reason is not None:
                return
    except (asyncio.IncompleteReadError, aiohttp.ClientPayloadError) as exc:
        raise ServiceUnavailable(f"The worker for `{model}` went away.") from exc


def _queued(
    runner: PoolRunner, request_id: str, terms: QueueTerms, cost: float,
    least: float | None = None,
) -> Request:  # fmt: skip
    return runner.request(
        request_id, terms.tenant, cost, timeout_s=terms.left_s(), priority=terms.priority,
        weight=terms.weight, least=least,
    )  # fmt: skip


PREFILL_SHARE = 0.25
"""A prompt token's share of a generated token's time, for a generation's least cost: 1.3-2.5
ms a prefilled token against 8 ms a generated one (SmolLM2, one stream, 512-6,000-token prompts,
2026-12-06). The pool's service line is fitted on prompt plus generated tokens alike, mostly
generated ones; counted alike, an 8,191-token prompt was turned away at a 60 s deadline, and
took 27 s when given 600 s."""


ANSWER_MARGIN_S = 0.1
"""Kept back from a dispatched request's deadline (at most a tenth of what is left) for the
gateway's work after the worker's answer: the ledger commit, encoding, sending. Without it the
overload bench's late 200s were answered 5-75 ms (median) past their deadline, all of it in
the gateway after the worker (``Server-Timing: total``)."""
M = TypeVar("M", EmbedRequest, InferRequest, GenerateRequest)
R = TypeVar("R", EmbedResult, InferResult)


def _worker_timed(result: R) -> R:
    """Report where the worker spent the request's time, for ``Server-Timing``."""
    timing("worker-queue", result.queue_ms)
    timing("compute", result.compute_ms)
    return result


def _leased(message: M, lease: Lease) -> M:
    """``message`` marked to run in the worker's express lane if the lease is an express
    credit; reports the lease's fair-queue wait (and the lane) for ``Server-Timing``."""
    timing("queue", lease.waited_s * 1000)
    tracing.record_waited("fair queue", lease.waited_s, {"kiln.express": lease.express})
    if not lease.express:
        return message
    timing("express", 0.0)
    return msgspec.structs.replace(message, express=True)


def _bounded(
    message: M, limit: aiohttp.ClientTimeout, left_s: float | None
) -> tuple[M, aiohttp.ClientTimeout]:
    """``message`` carrying what is left of its deadline (less the answer's margin), and its
    call bounded by it: the worker's batcher drops it unrun once it cannot finish in time, and
    an answer that would come later is a 504 by the deadline, not a late 200. A generation
    keeps its own bounds (its stream deadline, ``gateway.llm``)."""
    if left_s is None or isinstance(message, GenerateRequest):
        return message, limit
    left_ms = max(1, int((left_s - min(ANSWER_MARGIN_S, left_s / 10)) * 1000))
    if message.timeout_ms is not None:
        left_ms = min(left_ms, message.timeout_ms)
    total = left_ms / 1000 if limit.total is None else min(limit.total, left_ms / 1000)
    bound = aiohttp.ClientTimeout(total=total)
    return msgspec.structs.replace(message, timeout_ms=left_ms), bound


def _error(body: bytes) -> KilnError:
    """The refusal as the error its client sees; a code this gateway does not know (a newer
    worker's) is a 503 if the worker said when to retry, else a 500."""
    reply = _reply(body)
    transient = ServiceUnavailable if reply.retry_after_s is not None else KilnError
    made = _ERRORS.get(reply.code, transient)
    return made(reply.message, retry_after=reply.retry_after_s, param=reply.param)


def _reply(body: bytes) -> ErrorReply:
    """The worker's ``ErrorReply``, or an ``internal`` one for a body that is not one (a proxy's
    page in front of the worker, a truncated answer)."""
    try:
        return _error_decoder.decode(body)
    except msgspec.DecodeError:  # ValidationError included
        log.warning("worker_reply_unreadable", body=body[:200])
        return ErrorReply(code="internal", message="The worker's answer could not be read.")
