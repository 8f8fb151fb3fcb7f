"""The Responses API on the chat path: input items become chat messages, the generation is
the chat completion's, and its text comes back as one assistant message (or the Responses
stream's typed events)."""

from __future__ import annotations

import itertools
import time
from functools import partial
from typing import TYPE_CHECKING, Any

import msgspec
import structlog
from sqlalchemy.exc import SQLAlchemyError

from kiln_platform.errors import BadRequest, KilnError
from kiln_platform.gateway import _logprobs, _prompts, _response_input, llm, metrics, tokens
from kiln_platform.gateway._prompts import ContextTooLong
from kiln_platform.gateway._response_input import to_chat
from kiln_platform.gateway.background import Feed
from kiln_platform.gateway.completions import Answer, collect, ident, is_text, tool_calls
from kiln_platform.gateway.conversation_items import conversation_id, ided, named
from kiln_platform.gateway.llm_schemas import ChatCompletionRequest, TokenLogprob
from kiln_platform.gateway.responses_schemas import (
    FunctionCallItem,
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
        service_tier=gen.admission.service_tier,
        text=request.text or {"format": {"type": "text"}}, tools=request.tools or [],
        tool_choice=request.tool_choice or "auto", store=bool(request.store),
        parallel_tool_calls=request.parallel_tool_calls is not False,
        truncation=request.truncation or "disabled",
        previous_response_id=request.previous_response_id, background=bool(request.background),
        conversation=named(request.conversation),
        **{"status": "in_progress", "output": [], "usage": None, **fields},
    )  # fmt: skip


def _answered(
    gen: Generation, request: ResponsesRequest, created: int, answer: Answer
) -> ResponseObject:
    """The finished response: its calls, if the request's tools were called, else its text
    (``incomplete`` if cut at the token limit) and, if asked, its log-probabilities."""
    text, finish = "".join(answer.parts), answer.finish
    status = "completed" if finish == "stop" else "incomplete"
    output: list[OutputMessage | FunctionCallItem]
    if (calls := tool_calls(gen, 0, text, finish)) is not None:
        output = [
            FunctionCallItem(id=f"fc-{c.id}", call_id=c.id, name=c.function.name,
                             arguments=c.function.arguments) for c in calls
        ]  # fmt: skip
    else:
        said = OutputText(text=text, logprobs=_scored(gen, answer, 0))
        output = [OutputMessage(id=ident("msg", gen), status=status, content=[said])]
    details = None if status == "completed" else IncompleteDetails(reason="max_output_tokens")
    return _response(
        gen, request, created, status=status, output=output, usage=_usage(gen),
        incomplete_details=details, completed_at=int(time.time()),
    )  # fmt: skip


async def complete(
    gen: Generation, request: ResponsesRequest, history: list[dict[str, Any]]
) -> ResponseObject:
    """A non-streamed response (stored before it is sent, if asked)."""
    return await _kept(gen, request, await answered(gen, request, int(time.time())), history)


async def answered(gen: Generation, request: ResponsesRequest, created: int) -> ResponseObject:
    """The response ``gen`` generates (created at ``created``), not stored."""
    (answer,) = await collect(gen)
    return _answered(gen, request, created, answer)


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
    shell = _response(gen, request, int(time.time()), status="queued")
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


def _scored(gen: Generation, answer: Answer, start: int) -> list[TokenLogprob]:
    """The answer's log-probabilities from token ``start`` on (none unless asked)."""
    if not answer.logprobs:
        return []
    ids, entries = answer.token_ids[start:], answer.logprobs[start:]
    return _logprobs.chat(gen.model, ids, entries).content or []


async def stream(
    gen: Generation, request: ResponsesRequest, history: list[dict[str, Any]], *,
    shell: ResponseObject | None = None, ended: Callable[[ResponseObject], None] | None = None,
) -> AsyncGenerator[bytes, None]:  # fmt: skip
    """The Responses stream: ``response.created``, ``response.in_progress``, the message's item
    and part, its ``response.output_text.delta`` events, their ``done`` events, then
    ``response.completed`` (or ``response.incomplete``); a failure after the start is an
    ``error`` event and ``response.failed``. Tool calls are sent whole once the answer is: each
    ``function_call`` item added, its arguments (one delta), done. A background response's
    stream starts from its stored ``shell`` and stores nothing: ``ended`` gets its end."""
    created = shell.created_at if shell else int(time.time())
    numbers, item = itertools.count(), ident("msg", gen)
    at = {"item_id": item, "output_index": 0, "content_index": 0}

    def event(kind: str, **fields: Any) -> bytes:
        body = msgspec.json.encode({"type": kind, "sequence_number": next(numbers), **fields})
        return b"event: " + kind.encode() + b"\ndata: " + body + b"\n\n"

    started = _response(gen, request, created)
    yield event("response.created", response=shell or started)
    yield event("response.in_progress", response=started)
    opened, answer, sent = gen.tools is None, Answer.of(gen), 0
    if opened:  # text from the start (with tools, once the model chose text: ``is_text``)
        yield event("response.output_item.added", output_index=0, item=_opened(item))
        yield event("response.content_part.added", **at, part=OutputText(text=""))
    try:
        async for piece in gen.pieces():
            delta = piece.text if opened else "".join(answer.parts) + piece.text  # all, if held
            answer.add(piece)
            if delta and not opened and is_text(gen, delta):
                opened = True
                yield event("response.output_item.added", output_index=0, item=_opened(item))
                yield event("response.content_part.added", **at, part=OutputText(text=""))
            if delta and opened:
                scored = _scored(gen, answer, sent)
                sent += len(scored)
                yield event("response.output_text.delta", **at, delta=delta, logprobs=scored)
    except KilnError as exc:
        yield event("error", code=exc.code, message=exc.message, param=exc.param)
        failure = ResponseError(code="server_error", message=exc.message)
        failed = _response(gen, request, created, status="failed", error=failure)
        if ended is not None:
            ended(failed)
        yield event("response.failed", response=failed)
        return
    done = _answered(gen, request, created, answer)
    if shell is None:
        done = await _kept(gen, request, done, history)
    else:  # a background one's end is stored by its runner
        await _joined(gen, request, done)
    if ended is not None:
        ended(done)
    for index, out in enumerate(done.output):
        for kind, fields in _item_events(out, index, opened=opened):
            yield event(kind, **fields)
    yield event(f"response.{done.status}", response=done)


def _opened(item: str) -> OutputMessage:
    return OutputMessage(id=item, status="in_progress", content=[])


def _item_events(
    item: OutputMessage | FunctionCallItem, index: int, *, opened: bool
) -> list[tuple[str, dict[str, Any]]]:
    """The events that finish one output item (and, unless its text was streamed as it came,
    open it and carry its text in one delta)."""
    at = {"item_id": item.id, "output_index": index}
    events: list[tuple[str, dict[str, Any]]] = []
    if isinstance(item, FunctionCallItem):
        started = msgspec.structs.replace(item, status="in_progress", arguments="")
        events += [
            ("response.output_item.added", {"output_index": index, "item": started}),
            ("response.function_call_arguments.delta", {**at, "delta": item.arguments}),
            ("response.function_call_arguments.done", {**at, "arguments": item.arguments}),
        ]
    else:
        part, at = item.content[0], {**at, "content_index": 0}
        if not opened:
            start = msgspec.structs.replace(item, status="in_progress", content=[])
            events += [
                ("response.output_item.added", {"output_index": index, "item": start}),
                ("response.content_part.added", {**at, "part": OutputText(text="")}),
                ("response.output_text.delta", {**at, "delta": part.text,
                                                 "logprobs": part.logprobs}),
            ]  # fmt: skip
        events += [
            ("response.output_text.done", {**at, "text": part.text, "logprobs": part.logprobs}),
            ("response.content_part.done", {**at, "part": part}),
        ]
    return [*events, ("response.output_item.done", {"output_index": index, "item": item})]
