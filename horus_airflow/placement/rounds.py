"""A scheduling round: the queue and the cluster in, the jobs to book out, with why every other job waits.

The live scheduler and the simulator make the same choices because both call :func:`schedule` (the
profile's queue policy, then :func:`place`) on a :class:`ClusterState`: a round calls it again on the
state with each chosen job's booking added, until no waiting job fits. Pure: the caller reads the queue
and the cluster, and books what the round returns in one compare-and-swap.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Hashable, Mapping, Sequence

from horus_airflow.interference import InterferenceModel
from horus_airflow.placement.placer import Decision, demand_shape, schedule
from horus_airflow.placement.profiles import Profile
from horus_airflow.placement.queue import Waiting
from horus_airflow.placement.state import ClusterState, Resident


_SAME_DEMAND = "a queued job with the same demand does not fit now"


@dataclass(frozen=True)
class Chosen:
    """A queued job the round places, with the decision to book."""

    job: Waiting
    decision: Decision


@dataclass(frozen=True)
class Held:
    """A queued job the round leaves waiting, and why (the placer's reason, or the job's turn)."""

    job: Waiting
    reason: str


@dataclass(frozen=True)
class RoundResult:
    """``chosen`` in the order the round placed them; ``state`` is the cluster with their bookings;
    ``more``: the round stopped at its limit while jobs still waited, so the next round goes on."""

    chosen: tuple[Chosen, ...]
    held: tuple[Held, ...]
    state: ClusterState
    more: bool = False


def scheduling_round(
    waiting: Sequence[Waiting],
    state: ClusterState,
    profile: Profile,
    interference: InterferenceModel | None = None,
    credits: Mapping[str, float] | None = None,
    limit: int = 0,
) -> RoundResult:
    """Place waiting jobs one at a time, as the profile's queue policy orders them, each on the state the
    earlier ones left; a job placed ahead of one before it in the queue's order (older, or of a higher
    priority) counts as a skip of that one (the policies' starvation guard), as in the simulator. ``limit`` > 0 stops after that many jobs (what a
    round books in one transaction): the next round, on the state with these bookings and skips, carries
    on where this one stopped."""
    queue = {w.demand.job_id: w for w in waiting}
    chosen: list[Chosen] = []
    reasons: dict[str, str] = {}
    unplaceable: frozenset[Hashable] = frozenset()
    more = False
    while queue:
        if limit and len(chosen) >= limit:
            more = True
            break
        done = schedule(list(queue.values()), state, profile, interference, credits, unplaceable)
        for decision in done.tried:
            if not decision.placed:
                reasons[decision.job_id] = decision.reason
        if done.hold is not None and done.hold.job_id in reasons:
            hold = done.hold
            reasons[hold.job_id] = f"{reasons[hold.job_id]}; {','.join(hold.gpu_ids)} {hold.describe()}"
        if done.job is None or done.decision is None:
            unplaceable = done.unplaceable
            break
        placed = done.job.demand.job_id
        del queue[placed]
        for job_id, other in queue.items():
            if other.rank < done.job.rank:  # ahead of it in the queue's order, passed over
                queue[job_id] = replace(other, skips=other.skips + 1)
        chosen.append(Chosen(done.job, done.decision))
        state = _with_booking(state, done.job, done.decision)
        unplaceable = frozenset()
    stopped = stopped_at_limit(limit) if more else ""
    shapes = {key[0] for key in unplaceable}  # keys: (demand shape, hold tried under)
    turn = f"waits its turn: the {profile.queue.name} queue policy tries other jobs first"
    held = tuple(Held(job, reasons.get(job_id) or stopped
                      or (_SAME_DEMAND if shapes and demand_shape(job.demand) in shapes else turn))
                 for job_id, job in queue.items())
    return RoundResult(tuple(chosen), held, state, more)


def stopped_at_limit(limit: int) -> str:
    """Why a job waits that a round stopped before reaching."""
    return f"the round stopped at its limit of {limit} bookings; the next round goes on"


def _with_booking(state: ClusterState, job: Waiting, decision: Decision) -> ClusterState:
    """The state with the job booked where the decision put it (the GPUs' positions are the decision's
    trace's: it was made on this very state)."""
    if decision.trace is None or decision.trace.state is not state:
        raise ValueError(f"decision for {job.demand.job_id} was not made by place() on this state")
    changes = {}
    ends_at = None if job.expected_runtime_s is None else job.now + job.expected_runtime_s
    for i in decision.trace.chosen:
        gpu = state.gpus[i]
        need = job.demand.on(gpu.gpu_type)
        resident = Resident(job.demand.job_id, need.util, need.util_p90, need.mem_mib, job.demand.signature, ends_at)
        changes[i] = replace(gpu, residents=(*gpu.residents, resident))
    return state.with_changes(changes)
