"""The GenAI engine thread: ``EngineCore.step()`` (schedule -> execute -> update) over a
slot-indexed KV cache. A request joins between decode steps as soon as a slot is free, leaves on
the step it finishes, and a closed stream frees its slot at the next step.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING

import structlog

from kiln_runtimes import cpus as placement
from kiln_runtimes._errors import FieldError
from kiln_runtimes.backends._genai_logits import token_logprobs
from kiln_runtimes.backends._genai_scheduler import Sequence, SequenceOutput
from kiln_runtimes.protocol import MAX_LOGPROBS, GenerateChunk

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    from kiln_runtimes.backends._genai_config import ModelSpec
    from kiln_runtimes.backends._genai_runner import ModelRunner
    from kiln_runtimes.backends._genai_sampling import Sampler
    from kiln_runtimes.backends._genai_scheduler import Scheduler
    from kiln_runtimes.backends.base import PrefixStats
    from kiln_runtimes.protocol import GenerateRequest, TokenLogprobs

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class Sink:
    """Where a sequence's chunks go: an asyncio queue owned by ``loop``."""

    request_id: str
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue[GenerateChunk | BaseException]
    sampler: Sampler


_Item = tuple[Sink, GenerateChunk | BaseException]


class EngineCore:
    """The engine loop. Other threads only ``submit``/``abort``; everything else is its thread's."""

    def __init__(
        self, spec: ModelSpec, runner: ModelRunner, scheduler: Scheduler,
        cpus: frozenset[int] | None = None,
    ) -> None:  # fmt: skip
        self.spec = spec
        self._cpus = cpus
        self._runner = runner
        self._scheduler = scheduler
        self._sinks: dict[int, Sink] = {}
        self._prompt_scores: dict[int, list[TokenLogprobs]] = {}
        """The prompt tokens scored so far of each sequence that scores its prompt."""
        self._joining: deque[tuple[Sequence, Sink]] = deque()
        self._leaving: deque[int] = deque()
        self._wakeup = threading.Condition()
        self._stopping = False
        self._ids = itertools.count(1)
        self._thread = threading.Thread(target=self._run, name="kiln-genai-engine", daemon=True)

    @property
    def started(self) -> bool:
        """Whether the engine thread was started (it runs until ``stop``)."""
        return self._thread.ident is not None

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Finish the current step, fail whatever is left, and join the thread."""
        if not self.started:
            return
        with self._wakeup:
            self._stopping = True
            self._wakeup.notify()
        self._thread.join()

    def new_sequence(self, request: GenerateRequest) -> Sequence:
        """Validate a request into a sequence; raises ``ValueError`` before any admission."""
        _validate(request, self.spec)
        if request.prompt_logprobs is not None and self._runner.pruned:
            raise FieldError("this model's build computes the last position's logits only (built "
                             "with prune_lm_head), so it cannot score prompt tokens "
                             "('prompt_logprobs', or 'echo' with 'logprobs')",
                             "prompt_logprobs")  # fmt: skip
        return Sequence(
            seq_id=next(self._ids),
            prompt_ids=list(request.prompt_ids),
            max_tokens=request.max_tokens,
            stop_ids=stop_ids(request, self.spec),
            express=request.express,
            tenant=request.tenant,
            public_prefix=request.public_prefix,
            prompt_logprobs=request.prompt_logprobs,
        )

    def submit(self, seq: Sequence, sink: Sink) -> None:
        with self._wakeup:
            self._joining.append((seq, sink))
            self._wakeup.notify()

    def abort(self, seq_id: int) -> None:
        with self._wakeup:
            self._leaving.append(seq_id)
            self._wakeup.notify()

    def running(self) -> int:
        return self._scheduler.running

    def waiting(self) -> int:
        return len(self._joining) + len(self._scheduler.waiting)

    def prefix_stats(self) -> PrefixStats | None:
        prefix = self._scheduler.prefix
        return prefix.stats() if prefix else None

    def adapters_in_slots(self) -> int:
        table = self._scheduler.adapters
        return table.loaded() if table else 0

    def step(self) -> None:
        """One iteration: admit/cancel, schedule -> execute -> update, publish new tokens."""
        outputs = self._take_inbox()
        plan = self._scheduler.schedule()
        started = time.perf_counter()
        logits = self._runner.execute(plan)
        self._score()
        sampled = self._sample(logits)
        self._scheduler.charge(plan, time.perf_counter() - started)
        outputs += self._scheduler.update(plan, sampled)
        self._publish(outputs)
        if not self._scheduler.has_work():
            self._runner.shrink()

    def _run(self) -> None:
        placement.pin_thread(self._cpus)
        while self._wait_for_work():
            try:
                self.step()
            except Exception as exc:
                log.exception("genai engine step failed")
                self._fail_all("generation step failed", exc)
        self._fail_all("generation backend unloaded", None)

    def _wait_for_work(self) -> bool:
        with self._wakeup:
            while not (self._stopping or self._joining or self._leaving):
                if self._scheduler.has_work():
                    break
                self._wakeup.wait()
            return not self._stopping

    def _take_inbox(self) -> list[SequenceOutput]:
        with self._wakeup:
            joining, self._joining = list(self._joining), deque()
            leaving, self._leaving = list(self._leaving), deque()
        for seq, sink in joining:
            self._sinks[seq.seq_id] = sink
            self._scheduler.add(seq)
        aborted = (self._scheduler.abort(seq_id) for seq_id in leaving)
        return [out for out in aborted if out is not None]

    def _score(self) -> None:
        """Score the prompt tokens the step's scoring prefills predicted: position ``p``'s
        logits give token ``p + 1`` (the last one's is the first generated, not scored here)."""
        for work, rows in self._runner.scored:
            seq = self._scheduler.slots[work.slot]
            if seq is None or seq.prompt_logprobs is None:
                continue
            targets = seq.prompt_ids[work.start + 1 : work.start + 1 + len(work.token_ids)]
            scores = self._prompt_scores.setdefault(seq.seq_id, [])
            top = seq.prompt_logprobs
            scored = zip(rows[: len(targets)], targets, strict=True)
            scores.extend(token_logprobs(row, token, top, rank=True) for row, token in scored)

    def _sample(self, logits: dict[int, npt.NDArray[np.float32]]) -> dict[int, int]:
        tokens = {}
        for slot, row in logits.items():
            seq = self._scheduler.slots[slot]
            if seq is not None:
                tokens[slot] = self._sinks[seq.seq_id].sampler.sample(row)
        return tokens

    def _publish(self, outputs: list[SequenceOutput]) -> None:
        """Hand each output to its stream's loop: one ``call_soon_threadsafe`` per loop."""
        by_loop: dict[asyncio.AbstractEventLoop, list[_Item]] = {}
        for out in outputs:
            sink = self._sinks[out.seq_id]
            if out.finish_reason is not None:
                del self._sinks[out.seq_id]
            logprobs = sink.sampler.take_logprobs(len(out.token_ids))
            prompt = self._prompt_scores.pop(out.seq_id, None)
            chunk = _chunk(sink.request_id, out, logprobs, prompt)
            by_loop.setdefault(sink.loop, []).append((sink, chunk))
        for loop, items in by_loop.items():
            _call_soon(loop, items)

    def _fail_all(self, reason: str, cause: BaseException | None) -> None:
        """Drop every sequence (a failed step leaves the cache undefined); their streams raise."""
        self._take_inbox()
        for seq in [*self._scheduler.waiting, *filter(None, self._scheduler.slots)]:
            self._scheduler.abort(seq.seq_id)
        sinks, self._sinks = list(self._sinks.values()), {}
        self._prompt_scores.clear()
        for sink in sinks:
            error = RuntimeError(reason)
            error.__cause__ = cause
            _call_soon(sink.loop, [(sink, error)])
        self._runner.shrink()


def stop_ids(request: GenerateRequest, spec: ModelSpec) -> frozenset[int]:
    """The tokens that end a sequence: the model's end-of-sequence ones (unless the request
    ignores them) and the request's own."""
    eos = frozenset() if request.ignore_eos else spec.eos_token_ids
    return eos | frozenset(request.stop_token_ids)


def _validate(request: GenerateRequest, spec: ModelSpec) -> None:
    prompt = len(request.prompt_ids)
    if prompt == 0:
        raise ValueError("prompt_ids is empty")
    if request.max_tokens < 1:
        raise ValueError("max_tokens must be at least 1")
    if request.public_prefix < 0:
        raise ValueError("public_prefix must not be negative")
    if prompt + request.max_tokens > spec.context_length:
        raise ValueError(
            f"prompt ({prompt} tokens) plus max_tokens ({request.max_tokens}) exceeds "
            f"the context length ({spec.context_length})"
        )
    if not all(0 <= token < spec.vocab_size for token in request.prompt_ids):
        raise ValueError(f"prompt_ids must be token ids in [0, {spec.vocab_size})")
    if not all(0 <= token < spec.vocab_size for token in request.logit_bias):
        raise ValueError(f"logit_bias keys must be token ids in [0, {spec.vocab_size})")
    if not all(0 <= token < spec.vocab_size for token in request.stop_token_ids):
        raise ValueError(f"stop_token_ids must be token ids in [0, {spec.vocab_size})")
    if request.min_tokens < 0:
        raise ValueError("min_tokens must not be negative")
    scored = request.prompt_logprobs
    if scored is not None and not 0 <= scored <= MAX_LOGPROBS:
        raise ValueError(f"prompt_logprobs must be in [0, {MAX_LOGPROBS}]")
    if request.grammar is not None and (request.min_tokens or request.ignore_eos):
        raise ValueError("a grammar ends its sequence itself: no min_tokens or ignore_eos")


def _chunk(
    request_id: str, out: SequenceOutput, logprobs: list[TokenLogprobs] | None,
    prompt_logprobs: list[TokenLogprobs] | None = None,
) -> GenerateChunk:  # fmt: skip
    return GenerateChunk(
        request_id=request_id,
        token_ids=list(out.token_ids),
        finish_reason=out.finish_reason,
        prompt_tokens=out.prompt_tokens,
        completion_tokens=out.completion_tokens,
        cached_tokens=out.cached_tokens,
        queue_ms=out.queue_s * 1000,
        compute_ms=out.compute_s * 1000,
        logprobs=logprobs,
        prompt_logprobs=prompt_logprobs,
        stop_token=out.stop_token,
    )


def _call_soon(loop: asyncio.AbstractEventLoop, items: list[_Item]) -> None:
    """Deliver from the engine thread; a closed loop means nobody is listening any more."""
    with contextlib.suppress(RuntimeError):
        loop.call_soon_threadsafe(_deliver, items)


def _deliver(items: list[_Item]) -> None:
    for sink, item in items:
        sink.queue.put_nowait(item)
