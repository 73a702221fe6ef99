"""The interference model in MLflow: training runs (experiment ``horus-interference-training``) and the
registered model ``horus-interference`` under the same alias scheme as the predictor.

A registered version is a pyfunc model (pair design rows in, ``speed`` and ``fits`` out) whose artifacts
are the two ``mlflow.lightgbm`` models, ``curve.json``, the fallback proxy's fitted curve, and
``support.json``, the training jobs' signatures (a version without it answers for every job).
"""

from __future__ import annotations

import json
import logging
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import lightgbm
import mlflow
import numpy as np
import pandas as pd
from mlflow.models import infer_signature

from horus_airflow.interference import LearnedInterference, SummedUtilization
from horus_airflow.interference.learned import Support
from horus_airflow.interference.base import InterferenceModel
from horus_airflow.interference.evaluation import (
    SplitScores,
    evaluate_interference,
    scores_table,
)
from horus_airflow.interference.pairs import DESIGN_COLUMNS, design_matrix
from horus_airflow.registry import versions
from horus_airflow.registry.store import logged_run
from horus_airflow.settings import Settings
from horus_airflow.run_schema import Experiment, Tag

log = logging.getLogger(__name__)

INTERFERENCE_MODEL = "horus-interference"
_CURVE_FILE = "curve.json"
_SUPPORT_FILE = "support.json"


class InterferencePyfunc(mlflow.pyfunc.PythonModel):  # type: ignore[misc]
    """pyfunc face of a registered version: pair design rows in, speed and fits out."""

    def load_context(self, context: Any) -> None:
        self.model = _model_from_artifacts({k: Path(v) for k, v in context.artifacts.items()})

    def predict(self, context: Any, model_input: pd.DataFrame, params: dict[str, Any] | None = None) -> pd.DataFrame:
        speed, fits = self.model.predict_pairs(model_input[list(DESIGN_COLUMNS)].to_numpy(dtype=float))
        return pd.DataFrame({"speed": speed, "fits": fits})


@dataclass(frozen=True)
class InterferenceTrainingOutcome:
    run_id: str
    version: str | None
    aliases: tuple[str, ...]
    scores: list[SplitScores]
    model: LearnedInterference | None = field(default=None, compare=False, repr=False)


def train_interference(settings: Settings, pairs: pd.DataFrame, source: str, register: bool = True) -> InterferenceTrainingOutcome:
    """Evaluate (job types and GPU types held out), fit on every pair, log, and register as challenger
    (and champion when there is none)."""
    scores = evaluate_interference(pairs)
    model = LearnedInterference().fit(pairs)
    tags = {Tag.RUN_KIND: "interference-training", Tag.DATA_SOURCE: source}
    with logged_run(settings, Experiment.INTERFERENCE_TRAINING, "train-interference", tags) as run_id:
        mlflow.log_params({"data.source": source, "data.pairs": len(pairs), "data.pairs_that_ran": int(pairs["fits"].sum()),
                           "data.gpu_types": ",".join(sorted(pairs["gpu_type"].unique())),
                           "data.job_types": ",".join(sorted(pairs["family_a"].unique()))})
        mlflow.log_metrics({
            f"heldout.{s.scheme.replace(' ', '_')}.{who}.{metric}": getattr(s, f"{who}_{metric}")
            for s in scores if s.held_out == "all"
            for who in ("proxy", "learned") for metric in ("mae", "spearman", "fit_accuracy")
            if not np.isnan(getattr(s, f"{who}_{metric}"))
        })
        mlflow.log_input(mlflow.data.from_pandas(pairs, source=source, targets="speed_a", name="colocation-pairs"),
                         context="training")
        mlflow.log_text(scores_table(scores), "evaluation/scores.md")
        logged = _log_model(model, pairs)
    version, aliases = None, ()
    if register:
        version, aliases = versions.register_version(settings, INTERFERENCE_MODEL, logged.model_uri, run_id,
                                                     "Horus co-location interference model", logged.model_id)
    return InterferenceTrainingOutcome(run_id, version, aliases, scores, model)


def load_interference(settings: Settings) -> tuple[InterferenceModel, str]:
    """The champion (cached as the predictor's is) and its label; without one, the uncalibrated
    summed-utilization proxy, and a label that says so."""
    found = versions.fetch_champion(settings, INTERFERENCE_MODEL)
    if isinstance(found, versions.NoChampion):
        return SummedUtilization(), f"summed-utilization default curve ({found.reason})"
    label = found.label + (f" ({'; '.join(found.notes)})" if found.notes else "")
    return found.load(_model_from_artifacts), label


def _model_from_artifacts(artifacts: dict[str, Path]) -> LearnedInterference:
    curve = json.loads(artifacts[_CURVE_FILE].read_text())
    support = None
    if _SUPPORT_FILE in artifacts:
        kept = json.loads(artifacts[_SUPPORT_FILE].read_text())
        support = Support(np.array(kept["signatures"], dtype=float), np.array(kept["scale"], dtype=float))
    return LearnedInterference(
        speed_model=mlflow.lightgbm.load_model(str(artifacts["speed"])),
        fit_model=mlflow.lightgbm.load_model(str(artifacts["fits"])),
        fallback=SummedUtilization(tuple(curve["util"]), tuple(curve["speed"])),
        support=support,
    )


def _log_model(model: LearnedInterference, pairs: pd.DataFrame) -> Any:
    design = pd.DataFrame(design_matrix(pairs.head(20)), columns=list(DESIGN_COLUMNS))
    requirements = [f"lightgbm=={lightgbm.__version__}"]
    with tempfile.TemporaryDirectory() as tmp:
        artifacts = {}
        for key, estimator in (("speed", model.speed_model), ("fits", model.fit_model)):
            path = Path(tmp) / key
            mlflow.lightgbm.save_model(estimator, str(path), pip_requirements=requirements,
                                       signature=infer_signature(design, estimator.predict(design.to_numpy())))
            artifacts[key] = str(path)
        curve = Path(tmp) / _CURVE_FILE
        curve.write_text(json.dumps({"util": model.fallback.curve_util, "speed": model.fallback.curve_speed}))
        artifacts[_CURVE_FILE] = str(curve)
        if model.support is not None:
            support = Path(tmp) / _SUPPORT_FILE
            support.write_text(json.dumps({"signatures": model.support.signatures.tolist(), "scale": model.support.scale.tolist()}))
            artifacts[_SUPPORT_FILE] = str(support)
        speed, fits = model.predict_pairs(design.to_numpy())
        return mlflow.pyfunc.log_model(
            name="interference", python_model=InterferencePyfunc(), artifacts=artifacts,
            signature=infer_signature(design, pd.DataFrame({"speed": speed, "fits": fits})),
            input_example=design.head(2),
            pip_requirements=[*requirements, f"pandas=={pd.__version__}", f"mlflow=={mlflow.__version__}", "horus-airflow"],
        )


__all__ = ["INTERFERENCE_MODEL", "InterferenceTrainingOutcome", "load_interference", "train_interference"]
