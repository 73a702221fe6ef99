"""NVML access that degrades cleanly: on a machine without an NVIDIA driver every call says 'absent'.

:class:`NvmlSource` reads, per GPU: device utilization and memory-controller utilization, used
memory, power, the watched processes' memory, their SM and memory utilization
(``nvmlDeviceGetProcessUtilization``), SM activity from GPM metrics where the GPU supports them
(Hopper and later), and which other processes compute on the GPU. A metric a GPU or driver does not
offer is recorded as absent for the whole run, not retried each sample.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Protocol

import pynvml

from horus_airflow.telemetry.samples import GpuReading

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


def _text(value: str | bytes) -> str:
    return value if isinstance(value, str) else value.decode()


def discover_gpus() -> list[NvmlGpu]:
    if not init():
        return []
    gpus = []
    for index in range(pynvml.nvmlDeviceGetCount()):
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        memory = pynvml.nvmlDeviceGetMemoryInfo(handle).total // _MIB
        gpus.append(NvmlGpu(index, _text(pynvml.nvmlDeviceGetName(handle)), int(memory)))
    return gpus


class GpuSource(Protocol):
    """Where GPU readings come from: NVML here, a scripted source in tests."""

    def read(self, pids: set[int]) -> list[GpuReading]: ...

    def close(self) -> None: ...


class _Gpm:
    """SM utilization between two GPM samples of one GPU (the previous read and this one)."""

    def __init__(self, handle: object) -> None:
        self.handle = handle
        self.previous = pynvml.nvmlGpmSampleAlloc()
        self.current = pynvml.nvmlGpmSampleAlloc()
        pynvml.nvmlGpmSampleGet(handle, self.previous)

    def sm_util(self) -> float | None:
        pynvml.nvmlGpmSampleGet(self.handle, self.current)
        request = pynvml.c_nvmlGpmMetricsGet_t()
        request.version = pynvml.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = 1
        request.sample1, request.sample2 = self.previous, self.current
        request.metrics[0].metricId = pynvml.NVML_GPM_METRIC_SM_UTIL
        pynvml.nvmlGpmMetricsGet(request)
        self.previous, self.current = self.current, self.previous
        metric = request.metrics[0]
        return float(metric.value) if metric.nvmlReturn == pynvml.NVML_SUCCESS else None

    def close(self) -> None:
        for sample in (self.previous, self.current):
            pynvml.nvmlGpmSampleFree(sample)


class NvmlSource:
    """Readings of some GPUs through NVML; call only after :func:`init` returned True."""

    def __init__(self, indices: list[int]) -> None:
        self.handles = {i: pynvml.nvmlDeviceGetHandleByIndex(i) for i in indices}
        self.gpm: dict[int, _Gpm] = {}
        for index, handle in self.handles.items():
            try:
                if pynvml.nvmlGpmQueryDeviceSupport(handle).isSupportedDevice:
                    self.gpm[index] = _Gpm(handle)
            except pynvml.NVMLError as exc:
                log.debug("GPU %d: no GPM metrics (%s); SM activity is recorded as absent", index, exc)
        self.last_seen = dict.fromkeys(self.handles, 0)
        self.process_util = True

    def read(self, pids: set[int]) -> list[GpuReading]:
        return [self._read_one(index, handle, pids) for index, handle in self.handles.items()]

    def _read_one(self, index: int, handle: object, pids: set[int]) -> GpuReading:
        rates = pynvml.nvmlDeviceGetUtilizationRates(handle)
        used = pynvml.nvmlDeviceGetMemoryInfo(handle).used / _MIB
        processes = pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
        mine = sum((p.usedGpuMemory or 0) for p in processes if p.pid in pids) / _MIB
        others = tuple(sorted({p.pid for p in processes if p.pid not in pids}))
        try:
            power: float | None = pynvml.nvmlDeviceGetPowerUsage(handle) / 1000.0
        except pynvml.NVMLError:
            power = None
        sm_active = None
        if index in self.gpm:
            try:
                sm_active = self.gpm[index].sm_util()
            except pynvml.NVMLError as exc:
                log.debug("GPU %d: GPM read failed (%s)", index, exc)
        process_sm, process_mem = self._process_utilization(index, handle, pids)
        return GpuReading(
            index=index, util=float(rates.gpu), mem_used_mib=used, process_mem_mib=mine, power_w=power,
            mem_util=float(rates.memory), sm_active=sm_active, process_sm_util=process_sm,
            process_mem_util=process_mem, co_resident_pids=others,
        )

    def _process_utilization(self, index: int, handle: object, pids: set[int]) -> tuple[float | None, float | None]:
        """SM and memory utilization of the watched processes since the last read (NVML keeps a short
        per-process history); absent when the driver has no sample for them in that window."""
        if not self.process_util:
            return None, None
        try:
            history = pynvml.nvmlDeviceGetProcessUtilization(handle, self.last_seen[index])
        except pynvml.NVMLError_NotFound:
            return None, None
        except pynvml.NVMLError as exc:
            log.debug("per-process utilization unavailable (%s); recorded as absent", exc)
            self.process_util = False
            return None, None
        if history:
            self.last_seen[index] = max(s.timeStamp for s in history)
        latest: dict[int, tuple[int, int, int]] = {}
        for s in history:
            if s.pid in pids and s.timeStamp >= latest.get(s.pid, (0, 0, 0))[0]:
                latest[s.pid] = (s.timeStamp, s.smUtil, s.memUtil)
        if not latest:
            return None, None
        return float(sum(v[1] for v in latest.values())), float(sum(v[2] for v in latest.values()))

    def close(self) -> None:
        for gpm in self.gpm.values():
            gpm.close()
