"""The worker's KV cache on the real SmolLM2 graph: a sequence grows past 256, 512 and 1024
positions without the cache being reallocated, copied or rebound, reads back what prefill wrote
(bit for bit the same however the prompt was chunked), and ``shrink`` hands the written pages back
without moving anything."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec
import numpy as np
import pytest

from kiln_runtimes.protocol import MANIFEST_NAME, ModelManifest

if TYPE_CHECKING:
    from kiln_runtimes.backends._genai_runner import ModelRunner

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

ROWS = 4
LONG = 1100  # past every power-of-two boundary the cache used to grow at (256, 512, 1024)
READ = 600  # past 512: long enough to cross a boundary, short enough to prefill twice quickly


@pytest.fixture(scope="module")
def runner(smollm2_dir: Path) -> ModelRunner:
    pytest.importorskip("onnxruntime")
    from kiln_runtimes.backends._genai_config import load_spec
    from kiln_runtimes.backends._genai_runner import ModelRunner

    manifest = msgspec.json.decode((smollm2_dir / MANIFEST_NAME).read_bytes(), type=ModelManifest)
    return ModelRunner(load_spec(smollm2_dir, manifest), ROWS)


def _decode(runner: ModelRunner, length: int, token: int = 5) -> dict[int, Any]:
    from kiln_runtimes.backends._genai_scheduler import StepPlan

    plan = StepPlan((), tuple(range(ROWS)), (token,) * ROWS, (length,) * ROWS)
    return runner.execute(plan)


def _prefill(runner: ModelRunner, slot: int, tokens: list[int]) -> Any:
    from kiln_runtimes.backends._genai_scheduler import PrefillWork, StepPlan

    for start in range(0, len(tokens), 128):
        chunk = tuple(tokens[start : start + 128])
        last = start + 128 >= len(tokens)
        logits = runner.execute(StepPlan(prefills=(PrefillWork(slot, start, chunk, last),)))
    return logits[slot]


def _addresses(runner: ModelRunner) -> list[int]:
    return [buffer.ctypes.data for buffer in runner._kv]


def test_growing_past_the_old_boundaries_allocates_copies_and_rebinds_nothing(
    runner: ModelRunner,
) -> None:
    _decode(runner, 10)
    buffers, binding = _addresses(runner), runner._decode_bindings[ROWS, 0]
    for length in (255, 256, 511, 512, 1023, 1024, LONG):
        _decode(runner, length)
        assert _addresses(runner) == buffers, length
        assert runner._decode_bindings[ROWS, 0] is binding, length


def test_a_decode_past_the_boundaries_reads_what_prefill_wrote(runner: ModelRunner) -> None:
    tokens = np.random.default_rng(7).integers(3, runner.spec.vocab_size, READ + 1).tolist()
    _prefill(runner, 0, tokens[:READ])
    whole = _prefill(runner, 1, tokens)  # the last token's logits from prefill alone
    stepped = _decode(runner, READ, tokens[READ])[0]  # ... from the cache row 0 holds
    assert int(stepped.argmax()) == int(whole.argmax())
    # The two paths differ by ~0.3 at any length (logits ~30; the same before the cache was
    # mapped at full size); a row that never saw the prefix is off by ~27.
    assert float(np.abs(stepped - whole).max()) < 1.0


def test_the_kv_a_prompt_leaves_is_the_same_bit_for_bit_however_it_is_cut(
    runner: ModelRunner,
) -> None:
    """What lets the scheduler end chunks wherever a step's budget does, with a prefix cache:
    a block restored from it holds what prefilling it under any other cuts would write."""
    from kiln_runtimes.backends._genai_scheduler import PrefillWork, StepPlan

    tokens = np.random.default_rng(3).integers(3, runner.spec.vocab_size, 300).tolist()
    # Row: chunk lengths, all of two tokens or more. A one-token chunk runs other kernels (with
    # [.., 1, ..] the last logits moved by up to 0.4), so the scheduler never cuts one.
    cuts = {0: [300], 1: [37] * 9, 2: [32, 32, 2, 30, 128, 76], 3: [3, 2, 295]}
    logits = {}
    for row, lengths in cuts.items():
        start = 0
        for length in lengths:
            end = min(start + length, len(tokens))
            work = PrefillWork(row, start, tuple(tokens[start:end]), end == len(tokens))
            out = runner.execute(StepPlan(prefills=(work,)))
            start = end
        logits[row] = out[row]
    for row in (1, 2, 3):
        assert np.array_equal(logits[row], logits[0]), row
        for buffer in runner._kv:
            assert np.array_equal(buffer[row, :, :300], buffer[0, :, :300]), row


def test_shrink_hands_pages_back_and_keeps_buffers_and_bindings(runner: ModelRunner) -> None:
    _decode(runner, LONG)
    binding = runner._decode_bindings[ROWS, 0]
    buffers = _addresses(runner)
    assert any(buffer[:, :, :LONG].any() for buffer in runner._kv)
    runner.shrink()
    assert not any(buffer[:, :, :LONG].any() for buffer in runner._kv)  # released: zeros again
    assert _addresses(runner) == buffers
    _decode(runner, 300)
    assert runner._decode_bindings[ROWS, 0] is binding
