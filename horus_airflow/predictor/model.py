"""The trained predictor: LightGBM models over graph features, the GPU's spec and the analytic prior's
own estimate, one per target. The p90 model is a quantile (alpha 0.9) model, so placement can be
conservative. A target without measurements keeps the prior's estimate.

Each model learns a correction of the prior in log space (``log1p(measured) - log1p(prior)``), not the
target itself: on a model family it has never seen, a tree model falls back to corrections learned
elsewhere instead of to the mean of the training targets, and the error it minimises is the relative
one that RMSLE measures. Held-out-family evaluation on the seed data chose this (docs/PREDICTOR.md).

A correction learned on some sources need not hold on another (on the seed, one fitted on Alnair's P100
rows made Muri's V100 jobs worse than the prior alone), so each one is applied only in the measure that
transfer on the training rows supports: ``fit`` refits it without each source in turn (each family
where the rows come from one source), predicts the rows left out, and keeps the weight of
:data:`SHRINKAGE_GRID` that errs least there; 0 is the prior alone.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import lightgbm as lgb
import numpy as np
import pandas as pd

from horus_airflow.features.gpus import GpuSpec, gpu_spec
from horus_airflow.features.graph import GraphFeatures
from horus_airflow.predictor.dataset import TARGETS
from horus_airflow.predictor.demand import Demand, GpuDemand, judge_confidence
from horus_airflow.predictor.prior import AnalyticPrior

INPUT_KINDS = ("image", "text", "translation", "interactions", "points", "frames", "state", "tensor")
_LOG_FEATURES = ("train_flops", "flops_conv", "flops_matmul", "flops_attention", "flops_recurrent", "flops_norm",
                 "flops_elementwise", "params", "activation_bytes", "peak_step_bytes", "kernels", "bytes_dense",
                 "bytes_other", "input_bytes", "batch_size", "host_us_per_sample")
_SHARES = ("flops_conv", "flops_matmul", "flops_attention", "flops_recurrent")
_LAYER_COUNTS = ("layers", "depth", "layers_conv", "layers_linear", "layers_attention", "layers_recurrent", "layers_norm",
                 "layers_activation", "layers_pool", "layers_embedding", "layers_dropout")
DESIGN_COLUMNS = (
    *(f"log_{name}" for name in _LOG_FEATURES),
    "log_flops_per_sample", "log_bytes_per_flop",
    *(f"share_{name}" for name in _SHARES),
    *_LAYER_COUNTS,
    "precision_bytes", "optimizer_state_factor", "traced",
    "gpu_log_fp32_tflops", "gpu_log_fp16_tflops", "gpu_bandwidth_gbs", "gpu_memory_mib", "gpu_sm_count",
    "prior_util", "prior_log_gpu_s", "prior_log_host_s", "prior_log_step_s", "prior_log_mem_mib", "prior_sm_share",
    "prior_bandwidth_share",
    "input_kind",
)
# Where physics fixes the sign of an effect, the correction may not reverse it: at a fixed host cost,
# more work per sample or a busier prior never lowers utilization, more host work never raises it; a
# larger counted peak or prior estimate never lowers memory.
_MONOTONE = {
    "gpu_util": {"log_flops_per_sample": 1, "prior_util": 1, "prior_log_gpu_s": 1, "log_host_us_per_sample": -1,
                 "prior_log_host_s": -1},
    "gpu_mem_mib": {"log_peak_step_bytes": 1, "log_activation_bytes": 1, "log_params": 1, "prior_log_mem_mib": 1},
}
_MONOTONE["gpu_util_p90"] = {}  # LightGBM's quantile objective takes no monotone constraints; p90 >= mean holds it
MIN_ROWS_PER_TARGET = 8
SHRINKAGE_GRID = (0.0, 0.25, 0.5, 0.75, 1.0)


@dataclass(frozen=True)
class Hyperparameters:
    """Sized for the few hundred rows a profiling campaign yields; leaves may hold 3 rows."""

    n_estimators: int = 100
    learning_rate: float = 0.05
    num_leaves: int = 4
    min_child_samples: int = 10
    subsample: float = 0.8
    colsample_bytree: float = 0.8
    p90_alpha: float = 0.9
    seed: int = 7

    def regressor(self, objective: str, monotone: list[int]) -> lgb.LGBMRegressor:
        extra = {"alpha": self.p90_alpha} if objective == "quantile" else {}
        return lgb.LGBMRegressor(
            objective=objective, n_estimators=self.n_estimators, learning_rate=self.learning_rate,
            num_leaves=self.num_leaves, min_child_samples=self.min_child_samples, subsample=self.subsample,
            subsample_freq=1, colsample_bytree=self.colsample_bytree, random_state=self.seed,
            min_data_in_bin=1, verbose=-1, deterministic=True, force_col_wise=True,
            **({"monotone_constraints": monotone, "monotone_constraints_method": "advanced"} if any(monotone) else {}), **extra,
        )


def design_row(features: GraphFeatures, spec: GpuSpec, prior: AnalyticPrior) -> list[float]:
    estimate = prior.estimate(features, spec)
    train = max(features.train_flops, 1)
    return [
        *(math.log10(1.0 + float(getattr(features, name))) for name in _LOG_FEATURES),
        math.log10(1.0 + train / features.batch_size),
        math.log10((1.0 + features.bytes_dense + features.bytes_other) / train),
        *(getattr(features, name) / train for name in _SHARES),
        *(float(getattr(features, name)) for name in _LAYER_COUNTS),
        features.precision_bytes, features.optimizer_state_factor, float(features.traced),
        math.log10(spec.fp32_tflops), math.log10(spec.fp16_tensor_tflops), spec.memory_bandwidth_gbs, spec.memory_mib,
        spec.sm_count,
        estimate.util, math.log10(estimate.gpu_s), math.log10(max(estimate.host_s, 1e-9)), math.log10(estimate.step_s),
        math.log10(estimate.mem_mib), estimate.sm_share, estimate.bandwidth_share,
        float(INPUT_KINDS.index(features.input_kind)) if features.input_kind in INPUT_KINDS else float(len(INPUT_KINDS)),
    ]


def design_matrix(rows: pd.DataFrame, prior: AnalyticPrior) -> pd.DataFrame:
    matrix = [design_row(GraphFeatures.from_mapping(row), gpu_spec(row["gpu_type"]), prior) for _, row in rows.iterrows()]
    return pd.DataFrame(matrix, columns=list(DESIGN_COLUMNS))


_PRIOR_UTIL = DESIGN_COLUMNS.index("prior_util")
_PRIOR_LOG_MEM = DESIGN_COLUMNS.index("prior_log_mem_mib")


def _prior_log(design: np.ndarray, target: str, prior: AnalyticPrior) -> np.ndarray:
    """``log1p`` of the prior's estimate of ``target`` for each design row."""
    if target == "gpu_mem_mib":
        return np.log1p(10 ** design[:, _PRIOR_LOG_MEM])
    margin = prior.p90_margin if target == "gpu_util_p90" else 1.0
    return np.log1p(np.minimum(design[:, _PRIOR_UTIL] * margin, 100.0))


@dataclass
class UtilizationModel:
    """Plain estimator: ``fit`` on validated training rows, then ``predict``."""

    hyperparameters: Hyperparameters = field(default_factory=Hyperparameters)
    prior: AnalyticPrior = field(default_factory=AnalyticPrior)
    regressors: dict[str, lgb.LGBMRegressor] = field(default_factory=dict)
    trained_rows: dict[str, int] = field(default_factory=dict)
    gpu_types: tuple[str, ...] = ()  # the GPU types of the rows it was fitted on
    shrinkage: dict[str, float] = field(default_factory=dict)  # the weight of each target's correction

    def fit(self, rows: pd.DataFrame) -> UtilizationModel:
        design = design_matrix(rows, self.prior)
        self.regressors, self.trained_rows, self.shrinkage = {}, {}, {}
        self.gpu_types = tuple(sorted(rows["gpu_type"].astype(str).unique()))
        groups = _transfer_groups(rows)
        for target in TARGETS:
            known = rows[target].notna().to_numpy()
            if known.sum() < MIN_ROWS_PER_TARGET:
                continue
            measured = rows.loc[known, target].to_numpy(dtype=float)
            prior_log = _prior_log(design[known].to_numpy(), target, self.prior)
            correction = np.log1p(measured) - prior_log
            self.regressors[target] = self._fit_correction(target, design[known], correction)
            self.trained_rows[target] = int(known.sum())
            self.shrinkage[target] = self._transfer_weight(target, design[known], correction, prior_log, measured,
                                                           groups[known])
        return self

    def _fit_correction(self, target: str, design: pd.DataFrame, correction: np.ndarray) -> lgb.LGBMRegressor:
        objective = "quantile" if target == "gpu_util_p90" else "regression"
        monotone = [_MONOTONE[target].get(column, 0) for column in DESIGN_COLUMNS]
        regressor = self.hyperparameters.regressor(objective, monotone)
        return regressor.fit(design, correction, categorical_feature=["input_kind"])

    def _transfer_weight(self, target: str, design: pd.DataFrame, correction: np.ndarray, prior_log: np.ndarray,
                         measured: np.ndarray, groups: np.ndarray) -> float:
        """The weight of :data:`SHRINKAGE_GRID` whose corrections, each fitted without the group it
        predicts, err least on the rows left out (points of utilization; relative error of memory).
        Without two groups there is nothing to judge transfer on: the correction is kept whole."""
        left_out = np.full(len(correction), np.nan)
        for group in np.unique(groups):
            held = groups == group
            if held.all() or (~held).sum() < MIN_ROWS_PER_TARGET:
                continue
            regressor = self._fit_correction(target, design[~held], correction[~held])
            left_out[held] = regressor.booster_.predict(design[held].to_numpy(dtype=float))
        judged = ~np.isnan(left_out)
        if not judged.any():
            return 1.0
        errors = []
        for weight in SHRINKAGE_GRID:
            predicted = np.expm1(prior_log[judged] + weight * left_out[judged])
            error = np.abs(predicted - measured[judged])
            errors.append(float(np.mean(error / np.maximum(measured[judged], 1.0) if target == "gpu_mem_mib" else error)))
        return SHRINKAGE_GRID[int(np.argmin(errors))]

    def predict_design(self, design: pd.DataFrame) -> pd.DataFrame:
        """Predictions for design rows; a target without a trained model gets the prior's estimate."""
        return pd.DataFrame(self._predict_matrix(design[list(DESIGN_COLUMNS)].to_numpy(dtype=float)), index=design.index)

    def predict(self, rows: pd.DataFrame) -> pd.DataFrame:
        return self.predict_design(design_matrix(rows, self.prior))

    def predict_one(self, features: GraphFeatures, spec: GpuSpec) -> GpuDemand:
        """One job on one GPU type, without pandas: this runs on every placement."""
        predicted = self._predict_matrix(np.array([design_row(features, spec, self.prior)]))
        return GpuDemand(util=float(predicted["gpu_util"][0]), util_p90=float(predicted["gpu_util_p90"][0]),
                         mem_mib=float(predicted["gpu_mem_mib"][0]))

    def _predict_matrix(self, design: np.ndarray) -> dict[str, np.ndarray]:
        out = {}
        for target in TARGETS:
            log_value = _prior_log(design, target, self.prior)
            regressor = self.regressors.get(target)
            if regressor is not None:
                log_value = log_value + self.shrinkage.get(target, 1.0) * regressor.booster_.predict(design)
            out[target] = np.expm1(log_value)
        out["gpu_util"] = np.clip(out["gpu_util"], 1.0, 100.0)
        out["gpu_util_p90"] = np.clip(np.maximum(out["gpu_util_p90"], out["gpu_util"]), 1.0, 100.0)
        return out


def _transfer_groups(rows: pd.DataFrame) -> np.ndarray:
    """What a correction must transfer across: the rows' sources, or their families when one source."""
    origins = rows["origin"].astype(str).to_numpy()
    return origins if len(set(origins)) > 1 else rows["family"].astype(str).to_numpy()


@dataclass(frozen=True)
class TrainedPredictor:
    """A fitted model under its registered name, in the same shape as the prior."""

    model: UtilizationModel
    name: str
    notes: tuple[str, ...] = ()

    def predict(self, job_id: str, features: GraphFeatures, gpus: int, specs: list[GpuSpec]) -> Demand:
        untrained = [t for t in TARGETS if t not in self.model.regressors]
        notes = (*self.notes, *((f"prior estimate for {', '.join(untrained)}",) if untrained else ()))
        per_type = {spec.name: self.model.predict_one(features, spec) for spec in specs}
        unmeasured = tuple(spec.name for spec in specs if spec.name not in self.model.gpu_types)
        confidence, reasons = judge_confidence(per_type, features.traced, features.batch_size, unmeasured,
                                               self.model.gpu_types)
        return Demand(job_id=job_id, gpus=gpus, per_type=per_type, predictor=self.name, confidence=confidence,
                      notes=(*notes, *reasons))
