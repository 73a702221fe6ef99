"""Filter and score plugins, after the Kubernetes scheduling framework.

A filter says, for every GPU at once, whether it can take one worker of a job, and keeps the numbers it
judged by so the explanation can say why. A score gives every GPU a cost (lower is better) as named
parts. Plugins work on whole arrays (one entry per GPU): a decision over 8,192 GPUs is a handful of
vector operations, not 8,192 Python calls.

Two kinds are special: ``locality`` prices a *set* of GPUs (nodes and racks a gang spans), and
``interference`` is *late*: it asks an interference model about each candidate's co-residents, so it
runs only on the best candidates by the other scores (``score_top`` in the profile, as Kubernetes'
percentageOfNodesToScore).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping, Protocol, Sequence

import numpy as np

from horus_airflow.features.gpus import gpu_spec
from horus_airflow.interference import CoRunner, InterferenceModel
from horus_airflow.placement.state import ClusterArrays, ClusterState
from horus_airflow.validation import in_range, whole

Values = Mapping[str, np.ndarray]


@dataclass(frozen=True)
class Verdict:
    passed: bool
    reason: str


@dataclass(frozen=True)
class Need:
    """The newcomer's predicted demand on every GPU (its GPU type's prediction), and its signature."""

    util: np.ndarray
    util_p90: np.ndarray
    mem: np.ndarray
    predicted: np.ndarray
    signature: tuple[float, ...] = ()


@dataclass(frozen=True)
class FilterResult:
    passed: np.ndarray
    values: Values


class FilterPlugin(Protocol):
    name: str

    def evaluate(self, need: Need, gpus: ClusterArrays) -> FilterResult: ...

    def describe(self, passed: bool, values: Mapping[str, float]) -> str: ...


class ScorePlugin(Protocol):
    name: str

    def costs(self, need: Need, gpus: ClusterArrays) -> Values: ...


@dataclass(frozen=True)
class NodeHealthy:
    name = "node-healthy"

    def evaluate(self, need: Need, gpus: ClusterArrays) -> FilterResult:
        return FilterResult(gpus.healthy, {})

    def describe(self, passed: bool, values: Mapping[str, float]) -> str:
        return "healthy" if passed else "GPU or node unhealthy / cordoned"


@dataclass(frozen=True)
class MemoryFit:
    """Predicted peak memory of the newcomer and of every resident, plus ``context_mib`` per job where
    predictions leave the CUDA context out (ours include it), plus what the driver keeps, within the
    GPU's memory less a safety margin."""

    driver_reserved_mib: float = 300.0
    context_mib: float = 0.0
    margin_fraction: float = 0.05
    name = "memory-fit"

    def __post_init__(self) -> None:
        in_range(self.driver_reserved_mib, "driver_reserved_mib", 0.0)
        in_range(self.context_mib, "context_mib", 0.0)
        in_range(self.margin_fraction, "margin_fraction (a share of the GPU's memory)", 0.0, 0.9)

    def evaluate(self, need: Need, gpus: ClusterArrays) -> FilterResult:
        usable = gpus.memory * (1 - self.margin_fraction) - self.driver_reserved_mib
        needed = gpus.used_mem + need.mem + self.context_mib * (gpus.residents + 1)
        return FilterResult(needed <= usable, {"needed": needed, "usable": usable})

    def describe(self, passed: bool, values: Mapping[str, float]) -> str:
        sign = "<=" if passed else ">"
        return f"memory {values['needed']:.0f} {sign} {values['usable']:.0f} MiB usable"


@dataclass(frozen=True)
class MaxResidents:
    limit: int = 4
    name = "max-residents"

    def __post_init__(self) -> None:
        whole(self.limit, "limit", 1)

    def evaluate(self, need: Need, gpus: ClusterArrays) -> FilterResult:
        return FilterResult(gpus.residents < self.limit, {"residents": gpus.residents})

    def describe(self, passed: bool, values: Mapping[str, float]) -> str:
        count = int(values["residents"])
        return f"{count}/{self.limit} residents" if passed else f"already {count} residents (limit {self.limit})"


@dataclass(frozen=True)
class GpuTypes:
    allowed: tuple[str, ...] = ()
    name = "gpu-types"

    def __post_init__(self) -> None:
        if isinstance(self.allowed, str):
            raise ValueError(f"allowed must be a list of GPU types, got the string {self.allowed!r}")
        for gpu_type in self.allowed:
            gpu_spec(str(gpu_type))  # an unknown type lists the accepted ones

    def evaluate(self, need: Need, gpus: ClusterArrays) -> FilterResult:
        if not self.allowed:
            return FilterResult(np.ones(len(gpus.memory), dtype=bool), {"type": gpus.type_index})
        ok = np.array([t in self.allowed for t in gpus.types], dtype=bool)
        return FilterResult(ok[gpus.type_index], {"type": gpus.type_index})

    def describe(self, passed: bool, values: Mapping[str, float]) -> str:
        return "type allowed" if passed else f"type not in {', '.join(self.allowed)}"


@dataclass(frozen=True)
class HorusCost:
    """The paper's cost: memory term + |summed util - 100| (over-subscription weighted 1.6x) + residents.

    The authors' public simulator computes the memory term as ``cur + new / cap`` (operator
    precedence); we use the intended ``(cur + new) / cap``.
    """

    memory_weight: float = 1.3
    oversubscription_weight: float = 1.6
    name = "horus-cost"

    def __post_init__(self) -> None:
        in_range(self.memory_weight, "memory_weight", 0.0)
        in_range(self.oversubscription_weight, "oversubscription_weight", 0.0)

    def costs(self, need: Need, gpus: ClusterArrays) -> Values:
        gap = gpus.summed_util + need.util - 100.0
        util = np.where(gap > 0, gap * self.oversubscription_weight, -gap) / 100.0
        return {
            "memory": self.memory_weight * (gpus.used_mem + need.mem) / gpus.memory,
            "util": util,
            "residents": gpus.residents.astype(float),
        }


@dataclass(frozen=True)
class Allocation:
    """What KAI/Volcano-style schedulers do. ``binpack``: fill the fullest GPU (by memory) and node
    first; ``spread``: the emptiest first. Blind to utilization."""

    mode: str = "binpack"
    name = "allocation"

    def __post_init__(self) -> None:
        if self.mode not in ("binpack", "spread"):
            raise ValueError(f"allocation mode must be binpack or spread, got {self.mode!r}")

    def costs(self, need: Need, gpus: ClusterArrays) -> Values:
        gpu_fill = (gpus.used_mem + need.mem) / gpus.memory
        node_fill = gpus.node_busy / gpus.node_gpus
        if self.mode == "binpack":
            return {"gpu": 1.0 - gpu_fill, "node": 1.0 - node_fill}
        return {"gpu": gpu_fill, "node": node_fill}


@dataclass(frozen=True)
class Fragmentation:
    """Keep whole GPUs and whole nodes free for jobs that need them: opening an empty GPU costs
    ``gpu``, opening an idle node costs ``node`` more."""

    gpu: float = 1.0
    node: float = 1.0
    name = "fragmentation"

    def __post_init__(self) -> None:
        in_range(self.gpu, "gpu", 0.0)
        in_range(self.node, "node", 0.0)

    def costs(self, need: Need, gpus: ClusterArrays) -> Values:
        return {"empty_gpu": self.gpu * (gpus.residents == 0), "idle_node": self.node * (gpus.node_busy == 0)}


@dataclass(frozen=True)
class Locality:
    """Gang placement's set cost: each extra node a multi-GPU job spans costs ``node``, each extra rack
    ``rack``. ``max_nodes`` 1 keeps every gang on one node (all or nothing)."""

    node: float = 1.0
    rack: float = 2.0
    max_nodes: int = 1
    name = "locality"

    def __post_init__(self) -> None:
        in_range(self.node, "node", 0.0)
        in_range(self.rack, "rack", 0.0)
        whole(self.max_nodes, "max_nodes", 1)

    def costs(self, need: Need, gpus: ClusterArrays) -> Values:
        return {}

    def set_cost(self, nodes: int, racks: int) -> float:
        return self.node * (nodes - 1) + self.rack * (racks - 1)


@dataclass(frozen=True)
class InterferenceScore:
    """Predicted slowdown of the newcomer plus the extra slowdown it brings each resident; candidates
    where the model says the jobs do not fit, or anyone would run below ``min_speed``, are rejected.
    The model is the caller's (the registered champion, or a proxy): the placer does no I/O."""

    min_speed: float = 0.0
    name = "interference"

    def __post_init__(self) -> None:
        in_range(self.min_speed, "min_speed (a share of the job's speed alone)", 0.0, 1.0)

    def late(self, need: Need, state: ClusterState, indices: Sequence[int], model: InterferenceModel
             ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        passed = np.ones(len(indices), dtype=bool)
        newcomer_cost, resident_cost, worst = (np.zeros(len(indices)) for _ in range(3))
        by_type: dict[str, list[int]] = {}
        for row, i in enumerate(indices):
            by_type.setdefault(state.gpus[i].gpu_type, []).append(row)
        for gpu_type, rows in by_type.items():
            spec = gpu_spec(gpu_type)
            residents = [[CoRunner(r.util, r.util_p90, r.mem_mib, r.signature) for r in state.gpus[indices[row]].residents]
                         for row in rows]
            newcomers = [CoRunner(float(need.util[indices[row]]), float(need.util_p90[indices[row]]),
                                  float(need.mem[indices[row]]), need.signature) for row in rows]
            before = model.predict_many(residents, spec)
            after = model.predict_many([[*group, new] for group, new in zip(residents, newcomers)], spec)
            for row, was, now in zip(rows, before, after):
                newcomer_cost[row] = 1.0 - now.speeds[-1]
                resident_cost[row] = sum(b - a for b, a in zip(was.speeds, now.speeds[:-1]))
                worst[row] = min(now.speeds)
                passed[row] = now.fits and worst[row] >= self.min_speed
        return passed, {"newcomer_slowdown": newcomer_cost, "resident_slowdown": resident_cost, "min_speed": worst}


FILTERS: dict[str, Callable[..., FilterPlugin]] = {
    "node-healthy": NodeHealthy,
    "memory-fit": MemoryFit,
    "max-residents": MaxResidents,
    "gpu-types": GpuTypes,
}
SCORES: dict[str, Callable[..., object]] = {
    "horus-cost": HorusCost,
    "allocation": Allocation,
    "fragmentation": Fragmentation,
    "locality": Locality,
    "interference": InterferenceScore,
}
