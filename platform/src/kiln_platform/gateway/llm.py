"""Chat and text completions: validate, template, tokenize, generate, detokenize, meter."""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import msgspec

from kiln_platform.adapters.directory import slot_rank, split
from kiln_platform.billing.ledger import Usage, usage_of
from kiln_platform.billing.pricing import Quantities
from kiln_platform.errors import BadRequest, DeadlineExceeded, KilnError, ModelNotFound
from kiln_platform.gateway import metrics
from kiln_platform.gateway._offload import off_loop
from kiln_platform.gateway._textmodel import TextModel, load_text_model
from kiln_platform.gateway._textstream import TextStream
from kiln_platform.gateway.llm_schemas import (
    UNSUPPORTED,
    ChatCompletionRequest,
    CompletionRequest,
    Message,
)
from kiln_platform.registry.artifacts import local_tree
from kiln_runtimes import tracing
from kiln_runtimes.protocol import GenerateRequest

if TYPE_CHECKING:
    from collections.abc import AsyncGenerator, AsyncIterator

    from kiln_platform.admission.services import Admission
    from kiln_platform.context import Kiln
    from kiln_platform.registry.services import ResolvedVersion
    from kiln_platform.shadow.mirror import Plan

ROLES = {"system", "developer", "user", "assistant"}
MAX_STOP = 4


@dataclass(frozen=True, slots=True)
class Piece:
    """Text made final, and the finish reason once generation ends."""

    text: str
    finish_reason: str | None = None


@dataclass(slots=True)
class Generation:
    """One resolved, validated generation request and its running token counts."""

    kiln: Kiln
    admission: Admission
    version: ResolvedVersion
    name: str
    """The model as the request named it (``<model>:<adapter>`` for an adapter)."""
    model: TextModel
    request: GenerateRequest
    stop: tuple[str, ...]
    endpoint: str
    deadline: float
    """Loop time (``KILN_STREAM_TIMEOUT_S`` after admission) past which generation is cut."""
    completion_tokens: int = 0
    status: int = 499
    """The outcome so far: 499 (client went away) until generation finishes or fails."""
    compute_ms: float = 0.0
    queue_ms: float = 0.0
    shadow: Plan | None = None
    """The copy to make once the generation is recorded (``kiln_platform.shadow``)."""
    tokens: list[int] | None = None
    """The tokens generated, kept only for a shadow's comparison."""

    @property
    def prompt_tokens(self) -> int:
        """Tokens in the prompt."""
        return len(self.request.prompt_ids)

    async def pieces(self) -> AsyncIterator[Piece]:
        """Generate; the admission records exactly one usage event however it ends.

        The last piece (the one with a finish reason) comes only once that event is durable, so
        a stream's usage chunk and ``[DONE]``, or a whole response, never reach a client unbilled.
        A failed or abandoned generation is recorded, as it stands then, when the admission is
        left. Past the deadline the worker's sequence is cancelled and generation ends as if
        ``max_tokens`` were reached (``"length"``), billed for what was produced.
        """
        self.admission.meter(self.usage)
        started = time.perf_counter()
        try:
            final = None
            async with contextlib.aclosing(self._generate()) as pieces:
                while final is None:
                    piece = await self._next(pieces)
                    if piece is None or piece.finish_reason is not None:
                        final = piece
                        break
                    yield piece
            if final is None:  # the worker's stream always ends with a finish reason
                raise KilnError("The model stopped without finishing; please retry.")
            empty, cut = not self.completion_tokens, final.finish_reason == "length"
            self.admission.degenerate = empty or cut  # counted for a rollout's analysis
            await self.admission.commit(self.usage())  # the worker's slot is free meanwhile
            if self.shadow is not None and self.tokens is not None:
                took_s = time.perf_counter() - started
                self.kiln.shadows.generate(self.shadow, self.request, self.tokens, took_s)
            yield final
        except KilnError as exc:
            self.status = exc.status_code
            raise

    async def _next(self, pieces: AsyncGenerator[Piece, None]) -> Piece | None:
        """The next piece, or the ``"length"`` one if the deadline passes first (the worker's
        sequence is then cancelled: ``pieces`` is closed by the timeout's cancellation)."""
        loop = asyncio.get_running_loop()
        try:
            if loop.time() >= self.deadline:  # e.g. the client took that long to read the last
                raise TimeoutError
            async with asyncio.timeout_at(self.deadline):
                return await anext(pieces)
        except StopAsyncIteration:
            return None
        except TimeoutError:
            metrics.DEADLINE_CUTS.labels(self.version.model).inc()
            if not self.completion_tokens:  # never started: nothing to return, nothing billed
                raise DeadlineExceeded(
                    "The generation did not start before the server's deadline; retry shortly."
                ) from None
            self.status = 200
            return Piece("", "length")

    async def _generate(self) -> AsyncGenerator[Piece, None]:
        name = self.version.model
        text = TextStream(self.model.tokenizer, self.stop)
        start = last = time.perf_counter()
        metrics.ACTIVE_STREAMS.labels(name).inc()
        metrics.PROMPT_TOKENS.labels(name).inc(self.prompt_tokens)
        with tracing.span("detokenize") as span:
            async with contextlib.aclosing(self._relay(text, start, last)) as pieces:
                async for piece in pieces:
                    yield piece
            if span is not None:
                span.set_attribute("kiln.completion_tokens", self.completion_tokens)

    async def _relay(
        self, text: TextStream, start: float, last: float
    ) -> AsyncGenerator[Piece, None]:
        """Detokenize the worker's chunks into pieces (with their TTFT and inter-token times)."""
        name = self.version.model
        who = self.kiln.metrics.labels(
            name, self.version.version, str(self.admission.principal.tenant_id)
        )
        ttft, inter_token = (
            self.kiln.metrics.ttft.labels(*who),
            self.kiln.metrics.inter_token.labels(*who),
        )
        try:
            pool = self.version.pool
            async for chunk in self.kiln.workers.generate(pool, self.request, self.admission.terms):
                now = time.perf_counter()
                hist = inter_token if self.completion_tokens else ttft
                hist.observe(now - (last if self.completion_tokens else start))
                if not self.completion_tokens:
                    self.admission.first_token()
                last = now
                self.completion_tokens += len(chunk.token_ids)
                if self.tokens is not None:
                    self.tokens.extend(chunk.token_ids)
                self.compute_ms = max(self.compute_ms, chunk.compute_ms)
                self.queue_ms = max(self.queue_ms, chunk.queue_ms)
                piece = text.push(chunk.token_ids)
                if text.stopped:
                    self.status = 200
                    yield Piece(piece, "stop")
                    return
                if chunk.finish_reason in ("cancelled", "error"):
                    raise KilnError("The model failed while generating; please retry.")
                if chunk.finish_reason is not None:
                    self.status = 200
                    yield Piece(piece + text.flush(), chunk.finish_reason)
                    return
                if piece:
                    yield Piece(piece)
        finally:
            metrics.ACTIVE_STREAMS.labels(name).dec()
            metrics.COMPLETION_TOKENS.labels(name).inc(self.completion_tokens)

    def usage_counts(self) -> tuple[int, int, int]:
        """(prompt, completion, total) tokens so far."""
        return (
            self.prompt_tokens,
            self.completion_tokens,
            self.prompt_tokens + self.completion_tokens,
        )

    def usage(self) -> Usage:
        """What the request consumed so far, with its outcome (499 until it finishes)."""
        return usage_of(
            self.admission.principal, self.version, self.request.request_id, self.endpoint,
            status=self.status, input_tokens=self.prompt_tokens,
            output_tokens=self.completion_tokens, queue_ms=self.queue_ms,
            compute_ms=self.compute_ms, adapter=split(self.name)[1],
        )  # fmt: skip


def _reject_unsupported(request: ChatCompletionRequest | CompletionRequest) -> None:
    for field, unused in UNSUPPORTED.items():
        value = getattr(request, field, None)
        if value not in unused:
            raise BadRequest(f"The parameter '{field}' is not supported by Kiln.", param=field)


def _message_text(i: int, message: Message) -> str:
    if message.role not in ROLES:
        raise BadRequest(
            f"'messages[{i}].role' is '{message.role}'; Kiln supports system, developer, user "
            "and assistant.",
            param=f"messages[{i}].role",
        )
    if isinstance(message.content, str):
        return message.content
    if message.content is None:
        raise BadRequest(f"'messages[{i}].content' is required.", param=f"messages[{i}].content")
    parts = []
    for j, part in enumerate(message.content):
        if part.type != "text" or part.text is None:
            raise BadRequest(
                f"'messages[{i}].content[{j}]' has type '{part.type}'; only text is supported.",
                param=f"messages[{i}].content[{j}].type",
            )
        parts.append(part.text)
    return "".join(parts)


def chat_prompt(request: ChatCompletionRequest, model: TextModel) -> list[int]:
    """Validate the messages, render the model's chat template, tokenize."""
    if not request.messages:
        raise BadRequest("'messages' must contain at least one message.", param="messages")
    messages = [
        {"role": "system" if m.role == "developer" else m.role, "content": _message_text(i, m)}
        for i, m in enumerate(request.messages)
    ]
    return model.encode(model.render(messages))


def _chat_chars(request: ChatCompletionRequest) -> int:
    """About how many characters the chat template renders (the messages' text)."""
    return sum(
        len(m.content) if isinstance(m.content, str)
        else sum(len(getattr(part, "text", "") or "") for part in m.content or [])
        for m in request.messages
    )  # fmt: skip


def _prompt_chars(request: CompletionRequest) -> int:
    prompt = request.prompt
    if isinstance(prompt, str):
        return len(prompt)
    return len(prompt[0]) if len(prompt) == 1 and isinstance(prompt[0], str) else 0


def completion_prompt(request: CompletionRequest, model: TextModel) -> list[int]:
    """A text completion's prompt: a string, one-string list, or token ids."""
    prompt = request.prompt
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]
    if isinstance(prompt, str) and prompt:
        return model.encode(prompt)
    vocab = model.tokenizer.get_vocab_size()
    if (
        isinstance(prompt, list)
        and prompt
        and all(type(t) is int and 0 <= t < vocab for t in prompt)
    ):
        return list(prompt)
    raise BadRequest(
        "'prompt' must be a non-empty string or a list of token ids (one prompt per request).",
        param="prompt",
    )


def _stop(value: str | list[str] | None) -> tuple[str, ...]:
    stops = [value] if isinstance(value, str) else list(value or [])
    if len(stops) > MAX_STOP or not all(stops):
        raise BadRequest(f"'stop' takes up to {MAX_STOP} non-empty strings.", param="stop")
    return tuple(stops)


def _max_tokens(
    request: ChatCompletionRequest | CompletionRequest, prompt: int, context: int
) -> int:
    field, source = "max_tokens", "prompt"
    requested = request.max_tokens
    if isinstance(request, ChatCompletionRequest):
        source = "messages"
        if request.max_completion_tokens is not None:
            field, requested = "max_completion_tokens", request.max_completion_tokens
    if requested is not None and requested < 1:
        raise BadRequest(f"'{field}' must be at least 1.", param=field)
    wanted = requested if requested is not None else max(1, context - prompt)
    if prompt + wanted > context:
        raise BadRequest(
            f"This model's maximum context length is {context} tokens. However, you requested "
            f"{prompt + wanted} tokens ({prompt} in the {source}, {wanted} for the completion). "
            f"Shorten the {source} or lower '{field}'.",
            param=field if requested is not None and prompt < context else source,
        )
    return wanted


def _sampling(request: ChatCompletionRequest | CompletionRequest) -> tuple[float, float]:
    temperature = 1.0 if request.temperature is None else request.temperature
    top_p = 1.0 if request.top_p is None else request.top_p
    if not 0.0 <= temperature <= 2.0:
        raise BadRequest("'temperature' must be between 0 and 2.", param="temperature")
    if not 0.0 < top_p <= 1.0:
        raise BadRequest("'top_p' must be greater than 0 and at most 1.", param="top_p")
    return temperature, top_p


async def prepare(
    kiln: Kiln, admission: Admission, request: ChatCompletionRequest | CompletionRequest
) -> Generation:
    """Everything up to dispatch: validation, templating, tokenization, limits, and the budget
    hold; the admission is held to the generation's deadline."""
    principal, request_id = admission.principal, admission.request_id
    _reject_unsupported(request)
    base, adapter_name = split(request.model)
    version = await kiln.resolver.resolve(base, str(principal.tenant_id))
    manifest = version.manifest
    if manifest.task != "generate":
        raise BadRequest(f"The model `{version.model}` does not generate text.", param="model")
    admission.serves(version.model, split=kiln.resolver.split(base, str(principal.tenant_id)))
    adapter = None
    if adapter_name is not None:
        if not slot_rank(kiln.settings, version.engine.adapter_slots):
            raise BadRequest("This platform serves no adapters.", param="model")
        adapter = await kiln.adapters.digest(principal.tenant_id, version.model, adapter_name)
        if adapter is None:
            raise ModelNotFound(f"The model `{request.model}` does not exist.", param="model")
    model = load_text_model(
        await local_tree(kiln.store, version.artifact_digest),
        manifest.tokenizer_file or "tokenizer.json",
    )
    with tracing.span("tokenize"):
        if isinstance(request, ChatCompletionRequest):
            prompt = await off_loop(_chat_chars(request), chat_prompt, request, model)
            endpoint = "chat.completions"
        else:
            prompt = await off_loop(_prompt_chars(request), completion_prompt, request, model)
            endpoint = "completions"
    stop = _stop(request.stop)
    temperature, top_p = _sampling(request)
    generate = GenerateRequest(
        request_id=request_id,
        prompt_ids=prompt,
        max_tokens=_max_tokens(request, len(prompt), version.context_length),
        temperature=temperature,
        top_p=top_p,
        seed=request.seed,
        stop_token_ids=sorted({*model.eos_token_ids, *manifest.stop_token_ids}),
        adapter=adapter,
    )
    most = Quantities(input_tokens=len(prompt), output_tokens=generate.max_tokens)
    run_s = kiln.settings.stream_timeout_s
    deadline = asyncio.get_running_loop().time() + run_s
    await admission.hold(version, most, run_s)
    admission.deadline = deadline
    gen = Generation(kiln, admission, version, request.model, model, generate, stop, endpoint,
                     deadline)  # fmt: skip
    if adapter is None:  # a tenant's adapter is served by the primary's pool alone
        gen.shadow = kiln.shadows.plan(version, request_id)
        gen.tokens = None if gen.shadow is None else []
    return gen


def sse(payload: Any) -> bytes:
    """One server-sent event carrying JSON."""
    return b"data: " + msgspec.json.encode(payload) + b"\n\n"
