"""The MLflow tracking store: a client for the configured URI and experiments created with their
artifacts under HORUS_HOME when the store is local."""

from __future__ import annotations

import os

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")

import contextlib  # noqa: E402
from typing import Iterator  # noqa: E402

import mlflow  # noqa: E402
from mlflow.entities import RunStatus  # noqa: E402
from mlflow.exceptions import MlflowException  # noqa: E402
from mlflow.tracking import MlflowClient  # noqa: E402

from horus_airflow.settings import Settings  # noqa: E402


def client(settings: Settings) -> MlflowClient:
    return MlflowClient(tracking_uri=settings.mlflow_tracking_uri, registry_uri=settings.mlflow_tracking_uri)


def experiment_id(mlflow: MlflowClient, settings: Settings, name: str) -> str:
    """Get or create the experiment, keeping its artifacts under HORUS_HOME for local stores."""
    existing = mlflow.get_experiment_by_name(name)
    if existing is not None:
        return existing.experiment_id
    location = settings.mlflow_artifact_root.as_uri() if is_local(settings.mlflow_tracking_uri) else None
    try:
        return mlflow.create_experiment(name, artifact_location=location)
    except MlflowException:  # another worker created it first
        found = mlflow.get_experiment_by_name(name)
        if found is None:
            raise
        return found.experiment_id


def is_local(uri: str) -> bool:
    return uri.startswith(("sqlite:", "file:")) or "://" not in uri


@contextlib.contextmanager
def logged_run(settings: Settings, experiment: str, run_name: str, tags: dict[str, str]) -> Iterator[str]:
    """An active MLflow run for the fluent logging API (``log_model`` needs one), closed FINISHED, or
    FAILED if anything inside raises: no run is left open half-written."""
    mlflow.set_tracking_uri(settings.mlflow_tracking_uri)
    mlflow.set_registry_uri(settings.mlflow_tracking_uri)
    mlflow_client = client(settings)
    run = mlflow_client.create_run(experiment_id(mlflow_client, settings, experiment), run_name=run_name, tags=tags)
    run_id = run.info.run_id
    try:
        with mlflow.start_run(run_id=run_id):
            yield run_id
    except BaseException:
        mlflow_client.set_terminated(run_id, RunStatus.to_string(RunStatus.FAILED))
        raise
    mlflow_client.set_terminated(run_id, RunStatus.to_string(RunStatus.FINISHED))
