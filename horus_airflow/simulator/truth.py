"""What a simulated job really suffers when it shares a GPU: measured, never the policy's own model.

Pairs Gavel measured on a GPU's type give the speed of each job next to the other, and whether the
two could run together at all. Pairs it did not measure (job types outside Gavel's set) come from a
learned model fitted only on that GPU type's measured pairs, while the policies' own learned model is
fitted on the GPU types the cluster does *not* have (see :func:`split_models`): no policy ever sees the
measurements that decide its jobs' fate. With more than two jobs, slowdowns add up in time, as in the
learned model.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Protocol, Sequence

import numpy as np
import pandas as pd

from horus_airflow.errors import HorusError
from horus_airflow.features.gpus import GpuSpec
from horus_airflow.interference import CoRunner, LearnedInterference

MEASURED_GPUS = ("k80", "p100", "v100")


@dataclass(frozen=True)
class TruthOutcome:
    speeds: tuple[float, ...]
    fits: bool
    measured_pairs: int
    modelled_pairs: int


class GroundTruth(Protocol):
    """What the jobs on one GPU really get: each one's speed and whether they fit together at all."""

    def outcome(self, job_types: Sequence[str], runners: Sequence[CoRunner], gpu: GpuSpec) -> TruthOutcome: ...


@dataclass
class MeasuredTruth:
    """``pairs``: the measured rows of one GPU type (``job_a``, ``job_b``, ``speed_a``, ``fits``)."""

    pairs: pd.DataFrame
    fallback: LearnedInterference
    table: dict[tuple[str, str], tuple[float, bool]] = field(default_factory=dict, init=False)
    memo: dict[tuple[tuple[str, CoRunner], ...], TruthOutcome] = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        for row in self.pairs.itertuples(index=False):
            self.table[(row.job_a, row.job_b)] = (float(row.speed_a) if row.fits else 0.0, bool(row.fits))

    def outcome(self, job_types: Sequence[str], runners: Sequence[CoRunner], gpu: GpuSpec) -> TruthOutcome:
        """Memoized: the same mix of jobs on the same GPU type always fares the same."""
        key = tuple(zip(job_types, runners))
        if key not in self.memo:
            self.memo[key] = self._outcome(job_types, runners, gpu)
        return self.memo[key]

    def _outcome(self, job_types: Sequence[str], runners: Sequence[CoRunner], gpu: GpuSpec) -> TruthOutcome:
        if len(job_types) <= 1:
            return TruthOutcome(tuple(1.0 for _ in job_types), True, 0, 0)
        extra = np.zeros(len(job_types))
        fits, measured, modelled = True, 0, 0
        for i, a in enumerate(job_types):
            for k, b in enumerate(job_types):
                if i == k:
                    continue
                known = self.table.get((a, b))
                if known is None:
                    guess = self.fallback.predict([runners[i], runners[k]], gpu)
                    speed, ran = guess.speeds[0], guess.fits
                    modelled += 1
                else:
                    speed, ran = known
                    measured += 1
                if not ran:
                    fits = False
                    continue
                extra[i] += 1.0 / max(speed, 0.01) - 1.0
        return TruthOutcome(tuple(float(1.0 / (1.0 + t)) for t in extra), fits, measured, modelled)


@dataclass(frozen=True)
class Truth:
    """The ground truth of a cluster: on each GPU, what its own type's measured pairs say."""

    by_type: Mapping[str, MeasuredTruth]

    def outcome(self, job_types: Sequence[str], runners: Sequence[CoRunner], gpu: GpuSpec) -> TruthOutcome:
        return self.by_type[gpu.name].outcome(job_types, runners, gpu)


def split_models(pairs: pd.DataFrame, gpu_types: str | Sequence[str]) -> tuple[Truth, LearnedInterference]:
    """The ground truth for the cluster's GPU types and the policies' learned model, fitted on disjoint
    data: the truth on each type from that type's pairs only, the policies' model from the types the
    cluster does not have."""
    types = (gpu_types,) if isinstance(gpu_types, str) else tuple(dict.fromkeys(gpu_types))
    unmeasured = [t for t in types if t not in MEASURED_GPUS]
    if unmeasured:
        raise HorusError(
            f"simulated ground truth needs measured co-location pairs; GPU type {unmeasured[0]!r} has none. "
            f"Measured: {', '.join(MEASURED_GPUS)}"
        )
    others = pairs[~pairs["gpu_type"].isin(types)]
    if others.empty:
        raise HorusError(
            f"the policies' model must be fitted on GPU types the cluster does not have, so that no policy sees "
            f"the pairs that decide its jobs' fate; a cluster of {', '.join(types)} leaves none of {', '.join(MEASURED_GPUS)}"
        )
    truths = {}
    for gpu_type in types:
        own = pairs[pairs["gpu_type"] == gpu_type]
        truths[gpu_type] = MeasuredTruth(own, LearnedInterference().fit(own))
    return Truth(truths), LearnedInterference().fit(others)
