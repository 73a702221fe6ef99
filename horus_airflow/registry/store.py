"""The MLflow tracking store: a client for the configured URI and experiments created with their
artifacts under HORUS_HOME when the store is local."""

from __future__ import annotations

import os

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")

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
