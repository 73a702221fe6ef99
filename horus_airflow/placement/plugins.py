"""Filter and score plugins, after the Kubernetes scheduling framework: one small protocol per
extension point, each plugin declaring which one it implements (``kind``).

- ``filter`` (:class:`FilterPlugin`): for every GPU at once, can it take one worker of the job? It keeps
  the numbers it judged by, so the explanation can say why.
- ``score`` (:class:`ScorePlugin`): a cost for every GPU, as named raw parts. The placer sums a plugin's
  parts and scales the sum to **0-100** over the feasible GPUs (0: the plugin's best GPU, 100: its
  worst), so the weights of a profile compare across plugins whatever their raw units.
- ``shortlist`` (:class:`ShortlistPlugin`): a score too costly for every GPU (a model call per
  candidate); it runs on the ``score_top`` best candidates by the other scores (Kubernetes'
  percentageOfNodesToScore), may reject some, and is scaled to 0-100 over the ones it keeps.
- ``gang`` (:class:`GangPlugin`): prices the *set* of GPUs a multi-GPU job takes (nodes and racks it
  spans), 0-100, and says how many nodes a gang may span.

Plugins work on whole arrays (one entry per GPU): a decision over 8,192 GPUs is a handful of vector
operations, not 8,192 Python calls. Their arguments are dataclass fields, checked by type when a
profile is read and by value in ``__post_init__``. Plugins from other packages register through the
entry-point group ``horus_airflow.placement_plugins`` (:func:`plugin_class`; docs/PLACEMENT.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any, ClassVar, Literal, Mapping, Protocol, Sequence

import numpy as np

from horus_airflow.features.gpus import gpu_spec
from horus_airflow.interference import CoRunner, Interference, InterferenceModel
from horus_airflow.placement.state import ClusterArrays, ClusterState
from horus_airflow.predictor.demand import LOW_CONFIDENCE_MEMORY_FACTOR, Demand
from horus_airflow.validation import in_range, whole

Values = Mapping[str, np.ndarray]


@dataclass(frozen=True)
class Verdict:
    passed: bool
    reason: str


@dataclass(frozen=True)
class Need:
    """The newcomer's predicted demand on every GPU (its GPU type's prediction), and its signature."""

    util: np.ndarray
    util_p90: np.ndarray
    mem: np.ndarray
    predicted: np.ndarray
    signature: tuple[float, ...] = ()


def need_of(demand: Demand, state: ClusterState) -> Need:
    """The newcomer's demand on every GPU of the state (its GPU type's prediction). A low-confidence prediction is booked cautiously: its p90
    utilization and :data:`LOW_CONFIDENCE_MEMORY_FACTOR` times its memory."""
    gpus = state.arrays
    cautious = demand.confidence == "low"
    table = np.zeros((3, len(gpus.types)))  # a GPU type with no prediction: zeros, and not predicted
    known = np.zeros(len(gpus.types), dtype=bool)
    for position, gpu_type in enumerate(gpus.types):
        found = demand.per_type.get(gpu_type)
        if found is not None:
            known[position] = True
            table[:, position] = (found.util_p90 if cautious else found.util, found.util_p90,
                                  found.mem_mib * (LOW_CONFIDENCE_MEMORY_FACTOR if cautious else 1.0))
    if not len(state.gpus):
        return Need(np.zeros(0), np.zeros(0), np.zeros(0), np.zeros(0, dtype=bool), demand.signature)
    util, util_p90, mem = table[:, gpus.type_index]
    return Need(util, util_p90, mem, known[gpus.type_index], demand.signature)


@dataclass(frozen=True)
class FilterResult:
    passed: np.ndarray
    values: Values


Kind = Literal["filter", "score", "shortlist", "gang"]
KINDS: tuple[Kind, ...] = ("filter", "score", "shortlist", "gang")
SCALE = 100.0  # every score, shortlist and gang cost lies in 0..SCALE


class FilterPlugin(Protocol):
    name: ClassVar[str]
    kind: ClassVar[Kind]  # "filter"

    def evaluate(self, need: Need, gpus: ClusterArrays) -> FilterResult: ...

    def describe(self, passed: bool, values: Mapping[str, float]) -> str: ...


class ScorePlugin(Protocol):
    name: ClassVar[str]
    kind: ClassVar[Kind]  # "score"

    def costs(self, need: Need, gpus: ClusterArrays) -> Values:
        """Named raw cost parts per GPU, lower is better; any finite unit (the placer scales their sum)."""
        ...


@dataclass(frozen=True)
class Shortlisted:
    """What a shortlist plugin says about the shortlisted candidates (one row each): whether each may
    take the job, its raw cost (lower is better), named parts for the explanation, and a one-line
    verdict per row."""

    passed: np.ndarray
    cost: np.ndarray
    parts: dict[str, np.ndarray]
    verdicts: tuple[str, ...]


class ShortlistPlugin(Protocol):
    name: ClassVar[str]
    kind: ClassVar[Kind]  # "shortlist"

    def shortlist(self, need: Need, state: ClusterState, indices: Sequence[int], model: InterferenceModel) -> Shortlisted: ...


class GangPlugin(Protocol):
    name: ClassVar[str]
    kind: ClassVar[Kind]  # "gang"
    max_nodes: int

    def set_cost(self, nodes: int, racks: int) -> float:
        """The cost (0-100) of a gang spanning ``nodes`` nodes in ``racks`` racks."""
        ...


def scaled(raw: np.ndarray, among: np.ndarray) -> np.ndarray:
    """``raw`` mapped onto 0..SCALE by the lowest and highest value ``among`` the candidates (a boolean
    mask): 0 is the best candidate, SCALE the worst; all equal, all 0."""
    raw = np.asarray(raw, dtype=float)
    candidates = raw[among]
    if not candidates.size:
        return np.zeros_like(raw)
    low, high = float(candidates.min()), float(candidates.max())
    if high - low <= 1e-12 * max(1.0, abs(high)):  # all equal
        return np.zeros_like(raw)
    scaled_raw = (raw - low) * (SCALE / (high - low))
    return np.clip(scaled_raw, 0.0, SCALE, out=scaled_raw)


@dataclass(frozen=True)
class NodeHealthy:
    name: ClassVar[str] = "node-healthy"
    kind: ClassVar[Kind] = "filter"

    def evaluate(self, need: Need, gpus: ClusterArrays) -> FilterResult:
        return FilterResult(gpus.healthy, {})

    def describe(self, passed: bool, values: Mapping[str, float]) -> str:
        return "healthy" if passed else "GPU or node unhealthy / cordoned"


@dataclass(frozen=True)
class MemoryFit:
    """Predicted peak memory of the newcomer and of every resident, plus ``context_mib`` per job where
    predictions leave the CUDA context out (ours include it), plus what the driver keeps, within the
    GPU's memory less a safety margin."""

    driver_reserved_mib: float = 300.0
    context_mib: float = 0.0
    margin_fraction: float = 0.05
    name: ClassVar[str] = "memory-fit"
    kind: ClassVar[Kind] = "filter"

    def __post_init__(self) -> None:
        in_range(self.driver_reserved_mib, "driver_reserved_mib", 0.0)
        in_range(self.context_mib, "context_mib", 0.0)
        in_range(self.margin_fraction, "margin_fraction (a share of the GPU's memory)", 0.0, 0.9)

    def evaluate(self, need: Need, gpus: ClusterArrays) -> FilterResult:
        usable = gpus.memory * (1 - self.margin_fraction) - self.driver_reserved_mib
        needed = gpus.used_mem + need.mem + self.context_mib * (gpus.residents + 1)
        return FilterResult(needed <= usable, {"needed": needed, "usable": usable})

    def describe(self, passed: bool, values: Mapping[str, float]) -> str:
        sign = "<=" if passed else ">"
        return f"memory {values['needed']:.0f} {sign} {values['usable']:.0f} MiB usable"


@dataclass(frozen=True)
class MaxResidents:
    limit: int = 4
    name: ClassVar[str] = "max-residents"
    kind: ClassVar[Kind] = "filter"

    def __post_init__(self) -> None:
        whole(self.limit, "limit", 1)

    def evaluate(self, need: Need, gpus: ClusterArrays) -> FilterResult:
        return FilterResult(gpus.residents < self.limit, {"residents": gpus.residents})

    def describe(self, passed: bool, values: Mapping[str, float]) -> str:
        count = int(values["residents"])
        return f"{count}/{self.limit} residents" if passed else f"already {count} residents (limit {self.limit})"


@dataclass(frozen=True)
class GpuTypes:
    allowed: tuple[str, ...] = ()
    name: ClassVar[str] = "gpu-types"
    kind: ClassVar[Kind] = "filter"

    def __post_init__(self) -> None:
        if isinstance(self.allowed, str):
            raise ValueError(f"allowed must be a list of GPU types, got the string {self.allowed!r}")
        for gpu_type in self.allowed:
            gpu_spec(str(gpu_type))  # an unknown type lists the accepted ones

    def evaluate(self, need: Need, gpus: ClusterArrays) -> FilterResult:
        if not self.allowed:
            return FilterResult(np.ones(len(gpus.memory), dtype=bool), {"type": gpus.type_index})
        ok = np.array([t in self.allowed for t in gpus.types], dtype=bool)
        return FilterResult(ok[gpus.type_index], {"type": gpus.type_index})

    def describe(self, passed: bool, values: Mapping[str, float]) -> str:
        return "type allowed" if passed else f"type not in {', '.join(self.allowed)}"


@dataclass(frozen=True)
class HorusCost:
    """The paper's cost: memory term + |summed util - 100| (over-subscription weighted 1.6x) + residents.

    The authors' public simulator computes the memory term as ``cur + new / cap`` (operator
    precedence); we use the intended ``(cur + new) / cap``.
    """

    memory_weight: float = 1.3
    oversubscription_weight: float = 1.6
    name: ClassVar[str] = "horus-cost"
    kind: ClassVar[Kind] = "score"

    def __post_init__(self) -> None:
        in_range(self.memory_weight, "memory_weight", 0.0)
        in_range(self.oversubscription_weight, "oversubscription_weight", 0.0)

    def costs(self, need: Need, gpus: ClusterArrays) -> Values:
        gap = gpus.summed_util + need.util - 100.0
        util = np.where(gap > 0, gap * self.oversubscription_weight, -gap) / 100.0
        return {
            "memory": self.memory_weight * (gpus.used_mem + need.mem) / gpus.memory,
            "util": util,
            "residents": gpus.residents.astype(float),
        }


@dataclass(frozen=True)
class Allocation:
    """What KAI/Volcano-style schedulers do. ``binpack``: fill the fullest GPU (by memory) and node
    first; ``spread``: the emptiest first. Blind to utilization."""

    mode: str = "binpack"
    name: ClassVar[str] = "allocation"
    kind: ClassVar[Kind] = "score"

    def __post_init__(self) -> None:
        if self.mode not in ("binpack", "spread"):
            raise ValueError(f"allocation mode must be binpack or spread, got {self.mode!r}")

    def costs(self, need: Need, gpus: ClusterArrays) -> Values:
        gpu_fill = (gpus.used_mem + need.mem) / gpus.memory
        node_fill = gpus.node_busy / gpus.node_gpus
        if self.mode == "binpack":
            return {"gpu": 1.0 - gpu_fill, "node": 1.0 - node_fill}
        return {"gpu": gpu_fill, "node": node_fill}


@dataclass(frozen=True)
class Fragmentation:
    """Keep whole GPUs and whole nodes free for jobs that need them: opening an empty GPU costs
    ``gpu``, opening an idle node costs ``node`` more."""

    gpu: float = 1.0
    node: float = 1.0
    name: ClassVar[str] = "fragmentation"
    kind: ClassVar[Kind] = "score"

    def __post_init__(self) -> None:
        in_range(self.gpu, "gpu", 0.0)
        in_range(self.node, "node", 0.0)

    def costs(self, need: Need, gpus: ClusterArrays) -> Values:
        return {"empty_gpu": self.gpu * (gpus.residents == 0), "idle_node": self.node * (gpus.node_busy == 0)}


@dataclass(frozen=True)
class Locality:
    """Gang placement's set cost: each extra node a multi-GPU job spans costs ``node``, each extra rack
    ``rack``. ``max_nodes`` 1 keeps every gang on one node (all or nothing)."""

    node: float = 1.0
    rack: float = 2.0
    max_nodes: int = 1
    name: ClassVar[str] = "locality"
    kind: ClassVar[Kind] = "gang"

    def __post_init__(self) -> None:
        in_range(self.node, "node", 0.0)
        in_range(self.rack, "rack", 0.0)
        whole(self.max_nodes, "max_nodes", 1)

    def set_cost(self, nodes: int, racks: int) -> float:
        """Scaled so that the widest gang the profile allows (``max_nodes`` nodes, as many racks) costs 100."""
        widest = (self.node + self.rack) * (self.max_nodes - 1)
        raw = self.node * (nodes - 1) + self.rack * (racks - 1)
        return min(SCALE, SCALE * raw / widest) if widest > 0 else 0.0


def _predicted_speeds(need: Need, state: ClusterState, indices: Sequence[int], model: InterferenceModel
                      ) -> tuple[list[Interference], list[Interference]]:
    """The model's view of each shortlisted GPU, one row per index: its residents as they are, and with
    the newcomer added (the newcomer last). One model call per GPU type."""
    before: list[Interference] = [Interference((), True)] * len(indices)
    after: list[Interference] = [Interference((), True)] * len(indices)
    by_type: dict[str, list[int]] = {}
    for row, i in enumerate(indices):
        by_type.setdefault(state.gpus[i].gpu_type, []).append(row)
    for gpu_type, rows in by_type.items():
        spec = gpu_spec(gpu_type)
        residents = [[CoRunner(r.util, r.util_p90, r.mem_mib, r.signature) for r in state.gpus[indices[row]].residents]
                     for row in rows]
        newcomers = [CoRunner(float(need.util[indices[row]]), float(need.util_p90[indices[row]]),
                              float(need.mem[indices[row]]), need.signature) for row in rows]
        was = model.predict_many(residents, spec)
        now = model.predict_many([[*group, new] for group, new in zip(residents, newcomers)], spec)
        for row, b, a in zip(rows, was, now):
            before[row], after[row] = b, a
    return before, after


@dataclass(frozen=True)
class InterferenceScore:
    """Predicted slowdown of the newcomer plus the extra slowdown it brings each resident; candidates
    where the model says the jobs do not fit, or anyone would run below ``min_speed``, are rejected.
    The model is the caller's (the registered champion, or a proxy): the placer does no I/O."""

    min_speed: float = 0.0
    name: ClassVar[str] = "interference"
    kind: ClassVar[Kind] = "shortlist"

    def __post_init__(self) -> None:
        in_range(self.min_speed, "min_speed (a share of the job's speed alone)", 0.0, 1.0)

    def shortlist(self, need: Need, state: ClusterState, indices: Sequence[int], model: InterferenceModel) -> Shortlisted:
        before, after = _predicted_speeds(need, state, indices, model)
        newcomer_cost = np.array([1.0 - now.speeds[-1] for now in after])
        resident_cost = np.array([sum(b - a for b, a in zip(was.speeds, now.speeds[:-1])) for was, now in zip(before, after)])
        worst = np.array([min(now.speeds) for now in after])
        passed = np.array([now.fits for now in after], dtype=bool) & (worst >= self.min_speed)
        verdicts = tuple(f"predicted speed {1.0 - mine:.2f}, slowest co-runner {speed:.2f}" if ok
                         else f"does not fit or a co-runner would fall to speed {speed:.2f}"
                         for ok, mine, speed in zip(passed, newcomer_cost, worst))
        return Shortlisted(passed, newcomer_cost + resident_cost,
                           {"newcomer_slowdown": newcomer_cost, "resident_slowdown": resident_cost, "min_speed": worst}, verdicts)


@dataclass(frozen=True)
class ThroughputGain:
    """The predicted gain in work done per second on a GPU: the newcomer's normalized speed there plus
    what its residents' speeds add up to with it, minus what they added up to without it. An empty GPU
    gains 1.0; sharing gains what the pair does beyond one job alone (Gavel's V100 pairs: 78 % do more
    together than apart, median summed speed 1.37). Under queueing, work done drains the queue, so the
    highest gain is the best candidate, not the smallest slowdown.

    Rejected: candidates where the model says the jobs do not fit in memory together, where the gain is
    below ``min_gain`` (sharing that does less than the newcomer alone would, times ``min_gain``), or
    where anyone would run below ``min_speed``."""

    min_gain: float = 0.0
    min_speed: float = 0.0
    name: ClassVar[str] = "throughput-gain"
    kind: ClassVar[Kind] = "shortlist"

    def __post_init__(self) -> None:
        in_range(self.min_gain, "min_gain (work per second, in jobs alone)", 0.0, 1.0)
        in_range(self.min_speed, "min_speed (a share of the job's speed alone)", 0.0, 1.0)

    def shortlist(self, need: Need, state: ClusterState, indices: Sequence[int], model: InterferenceModel) -> Shortlisted:
        before, after = _predicted_speeds(need, state, indices, model)
        gain = np.array([sum(now.speeds) - sum(was.speeds) for was, now in zip(before, after)])
        worst = np.array([min(now.speeds) for now in after])
        fits = np.array([now.fits for now in after], dtype=bool)
        passed = fits & (gain >= self.min_gain) & (worst >= self.min_speed)
        verdicts = tuple(
            f"predicted gain {g:+.2f} jobs' work/s, slowest {w:.2f}" if ok
            else ("predicted not to fit in memory together" if not fit
                  else f"predicted gain {g:+.2f} < {self.min_gain:.2f} or slowest {w:.2f} < {self.min_speed:.2f}")
            for ok, fit, g, w in zip(passed, fits, gain, worst))
        return Shortlisted(passed, -gain, {"gain": gain, "min_speed": worst}, verdicts)


@dataclass(frozen=True)
class OomAntiAffinity:
    """Never again co-locate two jobs that crashed out of memory together: the pairs of signatures the
    cluster state carries as crashed (the ledger live, the simulator's state there) keep the newcomer
    off every GPU that holds its crash partner, so a crash is not repeated in a loop."""

    name: ClassVar[str] = "oom-anti-affinity"
    kind: ClassVar[Kind] = "filter"

    def evaluate(self, need: Need, gpus: ClusterArrays) -> FilterResult:
        partners = gpus.crash_partners.get(need.signature, frozenset()) if need.signature else frozenset()
        clash = np.zeros(len(gpus.memory))
        for i in np.flatnonzero(gpus.residents > 0) if partners else ():
            clash[i] = sum(1 for s in gpus.resident_signatures[i] if s in partners)
        return FilterResult(clash == 0, {"crash_partners": clash})

    def describe(self, passed: bool, values: Mapping[str, float]) -> str:
        return "no resident it crashed with" if passed else f"{values['crash_partners']:.0f} resident(s) it crashed out of memory with"


ENTRY_POINT_GROUP = "horus_airflow.placement_plugins"
BUILTIN: dict[str, type] = {
    plugin.name: plugin
    for plugin in (NodeHealthy, MemoryFit, MaxResidents, GpuTypes, OomAntiAffinity, HorusCost, Allocation, Fragmentation, Locality,
                   InterferenceScore, ThroughputGain)
}
_REQUIRED = {"filter": ("evaluate", "describe"), "score": ("costs",), "shortlist": ("shortlist",), "gang": ("set_cost",)}


def installed_plugins() -> dict[str, Any]:
    """Every plugin by name: the built-in ones, then those other packages register under the
    entry-point group ``horus_airflow.placement_plugins`` (entry-point name = plugin name). Read each
    time it is called (once per profile read), so a package installed while a process runs is seen by
    the next profile."""
    found: dict[str, Any] = dict(BUILTIN)
    for entry in entry_points(group=ENTRY_POINT_GROUP):
        if entry.name in BUILTIN:
            raise ValueError(f"placement plugin {entry.name!r} from {entry.value} would replace the built-in one; rename it")
        found[entry.name] = entry
    return found


def plugin_class(name: str, kinds: Sequence[Kind] = KINDS, installed: Mapping[str, Any] | None = None) -> type:
    """The class of plugin ``name``, checked to declare one of ``kinds`` and to have its methods;
    ``installed`` is :func:`installed_plugins` when the caller already read it."""
    found = installed_plugins() if installed is None else installed
    if name not in found:
        raise ValueError(f"unknown plugin {name!r}; accepted: {', '.join(sorted(found))}")
    plugin = found[name]
    if not isinstance(plugin, type):
        try:
            plugin = plugin.load()
        except Exception as exc:  # noqa: BLE001 - an outside package's import may fail any way
            raise ValueError(f"placement plugin {name!r} ({plugin.value}) could not be loaded: {type(exc).__name__}: {exc}") from None
        if not isinstance(plugin, type):
            raise ValueError(f"placement plugin {name!r} must be a class, got {plugin!r}")
    kind = getattr(plugin, "kind", None)
    if kind not in KINDS:
        raise ValueError(f"plugin {name!r} ({plugin.__qualname__}) must declare kind, one of {', '.join(KINDS)}; it has {kind!r}")
    if getattr(plugin, "name", None) != name:
        raise ValueError(f"plugin {plugin.__qualname__} is registered as {name!r} but its name is {getattr(plugin, 'name', None)!r}")
    missing = [m for m in _REQUIRED[kind] if not callable(getattr(plugin, m, None))]
    if missing:
        raise ValueError(f"{kind} plugin {name!r} lacks {', '.join(missing)}")
    if kind not in kinds:
        raise ValueError(f"plugin {name!r} is a {kind} plugin; here only {' or '.join(kinds)} plugins are accepted")
    return plugin
