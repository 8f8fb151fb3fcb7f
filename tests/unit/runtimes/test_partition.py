"""``onnx_embed.partition``: length runs that pay for themselves, covering every input once."""

from __future__ import annotations

from kiln_runtimes.backends._padding import partition


def test_uniform_lengths_stay_one_run() -> None:
    assert partition([10] * 8) == [sorted(range(8))]


def test_very_different_lengths_split_and_cover_each_index_once() -> None:
    lengths = [5, 200, 6, 210, 5, 7]
    runs = partition(lengths, run_cost=24)
    assert len(runs) == 2
    assert sorted(i for run in runs for i in run) == list(range(len(lengths)))
    assert {lengths[i] for i in runs[0]} == {5, 6, 7}


def test_expensive_runs_never_split() -> None:
    assert len(partition([5, 200, 6, 210], run_cost=10_000)) == 1
