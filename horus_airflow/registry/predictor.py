"""The predictor in MLflow: training runs (experiment ``horus-predictor-training``), the registered
model ``horus-gpu-utilization`` with aliases ``champion`` and ``challenger``, and the local cache the
operator keeps so that it predicts on when the tracking server cannot be reached.

A registered version is a pyfunc model whose artifacts are one ``mlflow.lightgbm`` model per target
plus ``predictor.json`` (hyperparameters, prior constants, rows per target). Loading it back goes
through the same :class:`~horus_airflow.predictor.model.UtilizationModel` the training used.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterator

import lightgbm
import mlflow
import pandas as pd
from mlflow.entities import RunStatus
from mlflow.exceptions import MlflowException
from mlflow.models import infer_signature
from mlflow.protos.databricks_pb2 import RESOURCE_DOES_NOT_EXIST, ErrorCode

from horus_airflow.predictor import AnalyticPrior
from horus_airflow.predictor.dataset import TARGETS, ValidatedData
from horus_airflow.predictor.evaluation import Evaluation, evaluate
from horus_airflow.predictor.model import DESIGN_COLUMNS, Hyperparameters, TrainedPredictor, UtilizationModel, design_matrix
from horus_airflow.registry.store import client, experiment_id
from horus_airflow.settings import Settings

log = logging.getLogger(__name__)

PREDICTOR_MODEL = "horus-gpu-utilization"
TRAINING_EXPERIMENT = "horus-predictor-training"
CHAMPION, CHALLENGER = "champion", "challenger"
_META_FILE = "predictor.json"
# A missing tracking server should cost seconds, not MLflow's default minutes of retries.
_QUICK_HTTP = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1", "MLFLOW_HTTP_REQUEST_TIMEOUT": "10"}

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


def train_predictor(
    settings: Settings,
    data: ValidatedData,
    source: str,
    hyperparameters: Hyperparameters | None = None,
    folds: int = 0,
    register: bool = True,
) -> TrainingOutcome:
    """Evaluate by held-out family, fit on every row, log the run and (optionally) register the model
    as ``challenger``, and as ``champion`` too when there is none yet. Fails before logging anything if
    the data cannot be evaluated; a run that breaks half-way is closed FAILED and nothing is registered."""
    hyper = hyperparameters or Hyperparameters()
    evaluation = evaluate(data.rows, hyper, folds)
    model = UtilizationModel(hyper).fit(data.rows)
    _use_store(settings)
    mlflow_client = client(settings)
    run = mlflow_client.create_run(experiment_id(mlflow_client, settings, TRAINING_EXPERIMENT), run_name="train-predictor",
                                   tags={"horus.run_kind": "predictor-training", "horus.data_source": source})
    run_id = run.info.run_id
    try:
        with mlflow.start_run(run_id=run_id):
            _log_training(data, source, hyper, evaluation, model)
            logged = _log_model(model, data)
        mlflow_client.set_terminated(run_id, RunStatus.to_string(RunStatus.FINISHED))
    except BaseException:
        mlflow_client.set_terminated(run_id, RunStatus.to_string(RunStatus.FAILED))
        raise
    version, aliases = None, ()
    if register:
        version, aliases = _register(settings, logged.model_uri, run_id)
    return TrainingOutcome(run_id, version, aliases, evaluation, dict(model.trained_rows), len(data.rejected))


def promote(settings: Settings, version: str, alias: str = CHAMPION) -> None:
    client(settings).set_registered_model_alias(PREDICTOR_MODEL, alias, version)
    log.info("%s version %s is now %s", PREDICTOR_MODEL, version, alias)


def champion_version(settings: Settings) -> str | None:
    """The champion's version number, or None when none is registered."""
    try:
        return str(client(settings).get_model_version_by_alias(PREDICTOR_MODEL, CHAMPION).version)
    except MlflowException as exc:
        if exc.error_code == ErrorCode.Name(RESOURCE_DOES_NOT_EXIST):
            return None
        raise


def load_predictor(settings: Settings) -> Predictor:
    """The champion, from the local cache when it already holds that version. When the tracking server
    cannot be reached, the cached champion (with a warning); with neither, the analytic prior, saying why."""
    cache = settings.home / "models" / PREDICTOR_MODEL
    try:
        with _quick_http():
            version = client(settings).get_model_version_by_alias(PREDICTOR_MODEL, CHAMPION)
    except MlflowException as exc:
        if exc.error_code == ErrorCode.Name(RESOURCE_DOES_NOT_EXIST):
            return _prior(f"no {CHAMPION} of {PREDICTOR_MODEL} registered")
        return _cached_or_prior(cache, f"{type(exc).__name__}: {exc.message[:200]}")
    except Exception as exc:  # connection errors surface as requests/urllib3 types
        return _cached_or_prior(cache, f"{type(exc).__name__}: {str(exc)[:200]}")
    number = str(version.version)  # an int on SQL stores, a string over REST
    folder = cache / f"v{number}"
    if not (folder / "artifacts" / _META_FILE).is_file():
        _download(settings, number, folder)
    _write_atomically(cache / "champion.json", json.dumps({"version": number, "run_id": version.run_id}))
    return TrainedPredictor(_load_cached(folder), f"{PREDICTOR_MODEL}/{number}")


def _prior(reason: str) -> AnalyticPrior:
    log.info("using the analytic prior: %s", reason)
    return AnalyticPrior(notes=(f"analytic prior: {reason}",))


def _cached_or_prior(cache: Path, error: str) -> Predictor:
    pointer = cache / "champion.json"
    if pointer.is_file():
        version = json.loads(pointer.read_text())["version"]
        folder = cache / f"v{version}"
        if (folder / "artifacts" / _META_FILE).is_file():
            log.warning("MLflow registry unreachable (%s); predicting with cached %s version %s", error, PREDICTOR_MODEL, version)
            return TrainedPredictor(_load_cached(folder), f"{PREDICTOR_MODEL}/{version}",
                                    notes=(f"registry unreachable, cached {CHAMPION} v{version}",))
    log.warning("MLflow registry unreachable (%s) and no cached %s; using the analytic prior", error, CHAMPION)
    return _prior(f"registry unreachable ({error}) and no cached {CHAMPION}")


_LOADED: dict[Path, UtilizationModel] = {}


def _load_cached(folder: Path) -> UtilizationModel:
    if folder not in _LOADED:
        artifacts = folder / "artifacts"
        _LOADED[folder] = _model_from_artifacts({p.name: p for p in artifacts.iterdir()})
    return _LOADED[folder]


def _model_from_artifacts(artifacts: dict[str, Path]) -> UtilizationModel:
    meta = json.loads(artifacts[_META_FILE].read_text())
    model = UtilizationModel(Hyperparameters(**meta["hyperparameters"]), AnalyticPrior(**meta["prior"]))
    model.regressors = {t: mlflow.lightgbm.load_model(str(artifacts[t])) for t in meta["trained_rows"]}
    model.trained_rows = meta["trained_rows"]
    return model


def _download(settings: Settings, version: str, folder: Path) -> None:
    """Download into a temporary sibling, then rename: a half-downloaded version is never used."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
    try:
        with _quick_http():
            source = client(settings).get_model_version_download_uri(PREDICTOR_MODEL, version)
            downloaded = mlflow.artifacts.download_artifacts(
                artifact_uri=source, dst_path=str(staging), tracking_uri=settings.mlflow_tracking_uri
            )
        shutil.rmtree(folder, ignore_errors=True)
        os.replace(downloaded, folder)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _log_training(data: ValidatedData, source: str, hyper: Hyperparameters, evaluation: Evaluation,
                  model: UtilizationModel) -> None:
    rows = data.rows
    mlflow.log_params({
        **{f"hp.{k}": v for k, v in asdict(hyper).items()},
        "data.source": source,
        "data.rows": len(rows),
        "data.rejected_rows": len(data.rejected),
        "data.families": ",".join(evaluation.families)[:500],
        "data.origins": ",".join(sorted(rows["origin"].astype(str).unique()))[:500],
        "data.gpu_types": ",".join(sorted(rows["gpu_type"].astype(str).unique())),
        "cv.folds": evaluation.folds,
        **{f"trained_rows.{t}": model.trained_rows.get(t, 0) for t in TARGETS},
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
                "trained_rows": model.trained_rows}
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


def _register(settings: Settings, model_uri: str, run_id: str) -> tuple[str, tuple[str, ...]]:
    mlflow_client = client(settings)
    with contextlib.suppress(MlflowException):
        mlflow_client.create_registered_model(PREDICTOR_MODEL, description="Horus GPU utilization and memory predictor")
    version = mlflow_client.create_model_version(PREDICTOR_MODEL, model_uri, run_id=run_id).version
    aliases = [CHALLENGER]
    try:
        mlflow_client.get_model_version_by_alias(PREDICTOR_MODEL, CHAMPION)
    except MlflowException:
        aliases.append(CHAMPION)
    for alias in aliases:
        mlflow_client.set_registered_model_alias(PREDICTOR_MODEL, alias, version)
    log.info("registered %s version %s as %s", PREDICTOR_MODEL, version, ", ".join(aliases))
    return str(version), tuple(aliases)


def _use_store(settings: Settings) -> None:
    mlflow.set_tracking_uri(settings.mlflow_tracking_uri)
    mlflow.set_registry_uri(settings.mlflow_tracking_uri)


@contextlib.contextmanager
def _quick_http() -> Iterator[None]:
    """Few retries and a short timeout for one registry call, unless the user set their own."""
    added = {k: v for k, v in _QUICK_HTTP.items() if k not in os.environ}
    os.environ.update(added)
    try:
        yield
    finally:
        for key in added:
            os.environ.pop(key, None)


def _write_atomically(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = path.with_suffix(".tmp")
    staging.write_text(text)
    os.replace(staging, path)

