"""The paper's proxy: every co-resident slows down by the same amount, a monotone (non-increasing)
function of the summed predicted utilization on the GPU, fitted to measured pairs by isotonic
regression. Fit is judged by summed predicted memory against the GPU's memory."""

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
        return [self.predict(jobs, gpu) for jobs in groups]

    def predict(self, jobs: Sequence[CoRunner], gpu: GpuSpec) -> Interference:
        if len(jobs) <= 1:
            return Interference(tuple(1.0 for _ in jobs), all(j.mem_mib <= gpu.memory_mib for j in jobs))
        speed = float(self.speed_at(sum(j.util for j in jobs)))
        return Interference(tuple(speed for _ in jobs), sum(j.mem_mib for j in jobs) <= gpu.memory_mib)
