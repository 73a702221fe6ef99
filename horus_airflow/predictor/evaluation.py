"""Evaluation that measures transfer: every row is predicted by a model that never saw its source, its
GPU type or its model family (one split scheme at a time, each value held out in turn), beside two
baselines fitted on the same training rows: always answering the training rows' mean, and the analytic
prior alone.

Utilization is scored by MAE in points and RMSLE (``log1p`` of 0-100); memory by MAPE. A split whose
held-out rows have no measurement of a target is not scored for it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from horus_airflow.errors import HorusError
from horus_airflow.predictor.dataset import TARGETS
from horus_airflow.predictor.model import Hyperparameters, UtilizationModel, design_matrix

PAPER_UTIL_RMSLE = 0.154
SCHEMES = {"source": "origin", "gpu": "gpu_type", "family": "family"}
PREDICTORS = ("mean", "prior", "model")
POOLED = "all"


@dataclass(frozen=True)
class Scores:
    n: int
    mae: float
    rmse: float
    rmsle: float
    mape: float
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
            mape=float((np.abs(error) / np.maximum(truth, 1e-9)).mean() * 100),
            r2=1.0 - float((error**2).sum()) / spread if spread > 0 else float("nan"),
        )


@dataclass(frozen=True)
class SplitScores:
    """One target on the rows of one held-out value (``all``: every held-out row of the scheme)."""

    scheme: str
    held_out: str
    target: str
    mean: Scores
    prior: Scores
    model: Scores

    def ratio(self, metric: str = "mae") -> float:
        """The model's error over the mean predictor's: below 1 it knows more than the average."""
        base = getattr(self.mean, metric)
        return getattr(self.model, metric) / base if base > 0 else float("nan")


@dataclass(frozen=True)
class Evaluation:
    schemes: tuple[str, ...]
    scores: tuple[SplitScores, ...]
    predictions: pd.DataFrame  # every held-out row, per scheme, with truth and the three predictions

    def split(self, scheme: str, held_out: str, target: str) -> SplitScores:
        return next(s for s in self.scores if (s.scheme, s.held_out, s.target) == (scheme, held_out, target))

    def pooled(self, scheme: str, target: str) -> SplitScores:
        return self.split(scheme, POOLED, target)

    def worst_ratio(self, target: str = "gpu_util", schemes: tuple[str, ...] = ("source", "gpu")) -> float:
        """The transfer score: the largest model-over-mean MAE ratio on any single held-out source or
        GPU type (nan when no such split exists)."""
        ratios = [s.ratio() for s in self.scores if s.scheme in schemes and s.held_out != POOLED and s.target == target]
        ratios = [r for r in ratios if not math.isnan(r)]
        return max(ratios) if ratios else float("nan")

    def table(self) -> str:
        """Markdown: every split's scores of the mean predictor, the prior and the model."""
        lines = [
            "Held-out evaluation: each row is predicted by models fitted without its held-out value "
            f"(utilization in points, memory in MiB; the paper reports utilization RMSLE {PAPER_UTIL_RMSLE}).",
            "",
            "| held out | target | rows | MAE mean | MAE prior | MAE model | model/mean | RMSLE mean | RMSLE prior | "
            "RMSLE model | MAPE mean | MAPE prior | MAPE model |",
            "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for s in self.scores:
            label = f"**{s.scheme}: all**" if s.held_out == POOLED else f"{s.scheme}: {s.held_out}"
            lines.append(
                f"| {label} | {s.target} | {s.model.n} | {s.mean.mae:.1f} | {s.prior.mae:.1f} | {s.model.mae:.1f} | "
                f"{s.ratio():.2f} | {s.mean.rmsle:.3f} | {s.prior.rmsle:.3f} | "
                f"{s.model.rmsle:.3f} | {s.mean.mape:.1f} % | {s.prior.mape:.1f} % | {s.model.mape:.1f} % |"
            )
        return "\n".join(lines) + "\n"

    def metrics(self) -> dict[str, float]:
        """Flat names for MLflow: ``heldout.<scheme>.<target>.<predictor>.<metric>`` (pooled) and
        ``transfer.gpu_util.worst_mae_ratio``."""
        out: dict[str, float] = {}
        for s in self.scores:
            if s.held_out != POOLED:
                continue
            for who in PREDICTORS:
                scores = getattr(s, who)
                for metric in ("mae", "rmsle", "mape", "r2"):
                    value = getattr(scores, metric)
                    if not math.isnan(value):
                        out[f"heldout.{s.scheme}.{s.target}.{who}.{metric}"] = value
        worst = self.worst_ratio()
        if not math.isnan(worst):
            out["transfer.gpu_util.worst_mae_ratio"] = worst
        return out


def evaluate(rows: pd.DataFrame, hyperparameters: Hyperparameters | None = None,
             schemes: tuple[str, ...] = tuple(SCHEMES)) -> Evaluation:
    """Hold out each value of each scheme in turn (``source``, ``gpu``, ``family``); a scheme with one
    value in the data cannot be held out and is skipped."""
    unknown = [s for s in schemes if s not in SCHEMES]
    if unknown:
        raise HorusError(f"unknown split scheme {', '.join(unknown)}; accepted: {', '.join(SCHEMES)}")
    usable = tuple(s for s in schemes if rows[SCHEMES[s]].astype(str).nunique() >= 2)
    if not usable:
        raise HorusError(
            f"evaluation needs at least two values of a split column ({', '.join(SCHEMES[s] for s in schemes)}); "
            "the data has one of each"
        )
    hyper = hyperparameters or Hyperparameters()
    frames = []
    for scheme in usable:
        column = rows[SCHEMES[scheme]].astype(str)
        for value in sorted(column.unique()):
            train, test = rows[column != value], rows[column == value]
            frames.append(_predict_held_out(train, test, hyper).assign(scheme=scheme, held_out=value))
    return _scored(usable, pd.concat(frames, ignore_index=True))


def evaluate_source(train: pd.DataFrame, test: pd.DataFrame, name: str,
                    hyperparameters: Hyperparameters | None = None) -> Evaluation:
    """Models fitted on every ``train`` row, scored on another source's rows (held out as ``name``): how the
    shipped champion does on measurements it never saw."""
    predicted = _predict_held_out(train, test, hyperparameters or Hyperparameters())
    return _scored(("source",), predicted.assign(scheme="source", held_out=name), pooled=False)


def _scored(schemes: tuple[str, ...], predictions: pd.DataFrame, pooled: bool = True) -> Evaluation:
    scores = []
    for scheme in schemes:
        of_scheme = predictions[predictions["scheme"] == scheme]
        for target in TARGETS:
            known = of_scheme[of_scheme[target].notna()]
            if known.empty:
                continue
            for held_out, group in [*sorted(known.groupby("held_out")), *([(POOLED, known)] if pooled else [])]:
                truth = group[target].to_numpy(dtype=float)
                scores.append(SplitScores(scheme, str(held_out), target,
                                          *(Scores.of(truth, group[f"{who}.{target}"].to_numpy(dtype=float)) for who in PREDICTORS)))
    return Evaluation(schemes, tuple(scores), predictions)


def _predict_held_out(train: pd.DataFrame, test: pd.DataFrame, hyper: Hyperparameters) -> pd.DataFrame:
    model = UtilizationModel(hyper).fit(train)
    design = design_matrix(test, model.prior)
    predicted = model.predict_design(design)
    prior = UtilizationModel(hyper, model.prior).predict_design(design)
    frame = test[["origin", "origin_ref", "family", "model", "gpu_type", "batch_size", *TARGETS]].reset_index(drop=True)
    for target in TARGETS:
        seen = train[target].dropna()
        frame[f"mean.{target}"] = float(seen.mean()) if len(seen) else np.nan
        frame[f"model.{target}"] = predicted[target].to_numpy()
        frame[f"prior.{target}"] = prior[target].to_numpy()
    return frame
