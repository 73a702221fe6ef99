"""What the Horus view shows, worked out from a cluster state and the placements behind it. Pure: the
readers in :mod:`horus_airflow.ui.sources` do the I/O, the app turns these into JSON."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any
from urllib.parse import quote

from horus_airflow.backends.ledger import QueueEntry
from horus_airflow.placement import ClusterState, GpuState

EXTERNAL_PREFIX = "external:"


@dataclass(frozen=True)
class TaskRef:
    """The Airflow task instance a placement belongs to, read from the ledger owner
    ``dag_id/task_id/run_id/map_index`` (run ids may hold ``/``, dag and task ids may not)."""

    dag_id: str
    task_id: str
    run_id: str
    map_index: int

    @classmethod
    def parse(cls, owner: str) -> TaskRef | None:
        parts = owner.split("/")
        if len(parts) < 4 or not parts[-1].lstrip("-").isdigit():
            return None
        return cls(parts[0], parts[1], "/".join(parts[2:-1]), int(parts[-1]))

    @property
    def ui_path(self) -> str:
        """The task instance's page in the Airflow 3 UI, relative to its base URL."""
        path = f"dags/{quote(self.dag_id, safe='')}/runs/{quote(self.run_id, safe='')}/tasks/{quote(self.task_id, safe='')}"
        return path + (f"/mapped/{self.map_index}" if self.map_index >= 0 else "")

    def to_json(self) -> dict[str, Any]:
        return {"dag_id": self.dag_id, "task_id": self.task_id, "run_id": self.run_id, "map_index": self.map_index,
                "ui_path": self.ui_path}


@dataclass(frozen=True)
class Placement:
    """Who holds a booking: its reservation and owner."""

    reservation_id: str
    job_id: str
    owner: str

    @cached_property
    def task(self) -> TaskRef | None:
        return TaskRef.parse(self.owner)


@dataclass(frozen=True)
class Measured:
    """A GPU as its telemetry last saw it: device-wide utilization (%) and used memory (MiB), each None
    when the GPU does not report it, and how old the reading is."""

    util: float | None
    mem_mib: float | None
    age_s: float


@dataclass(frozen=True)
class MapFilter:
    """Which GPUs to show: node name containing ``node``, exactly ``gpu_type``, hosting a task of ``dag_id``."""

    node: str | None = None
    gpu_type: str | None = None
    dag_id: str | None = None

    def keeps(self, gpu: GpuState, dag_ids: set[str]) -> bool:
        return ((not self.node or self.node.lower() in gpu.node.lower())
                and (not self.gpu_type or gpu.gpu_type == self.gpu_type)
                and (not self.dag_id or self.dag_id in dag_ids))


@dataclass(frozen=True)
class ClusterMap:
    """Every GPU (grouped by node), the tasks on it and what was predicted and measured for it."""

    source: str
    as_of: float
    state: ClusterState
    placements: Mapping[str, Placement]  # by job id
    measured: Mapping[str, Measured]  # by GPU id
    notes: tuple[str, ...] = ()

    @cached_property
    def dag_ids(self) -> frozenset[str]:
        """The DAGs whose tasks hold GPUs in this reading."""
        return frozenset(p.task.dag_id for p in self.placements.values() if p.task is not None)

    def to_json(self, keep: MapFilter = MapFilter(), hidden: frozenset[str] = frozenset()) -> dict[str, Any]:
        """The map as the API answers it; tasks of ``hidden`` DAGs (ones the viewer may not read) keep
        their GPU and demand but lose every name."""
        task_index: dict[str, int] = {}
        tasks: list[dict[str, Any]] = []
        nodes: dict[str, dict[str, Any]] = {}
        dag_ids: set[str] = set()
        busy = 0
        for gpu in self.state.gpus:
            gpu_dags = set()
            for resident in gpu.residents:
                placement = self.placements.get(resident.job_id)
                if placement is not None and placement.task is not None and placement.task.dag_id not in hidden:
                    gpu_dags.add(placement.task.dag_id)
            dag_ids |= gpu_dags
            busy += bool(gpu.residents)
            if not keep.keeps(gpu, gpu_dags):
                continue
            indices = []
            for resident in gpu.residents:
                key = resident.job_id
                if key not in task_index:
                    task_index[key] = len(tasks)
                    placement = self.placements.get(key)
                    task = placement.task if placement else None
                    masked = task is not None and task.dag_id in hidden
                    tasks.append({
                        "job_id": "hidden" if masked else key,
                        "reservation_id": placement.reservation_id if placement and not masked else None,
                        "task": task.to_json() if task and not masked else None, "external": key.startswith(EXTERNAL_PREFIX),
                        "util": round(resident.util, 1), "util_p90": round(resident.util_p90, 1), "mem_mib": round(resident.mem_mib),
                    })
                indices.append(task_index[key])
            measured = self.measured.get(gpu.gpu_id)
            node = nodes.setdefault(gpu.node, {"name": gpu.node, "rack": gpu.rack, "gpus": []})
            node["gpus"].append({
                "gpu_id": gpu.gpu_id, "index": gpu.index, "gpu_type": gpu.gpu_type, "memory_mib": round(gpu.memory_mib),
                "healthy": gpu.healthy, "declared": gpu.declared,
                "predicted": {"util": round(gpu.summed_util, 1), "util_p90": round(gpu.summed_p90, 1),
                              "mem_mib": round(gpu.used_mem_mib)},
                "measured": None if measured is None else {
                    "util": measured.util, "mem_mib": measured.mem_mib, "age_s": round(measured.age_s, 1)},
                "tasks": indices,
            })
        return {
            "source": self.source, "as_of": self.as_of, "version": self.state.version, "notes": list(self.notes),
            "filter": {"node": keep.node, "gpu_type": keep.gpu_type, "dag_id": keep.dag_id},
            "totals": {"nodes": len({g.node for g in self.state.gpus}), "gpus": len(self.state.gpus), "busy_gpus": busy},
            "gpu_types": sorted({g.gpu_type for g in self.state.gpus}), "dag_ids": sorted(dag_ids),
            "nodes": list(nodes.values()), "tasks": tasks,
        }


@dataclass(frozen=True)
class DecisionRow:
    """One placement as the decisions page lists it; ``explanation`` is the decision's JSON (chosen GPUs,
    the next best candidates with their filter verdicts and score terms)."""

    reservation_id: str
    job_id: str
    owner: str
    created_at: float
    status: str
    gpu_ids: tuple[str, ...]
    util: float
    util_p90: float
    mem_mib: float
    profile: str
    reason: str
    explanation: str | None

    @cached_property
    def task(self) -> TaskRef | None:
        return TaskRef.parse(self.owner)

    @property
    def dag_id(self) -> str | None:
        return self.task.dag_id if self.task else None

    def to_json(self, detail: bool = False) -> dict[str, Any]:
        task = self.task
        row = {
            "reservation_id": self.reservation_id, "job_id": self.job_id, "owner": self.owner,
            "task": task.to_json() if task else None, "created_at": self.created_at, "status": self.status,
            "gpu_ids": list(self.gpu_ids), "predicted": {"util": round(self.util, 1), "util_p90": round(self.util_p90, 1),
                                                         "mem_mib": round(self.mem_mib)},
            "profile": self.profile, "reason": self.reason, "explained": bool(self.explanation),
        }
        if detail:
            row["explanation"] = _explanation(self.explanation)
        return row


@dataclass(frozen=True)
class QueueRow:
    """A task waiting for GPUs as the queue page lists it: its place in the queue's order (higher priority
    first, then arrival; :func:`queue_rows`) and why the last
    scheduling round left it waiting (the placer's reason, or its turn under the queue policy)."""

    position: int
    entry: QueueEntry
    now: float

    @cached_property
    def task(self) -> TaskRef | None:
        return TaskRef.parse(self.entry.owner)

    @property
    def dag_id(self) -> str | None:
        return self.task.dag_id if self.task else None

    def to_json(self) -> dict[str, Any]:
        entry, task = self.entry, self.task
        return {
            "position": self.position, "entry_id": entry.entry_id, "job_id": entry.demand.job_id, "owner": entry.owner,
            "task": task.to_json() if task else None, "gpus": entry.demand.gpus, "priority": entry.priority,
            "profile": entry.profile,
            "pool": entry.pool, "enqueued_at": entry.enqueued_at, "waited_s": round(self.now - entry.enqueued_at, 1),
            "skips": entry.skips, "reason": entry.reason or "queued; no scheduling round has looked at it yet",
            "predicted": {t: {"util": round(d.util, 1), "mem_mib": round(d.mem_mib)} for t, d in entry.demand.per_type.items()},
        }


def queue_rows(entries: list[QueueEntry], now: float) -> list[QueueRow]:
    """The waiting entries numbered in the order every queue policy reads them (``Waiting.rank``: higher
    priority first, then the oldest)."""
    ordered = sorted(entries, key=lambda e: e.waiting(now).rank)
    return [QueueRow(i + 1, entry, now) for i, entry in enumerate(ordered)]


def _explanation(text: str | None) -> dict[str, Any] | None:
    """The stored explanation, or None when it is missing or unreadable (a placement made before
    decisions were journaled, or a pod annotation someone edited)."""
    if not text:
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return None
    return value if isinstance(value, dict) else None
