"""GPU utilization and memory on the worker's ``/metrics``, through NVML (``nvidia-ml-py``).

Only where there is something to read: without the library, without a driver or without a GPU,
``gpu_collector`` returns ``None`` and the worker exports no GPU series (and logs nothing worse
than a debug line). Each scrape reads NVML afresh (a few microseconds a device).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import structlog
from prometheus_client.core import GaugeMetricFamily

if TYPE_CHECKING:
    from collections.abc import Iterator

    from prometheus_client.core import Metric

log = structlog.get_logger(__name__)


class GpuCollector:
    """Per-GPU gauges of the devices NVML shows this worker (a pod's own, ``CUDA_VISIBLE_DEVICES``
    aside), and the device memory this process holds."""

    def __init__(self, nvml: Any, count: int) -> None:
        self._nvml = nvml
        self._handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]

    def collect(self) -> Iterator[Metric]:
        """Read each device now."""
        nvml, label = self._nvml, ["gpu"]
        busy = GaugeMetricFamily(
            "kiln_worker_gpu_utilization_ratio",
            "Share of the last sample period a kernel ran on the GPU (NVML utilization.gpu).",
            labels=label,
        )
        memory_busy = GaugeMetricFamily(
            "kiln_worker_gpu_memory_bandwidth_utilization_ratio",
            "Share of the last sample period device memory was read or written (NVML .memory).",
            labels=label,
        )
        used = GaugeMetricFamily(
            "kiln_worker_gpu_memory_used_bytes",
            "Device memory in use (all processes).",
            labels=label,
        )
        total = GaugeMetricFamily(
            "kiln_worker_gpu_memory_total_bytes", "Device memory installed.", labels=label
        )
        mine = GaugeMetricFamily(
            "kiln_worker_gpu_process_memory_bytes", "Device memory this worker holds.", labels=label
        )
        pid = os.getpid()
        for index, handle in enumerate(self._handles):
            gpu = [str(index)]
            rates = nvml.nvmlDeviceGetUtilizationRates(handle)
            busy.add_metric(gpu, rates.gpu / 100)
            memory_busy.add_metric(gpu, rates.memory / 100)
            info = nvml.nvmlDeviceGetMemoryInfo(handle)
            used.add_metric(gpu, info.used)
            total.add_metric(gpu, info.total)
            processes = nvml.nvmlDeviceGetComputeRunningProcesses(handle)
            held = sum(p.usedGpuMemory or 0 for p in processes if p.pid == pid)
            mine.add_metric(gpu, held)
        yield from (busy, memory_busy, used, total, mine)


def gpu_collector(nvml: Any = None) -> GpuCollector | None:
    """A collector over NVML (``pynvml``, or ``nvml`` given: a test's fake), or ``None`` where
    there is no library, no driver or no GPU."""
    if nvml is None:
        try:
            import pynvml
        except ImportError:
            return None
        nvml = pynvml
    try:
        nvml.nvmlInit()
        count = nvml.nvmlDeviceGetCount()
        return GpuCollector(nvml, count) if count else None
    except Exception as exc:  # NVMLError: no driver, no device, insufficient permissions
        log.debug("no GPU metrics", reason=str(exc))
        return None
