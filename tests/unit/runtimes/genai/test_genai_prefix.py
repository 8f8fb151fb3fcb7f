"""The prefix cache's keys, LRU bound and counts; how the scheduler restores and saves blocks."""

from __future__ import annotations

from typing import Any

import pytest

from kiln_runtimes.backends._genai_prefix import PrefixCache, block_keys, usable_blocks
from kiln_runtimes.backends._genai_scheduler import Scheduler, Sequence

BLOCK = 4
PAD = 0


def test_keys_chain_whole_blocks_only() -> None:
    keys = block_keys(list(range(11)), BLOCK, scope="a")
    assert len(keys) == 2  # the 3 tokens after the second block make no block
    assert block_keys(list(range(8)), BLOCK, scope="a") == keys
    # A block's key names the whole prefix: the same block after a different first block differs.
    other = block_keys([99, *range(1, 8)], BLOCK, scope="a")
    assert other[0] != keys[0]
    assert other[1] != keys[1]


def test_keys_differ_by_tenant_and_adapter_except_within_the_public_prefix() -> None:
    tokens = list(range(12))
    a, b = block_keys(tokens, BLOCK, scope="a"), block_keys(tokens, BLOCK, scope="b")
    assert not set(a) & set(b)
    assert not set(a) & set(block_keys(tokens, BLOCK, scope="a", adapter="lora"))
    public_a = block_keys(tokens, BLOCK, scope="a", public=9)
    public_b = block_keys(tokens, BLOCK, scope="b", public=9)
    assert public_a[:2] == public_b[:2]  # blocks ending at 4 and 8 lie within 9 public tokens
    assert public_a[2] != public_b[2]
    # No tenant is not the public scope.
    assert not set(block_keys(tokens, BLOCK, scope="")) & set(public_a)


def test_usable_blocks_leave_the_last_two_tokens_to_prefill() -> None:
    assert usable_blocks(9, BLOCK) == 1
    assert usable_blocks(10, BLOCK) == 2
    assert usable_blocks(3, BLOCK) == 0
    assert usable_blocks(1, BLOCK) == 0


def test_lookup_returns_the_leading_run_and_counts_hits_and_misses() -> None:
    cache: PrefixCache[str] = PrefixCache(BLOCK, 100)
    cache.put(b"k0", "b0", 10)
    cache.put(b"k2", "b2", 10)
    assert cache.lookup([b"k0", b"k1", b"k2"]) == ["b0"]  # k2 is useless without k1
    stats = cache.stats()
    assert (stats.hit_blocks, stats.miss_blocks, stats.blocks, stats.bytes) == (1, 2, 2, 20)


def test_least_recently_used_blocks_are_evicted_over_the_bound() -> None:
    cache: PrefixCache[str] = PrefixCache(BLOCK, 30)
    for name in ("a", "b", "c"):
        cache.put(name.encode(), name, 10)
    cache.lookup([b"a"])  # a is now the most recently used
    cache.put(b"d", "d", 10)
    assert b"b" not in cache
    assert all(key in cache for key in (b"a", b"c", b"d"))
    cache.put(b"huge", "huge", 31)  # larger than the bound: not kept, nothing evicted for it
    assert b"huge" not in cache
    stats = cache.stats()
    assert (stats.evicted_blocks, stats.bytes, stats.blocks) == (1, 30, 3)


def test_bad_bounds_are_refused() -> None:
    with pytest.raises(ValueError, match="block"):
        PrefixCache(0, 10)
    with pytest.raises(ValueError, match="prefill_chunk"):
        Scheduler(1, 8, 64, PAD, prefix=PrefixCache(BLOCK, 10))


def make(prefix: PrefixCache[Any], slots: int = 2) -> Scheduler:
    return Scheduler(slots, BLOCK, 64, PAD, prefix=prefix)


def seq(seq_id: int, prompt: list[int], tenant: str = "t") -> Sequence:
    return Sequence(
        seq_id=seq_id, prompt_ids=prompt, max_tokens=4, stop_ids=frozenset(), tenant=tenant
    )


def prefill_all(scheduler: Scheduler, prefix: PrefixCache[Any]) -> list[tuple[int, int]]:
    """Run steps until every prompt is prefilled, saving blocks as the runner would; returns
    the (start, length) of every chunk."""
    chunks = []
    while any(s and not s.prefill_done for s in scheduler.slots) or scheduler.waiting:
        plan = scheduler.schedule()
        for work in plan.prefills:
            chunks.append((work.start, len(work.token_ids)))
            for _start, key in work.saves:
                prefix.put(key, f"block@{_start}", 1)
        scheduler.update(plan, {w.slot: 1 for w in plan.prefills if w.last})
    return chunks


def test_a_second_prompt_starts_after_the_cached_blocks_of_the_first() -> None:
    prefix: PrefixCache[Any] = PrefixCache(BLOCK, 100)
    scheduler = make(prefix)
    first = seq(1, list(range(10)))
    scheduler.add(first)
    assert prefill_all(scheduler, prefix) == [(0, 4), (4, 4), (8, 2)]
    assert prefix.stats().blocks == 2
    second = seq(2, [*range(8), 50, 51, 52])  # shares the first 8 tokens
    scheduler.add(second)
    plan = scheduler.schedule()
    restored: list[Any] = [(r.slot, r.blocks) for r in plan.restores]  # the test's payloads
    assert restored == [(1, ("block@0", "block@4"))]
    assert [(w.start, w.token_ids) for w in plan.prefills] == [(8, (50, 51, 52))]
    assert second.cached_tokens == 8


def test_a_prompt_of_whole_cached_blocks_still_prefills_its_last_block() -> None:
    prefix: PrefixCache[Any] = PrefixCache(BLOCK, 100)
    scheduler = make(prefix)
    scheduler.add(seq(1, list(range(8))))
    prefill_all(scheduler, prefix)
    scheduler.add(seq(2, list(range(8))))
    plan = scheduler.schedule()
    assert [len(r.blocks) for r in plan.restores] == [1]
    assert [(w.start, len(w.token_ids), w.last) for w in plan.prefills] == [(4, 4, True)]


def test_a_prompt_to_score_is_prefilled_whole_and_keeps_its_logits() -> None:
    """A restored block has no logits to score its tokens by: such a prompt restores nothing,
    though its blocks are kept for later prompts."""
    prefix: PrefixCache[Any] = PrefixCache(BLOCK, 100)
    scheduler = make(prefix)
    scheduler.add(seq(1, list(range(10))))
    prefill_all(scheduler, prefix)
    scoring = seq(2, list(range(10)))
    scoring.prompt_logprobs = 0
    scheduler.add(scoring)
    plan = scheduler.schedule()
    assert plan.restores == ()
    assert [(w.start, w.scores) for w in plan.prefills] == [(0, True)]
    assert scoring.cached_tokens == 0


def test_another_tenant_finds_nothing() -> None:
    prefix: PrefixCache[Any] = PrefixCache(BLOCK, 100)
    scheduler = make(prefix)
    scheduler.add(seq(1, list(range(10)), tenant="a"))
    prefill_all(scheduler, prefix)
    scheduler.add(seq(2, list(range(10)), tenant="b"))
    plan = scheduler.schedule()
    assert plan.restores == ()
    assert plan.prefills[0].start == 0


def test_a_block_is_saved_by_the_chunk_that_completes_it_wherever_chunks_end() -> None:
    prefix: PrefixCache[Any] = PrefixCache(BLOCK, 100)
    scheduler = Scheduler(3, BLOCK, 64, PAD, prefix=prefix, decoding_budget=3)
    scheduler.add(seq(1, [90]))  # decodes from the second step on: 3-token chunks beside it
    scheduler.add(seq(2, list(range(10))))
    # 3-token chunks, but the one that would leave a single token behind takes 2.
    assert prefill_all(scheduler, prefix) == [(0, 1), (0, 3), (3, 3), (6, 2), (8, 2)]
    assert prefix.stats().blocks == 2  # each saved once positions 0-3, then 4-7, were written
    scheduler.add(seq(3, [*range(8), 50, 51]))
    plan = scheduler.schedule()
    restored: list[Any] = [(r.slot, r.blocks) for r in plan.restores]
    assert restored == [(2, ("block@0", "block@4"))]


def test_a_hybrids_chunks_end_where_the_blocks_they_save_end() -> None:
    """``aligned`` (a hybrid's: its states are known only where a chunk ends): a chunk that
    would pass the end of a block the cache lacks stops there and saves it; one that would
    leave a single token before it does not stop, and saves nothing."""
    chunks, saved, restored = [], [], list[Any]()
    for aligned in (False, True):
        prefix: PrefixCache[Any] = PrefixCache(BLOCK, 100)
        scheduler = Scheduler(3, BLOCK, 64, PAD, prefix=prefix, decoding_budget=3,
                              aligned=aligned)  # fmt: skip
        scheduler.add(seq(1, [90, 91]))  # decodes from the second step on: 3-token chunks
        scheduler.add(seq(2, list(range(10))))
        chunks.append(prefill_all(scheduler, prefix))
        saved.append(prefix.stats().blocks)
        scheduler.add(seq(3, [*range(8), 50, 51]))
        restored.append([r.blocks for r in scheduler.schedule().restores])
    assert chunks[0] == [(0, 2), (0, 2), (2, 3), (5, 3), (8, 2)]
    assert (saved[0], restored[0]) == (2, [("block@0", "block@4")])
    # 2-5 stops at 4 (block 0 saved); 7-10 cannot stop at 8 (a 1-token chunk): block 1 is not
    assert chunks[1] == [(0, 2), (0, 2), (2, 2), (4, 3), (7, 3)]
    assert (saved[1], restored[1]) == (1, [("block@0",)])


def test_the_worker_exports_the_cache_counts() -> None:
    from kiln_runtimes._metrics import WorkerMetrics

    cache: PrefixCache[str] = PrefixCache(BLOCK, 100)
    cache.put(b"a", "a", 10)
    cache.lookup([b"a", b"b"])
    metrics = WorkerMetrics()
    metrics.watch_prefix_cache(cache.stats)
    text = metrics.render().decode()
    assert 'kiln_worker_prefix_cache_blocks_total{result="hit"} 1.0' in text
    assert 'kiln_worker_prefix_cache_blocks_total{result="miss"} 1.0' in text
    assert "kiln_worker_prefix_cache_bytes 10.0" in text
