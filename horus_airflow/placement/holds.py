"""Holds: GPUs kept for a starving job (a gang, mostly) until they drain, so a stream of small jobs
cannot keep it waiting forever, while the rest of the cluster keeps working.

A job past its queue policy's bound that does not fit gets the GPUs that are predicted to free up
first for it: on one node when a node has enough, else across the fewest nodes taken in order. No job
is put on a held GPU unless it is predicted to end before the hold's GPUs are all free (EASY
backfilling: it cannot delay the held job). The hold is recomputed from the state in every round,
never stored, so nothing is left behind when the job is placed, leaves the queue or its owner dies.
Pure: the clock is the jobs' own (:attr:`Waiting.now`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from horus_airflow.placement.plugins import need_of
from horus_airflow.placement.queue import Waiting
from horus_airflow.placement.state import ClusterState


@dataclass(frozen=True)
class Hold:
    """GPUs (``positions`` in the state's order, ``gpu_ids``) held for ``job_id`` as of ``now``;
    ``free_at`` is when the last of them is predicted free (None: a resident's end is unknown)."""

    job_id: str
    positions: tuple[int, ...]
    gpu_ids: tuple[str, ...]
    now: float
    free_at: float | None

    def admits(self, job: Waiting) -> bool:
        """Whether ``job`` may use the held GPUs: it is predicted to end before they are needed."""
        return (self.free_at is not None and job.expected_runtime_s is not None
                and self.now + job.expected_runtime_s <= self.free_at)

    def mask(self, count: int) -> np.ndarray:
        held = np.zeros(count, dtype=bool)
        held[list(self.positions)] = True
        return held

    def describe(self) -> str:
        until = ("their residents' ends are not all known" if self.free_at is None
                 else f"predicted free in {max(0.0, self.free_at - self.now):.0f} s")
        return f"held for {self.job_id}, which waited past its bound ({until})"


def hold_for(job: Waiting, state: ClusterState) -> Hold | None:
    """The GPUs to hold for ``job``: of the GPUs that could take one of its workers once empty, as the
    placer would book it (healthy, a type it has a prediction for, enough
    memory), the set that frees up first, on one node if any node has enough, else the earliest across
    nodes in node order. None when no such set exists (a demand that cannot fit even the idle cluster
    waits without holding anything)."""
    arrays, k, need = state.arrays, job.demand.gpus, need_of(job.demand, state)
    eligible = np.flatnonzero(arrays.healthy & need.predicted & (arrays.memory >= need.mem))
    if len(eligible) < k:
        return None
    free_at, busy = arrays.free_at[eligible], arrays.residents[eligible]
    ranked = eligible[np.lexsort((arrays.gpu_index[eligible], busy, free_at, arrays.node_index[eligible]))]
    sets = arrays.node_sets(ranked, k)
    if len(sets):
        last_free = arrays.free_at[sets].max(axis=1)
        load = arrays.residents[sets].sum(axis=1)
        chosen = sets[np.lexsort((load, last_free))[0]]
    else:
        chosen = eligible[np.lexsort((arrays.node_index[eligible], busy, free_at))][:k]
    last = float(arrays.free_at[chosen].max())
    return Hold(job.demand.job_id, tuple(int(i) for i in chosen), tuple(state.gpus[int(i)].gpu_id for i in chosen),
                job.now, None if last == math.inf else max(job.now, last))
