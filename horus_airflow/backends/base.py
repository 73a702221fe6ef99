"""What every backend offers the placement service, and the place-then-reserve loop they share."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Protocol

from horus_airflow.backends.ledger import Reservation
from horus_airflow.errors import LedgerConflictError, NoPlacementError
from horus_airflow.interference import InterferenceModel
from horus_airflow.placement import ClusterState, Decision, Profile, place
from horus_airflow.predictor.demand import Demand

log = logging.getLogger(__name__)


class Backend(Protocol):
    """A cluster's GPUs and its booking ledger: all the placement service needs from a backend.

    An ``owner`` is one Airflow task instance (``dag/task/run/map_index``); it runs one try at a time.
    """

    def snapshot(self) -> ClusterState:
        """The GPUs with their live bookings, at a ledger version ``reserve`` can check against."""
        ...

    def reserve(self, decision: Decision, demand: Demand, owner: str) -> Reservation:
        """Book the decision's GPUs if the ledger is still at ``decision.state_version``; raise
        :class:`~horus_airflow.errors.LedgerConflictError` otherwise."""
        ...

    def release(self, reservation: Reservation) -> bool:
        """Idempotent: True if this call released it."""
        ...

    def release_owner(self, owner: str) -> int:
        """Release everything ``owner`` holds (its task ended); idempotent. Returns how many."""
        ...

    def reclaim(self, owner: str) -> int:
        """Before a new try of ``owner`` books: deal with what its earlier tries left. Returns how many
        bookings were released. Where a dead try's job died with it (local), its booking is released;
        where the job may still run and the new try re-attaches to it (a pod), it is kept and
        ``reserve`` hands it back."""
        ...


@dataclass(frozen=True)
class Acquired:
    """A reservation with the decision behind it and the ledger state that decision was made on
    (the reservation was accepted at that very version, so its residents are the job's co-residents)."""

    decision: Decision
    reservation: Reservation
    state: ClusterState
    conflicts: int
    seconds: float  # from the first snapshot to the booking, waiting for a GPU included


def refuse_unplaceable(demand: Demand, state: ClusterState, profile: Profile,
                       interference: InterferenceModel | None = None) -> None:
    """Raise :class:`NoPlacementError` for a demand no GPU could take even with the cluster idle: it would
    wait forever."""
    idle = ClusterState(tuple(replace(gpu, residents=()) for gpu in state.gpus), state.version, state.crashed_pairs)
    decision = place(demand, idle, profile, interference)
    if not decision.placed:
        raise NoPlacementError(f"job {demand.job_id} cannot fit even on idle GPUs: {decision.reason}")


def acquire(
    backend: Backend,
    demand: Demand,
    profile: Profile,
    owner: str,
    timeout_s: float,
    interference: InterferenceModel | None = None,
    state: ClusterState | None = None,
    poll_s: float = 2.0,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> Acquired:
    """Place and reserve, re-deciding on ledger conflicts and waiting while the GPUs are busy.

    A job that could not fit even on an idle cluster fails at once instead of waiting. ``state`` is a
    snapshot the caller already read, decided on first.
    """
    started = clock()
    deadline = started + timeout_s
    conflicts = 0
    while True:
        state = state if state is not None else backend.snapshot()
        decision = place(demand, state, profile, interference)
        if decision.placed:
            try:
                reservation = backend.reserve(decision, demand, owner)
                return Acquired(decision, reservation, state, conflicts, clock() - started)
            except LedgerConflictError as exc:
                conflicts += 1
                log.info("ledger conflict (%s), deciding again", exc)
                state = None
                continue
        refuse_unplaceable(demand, state, profile, interference)
        if clock() >= deadline:
            raise NoPlacementError(f"job {demand.job_id} not placed within {timeout_s:.0f} s: {decision.reason}")
        log.info("waiting for a GPU: %s", decision.reason)
        sleep(poll_s)
        state = None
