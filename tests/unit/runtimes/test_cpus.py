"""CPU placement: ``--cpus`` parsing, and real thread affinities (Linux)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading

import numpy as np
import pytest

from kiln_runtimes import cpus
from kiln_runtimes.batch_queue import BatchPolicy
from kiln_runtimes.batcher import Batcher
from kiln_runtimes.worker import parse_args

ALLOWED = frozenset(os.sched_getaffinity(0))
LAST = frozenset({max(ALLOWED)})


@pytest.mark.parametrize(
    ("text", "cores"),
    [("1", {1}), ("2-5", {2, 3, 4, 5}), ("0,2-3", {0, 2, 3}), (" 4 , 6-6", {4, 6})],
)
def test_parse_reads_cores_and_ranges(text: str, cores: set[int]) -> None:
    assert cpus.parse(text) == cores


@pytest.mark.parametrize(
    ("text", "part"), [("a", "'a'"), ("3-1", "'3-1'"), ("1,,2", "''"), ("2-", "'2-'")]
)
def test_parse_names_the_bad_part(text: str, part: str) -> None:
    with pytest.raises(ValueError, match=part):
        cpus.parse(text)


def test_worker_accepts_cores_it_has_and_refuses_others(
    capsys: pytest.CaptureFixture[str],
) -> None:
    settings = parse_args(["--model-dir", "m", "--cpus", str(max(ALLOWED))])
    assert settings.cpus == LAST
    with pytest.raises(SystemExit):
        parse_args(["--model-dir", "m", "--cpus", "4096"])
    assert "--cpus: this machine has no cores [4096]" in capsys.readouterr().err


async def test_run_on_runs_the_call_on_the_given_cores() -> None:
    assert await cpus.run_on(LAST, os.sched_getaffinity, 0) == LAST
    assert await cpus.run_on(None, os.sched_getaffinity, 0) == ALLOWED


def _in_thread(call: object) -> frozenset[int]:
    seen: list[frozenset[int]] = []

    def body() -> None:
        call(LAST)  # type: ignore[operator]
        seen.append(frozenset(os.sched_getaffinity(0)))

    thread = threading.Thread(target=body)
    thread.start()
    thread.join()
    return seen[0]


def test_keep_off_moves_every_thread_so_far_off_the_compute_cores() -> None:
    expected = ALLOWED - LAST or ALLOWED  # a one-core machine keeps its only core
    started, release = threading.Event(), threading.Event()
    seen: list[frozenset[int]] = []

    def bystander() -> None:  # a thread that was already running
        started.set()
        release.wait(10)
        seen.append(frozenset(os.sched_getaffinity(0)))

    thread = threading.Thread(target=bystander)
    thread.start()
    started.wait(10)
    try:
        assert _in_thread(cpus.keep_off) == expected
    finally:
        release.set()
        thread.join()
        for tid in os.listdir("/proc/self/task"):  # every thread of this process was moved
            with contextlib.suppress(ProcessLookupError):
                os.sched_setaffinity(int(tid), ALLOWED)
    assert seen == [expected]
    assert _in_thread(cpus.pin_thread) == LAST


async def test_batches_run_on_the_batcher_cores() -> None:
    def where(inputs: list[list[int]], stop: object = None) -> np.ndarray:
        pinned = os.sched_getaffinity(0) == LAST
        return np.array([[pinned, len(ids)] for ids in inputs], np.float32)

    batcher = Batcher(where, BatchPolicy(max_batch_size=4, max_wait=0.001), cpus=LAST)
    batcher.start()
    try:
        ticket = await batcher.submit("r", [[1], [2]], None)
    finally:
        await batcher.close()
    assert ticket.embeddings()[:, 0].tolist() == [1.0, 1.0]


def test_engine_threads_follow_the_cores_unless_given() -> None:
    settings = parse_args(["--model-dir", "m", "--cpus", str(max(ALLOWED))])
    assert settings.threads is None
    assert settings.engine_threads(7) == 1  # one per --cpus core, not one per machine core
    assert parse_args(["--model-dir", "m"]).engine_threads(7) == 7
    assert parse_args(["--model-dir", "m", "--threads", "3"]).engine_threads(7) == 3


IDLE_CHILD = """
import os, threading
from kiln_runtimes import cpus
before = threading.Event()
threading.Thread(target=before.wait, daemon=True).start()
cpus.run_idle()
after = threading.Event()
threading.Thread(target=after.wait, daemon=True).start()
print(sorted({os.sched_getscheduler(int(t)) for t in os.listdir("/proc/self/task")}))
"""


def test_run_idle_puts_threads_running_and_to_come_at_idle_priority() -> None:
    """In a child process: this one's threads keep their class."""
    out = subprocess.run([sys.executable, "-c", IDLE_CHILD], capture_output=True, text=True,
                         check=True, timeout=60)  # fmt: skip
    assert out.stdout.strip() == f"[{os.SCHED_IDLE}]"
    assert os.sched_getscheduler(0) == os.SCHED_OTHER
