"""The discrete-event simulator: jobs arrive, wait, are placed by a profile through the very placer the
operator uses, run at the speed their co-residents allow, and finish. Speeds are recomputed whenever a
GPU's residents change; a gang runs at the pace of its slowest worker. A placement that measured data
says cannot run (out of memory) crashes the newcomer, which is counted and re-queued after a delay.

The queue policy is offered the jobs back from a crash and the ``QUEUE_WINDOW`` oldest other waiting
jobs, so a long queue costs a bounded amount per event (every built-in policy looks at the oldest jobs
first anyway; ``shortest-first`` and ``credit`` then see the 256 oldest, not all).

Policies see predictions only (the analytic prior's demand, or a trained predictor's, and their own
interference model); what a job really suffers comes from :mod:`horus_airflow.simulator.truth`. The simulator owns the clock; the
placer stays pure.
"""

from __future__ import annotations

import heapq
import math
from itertools import islice
from dataclasses import dataclass, field, replace
from typing import Callable, Hashable, Protocol, Sequence

from horus_airflow.features import extract_features
from horus_airflow.features.gpus import GpuSpec, gpu_spec
from horus_airflow.features.graph import GraphFeatures
from horus_airflow.interference import CoRunner, InterferenceModel, Memoized, signature
from horus_airflow.placement import ClusterState, GpuState, Profile, Resident, Waiting, place, schedule
from horus_airflow.placement.state import crashed_pair
from horus_airflow.predictor import AnalyticPrior, Demand
from horus_airflow.simulator.traces import SimJob, Trace
from horus_airflow.simulator.truth import GroundTruth, TruthOutcome
from horus_airflow.simulator.workloads import Workload


QUEUE_WINDOW = 256


@dataclass(frozen=True)
class NodeGroup:
    """Nodes of one GPU type in a mixed cluster."""

    nodes: int
    gpus_per_node: int
    gpu_type: str


@dataclass(frozen=True)
class Cluster:
    """``nodes`` nodes of ``gpus_per_node`` ``gpu_type`` GPUs, and, for a cluster that mixes GPU types,
    the ``others`` node groups. Racks never mix GPU types, so a gang, kept to one rack, runs on one type."""

    nodes: int
    gpus_per_node: int
    gpu_type: str
    nodes_per_rack: int = 32
    others: tuple[NodeGroup, ...] = ()

    @property
    def groups(self) -> tuple[NodeGroup, ...]:
        return (NodeGroup(self.nodes, self.gpus_per_node, self.gpu_type), *self.others)

    @property
    def gpu_types(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(group.gpu_type for group in self.groups))

    @property
    def total_gpus(self) -> int:
        return sum(group.nodes * group.gpus_per_node for group in self.groups)

    def describe(self) -> str:
        return " + ".join(f"{g.nodes} nodes x {g.gpus_per_node} {g.gpu_type}" for g in self.groups)

    def gpus(self) -> tuple[GpuState, ...]:
        gpus, first_node = [], 0
        for number, group in enumerate(self.groups):
            memory = gpu_spec(group.gpu_type).memory_mib
            prefix = "r" if number == 0 else f"g{number}r"  # a group's racks are its own
            gpus.extend(GpuState(f"n{first_node + n}/{i}", f"n{first_node + n}", i, group.gpu_type, memory,
                                 rack=f"{prefix}{n // self.nodes_per_rack}")
                        for n in range(group.nodes) for i in range(group.gpus_per_node))
            first_node += group.nodes
        return tuple(gpus)


@dataclass(frozen=True)
class FinishedJob:
    job_id: str
    arrival_s: float
    start_s: float
    finish_s: float
    duration_s: float
    gpus: int
    colocated: bool
    restarts: int

    @property
    def jct_s(self) -> float:
        return self.finish_s - self.arrival_s

    @property
    def slowdown(self) -> float:
        return (self.finish_s - self.start_s) / self.duration_s


@dataclass(frozen=True)
class Sample:
    """The cluster at one event, for the plots. ``summed_util`` is the policies' predicted utilization
    summed per GPU (capped at 100 %) and averaged over GPUs: a prediction, shown next to the measured
    busy fraction and work rate."""

    time_s: float
    queued: int
    busy_fraction: float
    work_rate: float
    summed_util: float


@dataclass
class SimulationRun:
    """Everything one profile's run produced; :mod:`horus_airflow.simulator.metrics` summarises it."""

    profile: str
    cluster: Cluster
    finished: list[FinishedJob] = field(default_factory=list)
    samples: list[Sample] = field(default_factory=list)
    skipped: dict[str, int] = field(default_factory=dict)
    oom_events: int = 0
    busy_gpu_s: float = 0.0
    work_gpu_s: float = 0.0
    predicted_util_gpu_s: float = 0.0
    measured_pairs: int = 0
    modelled_pairs: int = 0
    unfinished: int = 0
    wall_s: float = 0.0  # how long the run took, set by the caller: the engine reads no clock


@dataclass
class _Running:
    job: SimJob
    demand: Demand
    gpus: list[int]
    duration_s: float  # its runtime alone on the GPUs it got
    remaining_s: float  # seconds of work alone left, as of ``updated_s``
    updated_s: float
    started_s: float
    speed: float = 1.0
    version: int = 0
    colocated: bool = False


def simulate(
    trace: Trace,
    cluster: Cluster,
    profile: Profile,
    truth: GroundTruth,
    policy_interference: InterferenceModel,
    restart_delay_s: float = 60.0,
    progress: Callable[[int, int], None] | None = None,
    predictor: DemandPredictor | None = None,
) -> SimulationRun:
    """``predictor``: what the policies predict each job's demand with (default: the analytic prior; the
    operators use the registered champion)."""
    run = SimulationRun(profile.name, cluster, skipped=dict(trace.skipped))
    policy_interference = Memoized(policy_interference)
    base = cluster.gpus()
    types = [gpu.gpu_type for gpu in base]
    specs = {gpu_type: gpu_spec(gpu_type) for gpu_type in cluster.gpu_types}
    index_of = {gpu.gpu_id: i for i, gpu in enumerate(base)}
    residents: list[list[str]] = [[] for _ in base]
    demands = Demands(cluster.gpu_types, predictor)
    placeable = Placeable(base, profile, policy_interference)
    jobs = []
    for job in trace.jobs:
        reason = placeable.reason(job, demands)
        if reason:
            run.skipped[reason] = run.skipped.get(reason, 0) + 1
        else:
            jobs.append(job)
    # what the queue policies expect a job to take: its runtime alone on the fastest type (all one on most clusters)
    expected = [min(job.duration_on(gpu_type) for gpu_type in cluster.gpu_types) for job in jobs]
    arrivals = [(job.arrival_s, 0, index) for index, job in enumerate(jobs)]
    heapq.heapify(arrivals)
    ready: list[tuple[float, int]] = []  # (ready time, job index) of crashed jobs waiting to restart
    fresh: dict[int, Waiting] = {}  # waiting since arrival, in arrival order
    retrying: dict[int, Waiting] = {}  # back in the queue after a crash
    restarts: dict[int, int] = {}
    running: dict[int, _Running] = {}
    finishes: list[tuple[float, int, int]] = []  # (time, version, job index)
    now = 0.0
    state = ClusterState(base)
    predicted_util = [0.0] * len(base)
    total = len(jobs)
    failed = _Failed(state, frozenset())

    def advance(to: float) -> None:
        """Integrate the rates of the last sample: they hold from one event to the next."""
        nonlocal now
        span = to - now
        if span > 0 and run.samples:
            last, gpus = run.samples[-1], len(base)
            run.busy_gpu_s += last.busy_fraction * gpus * span
            run.work_gpu_s += last.work_rate * gpus * span
            run.predicted_util_gpu_s += last.summed_util * gpus * span
        now = to

    def refresh(gpu_indices: set[int]) -> None:
        """Recompute the true speed of every job on these GPUs (and so of their gangs)."""
        touched = {job for i in gpu_indices for job in residents[i]}
        for key in touched:
            job_index = int(key)
            entry = running[job_index]
            speed = 1.0
            for g in entry.gpus:
                outcome = _truth_on(g, residents, running, truth, specs[types[g]], demands, run)
                speed = min(speed, outcome.speeds[residents[g].index(key)])
                entry.colocated = entry.colocated or len(residents[g]) > 1
            if speed != entry.speed:
                entry.remaining_s -= entry.speed * (now - entry.updated_s)
                entry.updated_s, entry.speed = now, speed
                entry.version += 1
                heapq.heappush(finishes, (now + entry.remaining_s / speed, entry.version, job_index))

    def rebuild(gpu_indices: set[int]) -> ClusterState:
        changes = {g: replace(base[g], residents=tuple(_resident(running[int(k)], types[g]) for k in residents[g]))
                   for g in gpu_indices}
        return state.with_changes(changes)

    while arrivals or ready or fresh or retrying or running:
        next_times = [t for t in (arrivals[0][0] if arrivals else math.inf, ready[0][0] if ready else math.inf,
                                  finishes[0][0] if finishes else math.inf) if t < math.inf]
        if not next_times:
            run.unfinished = len(fresh) + len(retrying)  # nothing will ever change: these cannot be placed
            break
        advance(min(next_times))
        changed: set[int] = set()
        while finishes and finishes[0][0] <= now + 1e-9:
            _, version, index = heapq.heappop(finishes)
            entry = running.get(index)
            if entry is None or entry.version != version:
                continue
            del running[index]
            for g in entry.gpus:
                residents[g].remove(str(index))
                predicted_util[g] -= entry.demand.on(types[g]).util
            changed.update(entry.gpus)
            run.finished.append(FinishedJob(entry.job.job_id, entry.job.arrival_s, entry.started_s, now,
                                            entry.duration_s, entry.job.gpus, entry.colocated, restarts.get(index, 0)))
            if progress:
                progress(len(run.finished), total)
        while arrivals and arrivals[0][0] <= now:
            _, _, index = heapq.heappop(arrivals)
            fresh[index] = Waiting(demands.of(jobs[index], index), jobs[index].arrival_s, expected_runtime_s=expected[index])
        while ready and ready[0][0] <= now:
            _, index = heapq.heappop(ready)
            retrying[index] = Waiting(demands.of(jobs[index], index), jobs[index].arrival_s, skips=restarts[index],
                                      expected_runtime_s=expected[index])
        if changed:
            state = rebuild(changed)
            refresh(changed)
        while fresh or retrying:
            window = [*retrying.values(), *islice(fresh.values(), QUEUE_WINDOW)]
            done = schedule([_as_of(w, now) for w in window], state, profile, policy_interference,
                            unplaceable=failed.unplaceable if failed.state is state else frozenset())
            if done.job is None or done.decision is None:
                failed = _Failed(state, done.unplaceable)
                break
            index = int(done.job.demand.job_id)
            for w in window:
                other = int(w.demand.job_id)
                if w.rank < done.job.rank and other != index:
                    queue = retrying if other in retrying else fresh
                    queue[other] = replace(w, skips=w.skips + 1)
            (retrying if index in retrying else fresh).pop(index)
            gpu_indices = [index_of[gpu_id] for gpu_id in done.decision.gpu_ids]
            job = jobs[index]
            duration = max(job.duration_on(types[g]) for g in gpu_indices)  # a gang runs at its slowest GPU's pace
            entry = _Running(job, done.job.demand, gpu_indices, duration, duration, now, now)
            running[index] = entry
            for g in gpu_indices:
                residents[g].append(str(index))
                predicted_util[g] += entry.demand.on(types[g]).util
            crashed_on = [g for g in gpu_indices if not _truth_on(g, residents, running, truth, specs[types[g]], demands, run).fits]
            if crashed_on:
                run.oom_events += 1
                del running[index]
                for g in gpu_indices:
                    residents[g].remove(str(index))
                    predicted_util[g] -= entry.demand.on(types[g]).util
                # what a live cluster learns from the crash: these jobs are not put together again
                pairs = {crashed_pair(entry.demand.signature, running[int(k)].demand.signature) for g in crashed_on for k in residents[g]}
                state = state.with_changes({}, crashed_pairs=state.crashed_pairs | pairs)
                restarts[index] = restarts.get(index, 0) + 1
                heapq.heappush(ready, (now + restart_delay_s, index))
                continue
            heapq.heappush(finishes, (now + duration, 0, index))
            state = rebuild(set(gpu_indices))
            refresh(set(gpu_indices))
        busy = sum(1 for r in residents if r)
        run.samples.append(Sample(now, len(fresh) + len(retrying), busy / len(base),
                                  sum(r.speed * r.job.gpus for r in running.values()) / len(base),
                                  sum(min(100.0, u) for u in predicted_util) / (100.0 * len(base))))
    return run


@dataclass(frozen=True)
class _Failed:
    """The demands the last round could not place, and the state it tried them on: while the state is
    the same object (arrivals only), they are not tried again."""

    state: ClusterState
    unplaceable: frozenset[Hashable]


def _as_of(job: Waiting, now: float) -> Waiting:
    """The job with its wait up to ``now``. ``dataclasses.replace`` would inspect the fields on every call,
    and this runs for every waiting job in every round."""
    return Waiting(demand=job.demand, arrival=job.arrival, waited_s=now - job.arrival, skips=job.skips,
                   expected_runtime_s=job.expected_runtime_s, queue=job.queue, priority=job.priority)


def _resident(entry: _Running, gpu_type: str) -> Resident:
    """As the policies see it: its end predicted from its expected runtime alone, not the true slowed one."""
    need = entry.demand.on(gpu_type)
    return Resident(entry.demand.job_id, need.util, need.util_p90, need.mem_mib, entry.demand.signature,
                    entry.started_s + entry.duration_s)


def _truth_on(g: int, residents: list[list[str]], running: dict[int, _Running], truth: GroundTruth, spec: GpuSpec,
              demands: Demands, run: SimulationRun) -> TruthOutcome:
    entries = [running[int(k)] for k in residents[g]]
    runners = [demands.runner(e.job.workload, spec.name) for e in entries]
    outcome = truth.outcome([e.job.workload.job_type for e in entries], runners, spec)
    run.measured_pairs += outcome.measured_pairs
    run.modelled_pairs += outcome.modelled_pairs
    return outcome


class DemandPredictor(Protocol):
    """What predicts a job's demand: the analytic prior, or a trained (registered) predictor."""

    name: str

    def predict(self, job_id: str, features: GraphFeatures, gpus: int, specs: list[GpuSpec]) -> Demand: ...


class Demands:
    """The policies' view of each workload (predicted demand and signature), computed once per workload."""

    def __init__(self, gpu_types: Sequence[str], predictor: DemandPredictor | None = None) -> None:
        self.gpu_types = tuple(gpu_types)
        self.predictor: DemandPredictor = predictor or AnalyticPrior()
        self.cache: dict[Workload, Demand] = {}

    def template(self, workload: Workload) -> Demand:
        if workload not in self.cache:
            features = extract_features(workload.model, workload.batch_size, workload.dataset)
            demand = self.predictor.predict("", features, 1, [gpu_spec(gpu_type) for gpu_type in self.gpu_types])
            self.cache[workload] = replace(demand, signature=signature(features))
        return self.cache[workload]

    def of(self, job: SimJob, index: int) -> Demand:
        return replace(self.template(job.workload), job_id=str(index), gpus=job.gpus)

    def runner(self, workload: Workload, gpu_type: str) -> CoRunner:
        demand = self.template(workload)
        need = demand.on(gpu_type)
        return CoRunner(need.util, need.util_p90, need.mem_mib, demand.signature)


class Placeable:
    """Whether a job could be placed on the idle cluster at all; one that never could would wait forever."""

    def __init__(self, base: tuple[GpuState, ...], profile: Profile, model: InterferenceModel) -> None:
        self.idle, self.profile, self.model = ClusterState(base), profile, model
        self.cache: dict[tuple[Workload, int], str | None] = {}

    def reason(self, job: SimJob, demands: Demands) -> str | None:
        if job.gpus > len(self.idle.gpus):
            return "more GPUs than the cluster has"
        key = (job.workload, job.gpus)
        if key not in self.cache:
            decision = place(replace(demands.template(job.workload), gpus=job.gpus), self.idle, self.profile, self.model)
            self.cache[key] = None if decision.placed else f"cannot be placed even on the idle cluster by {self.profile.name}"
        return self.cache[key]
