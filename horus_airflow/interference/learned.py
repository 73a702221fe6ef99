"""The learned model: LightGBM on both jobs' signatures, their predicted demand and the GPU's spec,
pairwise. A regressor predicts job A's speed next to job B (trained on pairs that ran), a classifier
whether the pair fits at all (trained on every pair: a measured throughput of zero means the pair could
not run together, not that it ran at speed 0).

More than two jobs: slowdowns add up in time, ``1/s_i = 1 + sum_j (1/s_ij - 1)``. A job without a
signature falls back to the summed-utilization proxy for its GPU.

The boosters answer only for jobs like those they were trained on: a job whose signature lies farther
than ``SUPPORT_RADIUS`` from every training job's (Euclidean, each field in units of its spread over the
training jobs) gets the time-sharing law instead, with a note saying so. Fitted on Gavel's seven job
types, the boosters rank Lucid's pairs of other jobs against their measured speeds (Spearman -0.23)
where the law, fitted on nothing, ranks them at 0.24 (docs/PLACEMENT.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Sequence

import lightgbm as lgb
import numpy as np
import pandas as pd

from horus_airflow.features.gpus import GpuSpec
from horus_airflow.interference.base import SIGNATURE_FIELDS, CoRunner, Interference, demand_shares
from horus_airflow.interference.pairs import DESIGN_COLUMNS, MONOTONE_DECREASING, design_matrix, gpu_columns
from horus_airflow.interference.proxy import SummedUtilization, TimeSharing

_LGB = dict(n_estimators=150, learning_rate=0.05, num_leaves=7, min_child_samples=20, subsample=0.8, subsample_freq=1,
            colsample_bytree=0.8, random_state=7, verbose=-1, deterministic=True, force_col_wise=True)
# One spread in every signature field, summed in quadrature: a round radius, not tuned; on Lucid's pairs
# radii from 0.5 to 3 score within 0.19-0.25 (docs/PLACEMENT.md).
SUPPORT_RADIUS = 1.0
_WIDTH = len(SIGNATURE_FIELDS)
_UTIL_A, _UTIL_B = DESIGN_COLUMNS.index("util_a"), DESIGN_COLUMNS.index("util_b")
_MEM_A, _MEM_B = DESIGN_COLUMNS.index("mem_frac_a"), DESIGN_COLUMNS.index("mem_frac_b")


@dataclass(frozen=True)
class Support:
    """The training jobs' distinct signatures and each field's spread over them."""

    signatures: np.ndarray
    scale: np.ndarray

    @classmethod
    def of(cls, pairs: pd.DataFrame) -> Support:
        sides = [pairs[[f"{side}.{f}" for f in SIGNATURE_FIELDS]].to_numpy(dtype=float) for side in "ab"]
        signatures = np.unique(np.vstack(sides), axis=0)
        spread = signatures.std(axis=0)
        return cls(signatures, np.where(spread > 0, spread, 1.0))

    def contains(self, signatures: np.ndarray) -> np.ndarray:
        """Per row: whether a training job lies within ``SUPPORT_RADIUS``."""
        gaps = (signatures[:, None, :] - self.signatures[None, :, :]) / self.scale
        return np.sqrt((gaps**2).sum(axis=2)).min(axis=1) <= SUPPORT_RADIUS


@dataclass
class LearnedInterference:
    speed_model: lgb.LGBMRegressor | None = None
    fit_model: lgb.LGBMClassifier | None = None
    fallback: SummedUtilization = field(default_factory=SummedUtilization)
    support: Support | None = None  # None: a version registered before supports were kept answers for every job
    name: str = field(default="learned", init=False)

    def fit(self, pairs: pd.DataFrame) -> LearnedInterference:
        design = design_matrix(pairs)
        ran = pairs["fits"].to_numpy(dtype=bool)
        monotone = [-1 if column in MONOTONE_DECREASING else 0 for column in DESIGN_COLUMNS]
        self.speed_model = lgb.LGBMRegressor(objective="regression", monotone_constraints=monotone,
                                             monotone_constraints_method="advanced", **_LGB)
        self.speed_model.fit(design[ran], pairs.loc[ran, "speed_a"].to_numpy(dtype=float))
        self.fit_model = lgb.LGBMClassifier(**_LGB)
        self.fit_model.fit(design, ran.astype(int))
        self.fallback = SummedUtilization().fit(
            (pairs.loc[ran, "util_a"] + pairs.loc[ran, "util_b"]).to_numpy(dtype=float),
            pairs.loc[ran, "speed_a"].to_numpy(dtype=float),
        )
        self.support = Support.of(pairs)
        return self

    def predict_pairs(self, design: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Speed of A next to B and whether they fit, for design rows; pairs with a job outside the
        support get the time-sharing law and the memory sum."""
        speed, fits = self._boosters(design)
        if self.support is not None and len(design):
            seen = self.support.contains(design[:, :_WIDTH]) & self.support.contains(design[:, _WIDTH:2 * _WIDTH])
            speed = np.where(seen, speed, TimeSharing.speed_at(design[:, _UTIL_A] + design[:, _UTIL_B]))
            fits = np.where(seen, fits, design[:, _MEM_A] + design[:, _MEM_B] <= 1.0)
        return speed, fits

    def _boosters(self, design: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        assert self.speed_model is not None and self.fit_model is not None, "fit() first"
        # one thread: the placer asks about a few hundred rows at a time, where OpenMP's start-up costs more
        # than it saves (3 ms against 1 ms for 500 rows on 2 cores, 8x worse when another process is busy)
        return (np.clip(self.speed_model.booster_.predict(design, num_threads=1), 0.01, 1.0),
                self.fit_model.booster_.predict(design, num_threads=1) >= 0.5)

    def predict(self, jobs: Sequence[CoRunner], gpu: GpuSpec) -> Interference:
        return self.predict_many([jobs], gpu)[0]

    def predict_many(self, groups: Sequence[Sequence[CoRunner]], gpu: GpuSpec) -> list[Interference]:
        """All groups' pairs go through the boosters in one call."""
        spec = gpu_columns(gpu)
        rows: list[list[float]] = []
        owners: list[tuple[int, int]] = []  # (group, job) whose speed each row is about
        unseen = self._unseen(groups)
        for g, jobs in enumerate(groups):
            if len(jobs) > 1 and all(len(j.signature) == len(SIGNATURE_FIELDS) for j in jobs) and not unseen[g]:
                for i, a in enumerate(jobs):
                    for k, b in enumerate(jobs):
                        if i != k:
                            rows.append(_pair_row(a, b, gpu, spec))
                            owners.append((g, i))
        # rows only of groups whose every job is in the support: the boosters answer, no second check
        speed, fits = self._boosters(np.array(rows)) if rows else (np.zeros(0), np.zeros(0, dtype=bool))
        extra_time = [np.zeros(len(jobs)) for jobs in groups]
        all_fit = [True] * len(groups)
        for (g, i), s, f in zip(owners, speed, fits):
            extra_time[g][i] += 1.0 / s - 1.0
            all_fit[g] = all_fit[g] and bool(f)
        out = []
        for g, jobs in enumerate(groups):
            fits_memory = sum(j.mem_mib for j in jobs) <= gpu.memory_mib
            if len(jobs) > 1 and any(len(j.signature) != len(SIGNATURE_FIELDS) for j in jobs):
                out.append(self.fallback.predict(jobs, gpu))
            elif unseen[g]:
                unlike = ", ".join(str(i + 1) for i in unseen[g])
                out.append(replace(TimeSharing().predict(jobs, gpu),
                                   note=f"time-sharing law: job {unlike} unlike every job the learned model was trained on"))
            else:
                out.append(Interference(tuple(float(1.0 / (1.0 + t)) for t in extra_time[g]), all_fit[g] and fits_memory))
        return out

    def _unseen(self, groups: Sequence[Sequence[CoRunner]]) -> list[list[int]]:
        """Per group, the (0-based) jobs with a signature outside the support."""
        signed = [(g, i, j.signature) for g, jobs in enumerate(groups) if len(jobs) > 1 for i, j in enumerate(jobs)
                  if len(j.signature) == _WIDTH]
        unseen: list[list[int]] = [[] for _ in groups]
        if self.support is None or not signed:
            return unseen
        inside = self.support.contains(np.array([sig for _, _, sig in signed], dtype=float))
        for (g, i, _), seen in zip(signed, inside):
            if not seen:
                unseen[g].append(i)
        return unseen


def _pair_row(a: CoRunner, b: CoRunner, gpu: GpuSpec, spec: list[float]) -> list[float]:
    mem_a, mem_b = a.mem_mib / gpu.memory_mib, b.mem_mib / gpu.memory_mib
    sm_a, bandwidth_a = demand_shares(a.util, a.signature, gpu)
    sm_b, bandwidth_b = demand_shares(b.util, b.signature, gpu)
    return [*a.signature, *b.signature, a.util, a.util_p90, mem_a, b.util, b.util_p90, mem_b, a.util + b.util,
            mem_a + mem_b, sm_a, bandwidth_a, sm_b, bandwidth_b, sm_a + sm_b, bandwidth_a + bandwidth_b, *spec]
