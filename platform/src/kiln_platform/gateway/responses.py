"""The Responses API on the chat path: input items become chat messages, the generation is
the chat completion's, and it comes back as output items (``response_output``: one assistant
message, after a reasoning model's reasoning) or the Responses stream's typed events
(``response_stream``)."""

from __future__ import annotations

import time
from functools import partial
from typing import TYPE_CHECKING, Any

import msgspec
import structlog
from sqlalchemy.exc import SQLAlchemyError

from kiln_platform.errors import BadRequest
from kiln_platform.gateway import (
    _prompts,
    _response_input,
    llm,
    metrics,
    response_output,
    response_stream,
    tokens,
)
from kiln_platform.gateway._prompts import ContextTooLong
from kiln_platform.gateway._response_input import to_chat
from kiln_platform.gateway.background import Feed
from kiln_platform.gateway.completions import collect
from kiln_platform.gateway.conversation_items import conversation_id, ided
from kiln_platform.gateway.llm_schemas import ChatCompletionRequest
from kiln_platform.gateway.responses_schemas import InputItem, ResponseObject, ResponsesRequest

if TYPE_CHECKING:
    from collections.abc import AsyncGenerator, Callable

    from kiln_platform.admission.services import Admission
    from kiln_platform.context import Kiln
    from kiln_platform.gateway.llm import Generation

log = structlog.get_logger(__name__)


async def prepare(
    kiln: Kiln, admission: Admission, request: ResponsesRequest
) -> tuple[Generation, list[dict[str, Any]]]:
    """The chat path's ``prepare`` (after the stored response ``previous_response_id`` names,
    if any), its errors naming the Responses API's fields; usage is recorded under the
    ``responses`` endpoint. Also the input items the response answers, to store with it."""
    history, chat = await _chat(kiln, admission, request)
    with _response_input.renamed():
        gen = await _fitted(kiln, admission, chat, auto=request.truncation == "auto")
    gen.endpoint = "responses"
    return gen, [*history, *_response_input.own(request.input)]


async def _chat(
    kiln: Kiln, admission: Admission, request: ResponsesRequest
) -> tuple[list[dict[str, Any]], ChatCompletionRequest]:
    """The items the request goes on from (the stored response ``previous_response_id``
    names, or its ``conversation``'s), and the chat completion it is after them."""
    tenant, history = admission.principal.tenant_id, []
    conversation = conversation_id(request.conversation, request.previous_response_id)
    if request.previous_response_id is not None:
        history = await kiln.responses.conversation(tenant, request.previous_response_id)
    elif conversation is not None:
        history = await kiln.conversations.items(tenant, conversation, "conversation")
    with _response_input.renamed():
        return history, to_chat(request, msgspec.convert(history, list[InputItem]))


async def input_tokens(kiln: Kiln, admission: Admission, request: ResponsesRequest) -> int:
    """``POST /v1/responses/input_tokens``: the tokens the request's input would take, its
    history, instructions and tools included, as the chat template renders them, after the
    cut ``truncation: auto`` would make; nothing is held or run."""
    _, chat = await _chat(kiln, admission, request)
    with _response_input.renamed():
        count = await tokens.count_prompt(kiln, admission, chat)
        if request.truncation != "auto":
            return count
        version, _ = await llm.resolve(kiln, admission, chat.model, slo=False)
        try:
            _prompts.max_tokens(
                chat, count, version.context_length, version.manifest.sampling.get("max_tokens")
            )
        except ContextTooLong as exc:
            return (await _cut(kiln, admission, chat, exc))[1]
        return count


async def _fitted(
    kiln: Kiln, admission: Admission, chat: ChatCompletionRequest, *, auto: bool
) -> Generation:
    """``llm.prepare``; with ``truncation: auto``, a conversation too long for the model's
    context loses whole turns (each from a user message on) after its leading system and
    developer messages, the oldest first and never the last, as few as fit (OpenAI drops
    items in the middle): a binary search on the token count (``tokens.count_prompt``, which
    holds and runs nothing), so a long history takes a few tokenizations, not one per turn."""
    try:
        return await llm.prepare(kiln, admission, chat)
    except ContextTooLong as exc:
        if not auto:
            raise
        return await llm.prepare(kiln, admission, (await _cut(kiln, admission, chat, exc))[0])


async def _cut(
    kiln: Kiln, admission: Admission, chat: ChatCompletionRequest, short: ContextTooLong
) -> tuple[ChatCompletionRequest, int]:
    """``chat`` without the fewest oldest turns that leave ``short.allowed`` prompt tokens,
    and its prompt tokens (``short`` raised if no cut fits)."""
    messages = chat.messages
    head = next((i for i, m in enumerate(messages) if m.role not in ("system", "developer")), 0)
    cuts = [i for i in range(head + 1, len(messages)) if messages[i].role == "user"]

    def kept(j: int) -> ChatCompletionRequest:
        return msgspec.structs.replace(chat, messages=[*messages[:head], *messages[cuts[j] :]])

    low, high = 0, len(cuts)  # the first cut that fits is in [low, high); high: none does
    fits = 0  # the prompt tokens of cut ``high`` once one fits (the search counted it)
    while low < high:
        mid = (low + high) // 2
        if (count := await tokens.count_prompt(kiln, admission, kept(mid))) <= short.allowed:
            high, fits = mid, count
        else:
            low = mid + 1
    if low == len(cuts):
        raise short
    return kept(low), fits


async def _kept(gen: Generation, request: ResponsesRequest, response: ResponseObject,
                history: list[dict[str, Any]]) -> ResponseObject:  # fmt: skip
    """``response``, stored first if the request asked (``store: true``). The answer is made
    and billed by now (the ledger spools through a database outage), so a store that fails
    answers it anyway, marked ``store: false``, rather than fail a request a retry would bill
    again."""
    await _joined(gen, request, response)
    if not request.store:
        return response
    try:
        await gen.kiln.responses.save(gen.admission.principal.tenant_id, response, history)
    except (SQLAlchemyError, OSError):
        log.warning("response not stored", response_id=response.id, exc_info=True)
        metrics.RESPONSES_NOT_STORED.labels(gen.name).inc()
        return msgspec.structs.replace(response, store=False)
    return response


async def _joined(gen: Generation, request: ResponsesRequest, response: ResponseObject) -> None:
    """Add the request's input and the response's output to its conversation, if it names one
    (``ConversationStore.join``)."""
    if (ident := conversation_id(request.conversation, None)) is not None:
        given = ided(_response_input.own(request.input))  # checked by ``prepare``
        turn = [*given, *msgspec.to_builtins(response.output)]
        tenant = gen.admission.principal.tenant_id
        await gen.kiln.conversations.join(tenant, ident, turn, response.id)


async def complete(
    gen: Generation, request: ResponsesRequest, history: list[dict[str, Any]]
) -> ResponseObject:
    """A non-streamed response (stored before it is sent, if asked)."""
    return await _kept(gen, request, await answered(gen, request, int(time.time())), history)


async def answered(gen: Generation, request: ResponsesRequest, created: int) -> ResponseObject:
    """The response ``gen`` generates (created at ``created``), not stored."""
    (answer,) = await collect(gen)
    return response_output.answered(gen, request, created, answer)


async def _ran(gen: Generation, request: ResponsesRequest, created: int) -> ResponseObject:
    """A background response's work: the answer, added to its conversation if it names one."""
    done = await answered(gen, request, created)
    await _joined(gen, request, done)
    return done


async def background(
    kiln: Kiln, admission: Admission, request: ResponsesRequest
) -> ResponseObject | Feed:
    """``background: true``: checked and admitted now (a bad request is its 400), stored
    ``queued`` and answered (with ``stream``, the run's events, which go on if the client
    leaves); the generation runs on (``gateway.background``). Its wait in the
    pool's queue is bounded by ``KILN_REQUEST_TIMEOUT_S`` at least, not by a client's short read
    timeout (which bounds a foreground request's); like any, it ends at the stream deadline."""
    if request.store is False:
        raise BadRequest("'background' needs 'store': its answer is read back.", param="store")
    request = msgspec.structs.replace(request, store=True)
    timeout_s = max(admission.terms.timeout_s or 0.0, kiln.settings.request_timeout_s)
    admission.schedule(admission.terms.priority, timeout_s)
    gen, history = await prepare(kiln, admission, request)
    shell = response_output.response(gen, request, int(time.time()), status="queued")
    if not request.stream:
        work = partial(_ran, gen, request, shell.created_at)
        await kiln.background.start(admission, shell, history, work)
        return shell
    feed = Feed()
    await kiln.background.start(
        admission, shell, history, partial(feed.pump, stream(gen, request, history, shell=shell,
                                                             ended=feed.ended)), feed=feed,
    )  # fmt: skip
    return feed


def stream(
    gen: Generation, request: ResponsesRequest, history: list[dict[str, Any]], *,
    shell: ResponseObject | None = None, ended: Callable[[ResponseObject], None] | None = None,
) -> AsyncGenerator[bytes, None]:  # fmt: skip
    """The Responses stream (``response_stream``), its response stored at its end if asked. A
    background response's stream starts from its stored ``shell`` and stores nothing (its
    runner does): ``ended`` gets its end."""

    async def finish(done: ResponseObject) -> ResponseObject:
        if shell is None:
            return await _kept(gen, request, done, history)
        await _joined(gen, request, done)
        return done

    return response_stream.events(gen, request, shell=shell, finish=finish, ended=ended)
