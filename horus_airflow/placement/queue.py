"""Queue policies: which waiting job the placer tries next. Pure: the caller (a backend or the
simulator) owns time, and passes how long each job has waited and how often it was passed over.

Every policy but ``fifo`` (which never lets a job overtake) has starvation protection: a job passed over
``max_skips`` times, or waiting longer than ``max_wait_s``, is :meth:`~QueuePolicy.starving`; it is tried
first, and while it does not fit no other job is placed (the whole cluster drains for it). With
``backfill: true`` only the GPUs that free up first are held for it
(:func:`~horus_airflow.placement.holds.hold_for`): other jobs get the rest, and only one predicted to end
before the held GPUs free up may backfill them. Opt-in: it lowers mean JCT but, on a heavily queued
cluster, lets a profile with optimistic memory predictions crash far more often (docs/SCHEDULER.md).
"""

from __future__ import annotations

import math
import operator
import statistics
from dataclasses import dataclass, field
from typing import Callable, Mapping, Protocol, Sequence

from horus_airflow.predictor.demand import Demand
from horus_airflow.validation import in_range, whole

_QUEUE_ORDER = operator.attrgetter("rank")  # a C-level key: a round sorts the whole queue once per job it places


@dataclass(frozen=True)
class Waiting:
    """A job in the queue. The queue's order is ``rank``: higher ``priority`` first, then earlier
    ``arrival`` (any clock); ``skips`` counts the times a job behind it in that order was placed ahead
    of it; ``queue`` is its credit queue (team or user) for ``credit``."""

    demand: Demand
    arrival: float
    waited_s: float = 0.0
    skips: int = 0
    expected_runtime_s: float | None = None
    queue: str = "default"
    priority: int = 0
    rank: tuple[int, float] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "rank", (-self.priority, self.arrival))

    @property
    def now(self) -> float:
        """The moment its wait was measured at, in the arrival's clock."""
        return self.arrival + self.waited_s

    @property
    def mean_util(self) -> float:
        values = [d.util for d in self.demand.per_type.values()]
        return sum(values) / len(values) if values else 0.0


class QueuePolicy(Protocol):
    name: str
    backfill: bool  # while a starving job does not fit: others may use what is not held for it

    def order(self, waiting: Sequence[Waiting], credits: Mapping[str, float] | None = None) -> list[Waiting]:
        """The jobs to try, best first (starvation aside: :meth:`starving` says who goes before all).
        A higher priority goes first in every policy; the policy orders jobs of one priority."""
        ...

    def starving(self, waiting: Sequence[Waiting]) -> Waiting | None:
        """The first job in queue order past the policy's bound (skips or wait), which goes first and is
        held for, whatever its priority: ``max_wait_s`` bounds every wait."""
        ...


def _check_window(k: int, max_skips: int, max_wait_s: float, smallest_k: int = 1) -> None:
    whole(k, "k", smallest_k)
    whole(max_skips, "max_skips", 1)
    if max_wait_s != math.inf:
        in_range(max_wait_s, "max_wait_s", 0.0, above=True)


class _Bounded:
    """The starvation guard of the policies that let jobs overtake (their ``max_skips``, ``max_wait_s``)."""

    max_skips: int
    max_wait_s: float

    def starving(self, waiting: Sequence[Waiting]) -> Waiting | None:
        hungry = [w for w in waiting if w.skips >= self.max_skips or w.waited_s >= self.max_wait_s]
        return min(hungry, key=_QUEUE_ORDER) if hungry else None


@dataclass(frozen=True)
class Fifo:
    """Strict queue order: only the head (the oldest of the highest priority) is tried (head-of-line
    blocking, the baseline)."""

    name = "fifo"
    backfill = False

    def order(self, waiting: Sequence[Waiting], credits: Mapping[str, float] | None = None) -> list[Waiting]:
        return [min(waiting, key=_QUEUE_ORDER)] if waiting else []

    def starving(self, waiting: Sequence[Waiting]) -> Waiting | None:
        return None


@dataclass(frozen=True)
class Lookahead(_Bounded):
    """The paper's: among the ``k`` jobs at the head of the queue, lowest predicted utilization first."""

    k: int = 5
    max_skips: int = 10
    max_wait_s: float = math.inf
    backfill: bool = False
    name = "lookahead"

    def __post_init__(self) -> None:
        _check_window(self.k, self.max_skips, self.max_wait_s)

    def order(self, waiting: Sequence[Waiting], credits: Mapping[str, float] | None = None) -> list[Waiting]:
        window = sorted(waiting, key=_QUEUE_ORDER)[: self.k]
        return sorted(window, key=lambda w: (-w.priority, w.mean_util, w.arrival))


@dataclass(frozen=True)
class ShortestFirst(_Bounded):
    """Shortest expected runtime first among the ``k`` at the head of the queue (0: all); unknown
    runtimes go last."""

    k: int = 0
    max_skips: int = 10
    max_wait_s: float = math.inf
    backfill: bool = False
    name = "shortest-first"

    def __post_init__(self) -> None:
        _check_window(self.k, self.max_skips, self.max_wait_s, smallest_k=0)

    def order(self, waiting: Sequence[Waiting], credits: Mapping[str, float] | None = None) -> list[Waiting]:
        window = sorted(waiting, key=_QUEUE_ORDER)
        window = window[: self.k] if self.k else window
        return sorted(window, key=lambda w: (-w.priority, math.inf if w.expected_runtime_s is None else w.expected_runtime_s,
                                             w.arrival))


@dataclass(frozen=True)
class Credit(_Bounded):
    """Horus+ multi-queue: queues with more credit left go first (the caller accrues credit by share and
    charges GPU time), arrival order within a queue; up to ``k`` jobs tried."""

    k: int = 5
    max_skips: int = 10
    max_wait_s: float = math.inf
    backfill: bool = False
    name = "credit"

    def __post_init__(self) -> None:
        _check_window(self.k, self.max_skips, self.max_wait_s)

    def order(self, waiting: Sequence[Waiting], credits: Mapping[str, float] | None = None) -> list[Waiting]:
        balance = credits or {}
        return sorted(waiting, key=lambda w: (-w.priority, -balance.get(w.queue, 0.0), w.arrival))[: self.k]


@dataclass(frozen=True)
class RemainingTime(_Bounded):
    """Least predicted remaining time first, with aging, among the ``window`` jobs at the head of the
    queue (0: all): a job's key is its expected runtime less ``aging`` times the seconds it has waited,
    so short jobs go first (what lowers mean JCT under queueing) and a long job moves up as it waits
    instead of starving. The window bounds how far a job arriving later may jump ahead. A job with no expected
    runtime is keyed by the median of those that have one. Up to ``k`` jobs are tried per round (0: all).

    Aging and the window are the starvation protection here, so ``max_skips`` is off by default: every
    short job placed ahead of a long one counts as a skip, and under a long queue a skip limit would soon
    turn the policy back into FIFO. ``max_wait_s`` still bounds any wait."""

    k: int = 16
    window: int = 0
    aging: float = 0.3
    max_skips: int = 1_000_000
    max_wait_s: float = math.inf
    backfill: bool = False
    name = "remaining-time"

    def __post_init__(self) -> None:
        _check_window(self.k, self.max_skips, self.max_wait_s, smallest_k=0)
        whole(self.window, "window", 0)
        in_range(self.aging, "aging (seconds of runtime forgiven per second waited)", 0.0)

    def order(self, waiting: Sequence[Waiting], credits: Mapping[str, float] | None = None) -> list[Waiting]:
        if self.window:
            waiting = sorted(waiting, key=_QUEUE_ORDER)[: self.window]
        known = [w.expected_runtime_s for w in waiting if w.expected_runtime_s is not None]
        typical = statistics.median(known) if known else 0.0
        ranked = sorted(waiting, key=lambda w: (-w.priority, (typical if w.expected_runtime_s is None else w.expected_runtime_s)
                                                - self.aging * w.waited_s, w.arrival))
        return ranked[: self.k] if self.k else ranked


POLICIES: dict[str, Callable[..., QueuePolicy]] = {
    "fifo": Fifo, "lookahead": Lookahead, "shortest-first": ShortestFirst, "credit": Credit, "remaining-time": RemainingTime,
}
