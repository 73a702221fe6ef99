"""The predictor in MLflow: training runs (experiment ``horus-predictor-training``), the registered
model ``horus-gpu-utilization`` with aliases ``champion`` and ``challenger``, and the local cache the
operator keeps so that it predicts on when the tracking server cannot be reached.

A registered version is a pyfunc model whose artifacts are one ``mlflow.lightgbm`` model per target
plus ``predictor.json`` (hyperparameters, prior constants, rows per target). Loading it back goes
through the same :class:`~horus_airflow.predictor.model.UtilizationModel` the training used.
"""

from __future__ import annotations

import json
import logging
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import lightgbm
import mlflow
import pandas as pd
from mlflow.models import infer_signature

from horus_airflow.errors import HorusError
from horus_airflow.predictor import AnalyticPrior
from horus_airflow.predictor.dataset import TARGETS, ValidatedData
from horus_airflow.predictor.evaluation import SCHEMES, Evaluation, evaluate
from horus_airflow.predictor.model import (
    DESIGN_COLUMNS,
    Hyperparameters,
    TrainedPredictor,
    UtilizationModel,
    design_matrix,
)
from horus_airflow.registry import versions
from horus_airflow.registry.store import logged_run
from horus_airflow.registry.versions import CHAMPION
from horus_airflow.settings import Settings
from horus_airflow.run_schema import Experiment, Tag

log = logging.getLogger(__name__)

PREDICTOR_MODEL = "horus-gpu-utilization"
_META_FILE = "predictor.json"

Predictor = AnalyticPrior | TrainedPredictor


class PredictorPyfunc(mlflow.pyfunc.PythonModel):  # type: ignore[misc]
    """pyfunc face of a registered version: design-matrix rows in, one column per target out."""

    def load_context(self, context: Any) -> None:
        self.model = _model_from_artifacts({k: Path(v) for k, v in context.artifacts.items()})

    def predict(self, context: Any, model_input: pd.DataFrame, params: dict[str, Any] | None = None) -> pd.DataFrame:
        return self.model.predict_design(model_input[list(DESIGN_COLUMNS)])


@dataclass(frozen=True)
class TrainingOutcome:
    run_id: str
    version: str | None
    aliases: tuple[str, ...]
    evaluation: Evaluation
    trained_rows: dict[str, int]
    rejected_rows: int
    model: UtilizationModel = field(default_factory=UtilizationModel, compare=False, repr=False)


def train_predictor(
    settings: Settings,
    data: ValidatedData,
    source: str,
    hyperparameters: Hyperparameters | None = None,
    schemes: tuple[str, ...] = tuple(SCHEMES),
    register: bool = True,
) -> TrainingOutcome:
    """Evaluate on held-out sources, GPU types and families, fit on every row, log the run and (optionally) register the model
    as ``challenger``, and as ``champion`` too when there is none yet. Fails before logging anything if
    the data cannot be evaluated; a run that breaks half-way is closed FAILED and nothing is registered."""
    hyper = hyperparameters or Hyperparameters()
    evaluation = evaluate(data.rows, hyper, schemes)
    model = UtilizationModel(hyper).fit(data.rows)
    tags = {Tag.RUN_KIND: "predictor-training", Tag.DATA_SOURCE: source}
    with logged_run(settings, Experiment.PREDICTOR_TRAINING, "train-predictor", tags) as run_id:
        _log_training(data, source, hyper, evaluation, model)
        logged = _log_model(model, data)
    version, aliases = None, ()
    if register:
        version, aliases = versions.register_version(
            settings, PREDICTOR_MODEL, logged.model_uri, run_id, "Horus GPU utilization and memory predictor", logged.model_id
        )
    return TrainingOutcome(run_id, version, aliases, evaluation, dict(model.trained_rows), len(data.rejected), model)


def promote(settings: Settings, version: str, alias: str = CHAMPION) -> None:
    versions.promote(settings, PREDICTOR_MODEL, version, alias)


def champion_version(settings: Settings) -> str | None:
    return versions.champion_version(settings, PREDICTOR_MODEL)


def load_predictor(settings: Settings) -> Predictor:
    """The champion, from the local cache when it already holds that version. When the tracking server
    cannot be reached, the cached champion (with a warning); with neither, the analytic prior, saying why."""
    found = versions.fetch_champion(settings, PREDICTOR_MODEL)
    if isinstance(found, versions.NoChampion):
        log.info("using the analytic prior: %s", found.reason)
        return AnalyticPrior(notes=(f"analytic prior: {found.reason}",))
    try:
        return TrainedPredictor(found.load(_model_from_artifacts), found.label, notes=found.notes)
    except IncompatibleModelError as exc:
        log.warning("using the analytic prior: %s", exc)
        return AnalyticPrior(notes=(f"analytic prior: {exc}",))


class IncompatibleModelError(HorusError):
    """A registered version whose design columns are not this release's (trained by an older one)."""


def _model_from_artifacts(artifacts: dict[str, Path]) -> UtilizationModel:
    meta = json.loads(artifacts[_META_FILE].read_text())
    if meta.get("design_columns") != list(DESIGN_COLUMNS):
        raise IncompatibleModelError(
            f"the {CHAMPION} of {PREDICTOR_MODEL} was trained on another feature set than this release computes; "
            "train a new version (horus predictor train, or the retraining DAG) and promote it"
        )
    model = UtilizationModel(Hyperparameters(**meta["hyperparameters"]), AnalyticPrior(**meta["prior"]))
    model.regressors = {t: mlflow.lightgbm.load_model(str(artifacts[t])) for t in meta["trained_rows"]}
    model.trained_rows = meta["trained_rows"]
    model.gpu_types = tuple(meta["gpu_types"])
    model.shrinkage = meta.get("shrinkage", {})  # a version from before shrinkage applied its corrections whole
    return model


def _log_training(data: ValidatedData, source: str, hyper: Hyperparameters, evaluation: Evaluation,
                  model: UtilizationModel) -> None:
    rows = data.rows
    mlflow.log_params({
        **{f"hp.{k}": v for k, v in asdict(hyper).items()},
        "data.source": source,
        "data.rows": len(rows),
        "data.rejected_rows": len(data.rejected),
        "data.families": ",".join(sorted(rows["family"].astype(str).unique()))[:500],
        "data.origins": ",".join(sorted(rows["origin"].astype(str).unique()))[:500],
        "data.gpu_types": ",".join(sorted(rows["gpu_type"].astype(str).unique())),
        "heldout.schemes": ",".join(evaluation.schemes),
        **{f"trained_rows.{t}": model.trained_rows.get(t, 0) for t in TARGETS},
        **{f"shrinkage.{t}": w for t, w in model.shrinkage.items()},
    })
    mlflow.log_metrics(evaluation.metrics())
    mlflow.log_input(mlflow.data.from_pandas(rows, source=source, targets="gpu_util", name="predictor-training-data"),
                     context="training")
    mlflow.log_table(evaluation.predictions, artifact_file="evaluation/heldout_predictions.json")
    mlflow.log_text(evaluation.table(), "evaluation/scores.md")
    if len(data.rejected):
        mlflow.log_table(data.rejected, artifact_file="data/rejected_rows.json")


def _log_model(model: UtilizationModel, data: ValidatedData) -> Any:
    design = design_matrix(data.rows.head(20), model.prior).astype(float)
    with tempfile.TemporaryDirectory() as tmp:
        artifacts = {}
        for target, regressor in model.regressors.items():
            path = Path(tmp) / target
            mlflow.lightgbm.save_model(regressor, str(path), signature=infer_signature(design, regressor.predict(design)),
                                       pip_requirements=[f"lightgbm=={lightgbm.__version__}"])
            artifacts[target] = str(path)
        meta = {"hyperparameters": asdict(model.hyperparameters), "prior": {k: v for k, v in asdict(model.prior).items() if k != "notes"},
                "trained_rows": model.trained_rows, "gpu_types": list(model.gpu_types),
                "shrinkage": model.shrinkage, "design_columns": list(DESIGN_COLUMNS)}
        (Path(tmp) / _META_FILE).write_text(json.dumps(meta, indent=2))
        artifacts[_META_FILE] = str(Path(tmp) / _META_FILE)
        return mlflow.pyfunc.log_model(
            name="predictor",
            python_model=PredictorPyfunc(),
            artifacts=artifacts,
            signature=infer_signature(design, model.predict_design(design)),
            input_example=design.head(2),
            pip_requirements=[f"lightgbm=={lightgbm.__version__}", f"pandas=={pd.__version__}", f"mlflow=={mlflow.__version__}",
                              "horus-airflow"],
        )
