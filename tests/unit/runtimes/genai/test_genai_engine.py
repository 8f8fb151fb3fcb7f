"""The engine thread and the async stream API, with a made-up model runner (no ONNX Runtime)."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec
import numpy as np
import pytest

from kiln_runtimes._errors import FieldError
from kiln_runtimes.backends._genai_config import ModelSpec
from kiln_runtimes.backends._genai_engine import EngineCore
from kiln_runtimes.backends._genai_scheduler import Scheduler, StepPlan
from kiln_runtimes.backends.genai import GenAIGenerationBackend
from kiln_runtimes.protocol import GenerateChunk, GenerateRequest

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable

VOCAB = 32
EOS = 2
SPEC = ModelSpec(
    model_path=Path("model.onnx"),
    num_layers=1,
    num_kv_heads=1,
    head_size=4,
    vocab_size=VOCAB,
    context_length=64,
    eos_token_ids=frozenset({EOS}),
    pad_token_id=0,
)


class FakeRunner:
    """Emits token ``5`` (or ``EOS`` after ``eos_after`` decode steps); can be told to fail."""

    def __init__(self, step_seconds: float = 0.002, eos_after: int | None = None) -> None:
        self.step_seconds = step_seconds
        self.eos_after = eos_after
        self.fail = threading.Event()
        self.batches: list[StepPlan] = []
        self.decodes = 0
        self.scored: list[Any] = []  # no prompt is scored here
        self.pruned = False

    def execute(self, batch: StepPlan) -> dict[int, np.ndarray]:
        if self.fail.is_set():
            self.fail.clear()
            raise RuntimeError("boom")
        self.batches.append(batch)
        time.sleep(self.step_seconds)
        token = 5
        if batch.decode_slots:
            self.decodes += 1
            if self.eos_after is not None and self.decodes >= self.eos_after:
                token = EOS
        row = np.zeros(VOCAB, dtype=np.float32)
        row[token] = 1.0
        slots = [w.slot for w in batch.prefills if w.last] + list(batch.decode_slots)
        return dict.fromkeys(slots, row)

    def shrink(self) -> None:
        pass


@pytest.fixture
async def backend() -> AsyncIterator[tuple[GenAIGenerationBackend, FakeRunner]]:
    runner = FakeRunner()
    core = EngineCore(SPEC, runner, Scheduler(2, 16, SPEC.context_length, 0))  # type: ignore[arg-type]
    core.start()
    generation = GenAIGenerationBackend()
    generation._core = core
    yield generation, runner
    generation.unload()


def running_waiting(generation: GenAIGenerationBackend) -> tuple[int, int]:
    health = generation.health()
    return health.running, health.waiting


def request(rid: str = "r", prompt: int = 3, max_tokens: int = 4) -> GenerateRequest:
    return GenerateRequest(
        request_id=rid,
        prompt_ids=list(range(10, 10 + prompt)),
        max_tokens=max_tokens,
        temperature=0,
    )


async def collect(stream: AsyncIterator[GenerateChunk]) -> tuple[list[int], GenerateChunk]:
    tokens: list[int] = []
    async for chunk in stream:
        tokens += chunk.token_ids
    return tokens, chunk


async def wait_until(condition: Callable[[], bool], seconds: float = 1.0) -> float:
    """Seconds until ``condition()`` held; fails the test after ``seconds``."""
    started = time.monotonic()
    for _ in range(int(seconds / 0.001)):
        if condition():
            return time.monotonic() - started
        await asyncio.sleep(0.001)
    raise AssertionError("condition not met in time")


async def test_stream_yields_tokens_then_length(
    backend: tuple[GenAIGenerationBackend, FakeRunner],
) -> None:
    generation, _ = backend
    tokens, last = await collect(generation.stream(request(max_tokens=4)))
    assert tokens == [5, 5, 5, 5]
    assert (last.finish_reason, last.prompt_tokens, last.completion_tokens) == ("length", 3, 4)
    assert running_waiting(generation) == (0, 0)


async def test_a_pruned_build_refuses_prompt_logprobs_naming_the_field(
    backend: tuple[GenAIGenerationBackend, FakeRunner],
) -> None:
    generation, runner = backend
    runner.pruned = True  # prune_lm_head: the last position's logits only
    asked = msgspec.structs.replace(request(), prompt_logprobs=1)
    with pytest.raises(FieldError, match="prune_lm_head") as refused:
        await collect(generation.stream(asked))
    assert refused.value.param == "prompt_logprobs"  # the worker's 400 names it (e2e: sampling)


async def test_eos_stops_without_emitting_it(
    backend: tuple[GenAIGenerationBackend, FakeRunner],
) -> None:
    generation, runner = backend
    runner.eos_after = 2
    tokens, last = await collect(generation.stream(request(max_tokens=10)))
    assert tokens == [5, 5]
    assert (last.finish_reason, last.completion_tokens, last.stop_token) == ("stop", 3, EOS)


async def test_ignore_eos_runs_to_max_tokens_and_min_tokens_holds_eos_back(
    backend: tuple[GenAIGenerationBackend, FakeRunner],
) -> None:
    """vLLM's ``ignore_eos`` (EOS is a token like any other: emitted, not an end) and
    ``min_tokens`` (EOS not drawn before that many: the next most probable is)."""
    generation, runner = backend
    runner.eos_after = 1
    ignoring = msgspec.structs.replace(request(max_tokens=5), ignore_eos=True)
    tokens, last = await collect(generation.stream(ignoring))
    assert (tokens, last.finish_reason) == ([5, EOS, EOS, EOS, EOS], "length")
    runner.decodes = 0
    held = msgspec.structs.replace(request(max_tokens=10), min_tokens=3)
    tokens, last = await collect(generation.stream(held))
    assert (tokens, last.finish_reason, last.completion_tokens) == ([5, 0, 0], "stop", 4)


async def test_more_streams_than_slots_wait_then_all_finish(
    backend: tuple[GenAIGenerationBackend, FakeRunner],
) -> None:
    generation, _ = backend
    streams = [generation.stream(request(f"r{i}", max_tokens=20)) for i in range(4)]
    tasks = [asyncio.create_task(collect(s)) for s in streams]
    await wait_until(lambda: running_waiting(generation) == (2, 2))
    results = await asyncio.gather(*tasks)
    assert [last.finish_reason for _, last in results] == ["length"] * 4
    assert running_waiting(generation) == (0, 0)


async def test_closing_a_stream_frees_its_slot(
    backend: tuple[GenAIGenerationBackend, FakeRunner],
) -> None:
    generation, runner = backend
    stream = generation.stream(request(max_tokens=50))
    first = await anext(stream)
    assert first.token_ids
    assert generation.health().running == 1
    await stream.aclose()
    elapsed = await wait_until(lambda: generation.health().running == 0)
    assert elapsed < 10 * runner.step_seconds + 0.05


async def test_cancel_ends_the_stream_with_counts(
    backend: tuple[GenAIGenerationBackend, FakeRunner],
) -> None:
    generation, _ = backend
    stream = generation.stream(request("c", max_tokens=50))
    await anext(stream)
    assert generation.cancel("c")
    _, last = await collect(stream)
    assert last.finish_reason == "cancelled"
    assert last.completion_tokens >= 1
    assert not generation.cancel("c")


async def test_requests_beyond_the_context_are_refused_up_front(
    backend: tuple[GenAIGenerationBackend, FakeRunner],
) -> None:
    generation, _ = backend
    with pytest.raises(ValueError, match="context length"):
        generation.stream(request(prompt=40, max_tokens=30))
    with pytest.raises(ValueError, match="token ids"):
        generation.stream(request(prompt=VOCAB, max_tokens=1))
    assert generation.health().waiting == 0


async def test_a_failed_step_fails_running_streams_and_the_engine_goes_on(
    backend: tuple[GenAIGenerationBackend, FakeRunner],
) -> None:
    generation, runner = backend
    stream = generation.stream(request(max_tokens=50))
    await anext(stream)
    runner.fail.set()
    with pytest.raises(RuntimeError, match="step failed") as failure:
        await collect(stream)
    assert str(failure.value.__cause__) == "boom"
    tokens, last = await collect(generation.stream(request(max_tokens=2)))
    assert (tokens, last.finish_reason) == ([5, 5], "length")


async def test_unload_fails_open_streams() -> None:
    core = EngineCore(SPEC, FakeRunner(), Scheduler(1, 16, 64, 0))  # type: ignore[arg-type]
    core.start()
    generation = GenAIGenerationBackend()
    generation._core = core
    stream = generation.stream(request(max_tokens=60))
    await anext(stream)
    generation.unload()
    with pytest.raises(RuntimeError, match="unloaded"):
        await collect(stream)
    with pytest.raises(RuntimeError, match="not loaded"):
        generation.stream(request())


async def test_the_engine_thread_runs_on_its_cores() -> None:
    last = frozenset({max(os.sched_getaffinity(0))})
    seen: list[frozenset[int]] = []

    class Recording(FakeRunner):
        def execute(self, batch: StepPlan) -> dict[int, np.ndarray]:
            seen.append(frozenset(os.sched_getaffinity(0)))
            return super().execute(batch)

    core = EngineCore(SPEC, Recording(), Scheduler(2, 16, SPEC.context_length, 0), last)  # type: ignore[arg-type]
    core.start()
    generation = GenAIGenerationBackend()
    generation._core = core
    try:
        await collect(generation.stream(request(max_tokens=2)))
    finally:
        generation.unload()
    assert seen
    assert set(seen) == {last}
