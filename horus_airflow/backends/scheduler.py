"""The live scheduler: one queue for every waiting task, and scheduling rounds that book from it.

A task that asks for GPUs joins the queue in the ledger; a round reads the queue and the cluster at one
ledger version, runs :func:`~horus_airflow.placement.rounds.scheduling_round` (the simulator's
``schedule()`` and ``place()``) for each profile the waiting entries name, oldest first, and books every
chosen entry in one compare-and-swap. Any process may run a round (every waiting task does, each time
it looks at its entry): two rounds on one version cannot both book, the loser reads again and decides
again. So the order in which tasks start is the queue policy's, not whichever task polled first.
"""

from __future__ import annotations

import functools
import logging
import statistics
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Protocol, runtime_checkable

from horus_airflow.backends.ledger import Booking, DecisionNote, QueueEntry, Reservation, RoundBooking
from horus_airflow.errors import LedgerConflictError, NoPlacementError, ProfileError
from horus_airflow.interference import InterferenceModel
from horus_airflow.placement import ClusterState, Decision, Profile, load_profile
from horus_airflow.placement.rounds import Chosen, scheduling_round, stopped_at_limit
from horus_airflow.predictor.demand import Demand

from horus_airflow.backends.base import Acquired, Backend, refuse_unplaceable

log = logging.getLogger(__name__)

ROUND_ATTEMPTS = 5
ROUND_BOOKINGS = 16  # bookings per round: bounds a round's time and its compare-and-swap window
CREDIT_WINDOW_S = 3600.0  # the waiting history the credit policy's credits come from


def pool_credits(waits: Mapping[str, list[float]], waiting: Mapping[str, int]) -> dict[str, float]:
    """Horus+'s credit per pool: the median wait of its jobs over the window times how many of its jobs
    wait now, so a pool whose jobs have waited long, and many of them, goes first; a pool with nothing
    waiting has none."""
    return {pool: statistics.median(waits[pool]) * count for pool, count in waiting.items() if waits.get(pool)}


@runtime_checkable
class QueueingBackend(Backend, Protocol):
    """A backend whose ledger also keeps the queue (the local backend's SQLite file)."""

    def enqueue(self, owner: str, demand: Demand, profile: str, pool: str = "default",
                expected_runtime_s: float | None = None, priority: int = 0) -> QueueEntry: ...

    def queue(self) -> tuple[int, list[QueueEntry]]:
        """The ledger version and the entries waiting now, oldest first."""
        ...

    def queue_entry(self, entry_id: str) -> QueueEntry | None: ...

    def book_round(self, version: int, round_id: str, bookings: list[RoundBooking], held: dict[str, str],
                   skips: dict[str, int]) -> list[Reservation]: ...

    def reservation(self, reservation_id: str) -> Reservation | None: ...

    def waits(self, window_s: float) -> dict[str, list[float]]:
        """Each pool's waits over the last ``window_s`` seconds (:meth:`SqliteLedger.waits`)."""
        ...

    def renew_entry(self, entry_id: str) -> bool: ...

    def take(self, entry_id: str) -> None: ...

    def leave(self, entry_id: str, reason: str) -> bool: ...

    def now(self) -> float:
        """The ledger's clock (wall time: entries and leases are written in it)."""
        ...


@dataclass(frozen=True)
class RoundOutcome:
    """What one round booked (entry, reservation, decision), how often it had to decide again, and
    whether it stopped at its limit of bookings while more might fit (``more``)."""

    round_id: str
    booked: tuple[tuple[QueueEntry, Reservation, Decision], ...]
    waiting: int
    conflicts: int
    more: bool = False


@functools.cache
def _named_profile(name: str) -> Profile:
    return load_profile(name)


def run_round(
    backend: QueueingBackend,
    interference: InterferenceModel | None = None,
    profiles: Callable[[str], Profile] = _named_profile,
    max_bookings: int = ROUND_BOOKINGS,
) -> RoundOutcome:
    """One scheduling round over the whole queue. Entries are grouped by the profile they were queued
    with; the group holding the oldest entry goes first, each on the state the earlier left. A profile
    whose queue policy is ``credit`` gets each pool's credit from the ledger's waiting history. At most
    ``max_bookings`` entries are booked (0: no limit); the next round goes on, as the Kubernetes
    scheduler binds pod after pod, so no transaction holds the ledger for long."""
    round_id = uuid.uuid4().hex[:12]
    conflicts = 0
    for _ in range(ROUND_ATTEMPTS):
        state = backend.snapshot()
        version, entries = backend.queue()
        if version != state.version:  # something was written between the two reads
            conflicts += 1
            continue
        credits = _credits(backend, entries, profiles)
        chosen, held, skips, more = _decide(entries, state, backend.now(), interference, profiles, credits, max_bookings)
        by_id = {e.entry_id: e for e in entries}
        bookings = [RoundBooking(entry_id, _bookings(c), _note(c, round_id)) for entry_id, c in chosen]
        held, skips = _changed(by_id, held, skips)
        if not bookings and not held:  # nothing to write: a stale read costs nothing, the next round decides again
            return RoundOutcome(round_id, (), len(entries), conflicts, more)
        try:
            reservations = backend.book_round(version, round_id, bookings, held, skips)
        except LedgerConflictError as exc:
            conflicts += 1
            log.info("round %s: ledger conflict (%s), deciding again", round_id, exc)
            continue
        booked = tuple((by_id[entry_id], r, c.decision) for (entry_id, c), r in zip(chosen, reservations))
        for entry, reservation, _ in booked:
            log.info("round %s booked %s for %s", round_id, ",".join(reservation.gpu_ids), entry.owner)
        return RoundOutcome(round_id, booked, len(entries) - len(booked), conflicts, more)
    log.info("round %s gave up after %d conflicts: the next round decides", round_id, conflicts)
    return RoundOutcome(round_id, (), -1, conflicts)


def rounds_after_release(backend: Backend, interference: Callable[[], InterferenceModel | None]) -> int:
    """GPUs were just freed: book the queue onto them now, as the simulator decides at each job's end,
    not at a waiting task's next look, when later arrivals may have joined the queue. Returns how many
    entries the rounds booked. A round that fails is logged, not raised: the release stands, and the
    next look decides. ``interference`` is called only if a round runs (it may load a model)."""
    if not isinstance(backend, QueueingBackend):
        return 0
    booked = 0
    try:
        model = interference()
        while True:
            outcome = run_round(backend, model)
            booked += len(outcome.booked)
            if not outcome.more:
                return booked
    except Exception as exc:  # any failure: the task that released must not fail for other jobs' round
        log.warning("the scheduling round after a release failed (%s: %s); the next look at the queue decides",
                    type(exc).__name__, exc)
        return booked


def _changed(by_id: Mapping[str, QueueEntry], held: dict[str, str], skips: dict[str, int]) -> tuple[dict[str, str], dict[str, int]]:
    """The waiting entries whose reason or skip count this round changed, so a round writes only those
    (and an entry the round did not reach keeps its skips)."""
    counts = {entry_id: skips.get(entry_id, by_id[entry_id].skips) for entry_id in held}
    changed = {entry_id: reason for entry_id, reason in held.items()
               if (reason, counts[entry_id]) != (by_id[entry_id].reason, by_id[entry_id].skips)}
    return changed, {entry_id: counts[entry_id] for entry_id in changed}


def _credits(backend: QueueingBackend, entries: list[QueueEntry], profiles: Callable[[str], Profile]) -> dict[str, float] | None:
    def uses_credit(name: str) -> bool:
        try:
            return profiles(name).queue.name == "credit"
        except ProfileError:
            return False

    if not any(uses_credit(name) for name in {e.profile for e in entries}):
        return None
    waiting: dict[str, int] = {}
    for entry in entries:
        waiting[entry.pool] = waiting.get(entry.pool, 0) + 1
    return pool_credits(backend.waits(CREDIT_WINDOW_S), waiting)


def _decide(
    entries: list[QueueEntry],
    state: ClusterState,
    now: float,
    interference: InterferenceModel | None,
    profiles: Callable[[str], Profile],
    credits: Mapping[str, float] | None,
    limit: int,
) -> tuple[list[tuple[str, Chosen]], dict[str, str], dict[str, int], bool]:
    groups: dict[str, list[QueueEntry]] = {}
    for entry in entries:  # oldest first, so the group of the oldest entry comes first
        groups.setdefault(entry.profile, []).append(entry)
    chosen: list[tuple[str, Chosen]] = []
    held: dict[str, str] = {}
    skips: dict[str, int] = {}
    more = False
    for name, group in groups.items():
        if limit and len(chosen) >= limit:
            more = True
            held.update({e.entry_id: stopped_at_limit(limit) for e in group})
            continue
        try:
            profile = profiles(name)
        except ProfileError as exc:
            held.update({e.entry_id: f"profile {name!r} cannot be loaded here: {exc}" for e in group})
            continue
        entry_of = {e.demand.job_id: e.entry_id for e in group}
        result = scheduling_round([e.waiting(now) for e in group], state, profile, interference, credits,
                                  limit - len(chosen) if limit else 0)
        more = more or result.more
        chosen += [(entry_of[c.job.demand.job_id], c) for c in result.chosen]
        for h in result.held:
            held[entry_of[h.job.demand.job_id]] = h.reason
            skips[entry_of[h.job.demand.job_id]] = h.job.skips
        state = result.state
    return chosen, held, skips, more


def _bookings(chosen: Chosen) -> tuple[Booking, ...]:
    """What the ledger books: the demand on each chosen GPU's type, as the decision's own state has it."""
    demand, trace = chosen.job.demand, chosen.decision.trace
    if trace is None:
        raise ValueError(f"decision for {demand.job_id} has no trace: it was not made by place()")
    types = [trace.state.gpus[i].gpu_type for i in trace.chosen]
    decision = chosen.decision
    return tuple(Booking(gpu_id, need.util, need.util_p90, need.mem_mib, demand.signature)
                 for gpu_id, need in zip(decision.gpu_ids, (demand.on(t) for t in types)))


def _note(chosen: Chosen, round_id: str) -> DecisionNote:
    decision = chosen.decision
    policy = decision.trace.profile.queue.name if decision.trace else "?"
    return DecisionNote(decision.profile, f"{decision.reason} [round {round_id}, queue policy {policy}]",
                        decision.explanation())


def state_before(state: ClusterState, job_id: str) -> ClusterState:
    """The cluster as the job's decision saw it: its own booking taken out."""
    return ClusterState(tuple(replace(g, residents=tuple(r for r in g.residents if r.job_id != job_id)) for g in state.gpus),
                        state.version, state.crashed_pairs)


def enqueue_demand(
    backend: QueueingBackend,
    demand: Demand,
    profile: Profile,
    owner: str,
    interference: InterferenceModel | None = None,
    state: ClusterState | None = None,
    pool: str = "default",
    expected_runtime_s: float | None = None,
    priority: int = 0,
) -> QueueEntry:
    """Queue the demand; one no idle GPU could take is refused first (it would wait forever)."""
    refuse_unplaceable(demand, state if state is not None else backend.snapshot(), profile, interference)
    return backend.enqueue(owner, demand, profile.reference, pool, expected_runtime_s, priority)


@dataclass(frozen=True)
class Look:
    """An entry as a round left it: ``status`` is the entry's (``booked``, ``waiting``, ``expired``,
    ``left``) or ``gone`` when the ledger has no such entry."""

    entry: QueueEntry | None
    status: str
    outcome: RoundOutcome


def look_at(backend: QueueingBackend, entry_id: str, interference: InterferenceModel | None = None,
            profiles: Callable[[str], Profile] = _named_profile) -> Look:
    """Run rounds until one stops short of its limit or books the entry, then read the entry: what a
    waiting task does each time it looks. Every round that stops at its limit has booked something, so
    this ends."""
    conflicts = 0
    while True:
        outcome = run_round(backend, interference, profiles)
        conflicts += outcome.conflicts
        entry = backend.queue_entry(entry_id)
        status = entry.status(backend.now()) if entry is not None else "gone"
        if not outcome.more or status != "waiting":
            return Look(entry, status, replace(outcome, conflicts=conflicts))


def wait_for_booking(
    backend: QueueingBackend,
    entry: QueueEntry,
    profile: Profile,
    timeout_s: float,
    interference: InterferenceModel | None = None,
    poll_s: float = 2.0,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> Acquired:
    """Wait, blocking, until a round books the entry, renewing its lease. Whatever stops the wait (the
    timeout, the task killed) takes the entry out of the queue and releases a booking it never took."""
    started = clock()
    conflicts = 0
    own = functools.partial(_own_profile, profile)
    try:
        while True:
            seen = look_at(backend, entry.entry_id, interference, own)
            conflicts += seen.outcome.conflicts
            if seen.status == "booked" and seen.entry is not None:
                backend.take(entry.entry_id)
                return booked_acquisition(backend, seen.entry, seen.outcome, conflicts, clock() - started)
            reason = seen.entry.reason if seen.entry is not None else ""
            if seen.status != "waiting":
                raise NoPlacementError(f"job {entry.demand.job_id} left the queue ({seen.status}): {reason}")
            if clock() - started >= timeout_s:
                raise NoPlacementError(f"job {entry.demand.job_id} not placed within {timeout_s:.0f} s: {reason}")
            log.info("queued: %s", reason)
            backend.renew_entry(entry.entry_id)
            sleep(poll_s)
    except BaseException as exc:
        backend.leave(entry.entry_id, f"the task stopped waiting: {exc}"[:500])
        raise


def wait_in_queue(
    backend: QueueingBackend,
    demand: Demand,
    profile: Profile,
    owner: str,
    timeout_s: float,
    interference: InterferenceModel | None = None,
    state: ClusterState | None = None,
    pool: str = "default",
    expected_runtime_s: float | None = None,
    poll_s: float = 2.0,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    priority: int = 0,
) -> Acquired:
    """Queue the demand and wait, blocking, until a round books it (:func:`enqueue_demand`, then
    :func:`wait_for_booking`)."""
    started = clock()
    entry = enqueue_demand(backend, demand, profile, owner, interference, state, pool, expected_runtime_s, priority)
    acquired = wait_for_booking(backend, entry, profile, timeout_s, interference, poll_s, clock, sleep)
    return replace(acquired, seconds=clock() - started)


def booked_acquisition(backend: QueueingBackend, entry: QueueEntry, outcome: RoundOutcome | None, conflicts: int,
                       seconds: float) -> Acquired:
    """The booking a round made for ``entry``, with its decision: this process's own if its round booked
    it, else rebuilt from the ledger (the journaled reason; the candidates stay in the ledger's journal)."""
    for booked_entry, reservation, decision in outcome.booked if outcome else ():
        if booked_entry.entry_id == entry.entry_id:
            state = decision.trace.state if decision.trace else state_before(backend.snapshot(), entry.demand.job_id)
            return Acquired(decision, reservation, state, conflicts, seconds)
    reservation = backend.reservation(entry.reservation_id or "")
    if reservation is None:
        raise NoPlacementError(f"the booking {entry.reservation_id} of job {entry.demand.job_id} is not in the ledger")
    state = state_before(backend.snapshot(), entry.demand.job_id)
    decision = Decision(entry.demand.job_id, entry.profile, reservation.gpu_ids, entry.reason, state.version)
    return Acquired(decision, reservation, state, conflicts, seconds)


def _own_profile(profile: Profile, name: str) -> Profile:
    return profile if name == profile.reference else _named_profile(name)
