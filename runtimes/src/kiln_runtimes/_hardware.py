"""What an engine is specific to: this machine's hardware class and the engine libraries'
versions (parts of an engine's cache key, ``engines.engine_key``)."""

from __future__ import annotations

import platform
import shutil
import subprocess
from importlib import metadata
from pathlib import Path

_CPU_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "neon", "asimd")
_LIBRARIES: dict[str, tuple[str, ...]] = {
    "cpu": ("onnxruntime",),
    "cuda": ("onnxruntime-gpu",),
    "tensorrt": ("onnxruntime-gpu", "tensorrt"),
}


def cpu_hardware(cpuinfo: str, machine: str) -> str:
    """A CPU hardware class: architecture plus the vector extensions kernels dispatch on."""
    flags: set[str] = set()
    for line in cpuinfo.splitlines():
        if line.startswith(("flags", "Features")):
            flags.update(line.partition(":")[2].split())
            break
    return "-".join([machine, *[f for f in _CPU_FLAGS if f in flags]])


def gpu_hardware() -> str:
    """The first NVIDIA GPU's name and compute capability, or ``none``."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return "none"
    out = subprocess.run(
        [smi, "--query-gpu=name,compute_cap", "--format=csv,noheader"],
        capture_output=True, text=True, timeout=10, check=False,
    ).stdout  # fmt: skip
    first = out.strip().splitlines()[0] if out.strip() else "none"
    return first.replace(", ", "-sm").replace(" ", "_")


def hardware(target: str) -> str:
    """The hardware class engines for ``target`` are specific to on this machine."""
    if target == "cpu":
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            cpuinfo = ""
        return cpu_hardware(cpuinfo, platform.machine())
    return gpu_hardware()


def library_versions(target: str) -> tuple[tuple[str, str], ...]:
    """Installed versions of the libraries an engine for ``target`` is built with."""
    versions = []
    for name in _LIBRARIES[target]:
        try:
            versions.append((name, metadata.version(name)))
        except metadata.PackageNotFoundError:
            versions.append((name, "absent"))
    return tuple(versions)
