"""Filter and score plugins, after the Kubernetes scheduling framework.

A filter says whether a GPU can take one worker of a job at all, and why not. A score gives a cost
(lower is better) with its parts, so the explanation can show where the number came from.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping, Protocol

from horus_airflow.placement.state import GpuState
from horus_airflow.predictor.demand import GpuDemand


@dataclass(frozen=True)
class Verdict:
    passed: bool
    reason: str


@dataclass(frozen=True)
class Cost:
    value: float
    parts: Mapping[str, float]


class FilterPlugin(Protocol):
    name: str

    def check(self, demand: GpuDemand, gpu: GpuState) -> Verdict: ...


class ScorePlugin(Protocol):
    name: str

    def cost(self, demand: GpuDemand, gpu: GpuState) -> Cost: ...


@dataclass(frozen=True)
class NodeHealthy:
    name = "node-healthy"

    def check(self, demand: GpuDemand, gpu: GpuState) -> Verdict:
        return Verdict(gpu.healthy, "healthy" if gpu.healthy else "GPU or node unhealthy / cordoned")


@dataclass(frozen=True)
class MemoryFit:
    """Predicted peak memory of the newcomer and of every resident, plus what the driver keeps,
    plus a safety margin, must fit in the GPU's memory."""

    driver_reserved_mib: float = 300.0
    margin_fraction: float = 0.05
    name = "memory-fit"

    def check(self, demand: GpuDemand, gpu: GpuState) -> Verdict:
        usable = gpu.memory_mib * (1 - self.margin_fraction) - self.driver_reserved_mib
        needed = gpu.used_mem_mib + demand.mem_mib
        if needed <= usable:
            return Verdict(True, f"memory {needed:.0f}/{usable:.0f} MiB usable")
        return Verdict(False, f"memory {needed:.0f} MiB > {usable:.0f} MiB usable")


@dataclass(frozen=True)
class MaxResidents:
    limit: int = 4
    name = "max-residents"

    def check(self, demand: GpuDemand, gpu: GpuState) -> Verdict:
        count = len(gpu.residents)
        if count < self.limit:
            return Verdict(True, f"{count}/{self.limit} residents")
        return Verdict(False, f"already {count} residents (limit {self.limit})")


@dataclass(frozen=True)
class GpuTypes:
    allowed: tuple[str, ...] = ()
    name = "gpu-types"

    def check(self, demand: GpuDemand, gpu: GpuState) -> Verdict:
        if not self.allowed or gpu.gpu_type in self.allowed:
            return Verdict(True, f"type {gpu.gpu_type}")
        return Verdict(False, f"type {gpu.gpu_type} not in {', '.join(self.allowed)}")


@dataclass(frozen=True)
class HorusCost:
    """The paper's cost: memory term + |summed util - 100| (over-subscription weighted 1.6x) + residents.

    The authors' public simulator computes the memory term as ``cur + new / cap`` (operator
    precedence); we use the intended ``(cur + new) / cap``.
    """

    memory_weight: float = 1.3
    oversubscription_weight: float = 1.6
    name = "horus-cost"

    def cost(self, demand: GpuDemand, gpu: GpuState) -> Cost:
        memory = self.memory_weight * (gpu.used_mem_mib + demand.mem_mib) / gpu.memory_mib
        gap = gpu.summed_util + demand.util - 100.0
        util = (gap * self.oversubscription_weight if gap > 0 else abs(gap)) / 100.0
        residents = float(len(gpu.residents))
        return Cost(memory + util + residents, {"memory": memory, "util": util, "residents": residents})


FILTERS: dict[str, Callable[..., FilterPlugin]] = {
    "node-healthy": NodeHealthy,
    "memory-fit": MemoryFit,
    "max-residents": MaxResidents,
    "gpu-types": GpuTypes,
}
SCORES: dict[str, Callable[..., ScorePlugin]] = {"horus-cost": HorusCost}
