"""Chat and text completions: validate, template, tokenize, generate, detokenize, meter.

A request's choices (``n``, and one set per prompt of a text completion) are separate sequences
on the workers, generated concurrently; their pieces interleave, each carrying its ``index``.
"""

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
from kiln_platform.gateway import _prompts, _structured, _tools, metrics
from kiln_platform.gateway._prompts import chat_prompt
from kiln_platform.gateway._sampling import Sampling, sampling, think_budget
from kiln_platform.gateway._textmodel import TextModel, load_text_model
from kiln_platform.gateway._textstream import Detokenizing, TextStream
from kiln_platform.gateway.llm_schemas import ChatCompletionRequest, CompletionRequest, supported
from kiln_platform.registry.artifacts import local_tree
from kiln_runtimes import tracing
from kiln_runtimes.protocol import GenerateRequest

if TYPE_CHECKING:
    from collections.abc import AsyncGenerator, AsyncIterator, Callable

    from kiln_platform.admission.services import Admission
    from kiln_platform.context import Kiln
    from kiln_platform.registry.services import ResolvedVersion
    from kiln_platform.shadow.mirror import Plan
    from kiln_runtimes.protocol import TokenLogprobs

__all__ = ["Choice", "Generation", "Piece", "chat_prompt", "prepare", "sse"]


@dataclass(frozen=True, slots=True)
class Piece:
    """Text of choice ``index`` made final, and its finish reason once that choice ends; with
    the tokens that arrived with it and their log-probabilities when the request asked."""

    text: str
    finish_reason: str | None = None
    index: int = 0
    token_ids: tuple[int, ...] = ()
    logprobs: tuple[TokenLogprobs, ...] | None = None
    stop: str | int | None = None
    """vLLM's ``stop_reason``: the stop string or ``stop_token_ids`` entry that ended it."""


@dataclass(slots=True)
class Choice:
    """One sequence of a request: its own prompt, seed, worker stream and counts."""

    index: int
    request: GenerateRequest
    echo: str = ""
    """The prompt text a text completion's ``echo`` puts before the answer."""
    completion_tokens: int = 0
    compute_ms: float = 0.0
    queue_ms: float = 0.0
    tokens: list[int] | None = None
    """The tokens generated, kept for a shadow's comparison or a reasoning model's count."""
    cached_tokens: int = 0
    """Leading prompt tokens the worker took from its prefix cache instead of prefilling."""
    prompt_logprobs: tuple[TokenLogprobs, ...] = ()
    """Its prompt's tokens scored, from the second on (``echo`` with ``logprobs``, vLLM's
    ``prompt_logprobs``)."""
    counts_prompt: bool = True
    """The first choice of its prompt: the one whose prompt ``prompt_tokens`` counts."""


@dataclass(slots=True)
class Generation:
    """One resolved, validated completion request, its choices and their running counts."""

    kiln: Kiln
    admission: Admission
    version: ResolvedVersion
    name: str
    """The model as the request named it (``<model>:<adapter>`` for an adapter)."""
    model: TextModel
    choices: list[Choice]
    stop: Detokenizing
    endpoint: str
    deadline: float
    """Loop time (``KILN_STREAM_TIMEOUT_S`` after admission) past which generation is cut."""
    prompt_tokens: int
    """Tokens in the prompts, each counted once however many choices it has (as OpenAI bills)."""
    status: int = 499
    """The outcome so far: 499 (client went away) until generation finishes or fails."""
    shadow: Plan | None = None
    """The copy to make once the generation is recorded (``kiln_platform.shadow``)."""
    tools: _tools.ToolPlan | None = None
    """How a chat's answer becomes tool calls (``None``: it is text)."""

    @property
    def request(self) -> GenerateRequest:
        """The first choice's sequence (its ``request_id`` is the request's)."""
        return self.choices[0].request

    @property
    def cached_tokens(self) -> int:
        """Prompt tokens the prefix caches served, of each prompt's first choice (the prompt
        tokens counted): reported as OpenAI does, billed as any prompt token."""
        return sum(choice.cached_tokens for choice in self.choices if choice.counts_prompt)

    @property
    def completion_tokens(self) -> int:
        """Tokens generated so far, every choice's."""
        return sum(choice.completion_tokens for choice in self.choices)

    async def pieces(self) -> AsyncIterator[Piece]:
        """Generate; the admission records exactly one usage event however it ends.

        The last pieces (those with a finish reason, one per choice) come only once that event
        is durable, so a stream's usage chunk and ``[DONE]``, or a whole response, never reach
        a client unbilled. A failed or abandoned generation is recorded, as it stands then, when
        the admission is left. Past the deadline the workers' sequences are cancelled and the
        unfinished choices end as if ``max_tokens`` were reached (``"length"``), billed for what
        was produced.
        """
        self.admission.meter(self.usage)
        started = time.perf_counter()
        finals: dict[int, Piece] = {}
        try:
            async with contextlib.aclosing(self._merged()) as pieces:
                while len(finals) < len(self.choices):
                    got = await self._next(pieces, finals)
                    if got is None:
                        break
                    for piece in got:
                        if piece.finish_reason is None:
                            yield piece
                        else:
                            finals[piece.index] = piece
            if len(finals) < len(self.choices):  # a worker's stream always ends with a reason
                raise KilnError("The model stopped without finishing; please retry.")
            cut = any(piece.finish_reason == "length" for piece in finals.values())
            self.admission.degenerate = not self.completion_tokens or cut  # a rollout's analysis
            await self.admission.commit(self.usage())  # the workers' slots are free meanwhile
            first = self.choices[0]
            if self.shadow is not None and first.tokens is not None:
                took_s = time.perf_counter() - started
                self.kiln.shadows.generate(self.shadow, first.request, first.tokens, took_s)
            for index in sorted(finals):
                yield finals[index]
        except KilnError as exc:
            self.status = exc.status_code
            raise

    async def _next(
        self, pieces: AsyncGenerator[Piece, None], finals: dict[int, Piece]
    ) -> list[Piece] | None:
        """The next piece, or ``"length"`` ones for every unfinished choice if the deadline
        passes first (the workers' sequences are then cancelled: ``pieces`` is closed by the
        timeout's cancellation)."""
        loop = asyncio.get_running_loop()
        try:
            if loop.time() >= self.deadline:  # e.g. the client took that long to read the last
                raise TimeoutError
            async with asyncio.timeout_at(self.deadline):
                return [await anext(pieces)]
        except StopAsyncIteration:
            return None
        except TimeoutError:
            metrics.DEADLINE_CUTS.labels(self.version.model).inc()
            if not self.completion_tokens:  # never started: nothing to return, nothing billed
                raise DeadlineExceeded(
                    "The generation did not start before the server's deadline; retry shortly."
                ) from None
            self.status = 200
            return [Piece("", "length", c.index) for c in self.choices if c.index not in finals]

    def _merged(self) -> AsyncGenerator[Piece, None]:
        """Every choice's pieces as they come (one choice is iterated directly)."""
        if len(self.choices) == 1:
            return self._generate(self.choices[0])
        return self._fan_in()

    async def _fan_in(self) -> AsyncGenerator[Piece, None]:
        """One task per choice feeding a queue; closing this cancels every unfinished one."""
        queue: asyncio.Queue[Piece | Exception | None] = asyncio.Queue()

        async def run(choice: Choice) -> None:
            try:
                async with contextlib.aclosing(self._generate(choice)) as pieces:
                    async for piece in pieces:
                        queue.put_nowait(piece)
                queue.put_nowait(None)
            except Exception as exc:  # re-raised by the consumer
                queue.put_nowait(exc)

        tasks = [asyncio.create_task(run(choice)) for choice in self.choices]
        try:
            running = len(tasks)
            while running:
                item = await queue.get()
                if item is None:
                    running -= 1
                elif isinstance(item, Exception):
                    raise item
                else:
                    yield item
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _generate(self, choice: Choice) -> AsyncGenerator[Piece, None]:
        name = self.version.model
        text = self.stop.stream(self.model.tokenizer)
        metrics.ACTIVE_STREAMS.labels(name).inc()
        metrics.PROMPT_TOKENS.labels(name).inc(len(choice.request.prompt_ids))
        with tracing.span("detokenize") as span:
            async with contextlib.aclosing(self._relay(choice, text)) as pieces:
                async for piece in pieces:
                    yield piece
            if span is not None:
                span.set_attribute("kiln.completion_tokens", choice.completion_tokens)

    def _clock(self, choice: Choice) -> Callable[[], None]:
        """What to call as each chunk arrives: observes TTFT for the request's first token and
        inter-token time for a choice's later ones (histograms looked up once)."""
        who = self.kiln.metrics.labels(
            self.version.model, self.version.version, str(self.admission.principal.tenant_id)
        )
        ttft, inter_token = (
            self.kiln.metrics.ttft.labels(*who),
            self.kiln.metrics.inter_token.labels(*who),
        )
        start = last = time.perf_counter()

        def arrived() -> None:
            nonlocal last
            now = time.perf_counter()
            if not self.completion_tokens:
                ttft.observe(now - start)
                self.admission.first_token()
            elif choice.completion_tokens:
                inter_token.observe(now - last)
            last = now

        return arrived

    async def _relay(self, choice: Choice, text: TextStream) -> AsyncGenerator[Piece, None]:
        """Detokenize the worker's chunks into pieces (with their TTFT and inter-token times)."""
        index, name = choice.index, self.version.model
        arrived = self._clock(choice)
        try:
            pool = self.version.pool
            worker = self.kiln.workers.generate(pool, choice.request, self.admission.terms)
            async with contextlib.aclosing(worker) as chunks:  # closed here, not by the GC
                async for chunk in chunks:
                    arrived()
                    ids = tuple(chunk.token_ids)
                    choice.completion_tokens += len(ids)
                    choice.cached_tokens = max(choice.cached_tokens, chunk.cached_tokens)
                    if choice.tokens is not None:
                        choice.tokens.extend(ids)
                    choice.compute_ms = max(choice.compute_ms, chunk.compute_ms)
                    choice.queue_ms = max(choice.queue_ms, chunk.queue_ms)
                    logprobs = None if chunk.logprobs is None else tuple(chunk.logprobs)
                    if chunk.prompt_logprobs is not None:  # on the first chunk
                        choice.prompt_logprobs = tuple(chunk.prompt_logprobs)
                    piece = text.push(chunk.token_ids)
                    if text.stopped:
                        self.status = 200
                        yield Piece(piece, "stop", index, ids, logprobs, text.reason(None))
                        return
                    if chunk.finish_reason in ("cancelled", "error"):
                        raise KilnError("The model failed while generating; please retry.")
                    if chunk.finish_reason is not None:
                        self.status = 200
                        end, reason = chunk.finish_reason, text.reason(chunk.stop_token)
                        yield Piece(piece + text.flush(), end, index, ids, logprobs, reason)
                        return
                    if piece or logprobs:
                        yield Piece(piece, None, index, ids, logprobs)
        finally:
            metrics.ACTIVE_STREAMS.labels(name).dec()
            metrics.COMPLETION_TOKENS.labels(name).inc(choice.completion_tokens)

    def usage_counts(self) -> tuple[int, int, int]:
        """(prompt, completion, total) tokens so far."""
        completion = self.completion_tokens
        return self.prompt_tokens, completion, self.prompt_tokens + completion

    def usage(self) -> Usage:
        """What the request consumed so far, with its outcome (499 until it finishes): one
        ledger row for all its choices, their compute summed."""
        return usage_of(
            self.admission.principal, self.version, self.request.request_id, self.endpoint,
            status=self.status, input_tokens=self.prompt_tokens,
            output_tokens=self.completion_tokens,
            queue_ms=max(c.queue_ms for c in self.choices),
            compute_ms=sum(c.compute_ms for c in self.choices), adapter=split(self.name)[1],
        )  # fmt: skip


async def resolve(
    kiln: Kiln, admission: Admission, name: str, *, slo: bool = True
) -> tuple[ResolvedVersion, str | None]:
    """The version serving the model ``name`` (a request's ``model``) and the digest of its
    adapter, if one; counted in the model's SLOs unless ``slo`` is false (it runs nothing)."""
    tenant = str(admission.principal.tenant_id)
    base, adapter_name = split(name)
    version = await kiln.resolver.resolve(base, tenant)
    if version.manifest.task != "generate":
        raise BadRequest(f"The model `{version.model}` does not generate text.", param="model")
    if slo:
        admission.serves(version.model, split=kiln.resolver.split(base, tenant))
    if adapter_name is None:
        return version, None
    if not slot_rank(kiln.settings, version.engine.adapter_slots):
        raise BadRequest("This platform serves no adapters.", param="model")
    adapter = await kiln.adapters.digest(admission.principal.tenant_id, version.model, adapter_name)
    if adapter is None:
        raise ModelNotFound(f"The model `{name}` does not exist.", param="model")
    return version, adapter


def _choices(
    request: ChatCompletionRequest | CompletionRequest, request_id: str, *,
    prompts: list[list[int]], echoes: list[str], plan: Sampling, context: int,
    **shared: Any,
) -> list[Choice]:  # fmt: skip
    """One sequence per (prompt, choice), indexed ``prompt * n + j`` as OpenAI and vLLM do."""
    choices = []
    for p, (prompt, echo) in enumerate(zip(prompts, echoes, strict=True)):
        limit = _prompts.max_tokens(request, len(prompt), context, plan.most)
        for j in range(plan.n):
            index = p * plan.n + j
            sequence = GenerateRequest(
                request_id=request_id if index == 0 else f"{request_id}.{index}",
                prompt_ids=prompt, max_tokens=limit, seed=plan.seed_of(index),
                **shared, **plan.fields,
            )  # fmt: skip
            choices.append(Choice(index, sequence, echo, counts_prompt=j == 0))
    return choices


async def prepare(
    kiln: Kiln, admission: Admission, request: ChatCompletionRequest | CompletionRequest
) -> Generation:
    """Everything up to dispatch: validation, templating, tokenization, limits, and the budget
    hold; the admission is held to the generation's deadline."""
    supported(request)
    admission.serve_as(request.service_tier)
    version, adapter = await resolve(kiln, admission, request.model)
    model = await text_model(kiln, version)
    tools = _tools.requested(request, model)
    grammar = await _structured.compiled(request, tools)
    prompts, echoes, endpoint = await _prompts.tokenize(
        request, model, tools, version.context_length
    )
    chat = isinstance(request, ChatCompletionRequest)  # the answer is split
    grammar = _structured.after_thought(grammar, model.think if chat else None, prompts[0],
                                        model.harmony if chat else None)  # fmt: skip
    stop, eos = _prompts.stops(request, chat and _tools.marked(tools, model)), {
        *model.eos_token_ids, *version.manifest.stop_token_ids}  # fmt: skip
    plan = sampling(request, model.tokenizer.get_vocab_size(), len(prompts), grammar=grammar,
                    eos=eos, defaults=version.manifest.sampling)  # fmt: skip
    choices = _choices(
        request, admission.request_id, prompts=prompts, echoes=echoes, plan=plan,
        context=version.context_length, adapter=adapter,
        tenant=str(admission.principal.tenant_id), grammar=grammar,
        think_budget=think_budget(request, model if chat else None, prompts[0]),
    )  # fmt: skip
    prompt_tokens = sum(len(prompt) for prompt in prompts)
    most = Quantities(input_tokens=prompt_tokens,
                      output_tokens=sum(c.request.max_tokens for c in choices))  # fmt: skip
    run_s = kiln.settings.stream_timeout_s
    deadline = asyncio.get_running_loop().time() + run_s
    await admission.hold(version, most, run_s)
    admission.deadline = deadline
    gen = Generation(kiln, admission, version, request.model, model, choices, stop, endpoint,
                     deadline, prompt_tokens, tools=tools)  # fmt: skip
    if adapter is None:  # a tenant's adapter is served by the primary's pool alone
        gen.shadow = kiln.shadows.plan(version, admission.request_id)
    for c in choices:  # a shadow compares the first's, a reasoning model's chat counts them
        c.tokens = [] if (chat and model.reasons) or (c.index == 0 and gen.shadow) else None
    return gen


async def text_model(kiln: Kiln, v: ResolvedVersion) -> TextModel:
    """The version's tokenizer and chat template (read once per build, ``load_text_model``)."""
    return load_text_model(await local_tree(kiln.store, v.artifact_digest),
                           v.manifest.tokenizer_file or "tokenizer.json")  # fmt: skip


def sse(payload: Any) -> bytes:
    """One server-sent event carrying JSON."""
    return b"data: " + msgspec.json.encode(payload) + b"\n\n"
