"""NVML access that degrades cleanly: on a machine without an NVIDIA driver every call says 'absent'."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import pynvml

log = logging.getLogger(__name__)

_MIB = 1024 * 1024


@dataclass(frozen=True)
class NvmlGpu:
    index: int
    name: str
    memory_mib: int


def init() -> bool:
    """True when NVML is usable here; False (logged once at debug) where there is no driver."""
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        log.debug("NVML unavailable: %s", exc)
        return False
    return True


def discover_gpus() -> list[NvmlGpu]:
    if not init():
        return []
    gpus = []
    for index in range(pynvml.nvmlDeviceGetCount()):
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        name = pynvml.nvmlDeviceGetName(handle)
        memory = pynvml.nvmlDeviceGetMemoryInfo(handle).total // _MIB
        gpus.append(NvmlGpu(index, name if isinstance(name, str) else name.decode(), int(memory)))
    return gpus


@dataclass(frozen=True)
class GpuReading:
    """One GPU at one instant. ``process_mem_mib`` counts only the watched processes."""

    index: int
    util: float
    mem_used_mib: float
    process_mem_mib: float
    power_w: float | None


def read_gpus(indices: list[int], pids: set[int]) -> list[GpuReading]:
    readings = []
    for index in indices:
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        util = pynvml.nvmlDeviceGetUtilizationRates(handle).gpu
        used = pynvml.nvmlDeviceGetMemoryInfo(handle).used / _MIB
        processes = pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
        mine = sum((p.usedGpuMemory or 0) for p in processes if p.pid in pids) / _MIB
        try:
            power: float | None = pynvml.nvmlDeviceGetPowerUsage(handle) / 1000.0
        except pynvml.NVMLError:
            power = None
        readings.append(GpuReading(index, float(util), used, mine, power))
    return readings
