"""Scale from zero: how long the first request to an idle pool takes through Kiln, against the
engine's own floor (a new ONNX Runtime session and its first run, in-process) and a warm request.

    python bench/cold_start.py [--rounds 7] [--idle-s 1]

Kiln runs all-MiniLM-L6-v2 with ``KILN_POOL_IDLE_TO_ZERO_S`` short, so the pool falls to zero
between rounds; each round waits for zero workers (and, with the warm standby on, for the
standby), then times one embeddings request (cold) and the next one (warm). The reference, in
the same run, times ``InferenceSession(model.onnx)`` plus one ``run`` in this process, with the
library already imported (as the standby has it). Medians; ratio = Kiln cold / reference.
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import numpy as np
import onnxruntime as ort

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _kiln import Kiln
from embeddings import _model_dir

TEXT = "a cat sits on the mat"


def engine_floor(model: Path, rounds: int) -> float:
    """Median seconds for a new session of ``model`` and its first run (one short input)."""
    feed = {"input_ids": np.array([[101, 1037, 4937, 102]]), "attention_mask": np.ones((1, 4))}
    feed["attention_mask"] = feed["attention_mask"].astype(np.int64)
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
        session.run(None, feed)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _running(kiln: Kiln) -> float | None:
    text = httpx.get(f"{kiln.base_url}/metrics", timeout=5).text
    found = re.search(r'kiln_pool_replicas\{[^}]*state="running"[^}]*\} (\S+)', text)
    return float(found.group(1)) if found else None


def _standby_alive(kiln: Kiln) -> bool:
    return bool(kiln.roles()["standby"])


def _wait(probe: Callable[[], bool], timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not probe():
        if time.monotonic() > deadline:
            raise TimeoutError("the pool did not reach zero")
        time.sleep(0.05)


def _request(kiln: Kiln, http: httpx.Client) -> float:
    start = time.perf_counter()
    r = http.post(f"{kiln.base_url}/v1/embeddings", json={"model": kiln.model, "input": TEXT},
                  headers={"authorization": f"Bearer {kiln.key}"})  # fmt: skip
    r.raise_for_status()
    return time.perf_counter() - start


def kiln_cold(model_dir: Path, rounds: int, idle_s: float, standby: bool) -> tuple[float, float]:
    """Median (cold, warm) seconds of a request through Kiln, the pool at zero before each."""
    env = {
        "KILN_POOL_IDLE_TO_ZERO_S": str(idle_s), "KILN_POOL_SCALE_DOWN_DELAY_S": "0",
        "KILN_WARM_STANDBY": "true" if standby else "false", "KILN_WORKER_THREADS": "1",
    }  # fmt: skip
    kiln = Kiln.start(model_dir, env)
    cold, warm = [], []
    try:
        with httpx.Client(timeout=120) as http:  # one kept-alive connection, as SDKs keep
            for _ in range(rounds):
                _wait(lambda: _running(kiln) == 0.0 and (not standby or _standby_alive(kiln)))
                time.sleep(0.2)  # let the retired worker's exit settle
                cold.append(_request(kiln, http))
                warm.append(_request(kiln, http))
    finally:
        kiln.stop()
    return statistics.median(cold), statistics.median(warm)


def main() -> None:
    """Run the reference and both Kiln variants; print the table and the ratios."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--idle-s", type=float, default=1.0)
    args = parser.parse_args()
    model_dir = _model_dir(None)
    floor = engine_floor(model_dir / "model.onnx", args.rounds)
    print(f"engine floor (new session + first run, in-process): {floor * 1000:.0f} ms")
    for standby in (True, False):
        cold, warm = kiln_cold(model_dir, args.rounds, args.idle_s, standby)
        label = "with the warm standby" if standby else "no standby (new process)"
        print(f"Kiln {label}: cold {cold * 1000:.0f} ms, warm {warm * 1000:.1f} ms, "
              f"cold / engine floor = {cold / floor:.2f}, cold - floor = "
              f"{(cold - floor) * 1000:.0f} ms")  # fmt: skip


if __name__ == "__main__":
    main()
