"""The placer: a pure function of (job demand, cluster state, profile) to a decision with its reasons.

Filters and scores run on whole arrays; each score plugin's cost is scaled to 0-100 over the feasible
GPUs and weighted; shortlist plugins (the interference score) run on the ``score_top`` best
candidates only; a gang takes the cheapest set of GPUs on one node, or across the fewest nodes of one
rack when the profile's locality allows more than one. The explanation (every candidate's verdicts and
score terms) is built only when asked for, from the arrays the decision was made with.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Hashable, Mapping, Sequence

import numpy as np

from horus_airflow.interference import InterferenceModel, SummedUtilization
from horus_airflow.placement.plugins import FilterResult, Need, Verdict, need_of, scaled
from horus_airflow.placement.profiles import Profile
from horus_airflow.placement.queue import Waiting
from horus_airflow.placement.holds import Hold, hold_for
from horus_airflow.placement.state import ClusterState
from horus_airflow.predictor.demand import Demand

_DEFAULT_INTERFERENCE = SummedUtilization()
_EXPLAINED_ALTERNATIVES = 5


@dataclass(frozen=True)
class Candidate:
    """One GPU as the placer judged it: every filter's verdict and, if it passed, its cost."""

    gpu_id: str
    gpu_type: str
    verdicts: tuple[tuple[str, Verdict], ...]
    cost: float | None = None
    cost_parts: dict[str, float] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return all(v.passed for _, v in self.verdicts)

    @property
    def rejection(self) -> str:
        return "; ".join(f"{name}: {v.reason}" for name, v in self.verdicts if not v.passed)

    def to_dict(self) -> dict[str, Any]:
        return {
            "gpu_id": self.gpu_id, "gpu_type": self.gpu_type, "passed": self.passed,
            "verdicts": [{"plugin": name, "passed": v.passed, "reason": v.reason} for name, v in self.verdicts],
            "cost": self.cost, "cost_parts": self.cost_parts,
        }


@dataclass(frozen=True)
class _Trace:
    """What the decision was computed from, kept to explain it later."""

    state: ClusterState
    profile: Profile
    need: Need
    filters: tuple[FilterResult, ...]
    first_failure: np.ndarray  # index of the first failing filter, len(filters) for a shortlist, -1 passed, -2 no prediction, -3 held
    parts: dict[str, np.ndarray]
    total: np.ndarray
    shortlist_rows: dict[int, int]  # GPU position -> row of the shortlist arrays
    shortlist_passed: np.ndarray
    shortlist_parts: dict[str, np.ndarray]
    shortlist_verdicts: tuple[tuple[str, Verdict], ...] = ()  # per row: the first plugin that rejected it, or the last verdict
    chosen: tuple[int, ...] = ()  # positions of the GPUs the decision took
    hold: Hold | None = None  # GPUs kept from this job for a starving one


@dataclass(frozen=True)
class Decision:
    """Where a job goes (``gpu_ids`` empty when nowhere) and why: a one-line reason, and candidates
    with their filter verdicts and score terms (computed on first use)."""

    job_id: str
    profile: str
    gpu_ids: tuple[str, ...]
    reason: str
    state_version: int | str
    cost: float | None = None
    trace: _Trace | None = field(default=None, compare=False, repr=False)

    @property
    def placed(self) -> bool:
        return bool(self.gpu_ids)

    @cached_property
    def candidates(self) -> tuple[Candidate, ...]:
        return _candidates(self.trace) if self.trace else ()

    def to_dict(self, top: int | None = None) -> dict[str, Any]:
        """JSON form; ``top`` keeps only the chosen GPUs and the ``top`` cheapest other candidates, and
        counts the rejected GPUs by the first filter each failed (``rejected``). With ``top`` only those
        candidates are built, so the compact form costs little on a cluster of thousands of GPUs."""
        candidates = self.candidates if top is None else ()
        summary = {}
        if top is not None and self.trace is not None:
            candidates, rejected = _compact(self.trace, self.gpu_ids, top)
            summary = {"rejected": rejected}
        elif top is not None:
            summary = {"rejected": {}}
        return {
            "job_id": self.job_id, "profile": self.profile, "gpu_ids": list(self.gpu_ids), "reason": self.reason,
            "state_version": self.state_version, "cost": self.cost, "candidates": [c.to_dict() for c in candidates],
            **summary,
        }

    def annotations(self, prefix: str = "horus.ai") -> dict[str, str]:
        """Pod annotations: the reason, the GPUs and a compact explanation (chosen plus the next best)."""
        return {
            f"{prefix}/placement-reason": self.reason[:1000],
            f"{prefix}/gpu-ids": ",".join(self.gpu_ids),
            f"{prefix}/profile": self.profile,
            f"{prefix}/explanation": self.explanation(),
        }

    def explanation(self) -> str:
        """The compact explanation kept with a placement (pod annotation, ledger journal): the chosen
        GPUs and the next best candidates, as JSON."""
        return json.dumps(self.to_dict(top=_EXPLAINED_ALTERNATIVES), separators=(",", ":"))


def place(demand: Demand, state: ClusterState, profile: Profile, interference: InterferenceModel | None = None,
          hold: Hold | None = None) -> Decision:
    """Filter every GPU, score the survivors, run the interference score on the best ``score_top``,
    then take the cheapest set of ``demand.gpus`` GPUs. GPUs in ``hold`` are not this job's to take."""
    gpus = state.arrays
    count = len(state.gpus)
    need = need_of(demand, state)
    alive = need.predicted.copy()
    first_failure = np.where(alive, -1, -2)
    if hold is not None:
        held = hold.mask(count) & alive
        first_failure[held] = -3
        alive &= ~held
    results = []
    for position, plugin in enumerate(profile.filters):
        result = plugin.evaluate(need, gpus)
        failing = alive & ~result.passed
        first_failure[failing] = position
        alive &= result.passed
        results.append(result)
    total = np.zeros(count)
    parts: dict[str, np.ndarray] = {}
    for weighted in profile.scores:
        raw = np.zeros(count)
        for key, value in weighted.plugin.costs(need, gpus).items():
            parts[f"{weighted.plugin.name}.{key}"] = np.asarray(value, dtype=float)
            raw = raw + np.asarray(value, dtype=float)
        parts[weighted.plugin.name] = scaled(raw, alive)
        total += weighted.weight * parts[weighted.plugin.name]
    rows: dict[int, int] = {}
    kept, row_parts, row_verdicts = np.ones(0, dtype=bool), {}, ()
    if profile.shortlist:
        ranked = _cheapest(np.flatnonzero(alive), total, max(profile.score_top, demand.gpus))
        rows = {int(i): row for row, i in enumerate(ranked)}
        kept = np.ones(len(ranked), dtype=bool)
        verdicts: list[tuple[str, Verdict]] = [("", Verdict(True, ""))] * len(ranked)
        extra = np.zeros(len(ranked))
        for weighted in profile.shortlist:
            result = weighted.plugin.shortlist(need, state, ranked, interference or _DEFAULT_INTERFERENCE)
            row_parts.update({f"{weighted.plugin.name}.{k}": v for k, v in result.parts.items()})
            row_parts[weighted.plugin.name] = scaled(result.cost, kept & result.passed)
            verdicts = [old if not old[1].passed else (weighted.plugin.name, Verdict(bool(ok), why))
                        for old, ok, why in zip(verdicts, result.passed, result.verdicts)]
            kept &= result.passed
            extra += weighted.weight * row_parts[weighted.plugin.name]
        row_verdicts = tuple(verdicts)
        first_failure[ranked[~kept]] = len(profile.filters)
        total[ranked] += extra
        shortlisted = np.zeros(count, dtype=bool)
        shortlisted[ranked] = kept
        alive &= shortlisted
    chosen, cost = _choose(demand.gpus, alive, total, state, profile)
    trace = _Trace(state, profile, need, tuple(results), first_failure, parts, total, rows, kept, row_parts, row_verdicts,
                   tuple(chosen), hold)
    if not chosen:
        return Decision(demand.job_id, profile.name, (), _why_not(demand, alive, trace), state.version, None, trace)
    gpu_ids = tuple(state.gpus[i].gpu_id for i in chosen)
    reason = _why(demand, chosen, cost, int(alive.sum()), trace)
    return Decision(demand.job_id, profile.name, gpu_ids, reason, state.version, cost, trace)


@dataclass(frozen=True)
class Scheduled:
    """What one scheduling round did: the job placed (None when none could be), every decision tried, the
    demands that did not fit the state (:func:`demand_shape`, with the hold they were tried under) for the
    next round on the same state, and the GPUs held for a starving job that did not fit."""

    job: Waiting | None
    decision: Decision | None
    tried: tuple[Decision, ...]
    unplaceable: frozenset[Hashable] = frozenset()
    hold: Hold | None = None


def schedule(
    waiting: Sequence[Waiting],
    state: ClusterState,
    profile: Profile,
    interference: InterferenceModel | None = None,
    credits: Mapping[str, float] | None = None,
    unplaceable: frozenset[Hashable] = frozenset(),
) -> Scheduled:
    """Try the waiting jobs in the order the profile's queue policy gives; the first that fits wins. A job
    past the policy's bound (:meth:`~horus_airflow.placement.queue.QueuePolicy.starving`) is tried first;
    if it does not fit, GPUs are held for it (:func:`hold_for`) and the others are tried on the rest,
    a job predicted to end before the held GPUs free up on all of them (a policy with ``backfill`` off
    tries no other job). A job whose demand equals one that did not fit this state under the same hold
    (same GPUs, predictions and signature: the same workload) is not tried again, since the placer would
    give the same answer. ``unplaceable`` carries those over from an earlier round on the very same state:
    a loop that calls again after an arrival, with nothing else changed, tries only the newcomers."""
    tried = []
    failed = set(unplaceable)
    policy = profile.queue
    hold = None
    hungry = policy.starving(waiting)
    if hungry is not None:
        key = (demand_shape(hungry.demand), None)
        if key not in failed:
            decision = place(hungry.demand, state, profile, interference)
            tried.append(decision)
            if decision.placed:
                return Scheduled(hungry, decision, tuple(tried), frozenset(failed))
            failed.add(key)
        if not policy.backfill:
            return Scheduled(None, None, tuple(tried), frozenset(failed))
        hold = hold_for(hungry, state)
        waiting = [w for w in waiting if w is not hungry]
    for job in policy.order(waiting, credits):
        kept_from = None if hold is None or hold.admits(job) else hold
        key = (demand_shape(job.demand), kept_from.job_id if kept_from else None)
        if key in failed:
            continue
        decision = place(job.demand, state, profile, interference, kept_from)
        tried.append(decision)
        if decision.placed:
            return Scheduled(job, decision, tuple(tried), frozenset(failed), hold)
        failed.add(key)
    return Scheduled(None, None, tuple(tried), frozenset(failed), hold)


def demand_shape(demand: Demand) -> Hashable:
    """All of a demand the placer reads, less the job's id: two demands of one shape get one answer."""
    return (demand.gpus, tuple(sorted(demand.per_type.items())), demand.confidence, demand.signature)


def _cheapest(indices: np.ndarray, total: np.ndarray, k: int) -> np.ndarray:
    """The ``k`` of ``indices`` cheapest by ``total``, cheapest first, ties in index order: a stable
    sort's first ``k``, without sorting every GPU that passed the filters (all of a large cluster's, for a
    small job)."""
    costs = total[indices]
    if len(indices) > k:
        kth = np.partition(costs, k - 1)[k - 1]
        within = costs <= kth  # every GPU cheaper than the k-th, and those tied with it, in index order
        indices, costs = indices[within], costs[within]
    return indices[np.argsort(costs, kind="stable")][:k]


def _choose(k: int, alive: np.ndarray, total: np.ndarray, state: ClusterState, profile: Profile) -> tuple[list[int], float | None]:
    feasible = np.flatnonzero(alive)
    if len(feasible) < k:
        return [], None
    gpus = state.arrays
    if k == 1:
        best = int(feasible[np.argmin(total[feasible])])
        return [best], float(total[best])
    order = feasible[np.lexsort((gpus.gpu_index[feasible], total[feasible], gpus.node_index[feasible]))]
    best_set: list[int] = []
    best_cost = math.inf
    sets = gpus.node_sets(order, k)  # each node's k cheapest feasible GPUs
    if len(sets):
        sums = total[sets].sum(axis=1)
        cheapest = int(np.argmin(sums))  # the first of equal sums: the lowest node, as node order goes
        best_set, best_cost = [int(i) for i in sets[cheapest]], float(sums[cheapest])
    if best_set or profile.gang is None or profile.gang.plugin.max_nodes <= 1:
        return best_set, (best_cost if best_set else None)
    locality, weight = profile.gang.plugin, profile.gang.weight
    for rack in np.unique(gpus.rack_index[order]):
        in_rack = order[gpus.rack_index[order] == rack]
        nodes = np.unique(gpus.node_index[in_rack])
        by_size = sorted(nodes, key=lambda n: (-(gpus.node_index[in_rack] == n).sum(), total[in_rack[gpus.node_index[in_rack] == n]].sum()))
        picked: list[int] = []
        for node in by_size[: locality.max_nodes]:
            picked.extend(int(i) for i in in_rack[gpus.node_index[in_rack] == node][: k - len(picked)])
            if len(picked) == k:
                break
        if len(picked) == k:
            used = len({int(gpus.node_index[i]) for i in picked})
            cost = float(total[picked].sum()) + weight * locality.set_cost(used, 1)
            if cost < best_cost:
                best_set, best_cost = picked, cost
    return best_set, (best_cost if best_set else None)


def _why(demand: Demand, chosen: list[int], cost: float | None, passing: int, trace: _Trace) -> str:
    first = trace.state.gpus[chosen[0]]
    need = demand.on(first.gpu_type)
    residents = len(first.residents)
    sharing = f"shares with {residents} job(s), summed util {first.summed_util + need.util:.0f}%" if residents else "empty GPU"
    row = trace.shortlist_rows.get(chosen[0])
    if row is not None:  # what the shortlist plugins (the interference score) said of this GPU
        sharing += f", {trace.shortlist_verdicts[row][1].reason}"
    nodes = {trace.state.gpus[i].node for i in chosen}
    span = f" on {len(nodes)} nodes" if len(nodes) > 1 else ""
    gpus = ",".join(trace.state.gpus[i].gpu_id for i in chosen)
    return (
        f"{gpus} ({first.gpu_type}){span}: {sharing}; lowest cost {cost or 0.0:.2f} "
        f"of {passing} feasible / {len(trace.state.gpus)} GPUs; {demand.explained()}"
    )


def _why_not(demand: Demand, alive: np.ndarray, trace: _Trace) -> str:
    if not trace.state.gpus:
        return f"no GPUs in the inventory; {demand.explained()}"
    passing = int(alive.sum())
    if passing and passing < demand.gpus:
        return f"needs {demand.gpus} GPUs, only {passing} feasible; {demand.explained()}"
    if passing:
        return f"needs {demand.gpus} GPUs on one node (or the profile's locality limit), none has enough feasible; {demand.explained()}"
    shown = "; ".join(f"{c.gpu_id}: {c.rejection}" for c in _candidates(trace, limit=4))
    return f"no feasible GPU ({shown}); {demand.explained()}"


def _candidates(trace: _Trace, limit: int | None = None) -> tuple[Candidate, ...]:
    return tuple(_candidate(trace, i) for i in range(len(trace.state.gpus[:limit])))


def _compact(trace: _Trace, gpu_ids: tuple[str, ...], top: int) -> tuple[tuple[Candidate, ...], dict[str, int]]:
    """The chosen GPUs' candidates, the ``top`` cheapest others that passed, and the rejected GPUs counted
    by the first plugin that rejected each (most first; ties in GPU order), from the trace's arrays."""
    chosen_at = sorted(trace.chosen) if trace.chosen else [i for i, gpu in enumerate(trace.state.gpus) if gpu.gpu_id in gpu_ids]
    passed = trace.first_failure == -1
    passed[chosen_at] = False
    others = np.flatnonzero(passed)
    if len(others) > top > 0:  # only those at or below the top-th cost can be among the top: sort just them
        others = others[trace.total[others] <= np.partition(trace.total[others], top - 1)[top - 1]]
    others = others[np.argsort(trace.total[others], kind="stable")[:top]]
    filters = trace.profile.filters
    first_seen: dict[str, int] = {}
    counts: Counter[str] = Counter()
    number = np.bincount(trace.first_failure + 3)  # codes from -3: a count per code without sorting every GPU's
    for code in (np.flatnonzero(number) - 3).tolist():
        at, n = int(np.argmax(trace.first_failure == code)), int(number[code + 3])
        if code == -2:
            name = "prediction"
        elif code == -3:
            name = "hold"
        elif 0 <= code < len(filters):
            name = filters[code].name
        else:
            continue
        counts[name] += n
        first_seen[name] = min(first_seen.get(name, at), at)
    for i in np.flatnonzero(trace.first_failure == len(filters)).tolist():
        name = trace.shortlist_verdicts[trace.shortlist_rows[i]][0]
        counts[name] += 1
        first_seen.setdefault(name, i)
    rejected = dict(sorted(counts.items(), key=lambda item: (-item[1], first_seen[item[0]])))
    return tuple(_candidate(trace, i) for i in (*chosen_at, *others.tolist())), rejected


def _candidate(trace: _Trace, i: int) -> Candidate:
    gpu = trace.state.gpus[i]
    filters = trace.profile.filters
    failed_at = int(trace.first_failure[i])
    if failed_at == -2:
        return Candidate(gpu.gpu_id, gpu.gpu_type, (("prediction", Verdict(False, "no prediction for this GPU type")),))
    if failed_at == -3 and trace.hold is not None:
        return Candidate(gpu.gpu_id, gpu.gpu_type, (("hold", Verdict(False, trace.hold.describe())),))
    checked = len(filters) if failed_at < 0 or failed_at >= len(filters) else failed_at + 1
    verdicts = []
    for position in range(checked):
        result = trace.filters[position]
        passed = bool(result.passed[i])
        values = {k: float(v[i]) for k, v in result.values.items()}
        verdicts.append((filters[position].name, Verdict(passed, filters[position].describe(passed, values))))
    row = trace.shortlist_rows.get(i)
    if row is not None:
        verdicts.append(trace.shortlist_verdicts[row])
    if not all(v.passed for _, v in verdicts):
        return Candidate(gpu.gpu_id, gpu.gpu_type, tuple(verdicts))
    parts = {k: float(v[i]) for k, v in trace.parts.items()}
    if row is not None:
        parts.update({k: float(v[row]) for k, v in trace.shortlist_parts.items()})
    return Candidate(gpu.gpu_id, gpu.gpu_type, tuple(verdicts), float(trace.total[i]), parts)
