"""Models of co-location from summed predicted utilization alone. The paper's proxy: every co-resident
slows down by the same amount, a monotone (non-increasing) function of the summed utilization, fitted
to measured pairs by isotonic regression. The time-sharing law: the same shape with nothing fitted.
Both judge fit by summed predicted memory against the GPU's memory."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np
from sklearn.isotonic import IsotonicRegression

from horus_airflow.features.gpus import GpuSpec
from horus_airflow.interference.base import CoRunner, Interference


@dataclass
class SummedUtilization:
    """``curve_util`` / ``curve_speed``: the fitted curve's knots (summed util in percent -> speed)."""

    curve_util: tuple[float, ...] = (100.0, 200.0)
    curve_speed: tuple[float, ...] = (1.0, 0.5)
    name: str = field(default="summed-utilization", init=False)

    def fit(self, summed_util: np.ndarray, speed: np.ndarray) -> SummedUtilization:
        curve = IsotonicRegression(increasing=False, y_min=0.0, y_max=1.0, out_of_bounds="clip")
        curve.fit(summed_util, speed)
        self.curve_util = tuple(float(x) for x in curve.X_thresholds_)
        self.curve_speed = tuple(float(y) for y in curve.y_thresholds_)
        return self

    def speed_at(self, summed_util: np.ndarray | float) -> np.ndarray:
        return np.interp(summed_util, self.curve_util, self.curve_speed)

    def predict_many(self, groups: Sequence[Sequence[CoRunner]], gpu: GpuSpec) -> list[Interference]:
        return _shared_speeds(groups, gpu, self.speed_at, alone_at_full_speed=True)

    def predict(self, jobs: Sequence[CoRunner], gpu: GpuSpec) -> Interference:
        return _shared_speeds([jobs], gpu, self.speed_at, alone_at_full_speed=True)[0]


@dataclass(frozen=True)
class TimeSharing:
    """Co-residents share the GPU's busy time: while their summed utilization stays within 100 % each
    gets what it asks for; beyond, each slows by the same factor, 100 / sum. No constant is fitted, so
    it holds as well for jobs unlike any measured pair as for those like them, which a model fitted on
    one source's pairs does not (docs/PLACEMENT.md: Lucid's pairs)."""

    name: str = field(default="time-sharing", init=False)

    @staticmethod
    def speed_at(summed_util: np.ndarray | float) -> np.ndarray:
        return 100.0 / np.maximum(100.0, summed_util)

    def predict_many(self, groups: Sequence[Sequence[CoRunner]], gpu: GpuSpec) -> list[Interference]:
        return _shared_speeds(groups, gpu, self.speed_at, alone_at_full_speed=False)

    def predict(self, jobs: Sequence[CoRunner], gpu: GpuSpec) -> Interference:
        return _shared_speeds([jobs], gpu, self.speed_at, alone_at_full_speed=False)[0]


def _shared_speeds(groups: Sequence[Sequence[CoRunner]], gpu: GpuSpec, speed_at: Callable[[np.ndarray], np.ndarray],
                   alone_at_full_speed: bool) -> list[Interference]:
    """Every co-resident of a group at the one speed its summed utilization gives (one curve lookup for all
    the groups: the placer asks per shortlist); fit is summed memory against the GPU's."""
    summed = np.fromiter((sum(j.util for j in jobs) for jobs in groups), dtype=float, count=len(groups))
    return [Interference((1.0 if alone_at_full_speed and len(jobs) <= 1 else speed,) * len(jobs),
                         sum(j.mem_mib for j in jobs) <= gpu.memory_mib)
            for jobs, speed in zip(groups, speed_at(summed).tolist())]
