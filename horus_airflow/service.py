"""Predict, place, book: the one sequence behind both operators and the ``horus place`` command.

Every door into the placer goes through :class:`PlacementService`, so a job is predicted, placed and
booked the same way whether a local task, a Kubernetes pod or the CLI asked. The service owns the
models a decision needs (the placement profile, the champion predictor through :func:`predict_demand`,
the interference champion) and talks to the cluster only through the :class:`~horus_airflow.backends.Backend`
protocol.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cached_property
from typing import TYPE_CHECKING, Sequence

from horus_airflow.backends.base import Acquired, Backend, acquire
from horus_airflow.errors import NoPlacementError
from horus_airflow.backends.ledger import QueueEntry, Reservation
from horus_airflow.backends.scheduler import (Look, QueueingBackend, booked_acquisition, enqueue_demand, look_at,
                                              rounds_after_release, wait_in_queue)
from horus_airflow.features.gpus import gpu_spec
from horus_airflow.interference import InterferenceModel, Memoized, signature
from horus_airflow.jobs import JobSpec
from horus_airflow.placement import ClusterState, Decision, Profile, load_profile, place
from horus_airflow.predictor import Demand
from horus_airflow.registry import load_interference, load_predictor
from horus_airflow.settings import Settings

if TYPE_CHECKING:
    from horus_airflow.features import GraphFeatures


INTERFERENCE_MEMO_LIMIT = 20_000
"""Mixes of jobs a service remembers the interference model's answer for: 13 MiB when full of mixes of 2-4
jobs (traced with ``tracemalloc``). A waiting task's trigger holds one service."""


@dataclass(frozen=True)
class Planned:
    """A job checked and predicted, before anything is booked."""

    spec: JobSpec
    job_id: str
    features: GraphFeatures
    demand: Demand


def predict_demand(spec: JobSpec, job_id: str, gpu_types: Sequence[str], settings: Settings) -> tuple[GraphFeatures, Demand]:
    """Features of the job's graph, then the champion predictor's (or the prior's) demand per GPU type."""
    features = spec.features()
    demand = load_predictor(settings).predict(job_id, features, spec.gpus, [gpu_spec(t) for t in gpu_types])
    return features, replace(demand, signature=signature(features))


def pool_of(owner: str) -> str:
    """The credit pool of an owner (``dag/task/run/map_index``): its DAG, so Horus+ credit is shared
    fairly between DAGs."""
    return owner.split("/", 1)[0] or "default"


class PlacementService:
    """One profile, the registered models and (for booking) a backend.

    ``decide`` places without booking (dry runs, ``horus place``); ``book`` places and books, deciding
    again on ledger conflicts and waiting while the GPUs are busy. A demand that cannot fit even on the
    idle cluster fails at once (:class:`~horus_airflow.errors.NoPlacementError`) instead of waiting.
    """

    def __init__(self, settings: Settings, profile: str | Profile | None = None, backend: Backend | None = None) -> None:
        self.settings = settings
        self.profile = profile if isinstance(profile, Profile) else load_profile(profile or settings.profile)
        self.backend = backend

    @cached_property
    def _interference(self) -> tuple[InterferenceModel, str]:
        """Memoized: a round asks about every shortlisted GPU for each job it places, and most GPUs hold
        mixes it has seen, which the learned model's boosters would otherwise answer again."""
        model, label = load_interference(self.settings)
        return Memoized(model, INTERFERENCE_MEMO_LIMIT), label

    @property
    def interference(self) -> InterferenceModel:
        return self._interference[0]

    @property
    def interference_label(self) -> str:
        """The interference model's registered version, or why the proxy stands in."""
        return self._interference[1]

    def plan(self, spec: JobSpec, job_id: str, gpu_types: Sequence[str]) -> Planned:
        features, demand = predict_demand(spec, job_id, sorted(set(gpu_types)), self.settings)
        return Planned(spec, job_id, features, demand)

    def decide(self, demand: Demand, state: ClusterState) -> Decision:
        return place(demand, state, self.profile, self.interference)

    def book(self, demand: Demand, owner: str, timeout_s: float, state: ClusterState | None = None,
             expected_runtime_s: float | None = None, priority: int = 0) -> Acquired:
        """Make the owner's earlier tries safe (:meth:`Backend.reclaim`), then place and book.
        ``state`` is a snapshot the caller already read, decided on first. ``priority`` orders the queue
        (higher first), where the backend keeps one."""
        backend = self._booking()
        backend.reclaim(owner)
        if isinstance(backend, QueueingBackend):  # the local backend: through the queue, in the policy's order
            return wait_in_queue(backend, demand, self.profile, owner, timeout_s, self.interference, state=state,
                                 pool=pool_of(owner), expected_runtime_s=expected_runtime_s, priority=priority)
        return acquire(backend, demand, self.profile, owner, timeout_s, self.interference, state=state)

    def enqueue(self, demand: Demand, owner: str, expected_runtime_s: float | None = None, priority: int = 0) -> QueueEntry:
        """Make the owner's earlier tries safe, then queue the demand (refused at once if no idle GPU could
        take it) without waiting: a deferrable task waits in a trigger instead (:meth:`look`)."""
        backend = self._queueing()
        backend.reclaim(owner)
        return enqueue_demand(backend, demand, self.profile, owner, self.interference, pool=pool_of(owner),
                              expected_runtime_s=expected_runtime_s, priority=priority)

    def look(self, entry_id: str) -> Look:
        """Run a scheduling round and read the entry back."""
        return look_at(self._queueing(), entry_id, self.interference)

    def take(self, look: Look, seconds: float = 0.0) -> Acquired:
        """The booking a round made for a looked-at entry, now the task's."""
        backend = self._queueing()
        if look.entry is None or look.status != "booked":
            raise NoPlacementError(f"queue entry not booked ({look.status}): {look.entry.reason if look.entry else ''}")
        backend.take(look.entry.entry_id)
        return booked_acquisition(backend, look.entry, look.outcome, look.outcome.conflicts, seconds)

    def release(self, reservation: Reservation) -> bool:
        """Release a booking, then run scheduling rounds on the GPUs it freed
        (:func:`~horus_airflow.backends.scheduler.rounds_after_release`). True the first time."""
        backend = self._booking()
        released = backend.release(reservation)
        if released:
            rounds_after_release(backend, lambda: self.interference)
        return released

    def release_owner(self, owner: str) -> int:
        """Release every booking the owner holds, then run rounds as :meth:`release` does."""
        backend = self._booking()
        released = backend.release_owner(owner)
        if released:
            rounds_after_release(backend, lambda: self.interference)
        return released

    def _booking(self) -> Backend:
        if self.backend is None:
            raise TypeError("this PlacementService has no backend to book on; give one, or use decide()")
        return self.backend

    def _queueing(self) -> QueueingBackend:
        if not isinstance(self.backend, QueueingBackend):
            raise TypeError(f"{type(self.backend).__name__} keeps no queue; use book()")
        return self.backend
