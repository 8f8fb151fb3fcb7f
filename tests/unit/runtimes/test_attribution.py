"""Compute time attributed to requests: a batch's (or step's) time shared by members' cost."""

from __future__ import annotations

import numpy as np
import pytest

from kiln_runtimes._attribution import shares, shares_by
from kiln_runtimes._batch_types import Outcome
from kiln_runtimes._latency import LatencyModel
from kiln_runtimes.backends._genai_scheduler import Scheduler, Sequence, step_tokens
from kiln_runtimes.batch_queue import BatchPolicy, BatchQueue


def test_shares_are_proportional_and_add_up() -> None:
    assert shares([1, 3], 0.4) == pytest.approx([0.1, 0.3])
    assert sum(shares([5, 7, 11], 1.0)) == pytest.approx(1.0)
    assert shares([0, 0], 0.2) == pytest.approx([0.1, 0.1])
    assert shares([], 1.0) == []
    assert shares_by({"a": 1, "b": 1}, 2.0) == {"a": 1.0, "b": 1.0}


def test_a_batch_is_shared_by_tokens_and_summed_over_batches() -> None:
    clock = [0.0]
    queue = BatchQueue(BatchPolicy(max_batch_size=4, max_wait=0.0), lambda: clock[0],
                       LatencyModel(0.01, 0.02))  # fmt: skip
    small = queue.submit("small", [[1]], None)  # 1 token
    big = queue.submit("big", [[1, 2, 3], [4, 5, 6, 7, 8, 9]], None)  # 9 tokens
    batch, _ = queue.poll()
    assert batch is not None
    assert len(batch.items) == 3
    rows = np.zeros((3, 2), dtype=np.float32)
    queue.finish(batch, [Outcome(batch, rows, 0.100)])
    assert small.compute_s == pytest.approx(0.010)
    assert big.compute_s == pytest.approx(0.090)
    assert small.compute_s + big.compute_s == pytest.approx(0.100)  # nobody pays twice


def test_tensor_rows_share_equally() -> None:
    queue = BatchQueue(BatchPolicy(max_batch_size=4, max_wait=0.0), lambda: 0.0)
    one = queue.submit("one", [{"x": np.zeros(3)}], None)
    three = queue.submit("three", [{"x": np.zeros(3)}] * 3, None)
    batch, _ = queue.poll()
    assert batch is not None
    queue.finish(batch, [Outcome(batch, [None] * 4, 0.040)])
    assert (one.compute_s, three.compute_s) == pytest.approx((0.010, 0.030))


def _seq(seq_id: int, prompt: int, max_tokens: int = 8) -> Sequence:
    return Sequence(seq_id=seq_id, prompt_ids=[1] * prompt, max_tokens=max_tokens,
                    stop_ids=frozenset())  # fmt: skip


def test_an_llm_step_is_shared_by_the_tokens_each_sequence_processed() -> None:
    scheduler = Scheduler(max_sequences=4, prefill_chunk=128, context_length=256, pad_token_id=0)
    a = _seq(1, prompt=3)
    scheduler.add(a)
    step = scheduler.schedule()  # a's whole prompt
    scheduler.charge(step, 0.030)
    scheduler.update(step, {0: 5})
    b = _seq(2, prompt=9)
    scheduler.add(b)
    step = scheduler.schedule()  # a decodes 1 token, b prefills 9
    assert step_tokens(step) == {0: 1, 1: 9}
    scheduler.charge(step, 0.100)
    assert a.compute_s == pytest.approx(0.030 + 0.010)
    assert b.compute_s == pytest.approx(0.090)
    outputs = scheduler.update(step, {0: 6, 1: 7})
    assert [o.compute_s for o in outputs] == pytest.approx([0.040, 0.090])
