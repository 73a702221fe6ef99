"""The placer: a pure function of (job demand, cluster state, profile) to a decision with its reasons."""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import groupby

from horus_airflow.placement.plugins import Verdict
from horus_airflow.placement.profiles import Profile
from horus_airflow.placement.state import ClusterState, GpuState
from horus_airflow.predictor.demand import Demand


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


@dataclass(frozen=True)
class Decision:
    """Where a job goes (``gpu_ids`` empty when nowhere) and why: candidates, verdicts and scores."""

    job_id: str
    profile: str
    gpu_ids: tuple[str, ...]
    candidates: tuple[Candidate, ...]
    reason: str
    state_version: int

    @property
    def placed(self) -> bool:
        return bool(self.gpu_ids)


def place(demand: Demand, state: ClusterState, profile: Profile) -> Decision:
    """Filter every GPU, score the survivors, then take the cheapest ``demand.gpus`` on one node."""
    candidates = tuple(_judge(demand, gpu, profile) for gpu in state.gpus)
    by_id = {gpu.gpu_id: gpu for gpu in state.gpus}
    passing = sorted((c for c in candidates if c.passed), key=lambda c: by_id[c.gpu_id].node)
    best: list[Candidate] | None = None
    for _node, group in groupby(passing, key=lambda c: by_id[c.gpu_id].node):
        chosen = sorted(group, key=lambda c: (c.cost, by_id[c.gpu_id].index))[: demand.gpus]
        if len(chosen) == demand.gpus and (best is None or _total(chosen) < _total(best)):
            best = chosen
    if best is None:
        return Decision(demand.job_id, profile.name, (), candidates, _why_not(demand, candidates), state.version)
    return Decision(
        demand.job_id,
        profile.name,
        tuple(c.gpu_id for c in best),
        candidates,
        _why(demand, best, by_id, len(passing), len(candidates)),
        state.version,
    )


def _judge(demand: Demand, gpu: GpuState, profile: Profile) -> Candidate:
    need = demand.per_type.get(gpu.gpu_type)
    if need is None:
        return Candidate(gpu.gpu_id, gpu.gpu_type, (("prediction", Verdict(False, "no prediction for this GPU type")),))
    verdicts = []
    for plugin in profile.filters:
        verdict = plugin.check(need, gpu)
        verdicts.append((plugin.name, verdict))
        if not verdict.passed:
            return Candidate(gpu.gpu_id, gpu.gpu_type, tuple(verdicts))
    parts: dict[str, float] = {}
    total = 0.0
    for weighted in profile.scores:
        cost = weighted.plugin.cost(need, gpu)
        total += weighted.weight * cost.value
        parts.update({f"{weighted.plugin.name}.{k}": v for k, v in cost.parts.items()})
    return Candidate(gpu.gpu_id, gpu.gpu_type, tuple(verdicts), total, parts)


def _total(chosen: list[Candidate]) -> float:
    return sum(c.cost or 0.0 for c in chosen)


def _why(demand: Demand, chosen: list[Candidate], by_id: dict[str, GpuState], passing: int, total: int) -> str:
    first = by_id[chosen[0].gpu_id]
    need = demand.on(first.gpu_type)
    residents = len(first.residents)
    sharing = f"shares with {residents} job(s), summed util {first.summed_util + need.util:.0f}%" if residents else "empty GPU"
    gpus = ",".join(c.gpu_id for c in chosen)
    return (
        f"{gpus} ({first.gpu_type}): {sharing}; lowest cost {chosen[0].cost:.2f} "
        f"of {passing} feasible / {total} GPUs; {demand.explained()}"
    )


def _why_not(demand: Demand, candidates: tuple[Candidate, ...]) -> str:
    if not candidates:
        return "no GPUs in the inventory"
    passing = sum(c.passed for c in candidates)
    if passing and passing < demand.gpus:
        return f"needs {demand.gpus} GPUs on one node, only {passing} feasible"
    shown = "; ".join(f"{c.gpu_id}: {c.rejection}" for c in candidates[:4])
    return f"no feasible GPU ({shown}); {demand.explained()}"
