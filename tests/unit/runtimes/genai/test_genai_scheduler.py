"""Slot admission, chunked prefill and stop rules of the continuous-batching scheduler."""

from __future__ import annotations

import pytest

from kiln_runtimes.backends._genai_scheduler import (
    Scheduler,
    Sequence,
    StepPlan,
    chunk_length,
    finish_reason,
)

EOS = 2
PAD = 0


def make_scheduler(slots: int = 2, prefill_chunk: int = 64, context: int = 64) -> Scheduler:
    return Scheduler(slots, prefill_chunk, context, PAD)


def make_seq(
    seq_id: int, prompt: int = 4, max_tokens: int = 8, stop: tuple[int, ...] = ()
) -> Sequence:
    return Sequence(
        seq_id=seq_id,
        prompt_ids=list(range(10, 10 + prompt)),
        max_tokens=max_tokens,
        stop_ids=frozenset({EOS, *stop}),
    )


def run_step(scheduler: Scheduler, token: int = 7) -> tuple[StepPlan, dict[int, int]]:
    """Schedule, pretend to execute, and sample ``token`` for every slot that samples."""
    batch = scheduler.schedule()
    sampled = {w.slot: token for w in batch.prefills if w.last}
    sampled.update(dict.fromkeys(batch.decode_slots, token))
    return batch, sampled


def test_admits_fifo_into_free_slots_and_queues_the_rest() -> None:
    scheduler = make_scheduler(slots=2)
    for seq_id in (1, 2, 3):
        scheduler.add(make_seq(seq_id))
    batch = scheduler.schedule()
    assert [w.slot for w in batch.prefills] == [0, 1]
    assert [s.seq_id for s in scheduler.slots if s] == [1, 2]
    assert [s.seq_id for s in scheduler.waiting] == [3]
    assert scheduler.running == 2


def test_express_sequences_are_admitted_ahead_of_waiting_normal_ones() -> None:
    scheduler = make_scheduler(slots=1)
    for seq_id in (1, 2, 3):
        scheduler.add(make_seq(seq_id))
    scheduler.schedule()
    for seq_id in (4, 5):
        seq = make_seq(seq_id)
        seq.express = True
        scheduler.add(seq)
    scheduler.schedule()
    assert [s.seq_id for s in scheduler.slots if s] == [1]  # a running sequence keeps its slot
    assert [s.seq_id for s in scheduler.waiting] == [4, 5, 2, 3]


def test_prefill_budget_is_shared_and_chunks_long_prompts() -> None:
    scheduler = make_scheduler(slots=3, prefill_chunk=10, context=128)
    scheduler.add(make_seq(1, prompt=4))
    scheduler.add(make_seq(2, prompt=25))
    scheduler.add(make_seq(3, prompt=3))
    batch, sampled = run_step(scheduler)
    assert [(w.slot, w.start, len(w.token_ids), w.last) for w in batch.prefills] == [
        (0, 0, 4, True),
        (1, 0, 6, False),
    ]
    scheduler.update(batch, sampled)
    batch, sampled = run_step(scheduler)
    assert [(w.slot, w.start, len(w.token_ids), w.last) for w in batch.prefills] == [
        (1, 6, 10, False)
    ]
    assert batch.decode_slots == (0,)
    scheduler.update(batch, sampled)
    batch = scheduler.schedule()
    # One token of the budget is left: sequence 3 waits rather than prefill a 1-token chunk.
    assert [(w.slot, w.start, len(w.token_ids), w.last) for w in batch.prefills] == [
        (1, 16, 9, True)
    ]


@pytest.mark.parametrize(
    ("rest", "budget", "length"),
    [(5, 8, 5), (1, 8, 1), (9, 8, 7), (10, 8, 8), (3, 1, 0), (3, 2, 3), (2, 1, 2), (4, 2, 2)],
)
def test_a_chunk_is_never_one_token_of_a_longer_rest(rest: int, budget: int, length: int) -> None:
    assert chunk_length(rest, budget) == length
    assert rest - length != 1


def test_a_budget_of_two_or_more_always_moves_a_prompt_on() -> None:
    for budget in range(2, 12):
        for rest in range(2, 40):
            assert 2 <= chunk_length(rest, budget) <= budget + 1, (rest, budget)


def test_while_a_sequence_decodes_prompts_get_the_smaller_budget() -> None:
    scheduler = Scheduler(3, 10, 128, PAD, decoding_budget=3)
    scheduler.add(make_seq(1, prompt=4))
    scheduler.add(make_seq(2, prompt=12))
    batch, sampled = run_step(scheduler)  # nothing decodes yet: the full 10
    assert [(w.slot, w.start, len(w.token_ids)) for w in batch.prefills] == [(0, 0, 4), (1, 0, 6)]
    scheduler.update(batch, sampled)
    batch, sampled = run_step(scheduler)  # sequence 1 decodes now: 3 prompt tokens a step
    assert batch.decode_slots == (0,)
    assert [(w.slot, w.start, len(w.token_ids)) for w in batch.prefills] == [(1, 6, 3)]
    scheduler.update(batch, sampled)
    scheduler.abort(1)
    batch = scheduler.schedule()  # nothing decodes again: the rest of the prompt at once
    assert batch.decode_slots == ()
    assert [(w.slot, w.start, len(w.token_ids), w.last) for w in batch.prefills] == [
        (1, 9, 3, True)
    ]


def test_the_decoding_budget_is_positive_and_at_most_the_chunk() -> None:
    assert Scheduler(1, 8, 64, PAD, decoding_budget=50).decoding_budget == 8
    assert Scheduler(1, 8, 64, PAD).decoding_budget == 8
    with pytest.raises(ValueError, match="decoding_budget"):
        Scheduler(1, 8, 64, PAD, decoding_budget=1)


def test_decode_rows_cover_the_highest_ready_slot_with_lengths() -> None:
    scheduler = make_scheduler(slots=3, prefill_chunk=5, context=128)
    scheduler.add(make_seq(1, prompt=3))
    scheduler.add(make_seq(2, prompt=2))
    scheduler.update(*run_step(scheduler))  # both prefilled (3 + 2 tokens), one token each
    scheduler.add(make_seq(3, prompt=9))
    batch = scheduler.schedule()
    assert batch.decode_slots == (0, 1)
    assert batch.decode_tokens == (7, 7)
    assert batch.decode_lengths == (3, 2)  # KV already holds the prompts; the new token goes there
    assert [(w.slot, w.start, len(w.token_ids)) for w in batch.prefills] == [(2, 0, 5)]


def test_rows_that_are_not_decoding_keep_their_cache_positions() -> None:
    scheduler = make_scheduler(slots=3, prefill_chunk=4, context=128)
    scheduler.add(make_seq(1, prompt=2))
    scheduler.add(make_seq(2, prompt=2))
    scheduler.update(*run_step(scheduler))
    scheduler.abort(1)  # slot 0 is empty now, slot 1 decodes
    scheduler.add(make_seq(3, prompt=9))  # joins slot 0, prefills 4 tokens this step
    batch = scheduler.schedule()
    assert batch.decode_slots == (1,)
    assert batch.decode_lengths == (
        4,
        2,
    )  # slot 0's throwaway write lands where the next chunk goes


def test_stop_token_finishes_counted_but_not_emitted() -> None:
    scheduler = make_scheduler()
    scheduler.add(make_seq(1))
    outputs = scheduler.update(*run_step(scheduler, token=7))
    assert [(o.token_ids, o.finish_reason) for o in outputs] == [((7,), None)]
    batch, _ = run_step(scheduler)
    (out,) = scheduler.update(batch, {0: EOS})
    assert (out.token_ids, out.finish_reason, out.completion_tokens) == ((), "stop", 2)
    assert (out.stop_token, outputs[0].stop_token) == (EOS, None)  # named, for stop_reason
    assert out.prompt_tokens == 4
    assert scheduler.running == 0


def test_request_stop_token_ids_stop_too() -> None:
    scheduler = make_scheduler()
    scheduler.add(make_seq(1, stop=(99,)))
    (out,) = scheduler.update(*run_step(scheduler, token=99))
    assert (out.finish_reason, out.stop_token) == ("stop", 99)


def test_max_tokens_finishes_with_length_and_frees_the_slot() -> None:
    scheduler = make_scheduler(slots=1)
    scheduler.add(make_seq(1, max_tokens=3))
    scheduler.add(make_seq(2))
    reasons = []
    for _ in range(3):
        reasons += [o.finish_reason for o in scheduler.update(*run_step(scheduler))]
    assert reasons == [None, None, "length"]
    batch = scheduler.schedule()
    assert [(w.slot, w.start) for w in batch.prefills] == [(0, 0)]
    assert scheduler.slots[0] is not None
    assert scheduler.slots[0].seq_id == 2


def test_abort_running_and_waiting_sequences() -> None:
    scheduler = make_scheduler(slots=1)
    scheduler.add(make_seq(1))
    scheduler.add(make_seq(2))
    scheduler.update(*run_step(scheduler))
    running = scheduler.abort(1)
    waiting = scheduler.abort(2)
    assert running is not None
    assert (running.finish_reason, running.completion_tokens) == ("cancelled", 1)
    assert waiting is not None
    assert (waiting.finish_reason, waiting.completion_tokens) == ("cancelled", 0)
    assert scheduler.abort(3) is None
    assert not scheduler.has_work()


def test_add_rejects_requests_beyond_the_context() -> None:
    scheduler = make_scheduler(context=16)
    with pytest.raises(ValueError, match="context"):
        scheduler.add(make_seq(1, prompt=10, max_tokens=7))


def test_finish_reason_rules() -> None:
    seq = make_seq(1, prompt=4, max_tokens=2)
    seq.output_ids = [5]
    assert finish_reason(seq, 5, context_length=64) is None
    assert finish_reason(seq, 5, context_length=5) == "length"
    seq.output_ids = [5, 6]
    assert finish_reason(seq, 6, context_length=64) == "length"
    assert finish_reason(seq, EOS, context_length=64) == "stop"


def _with_adapter(seq: Sequence, key: str) -> Sequence:
    from kiln_runtimes.lora import Adapter

    seq.adapter, seq.adapter_key = Adapter(rank=1, alpha=1, modules=(), a={}, b={}), key
    return seq


def test_an_adapter_is_loaded_once_into_a_slot_and_rows_say_which() -> None:
    scheduler = Scheduler(4, 64, 64, PAD, adapter_slots=2)
    scheduler.add(_with_adapter(make_seq(1), "a"))
    scheduler.add(make_seq(2))
    scheduler.add(_with_adapter(make_seq(3), "a"))
    batch, sampled = run_step(scheduler)
    assert [(slot, adapter.rank) for slot, adapter in batch.adapter_loads] == [(0, 1)]
    assert [w.adapter for w in batch.prefills] == [0, -1, 0]
    scheduler.update(batch, sampled)
    batch, _ = run_step(scheduler)
    assert batch.decode_adapters == (0, -1, 0)
    assert batch.adapter_loads == ()


def test_a_sequence_whose_adapter_finds_no_slot_waits_while_others_go_ahead() -> None:
    scheduler = Scheduler(4, 64, 64, PAD, adapter_slots=1)
    scheduler.add(_with_adapter(make_seq(1, max_tokens=1), "a"))
    scheduler.add(_with_adapter(make_seq(2), "b"))  # the only slot holds a
    scheduler.add(make_seq(3))
    batch, sampled = run_step(scheduler)
    assert [s.seq_id for s in scheduler.slots if s] == [1, 3]
    assert [s.seq_id for s in scheduler.waiting] == [2]
    scheduler.update(batch, sampled)  # 1 finishes (max_tokens=1): its slot is unpinned
    batch, _ = run_step(scheduler)
    assert [s.seq_id for s in scheduler.slots if s] == [2, 3]
    assert [slot for slot, _ in batch.adapter_loads] == [0]


def test_a_worker_without_adapter_slots_refuses_an_adapter() -> None:
    with pytest.raises(ValueError, match="no adapter slots"):
        make_scheduler().add(_with_adapter(make_seq(1), "a"))
