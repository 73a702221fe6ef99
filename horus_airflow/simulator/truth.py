"""What a simulated job really suffers when it shares a GPU: measured, never the policy's own model.

Pairs Gavel measured on the cluster's GPU type give the speed of each job next to the other, and
whether the two could run together at all. Pairs it did not measure (job types outside Gavel's set)
come from a learned model fitted only on that GPU type's measured pairs, while the policies' own
learned model is fitted on the *other* GPU types (see :func:`split_models`): no policy ever sees the
measurements that decide its jobs' fate. With more than two jobs, slowdowns add up in time, as in the
learned model.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

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


def split_models(pairs: pd.DataFrame, gpu_type: str) -> tuple[MeasuredTruth, LearnedInterference]:
    """The ground truth for ``gpu_type`` and the policies' learned model, fitted on disjoint data."""
    if gpu_type not in MEASURED_GPUS:
        raise HorusError(
            f"simulated ground truth needs measured co-location pairs; GPU type {gpu_type!r} has none. "
            f"Measured: {', '.join(MEASURED_GPUS)}"
        )
    own = pairs[pairs["gpu_type"] == gpu_type]
    others = pairs[pairs["gpu_type"] != gpu_type]
    return MeasuredTruth(own, LearnedInterference().fit(own)), LearnedInterference().fit(others)
