"""The cluster as the placer sees it: GPUs and the jobs already booked on them."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Resident:
    """A job holding a slot on a GPU, with the demand it was placed with."""

    job_id: str
    util: float
    util_p90: float
    mem_mib: float


@dataclass(frozen=True)
class GpuState:
    """One GPU. ``declared`` marks GPUs named in an inventory string rather than found by NVML."""

    gpu_id: str
    node: str
    index: int
    gpu_type: str
    memory_mib: float
    residents: tuple[Resident, ...] = ()
    healthy: bool = True
    declared: bool = False

    @property
    def used_mem_mib(self) -> float:
        return sum(r.mem_mib for r in self.residents)

    @property
    def summed_util(self) -> float:
        return sum(r.util for r in self.residents)


@dataclass(frozen=True)
class ClusterState:
    """A consistent snapshot; ``version`` is the ledger version it was read at (compare-and-swap)."""

    gpus: tuple[GpuState, ...]
    version: int = 0
