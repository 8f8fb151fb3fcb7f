"""CPU placement: the engine's threads on the compute cores, the event loop on the others; and
the idle CPU priority of a background worker.

Public: the control plane checks ``KILN_WORKER_CPUS`` with the same ``parse`` the worker uses.

``--cpus`` (``KILN_WORKER_CPUS``) plays the part of Triton's ``--host-policy cpu-cores``: on a CPU
machine the batches then have their cores to themselves, and the worker's HTTP, decoding and
batching (and whatever else the operator places on the rest) cannot take their time slices.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from collections.abc import Callable

T = TypeVar("T")


def parse(text: str) -> frozenset[int]:
    """``"1"``, ``"2-5"``, ``"0,2-3"`` -> the set of cores; ``ValueError`` names a bad part."""
    cores: set[int] = set()
    for part in text.split(","):
        first, dash, last = part.strip().partition("-")
        if not first.isdigit() or (dash and not last.isdigit()):
            raise ValueError(f"{part!r} is not a core number or a range like 2-5")
        low, high = int(first), int(last or first)
        if high < low:
            raise ValueError(f"{part!r} is an empty range")
        cores.update(range(low, high + 1))
    return frozenset(cores)


def pin_thread(cpus: frozenset[int] | None) -> None:
    """Put the calling thread on ``cpus`` (``None``: leave it where it is)."""
    if cpus:
        os.sched_setaffinity(0, cpus)


def keep_off(cpus: frozenset[int] | None) -> None:
    """Move this process's threads so far to its other allowed cores, if there are any.

    Called on the event loop's thread before the batch threads start: the loop, the threads it
    starts later (which inherit its cores) and those already running (logging, uvloop's pool)
    stay off the compute cores.
    """
    rest = os.sched_getaffinity(0) - (cpus or set())
    if not cpus or not rest:
        return
    for tid in os.listdir("/proc/self/task"):
        with contextlib.suppress(ProcessLookupError):  # a thread that just ended
            os.sched_setaffinity(int(tid), rest)


async def run_on(cpus: frozenset[int] | None, call: Callable[..., T], *args: object) -> T:
    """``call(*args)`` on a thread of its own on ``cpus``: an engine's thread pool created there
    (at session creation) inherits the cores."""
    with ThreadPoolExecutor(1, initializer=pin_thread, initargs=(cpus,)) as executor:
        return await asyncio.get_running_loop().run_in_executor(executor, call, *args)


IDLE_NICE = 19
"""The niceness a background worker falls back to where ``SCHED_IDLE`` is refused."""


def run_idle() -> None:
    """Put every thread of this process, and so every thread they start, at idle CPU priority:
    ``SCHED_IDLE`` (nice 19 where the OS refuses it). Such a thread runs only on time no normal
    thread wants and gives its core up the moment one wakes, where a nice-19 thread keeps it to
    the end of its slice: a background worker (batch lines, shadow copies) then fills the cores
    the served workers, the gateway and PostgreSQL leave idle and takes no CPU time from them
    (caches and memory bandwidth it still shares)."""
    for tid in os.listdir("/proc/self/task"):  # a warm standby's preloading left threads too
        with contextlib.suppress(ProcessLookupError):  # a thread that just ended
            os.setpriority(os.PRIO_PROCESS, int(tid), IDLE_NICE)
            with contextlib.suppress(OSError):  # refused: the niceness stays
                os.sched_setscheduler(int(tid), os.SCHED_IDLE, os.sched_param(0))
