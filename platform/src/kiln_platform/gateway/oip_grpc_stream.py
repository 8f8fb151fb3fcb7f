"""gRPC's ``ModelStreamInfer``: Triton's streamed inference, what ``tritonclient.grpc``'s
``start_stream`` and ``async_stream_infer`` call (and genai-perf's Triton LLM runs).

The stream's key (``authorization`` metadata) is checked once: a bad one ends it
(``UNAUTHENTICATED``). Each request on it is then a call of its own, run as it arrives, several
at once: its admission (quotas, ``x-kiln-priority``, ``x-kiln-timeout``), ledger row and
workers, as ``ModelInfer``'s. Its responses come as they are made, told apart by ``id``: an
LLM's with ``stream`` true a response per piece of text (``oip_llm``; the input first unless
``exclude_input_in_output``), any other request one. Each carries ``triton_final_response``,
true on the request's last; with ``triton_enable_empty_final_response`` (the client's
``enable_empty_final_response``) the last is an empty response of its own, as Triton's for a
decoupled model. A request's error is a response's ``error_message``, as Triton's: the stream
goes on.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import TYPE_CHECKING, Any

import grpc
import structlog

from kiln_platform.admission.deps import priority_of, timeout_of
from kiln_platform.errors import KilnError
from kiln_platform.gateway import metrics, oip_llm, oip_models
from kiln_platform.gateway import oip_services as oip
from kiln_platform.gateway.auth import inference_principal
from kiln_platform.gateway.grpc_spans import traced
from kiln_platform.gateway.oip_grpc_codec import code_of, message, request_of, response_of
from kiln_platform.observability import new_request_id
from kiln_runtimes.protocol import InferResult

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from kiln_platform.admission.services import Admission
    from kiln_platform.context import Kiln
    from kiln_platform.gateway.oip_schemas import InferRequestBody
    from kiln_platform.keys.services import Principal

log = structlog.get_logger(__name__)
METHOD = "ModelStreamInfer"
FINAL, EMPTY_FINAL = "triton_final_response", "triton_enable_empty_final_response"


def _response(request: InferRequestBody, result: InferResult | None, model: str,
              version: str, *, final: bool) -> Any:  # fmt: skip
    """A ``ModelStreamInferResponse`` of a result (``None``: the empty final one)."""
    if result is None:
        answer = message("ModelInferResponse")(model_name=model, model_version=version,
                                               id=request.id or "")  # fmt: skip
    else:
        answer = response_of(request, result, model, version)
    answer.parameters[FINAL].bool_param = final
    return message("ModelStreamInferResponse")(infer_response=answer)


def _text(text: str) -> InferResult:
    return InferResult(request_id="", outputs=[oip_llm.output(text)], queue_ms=0, compute_ms=0)


class Stream:
    """One ``ModelStreamInfer`` call: its requests' work, their responses on one queue."""

    def __init__(self, kiln: Kiln, principal: Principal, headers: dict[str, str]) -> None:
        self.kiln, self.principal, self.headers = kiln, principal, headers
        self.out: asyncio.Queue[Any] = asyncio.Queue()

    async def run(self, call: Any) -> None:
        """One request, in its own admission; its responses (or its error) on ``out``."""
        request_id, started, code = new_request_id(), time.perf_counter(), grpc.StatusCode.OK
        structlog.contextvars.bind_contextvars(request_id=request_id)
        with traced(METHOD, self.headers, request_id, []) as span:
            try:
                async with self.kiln.admissions.open({"request_id": request_id}) as admission:
                    try:
                        await self._answer(admission, call)
                        admission.response_status = 200
                    except KilnError as exc:
                        admission.response_status = exc.status_code
                        code = code_of(exc.status_code)
                        log.warning("grpc stream request failed", code=code.name,
                                    error=exc.message)  # fmt: skip
                        error = message("ModelStreamInferResponse")(error_message=exc.message)
                        self.out.put_nowait(error)
            except asyncio.CancelledError:
                code = grpc.StatusCode.CANCELLED
                raise
            except Exception:
                code = grpc.StatusCode.INTERNAL
                log.exception("grpc stream request failed")
                error = "The server failed; please retry."
                self.out.put_nowait(message("ModelStreamInferResponse")(error_message=error))
            finally:
                if span is not None:
                    span.set_attribute("rpc.grpc.status_code", code.value[0])
                metrics.GRPC_CALLS.labels(METHOD, code.name).inc()
                metrics.GRPC_SECONDS.labels(METHOD).observe(time.perf_counter() - started)

    async def _answer(self, admission: Admission, call: Any) -> None:
        await admission.enter(self.principal)
        settings = self.kiln.settings
        admission.schedule(priority_of(self.headers),
                           timeout_of(self.headers, settings.request_timeout_s))  # fmt: skip
        tenant, name = admission.terms.tenant, call.model_name
        version = await oip.resolve(self.kiln, name, call.model_version or None, tenant)
        split = not call.model_version and self.kiln.resolver.split(name, tenant)
        admission.serves(version.model, split=split)
        request, tensors = request_of(call)
        empty_final = (request.parameters or {}).get(EMPTY_FINAL) is True
        model, number = version.model, version.version
        if not oip_models.is_llm(version):
            result = await oip.run(self.kiln, admission, version, request, tensors)
            self.out.put_nowait(_response(request, result, model, number, final=True))
            return
        address = (name, call.model_version or None)
        gen, streams = await oip_llm.prepare(
            self.kiln, admission, address, request, tensors, streams=True
        )
        model, number = gen.version.model, gen.version.version  # the version that answers
        if not streams:
            result = await oip_llm.answer(gen)
            self.out.put_nowait(_response(request, result, model, number, final=True))
            return
        if echo := gen.choices[0].echo:
            self.out.put_nowait(_response(request, _text(echo), model, number, final=False))
        async for piece in gen.pieces():
            last = piece.finish_reason is not None and not empty_final
            if piece.text or last:
                said = _text(piece.text)
                self.out.put_nowait(_response(request, said, model, number, final=last))
        if empty_final:
            self.out.put_nowait(_response(request, None, model, number, final=True))


async def serve(
    kiln: Kiln, requests: AsyncIterator[Any], context: grpc.aio.ServicerContext[Any, Any]
) -> AsyncIterator[Any]:
    """The responses of a stream of requests, each run as it arrives (``Stream.run``)."""
    headers = {k: v for k, v in context.invocation_metadata() or () if isinstance(v, str)}
    try:
        principal = await inference_principal(kiln, headers.get("authorization", ""))
    except KilnError as exc:
        metrics.GRPC_CALLS.labels(METHOD, code_of(exc.status_code).name).inc()
        await context.abort(code_of(exc.status_code), exc.message)
    stream, running = Stream(kiln, principal, headers), set[asyncio.Task[None]]()

    async def read() -> None:
        try:
            async for call in requests:
                task = asyncio.create_task(stream.run(call))
                running.add(task)
                task.add_done_callback(running.discard)
            while running:
                await asyncio.wait(set(running))
        finally:  # the client closed its side, and every request is answered (or it failed)
            stream.out.put_nowait(None)

    reader = asyncio.create_task(read())
    try:
        while (response := await stream.out.get()) is not None:
            yield response
    finally:
        for task in [reader, *running]:
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await reader
