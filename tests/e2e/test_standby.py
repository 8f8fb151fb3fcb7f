"""The warm standby worker: preloaded, taken by the next (re)start, replaced, stopped with Kiln."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from .conftest import MINILM, KilnProcess, minilm_up, wait_for


def _standbys(kiln: KilnProcess) -> list[psutil.Process]:
    return [p for p in kiln.workers() if "--standby" in p.cmdline()]


@pytest.fixture(scope="module")
def warm_kiln(minilm_dir: Path) -> Iterator[KilnProcess]:
    yield from minilm_up(minilm_dir, {"KILN_WARM_STANDBY": "true"})


def test_a_restart_takes_the_standby_and_a_new_one_is_made(warm_kiln: KilnProcess) -> None:
    (standby,) = wait_for(lambda: _standbys(warm_kiln))
    (worker,) = [p for p in warm_kiln.workers() if p.pid != standby.pid]
    worker.send_signal(signal.SIGKILL)
    worker.wait(10)
    warm_kiln.wait_until_serving(MINILM, path="embeddings")
    # The old standby now serves the model; a fresh standby replaces it.
    fresh = wait_for(lambda: [p for p in _standbys(warm_kiln) if p.pid != standby.pid])
    pids = {p.pid for p in warm_kiln.workers()}
    assert pids == {standby.pid, fresh[0].pid}
    assert standby.is_running()


def test_stopping_kiln_stops_the_standby_too(warm_kiln: KilnProcess) -> None:
    standbys = wait_for(lambda: _standbys(warm_kiln))
    assert warm_kiln.stop() == 0
    _, alive = psutil.wait_procs(standbys, timeout=30)
    assert not alive
