"""The cluster as the placer sees it: GPUs and the jobs already booked on them.

The cluster-state JSON format (``horus place --state``, docs/PLACEMENT.md) is :meth:`ClusterState.to_dict`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any

import numpy as np

from horus_airflow.errors import InventoryError
from horus_airflow.validation import finite, in_range, whole


Signature = tuple[float, ...]


@dataclass(frozen=True)
class Resident:
    """A job holding a slot on a GPU, with the demand it was placed with and, when known, its
    interference signature (see :func:`horus_airflow.interference.signature`) and when it is expected to
    end (its start plus its expected runtime, in the queue's clock), which tells a held gang when its
    GPUs free up."""

    job_id: str
    util: float
    util_p90: float
    mem_mib: float
    signature: tuple[float, ...] = ()
    ends_at: float | None = None


@dataclass(frozen=True)
class GpuState:
    """One GPU. ``declared`` marks GPUs named in an inventory string rather than found by NVML;
    ``healthy`` False covers a cordoned or NotReady node too."""

    gpu_id: str
    node: str
    index: int
    gpu_type: str
    memory_mib: float
    residents: tuple[Resident, ...] = ()
    healthy: bool = True
    declared: bool = False
    rack: str = ""

    @property
    def used_mem_mib(self) -> float:
        return sum(r.mem_mib for r in self.residents)

    @property
    def summed_util(self) -> float:
        return sum(r.util for r in self.residents)

    @property
    def summed_p90(self) -> float:
        return sum(r.util_p90 for r in self.residents)

    @property
    def free_at(self) -> float:
        """When its last resident is expected to end: -inf when it has none, inf when one's end is unknown."""
        return max((math.inf if r.ends_at is None else r.ends_at for r in self.residents), default=-math.inf)


@dataclass(frozen=True)
class ClusterArrays:
    """Column view of a state: one entry per GPU, so filters and scores work on whole arrays."""

    memory: np.ndarray
    used_mem: np.ndarray
    summed_util: np.ndarray
    summed_p90: np.ndarray
    residents: np.ndarray
    healthy: np.ndarray
    type_index: np.ndarray
    types: tuple[str, ...]
    node_index: np.ndarray
    nodes: tuple[str, ...]
    rack_index: np.ndarray
    gpu_index: np.ndarray
    node_gpus: np.ndarray  # per GPU: GPUs on its node
    node_busy: np.ndarray  # per GPU: GPUs with residents on its node
    free_at: np.ndarray  # per GPU: :attr:`GpuState.free_at`
    resident_signatures: tuple[tuple[Signature, ...], ...] = ()  # per GPU: its residents' signatures
    crash_partners: Mapping[Signature, frozenset[Signature]] = field(default_factory=dict)  # from ``crashed_pairs``

    def node_sets(self, order: np.ndarray, k: int) -> np.ndarray:
        """Each node's first ``k`` GPUs in ``order`` (GPU positions grouped by node), one row per node that
        has ``k``, all nodes at once: the candidate sets of a one-node gang."""
        node_of = self.node_index[order]
        starts = np.flatnonzero(np.r_[True, node_of[1:] != node_of[:-1]])
        full = starts[np.diff(np.r_[starts, len(order)]) >= k]
        return order[full[:, None] + np.arange(k)] if len(full) else np.zeros((0, k), dtype=np.int64)

    def updated(self, changes: Mapping[int, GpuState]) -> ClusterArrays:
        """New arrays with these GPUs' residents replaced; the old arrays stay as they were (a decision
        made on them can still be explained)."""
        used, util, p90, count = self.used_mem.copy(), self.summed_util.copy(), self.summed_p90.copy(), self.residents.copy()
        free_at = self.free_at.copy()
        signatures = list(self.resident_signatures)
        for i, gpu in changes.items():
            used[i], util[i], count[i] = gpu.used_mem_mib, gpu.summed_util, len(gpu.residents)
            p90[i], free_at[i] = gpu.summed_p90, gpu.free_at
            signatures[i] = tuple(r.signature for r in gpu.residents)
        busy_per_node = np.bincount(self.node_index, weights=(count > 0), minlength=len(self.nodes))
        return replace(self, used_mem=used, summed_util=util, summed_p90=p90, residents=count,
                       node_busy=busy_per_node[self.node_index], free_at=free_at, resident_signatures=tuple(signatures))


def crash_partners(pairs: frozenset[tuple[Signature, Signature]]) -> dict[Signature, frozenset[Signature]]:
    """Each signature's partners in ``pairs`` (both ways)."""
    partners: dict[Signature, set[Signature]] = {}
    for a, b in pairs:
        partners.setdefault(a, set()).add(b)
        partners.setdefault(b, set()).add(a)
    return {s: frozenset(p) for s, p in partners.items()}


@dataclass(frozen=True)
class ClusterState:
    """A consistent snapshot; ``version`` is the ledger version it was read at (compare-and-swap): SQLite's
    counter, or a Kubernetes ``resourceVersion``, which is an opaque string. ``crashed_pairs``: pairs of
    job signatures that crashed out of memory when they shared a GPU (the ``oom-anti-affinity`` filter
    keeps them apart)."""

    gpus: tuple[GpuState, ...]
    version: int | str = 0
    crashed_pairs: frozenset[tuple[Signature, Signature]] = frozenset()

    @cached_property
    def arrays(self) -> ClusterArrays:
        gpus = self.gpus
        types = tuple(sorted({g.gpu_type for g in gpus}))
        nodes = tuple(dict.fromkeys(g.node for g in gpus))
        racks = {r: i for i, r in enumerate(dict.fromkeys(g.rack for g in gpus))}
        type_of, node_of = {t: i for i, t in enumerate(types)}, {n: i for i, n in enumerate(nodes)}
        node_index = np.fromiter((node_of[g.node] for g in gpus), dtype=np.int64, count=len(gpus))
        residents = np.fromiter((len(g.residents) for g in gpus), dtype=np.int64, count=len(gpus))
        per_node = np.bincount(node_index, minlength=len(nodes))
        busy_per_node = np.bincount(node_index, weights=(residents > 0), minlength=len(nodes))
        return ClusterArrays(
            memory=np.fromiter((g.memory_mib for g in gpus), dtype=float, count=len(gpus)),
            used_mem=np.fromiter((g.used_mem_mib for g in gpus), dtype=float, count=len(gpus)),
            summed_util=np.fromiter((g.summed_util for g in gpus), dtype=float, count=len(gpus)),
            summed_p90=np.fromiter((g.summed_p90 for g in gpus), dtype=float, count=len(gpus)),
            residents=residents,
            healthy=np.fromiter((g.healthy for g in gpus), dtype=bool, count=len(gpus)),
            type_index=np.fromiter((type_of[g.gpu_type] for g in gpus), dtype=np.int64, count=len(gpus)),
            types=types,
            node_index=node_index,
            nodes=nodes,
            rack_index=np.fromiter((racks[g.rack] for g in gpus), dtype=np.int64, count=len(gpus)),
            gpu_index=np.fromiter((g.index for g in gpus), dtype=np.int64, count=len(gpus)),
            node_gpus=per_node[node_index],
            node_busy=busy_per_node[node_index],
            free_at=np.fromiter((g.free_at for g in gpus), dtype=float, count=len(gpus)),
            resident_signatures=tuple(tuple(r.signature for r in g.residents) for g in gpus),
            crash_partners=crash_partners(self.crashed_pairs),
        )

    def with_changes(self, changes: Mapping[int, GpuState], version: int | str | None = None,
                     crashed_pairs: frozenset[tuple[Signature, Signature]] | None = None) -> ClusterState:
        """The state with some GPUs (by position) replaced, updating the arrays instead of rebuilding them:
        what a simulator or a long-lived backend needs when one event touches a few GPUs."""
        gpus = list(self.gpus)
        for i, gpu in changes.items():
            gpus[i] = gpu
        pairs = self.crashed_pairs if crashed_pairs is None else crashed_pairs
        state = ClusterState(tuple(gpus), self.version if version is None else version, pairs)
        arrays = self.arrays.updated(changes)
        if pairs != self.crashed_pairs:
            arrays = replace(arrays, crash_partners=crash_partners(pairs))
        state.__dict__["arrays"] = arrays  # seeds the cached property
        return state

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "gpus": [
                {
                    "gpu_id": g.gpu_id, "node": g.node, "rack": g.rack, "index": g.index, "gpu_type": g.gpu_type,
                    "memory_mib": g.memory_mib, "healthy": g.healthy,
                    "residents": [
                        {"job_id": r.job_id, "util": r.util, "util_p90": r.util_p90, "mem_mib": r.mem_mib,
                         **({"signature": list(r.signature)} if r.signature else {}),
                         **({"ends_at": r.ends_at} if r.ends_at is not None else {})}
                        for r in g.residents
                    ],
                }
                for g in self.gpus
            ],
            **({"crashed_pairs": [[list(a), list(b)] for a, b in sorted(self.crashed_pairs)]} if self.crashed_pairs else {}),
        }

    @classmethod
    def from_dict(cls, raw: Any) -> ClusterState:
        """Read the documented JSON form. Anything a placer could turn into nonsense is refused, naming the
        entry and what is accepted: duplicate GPU ids, memory that is not a positive number, a resident's
        demand outside 0-100 % or below 0 MiB, ``healthy`` that is not true/false."""
        if not isinstance(raw, dict) or not isinstance(raw.get("gpus"), list) or not raw["gpus"]:
            raise InventoryError(f"malformed cluster state: expected an object with a non-empty \"gpus\" list; {_STATE_SHAPE}")
        gpus = tuple(_read_gpu(g, n) for n, g in enumerate(raw["gpus"]))
        seen: set[str] = set()
        for gpu in gpus:
            if gpu.gpu_id in seen:
                raise InventoryError(f"malformed cluster state: gpu_id {gpu.gpu_id!r} appears more than once; expected one entry per GPU, each with its own id")
            seen.add(gpu.gpu_id)
        version = raw.get("version", 0)
        if isinstance(version, bool) or not isinstance(version, (int, str)):
            raise InventoryError(f"malformed cluster state: version {version!r}; expected an integer or a string")
        return cls(gpus, version, _read_crashed_pairs(raw.get("crashed_pairs", [])))


_STATE_SHAPE = ('expected {"gpus": [{"gpu_id", "node", "gpu_type", "memory_mib", optional "index", "rack", "healthy", '
                '"residents": [{"job_id", "util", "util_p90", "mem_mib", optional "signature", "ends_at"}]}]}')


def _read_crashed_pairs(raw: Any) -> frozenset[tuple[Signature, Signature]]:
    shape = "expected crashed_pairs: [[signature, signature], ...], each signature a list of numbers"
    if not isinstance(raw, list):
        raise InventoryError(f"malformed cluster state: crashed_pairs is {type(raw).__name__}; {shape}")
    pairs = []
    for n, pair in enumerate(raw):
        if not isinstance(pair, list) or len(pair) != 2 or not all(isinstance(s, list) and s for s in pair):
            raise InventoryError(f"malformed cluster state: crashed_pairs[{n}] is {pair!r}; {shape}")
        try:
            a, b = (tuple(finite(x, "signature") for x in s) for s in pair)
        except (TypeError, ValueError) as exc:
            raise InventoryError(f"malformed cluster state: crashed_pairs[{n}]: {exc}; {shape}") from None
        pairs.append(crashed_pair(a, b))
    return frozenset(pairs)


def crashed_pair(a: Signature, b: Signature) -> tuple[Signature, Signature]:
    """The one key of an unordered pair."""
    return (a, b) if a <= b else (b, a)


def _read_gpu(raw: Any, position: int) -> GpuState:
    where = f"gpus[{position}]"
    if not isinstance(raw, dict):
        raise InventoryError(f"malformed cluster state: {where} is {type(raw).__name__}; {_STATE_SHAPE}")
    try:
        residents = raw.get("residents", [])
        if not isinstance(residents, list):
            raise TypeError(f"residents must be a list, got {type(residents).__name__}")
        healthy = raw.get("healthy", True)
        if not isinstance(healthy, bool):
            raise ValueError(f"healthy must be true or false, got {healthy!r}")
        return GpuState(
            gpu_id=_text(raw, "gpu_id"), node=_text(raw, "node"), index=whole(raw.get("index", position), "index"), gpu_type=_text(raw, "gpu_type"),
            memory_mib=_number(raw, "memory_mib", low=0.0, strict_low=True), healthy=healthy, rack=str(raw.get("rack", "")),
            residents=tuple(_read_resident(r, f"{where}.residents[{i}]") for i, r in enumerate(residents)),
        )
    except (KeyError, TypeError, ValueError) as exc:
        problem = f"missing key {exc}" if isinstance(exc, KeyError) else str(exc)
        raise InventoryError(f"malformed cluster state: {where}: {problem}; {_STATE_SHAPE}") from None


def _read_resident(raw: Any, where: str) -> Resident:
    if not isinstance(raw, dict):
        raise TypeError(f"{where} is {type(raw).__name__}, expected an object")
    try:
        util = _number(raw, "util", low=0.0, high=100.0)
        signature = raw.get("signature", [])
        if not isinstance(signature, list):
            raise TypeError(f"signature must be a list of numbers, got {type(signature).__name__}")
        ends_at = raw.get("ends_at")
        return Resident(_text(raw, "job_id"), util, _number(raw, "util_p90", low=0.0, high=100.0, default=util),
                        _number(raw, "mem_mib", low=0.0), tuple(finite(x, "signature") for x in signature),
                        None if ends_at is None else finite(ends_at, "ends_at"))
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{where}: {exc}") from None
    except KeyError as exc:
        raise ValueError(f"{where}: missing key {exc}") from None


def _text(raw: dict[str, Any], key: str) -> str:
    value = raw[key]
    if not isinstance(value, (str, int)) or isinstance(value, bool) or not str(value).strip():
        raise ValueError(f"{key} must be a non-empty string, got {value!r}")
    return str(value)


def _number(raw: dict[str, Any], key: str, low: float, high: float = math.inf, strict_low: bool = False,
            default: float | None = None) -> float:
    return in_range(raw.get(key, default) if default is not None else raw[key], key, low, high, above=strict_low)
