"""GPU series through NVML: read per device and per process where NVML answers; nothing at all
(and no error) without the library, a driver or a GPU. NVML is an external library, so a small
fake stands in for ``pynvml``."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest

from kiln_runtimes._metrics import WorkerMetrics
from kiln_runtimes._nvml import gpu_collector

pytestmark = pytest.mark.unit
GIB = 1 << 30


class FakeNvml:
    """The five NVML calls the collector makes, over made-up devices."""

    def __init__(self, devices: int = 2, *, fail_init: bool = False) -> None:
        self.devices, self.fail_init = devices, fail_init

    def nvmlInit(self) -> None:
        if self.fail_init:
            raise RuntimeError("NVML Shared Library Not Found")

    def nvmlDeviceGetCount(self) -> int:
        return self.devices

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetUtilizationRates(self, handle: int) -> SimpleNamespace:
        return SimpleNamespace(gpu=90 - 50 * handle, memory=30 + handle)

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> SimpleNamespace:
        return SimpleNamespace(used=(handle + 3) * GIB, total=16 * GIB)

    def nvmlDeviceGetComputeRunningProcesses(self, handle: int) -> list[SimpleNamespace]:
        return [
            SimpleNamespace(pid=os.getpid(), usedGpuMemory=GIB if handle == 0 else None),
            SimpleNamespace(pid=1, usedGpuMemory=5 * GIB),  # another process's
        ]


def _sample(metrics: WorkerMetrics, name: str, gpu: str) -> float | None:
    return metrics.registry.get_sample_value(name, {"gpu": gpu})


def test_each_gpu_is_read_at_scrape_time() -> None:
    metrics = WorkerMetrics(nvml=FakeNvml())
    assert _sample(metrics, "kiln_worker_gpu_utilization_ratio", "0") == pytest.approx(0.9)
    assert _sample(metrics, "kiln_worker_gpu_utilization_ratio", "1") == pytest.approx(0.4)
    bandwidth = "kiln_worker_gpu_memory_bandwidth_utilization_ratio"
    assert _sample(metrics, bandwidth, "1") == pytest.approx(0.31)
    assert _sample(metrics, "kiln_worker_gpu_memory_used_bytes", "1") == 4 * GIB
    assert _sample(metrics, "kiln_worker_gpu_memory_total_bytes", "0") == 16 * GIB
    assert _sample(metrics, "kiln_worker_gpu_process_memory_bytes", "0") == GIB
    assert _sample(metrics, "kiln_worker_gpu_process_memory_bytes", "1") == 0


@pytest.mark.parametrize("nvml", [FakeNvml(fail_init=True), FakeNvml(devices=0)])
def test_no_driver_or_no_gpu_means_no_series(nvml: FakeNvml) -> None:
    assert gpu_collector(nvml) is None
    assert b"kiln_worker_gpu" not in WorkerMetrics(nvml=nvml).render()


def test_without_the_library_there_are_no_series(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(__import__("sys").modules, "pynvml", None)  # import raises ImportError
    assert gpu_collector() is None
    assert b"kiln_worker_gpu" not in WorkerMetrics().render()
