"""Evaluation that never lets a model family be in both training and test: group k-fold by family,
with the prior scored on the very same held-out rows."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd
from sklearn.model_selection import GroupKFold

from horus_airflow.errors import HorusError
from horus_airflow.predictor.dataset import TARGETS
from horus_airflow.predictor.model import Hyperparameters, UtilizationModel, design_matrix

PAPER_UTIL_RMSLE = 0.154


@dataclass(frozen=True)
class Scores:
    n: int
    mae: float
    rmse: float
    rmsle: float
    r2: float

    @classmethod
    def of(cls, truth: np.ndarray, predicted: np.ndarray) -> Scores:
        error = predicted - truth
        squared_log = (np.log1p(np.maximum(predicted, 0)) - np.log1p(truth)) ** 2
        spread = float(((truth - truth.mean()) ** 2).sum())
        return cls(
            n=len(truth),
            mae=float(np.abs(error).mean()),
            rmse=math.sqrt(float((error**2).mean())),
            rmsle=math.sqrt(float(squared_log.mean())),
            r2=1.0 - float((error**2).sum()) / spread if spread > 0 else float("nan"),
        )


@dataclass(frozen=True)
class TargetScores:
    target: str
    family: str  # "all" or the held-out family
    prior: Scores
    model: Scores


@dataclass(frozen=True)
class Evaluation:
    folds: int
    families: tuple[str, ...]
    scores: tuple[TargetScores, ...]
    predictions: pd.DataFrame  # held-out rows with truth, prior and model predictions

    def overall(self, target: str) -> TargetScores:
        return next(s for s in self.scores if s.target == target and s.family == "all")

    def table(self) -> str:
        """Markdown: per target and held-out family, the prior's and the model's scores."""
        lines = [
            f"Held-out-family evaluation, {self.folds} folds (utilization in percent; the paper reports "
            f"utilization RMSLE {PAPER_UTIL_RMSLE}).",
            "",
            "| target | held-out family | rows | prior MAE | model MAE | prior RMSLE | model RMSLE | model R² |",
            "|---|---|---:|---:|---:|---:|---:|---:|",
        ]
        for s in self.scores:
            lines.append(
                f"| {s.target} | {s.family} | {s.model.n} | {s.prior.mae:.1f} | {s.model.mae:.1f} | "
                f"{s.prior.rmsle:.3f} | {s.model.rmsle:.3f} | {s.model.r2:.2f} |"
            )
        return "\n".join(lines) + "\n"

    def metrics(self) -> dict[str, float]:
        """Flat names for MLflow: ``cv.<target>.<predictor>.<metric>``."""
        out: dict[str, float] = {}
        for s in self.scores:
            if s.family != "all":
                continue
            for who, scores in (("prior", s.prior), ("model", s.model)):
                for metric in ("mae", "rmse", "rmsle", "r2"):
                    value = getattr(scores, metric)
                    if not math.isnan(value):
                        out[f"cv.{s.target}.{who}.{metric}"] = value
        return out


def evaluate(rows: pd.DataFrame, hyperparameters: Hyperparameters | None = None, folds: int = 0) -> Evaluation:
    """Group k-fold by ``family``; ``folds`` 0 holds out one family per fold."""
    families = rows["family"].astype(str)
    count = families.nunique()
    if count < 2:
        raise HorusError(f"evaluation needs at least two model families, the data has {count}")
    splits = count if folds <= 0 else min(folds, count)
    held_out = []
    for train_index, test_index in GroupKFold(n_splits=splits).split(rows, groups=families):
        train, test = rows.iloc[train_index], rows.iloc[test_index]
        model = UtilizationModel(hyperparameters or Hyperparameters()).fit(train)
        design = design_matrix(test, model.prior)
        predicted = model.predict_design(design)
        prior = UtilizationModel(hyperparameters or Hyperparameters(), model.prior).predict_design(design)
        frame = test[["origin", "origin_ref", "family", "model", "gpu_type", *TARGETS]].reset_index(drop=True)
        for target in TARGETS:
            frame[f"model.{target}"] = predicted[target].to_numpy()
            frame[f"prior.{target}"] = prior[target].to_numpy()
        held_out.append(frame)
    predictions = pd.concat(held_out, ignore_index=True)
    scores = []
    for target in TARGETS:
        known = predictions[predictions[target].notna()]
        if known.empty:
            continue
        groups = [("all", known), *((str(f), g) for f, g in known.groupby("family"))]
        for family, group in groups:
            truth = group[target].to_numpy(dtype=float)
            scores.append(TargetScores(target, family, Scores.of(truth, group[f"prior.{target}"].to_numpy()),
                                       Scores.of(truth, group[f"model.{target}"].to_numpy())))
    return Evaluation(splits, tuple(sorted(families.unique())), tuple(scores), predictions)
