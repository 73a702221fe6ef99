"""Evaluation on what neither model has seen: leave one job type out (train without any pair that
involves it, test on every pair that does) and leave one GPU type out (train on two, test on the third).
Both models, and the constant baseline (the training pairs' mean speed), are fitted on the same
training split and scored on the same held-out pairs."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy.stats import spearmanr

from horus_airflow.features.gpus import gpu_spec
from horus_airflow.interference.learned import LearnedInterference
from horus_airflow.interference.pairs import design_matrix
from horus_airflow.interference.proxy import SummedUtilization


@dataclass(frozen=True)
class SplitScores:
    scheme: str  # "job type" or "GPU type"
    held_out: str  # the held-out value, or "all" for the pooled scores of the scheme
    pairs: int
    constant_mae: float
    proxy_mae: float
    learned_mae: float
    proxy_spearman: float
    learned_spearman: float
    proxy_fit_accuracy: float
    learned_fit_accuracy: float


def evaluate_interference(pairs: pd.DataFrame) -> list[SplitScores]:
    scores: list[SplitScores] = []
    schemes = (
        ("job type", sorted(set(pairs["family_a"]))),
        ("GPU type", sorted(set(pairs["gpu_type"]))),
    )
    for scheme, values in schemes:
        held = []
        for value in values:
            if scheme == "job type":
                test_mask = (pairs["family_a"] == value) | (pairs["family_b"] == value)
                train = pairs[(pairs["family_a"] != value) & (pairs["family_b"] != value)]
            else:
                test_mask = pairs["gpu_type"] == value
                train = pairs[~test_mask]
            test = pairs[test_mask]
            predicted = _predict(train, test)
            held.append(predicted)
            scores.append(_score(scheme, value, predicted))
        scores.append(_score(scheme, "all", pd.concat(held, ignore_index=True)))
    return scores


def evaluate_source(train: pd.DataFrame, test: pd.DataFrame, name: str) -> SplitScores:
    """Both models and the constant fitted on every ``train`` pair, scored on another source's pairs."""
    return _score("source", name, _predict(train, test))


def _predict(train: pd.DataFrame, test: pd.DataFrame) -> pd.DataFrame:
    learned = LearnedInterference().fit(train)
    ran = train["fits"].to_numpy(dtype=bool)
    proxy = SummedUtilization().fit((train["util_a"] + train["util_b"]).to_numpy(dtype=float)[ran],
                                    train["speed_a"].to_numpy(dtype=float)[ran])
    speed, fits = learned.predict_pairs(design_matrix(test))
    out = test[["gpu_type", "family_a", "family_b", "speed_a", "fits"]].reset_index(drop=True)
    out["learned_speed"], out["learned_fits"] = speed, fits
    out["constant_speed"] = float(train.loc[ran, "speed_a"].mean())
    out["proxy_speed"] = proxy.speed_at((test["util_a"] + test["util_b"]).to_numpy(dtype=float))
    memory = test["gpu_type"].map(lambda name: gpu_spec(name).memory_mib).to_numpy(dtype=float)
    out["proxy_fits"] = (test["mem_a"] + test["mem_b"]).to_numpy(dtype=float) <= memory
    return out


def _score(scheme: str, held_out: str, predicted: pd.DataFrame) -> SplitScores:
    ran = predicted[predicted["fits"]]
    truth = ran["speed_a"].to_numpy(dtype=float)

    def spearman(values: np.ndarray) -> float:
        if len(truth) < 3 or np.ptp(values) == 0 or np.ptp(truth) == 0:
            return math.nan
        return float(spearmanr(truth, values).statistic)

    return SplitScores(
        scheme, held_out, len(predicted), float(np.abs(ran["constant_speed"] - truth).mean()),
        float(np.abs(ran["proxy_speed"] - truth).mean()), float(np.abs(ran["learned_speed"] - truth).mean()),
        spearman(ran["proxy_speed"].to_numpy()), spearman(ran["learned_speed"].to_numpy()),
        float((predicted["proxy_fits"] == predicted["fits"]).mean()),
        float((predicted["learned_fits"] == predicted["fits"]).mean()),
    )


def scores_table(scores: list[SplitScores]) -> str:
    lines = [
        "| held out | pairs | MAE constant | MAE proxy | MAE learned | learned/constant | Spearman proxy | Spearman learned | "
        "fit accuracy proxy | fit accuracy learned |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for s in scores:
        label = f"**{s.scheme}: all (pooled)**" if s.held_out == "all" else f"{s.scheme}: {s.held_out}"
        lines.append(
            f"| {label} | {s.pairs} | {s.constant_mae:.3f} | {s.proxy_mae:.3f} | {s.learned_mae:.3f} | "
            f"{s.learned_mae / s.constant_mae:.2f} | {s.proxy_spearman:.2f} | "
            f"{s.learned_spearman:.2f} | {s.proxy_fit_accuracy:.2f} | {s.learned_fit_accuracy:.2f} |"
        )
    return "\n".join(lines) + "\n"
