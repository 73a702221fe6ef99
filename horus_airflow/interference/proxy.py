"""Models of co-location from summed predicted utilization alone. The paper's proxy: every co-resident
slows down by the same amount, a monotone (non-increasing) function of the summed utilization, fitted
to measured pairs by isotonic regression. The time-sharing law: the same shape with nothing fitted.
Both judge fit by summed predicted memory against the GPU's memory."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

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
        return self._answers(groups, gpu)

    def predict(self, jobs: Sequence[CoRunner], gpu: GpuSpec) -> Interference:
        return self._answers([jobs], gpu)[0]

    def _answers(self, groups: Sequence[Sequence[CoRunner]], gpu: GpuSpec) -> list[Interference]:
        speeds = self.speed_at(_summed_utils(groups)).tolist()  # one curve lookup for the lot: the placer asks per shortlist
        return [Interference((1.0 if len(jobs) <= 1 else speed,) * len(jobs), sum(j.mem_mib for j in jobs) <= gpu.memory_mib)
                for jobs, speed in zip(groups, speeds)]


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
        return self._answers(groups, gpu)

    def predict(self, jobs: Sequence[CoRunner], gpu: GpuSpec) -> Interference:
        return self._answers([jobs], gpu)[0]

    def _answers(self, groups: Sequence[Sequence[CoRunner]], gpu: GpuSpec) -> list[Interference]:
        speeds = self.speed_at(_summed_utils(groups)).tolist()
        return [Interference((speed,) * len(jobs), sum(j.mem_mib for j in jobs) <= gpu.memory_mib)
                for jobs, speed in zip(groups, speeds)]


def _summed_utils(groups: Sequence[Sequence[CoRunner]]) -> np.ndarray:
    return np.fromiter((sum(j.util for j in jobs) for jobs in groups), dtype=float, count=len(groups))
