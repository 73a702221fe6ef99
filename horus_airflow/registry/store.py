"""The MLflow tracking store: a client for the configured URI with explicit HTTP retry settings, the
one search helper, and experiments created with their artifacts under HORUS_HOME when the store is
local."""

from __future__ import annotations

import os

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")

import contextlib  # noqa: E402
import contextvars  # noqa: E402
import functools  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from typing import Any, Iterator  # noqa: E402

import mlflow  # noqa: E402
from mlflow.entities import Run, RunStatus  # noqa: E402
from mlflow.environment_variables import MLFLOW_HTTP_REQUEST_MAX_RETRIES, MLFLOW_HTTP_REQUEST_TIMEOUT  # noqa: E402
from mlflow.exceptions import MlflowException  # noqa: E402
from mlflow.tracking import MlflowClient  # noqa: E402

from horus_airflow.settings import Settings  # noqa: E402


@dataclass(frozen=True)
class HttpPolicy:
    """How hard an MLflow call tries a tracking server. A variable the user set
    (``MLFLOW_HTTP_REQUEST_MAX_RETRIES``, ``MLFLOW_HTTP_REQUEST_TIMEOUT``) wins over any policy."""

    max_retries: int
    timeout_s: int


FULL_RETRIES: HttpPolicy | None = None  # MLflow's own defaults: 7 retries, 120 s per request
QUICK = HttpPolicy(max_retries=1, timeout_s=10)  # a missing server should cost seconds, not minutes

_POLICY: contextvars.ContextVar[HttpPolicy | None] = contextvars.ContextVar("horus_mlflow_http_policy", default=None)


def _read_with_policy(variable: Any, field: str) -> None:
    """MLflow reads its retry settings from the environment on every request; a policy set for this
    thread or task (a context variable) answers first. Unlike changing ``os.environ``, that does not
    leak into the UI's other worker threads."""
    read_environment = variable.get

    def get() -> Any:
        policy = _POLICY.get()
        if policy is None or variable.is_set():
            return read_environment()
        return getattr(policy, field)

    variable.get = get


_read_with_policy(MLFLOW_HTTP_REQUEST_MAX_RETRIES, "max_retries")
_read_with_policy(MLFLOW_HTTP_REQUEST_TIMEOUT, "timeout_s")


@contextlib.contextmanager
def http_policy(policy: HttpPolicy | None) -> Iterator[None]:
    """Every MLflow call made inside (client or fluent API, in this thread) follows ``policy``."""
    token = _POLICY.set(policy)
    try:
        yield
    finally:
        _POLICY.reset(token)


class _PolicyClient(MlflowClient):
    """An MlflowClient whose every public call follows one :class:`HttpPolicy`."""

    def __init__(self, tracking_uri: str, policy: HttpPolicy) -> None:
        super().__init__(tracking_uri=tracking_uri, registry_uri=tracking_uri)
        self._policy = policy

    def __getattribute__(self, name: str) -> Any:
        attribute = super().__getattribute__(name)
        if name.startswith("_") or not callable(attribute):
            return attribute
        policy = super().__getattribute__("_policy")

        @functools.wraps(attribute)
        def call(*args: Any, **kwargs: Any) -> Any:
            with http_policy(policy):
                return attribute(*args, **kwargs)

        return call


def client(settings: Settings, policy: HttpPolicy | None = FULL_RETRIES) -> MlflowClient:
    """A client of the configured tracking server and registry; ``policy`` sets how hard its calls try
    (default: MLflow's full retries, for writes that must land)."""
    if policy is None:
        return MlflowClient(tracking_uri=settings.mlflow_tracking_uri, registry_uri=settings.mlflow_tracking_uri)
    return _PolicyClient(settings.mlflow_tracking_uri, policy)


def search(
    settings: Settings, experiment: str, filter_string: str = "", *, max_results: int | None = None,
    order_by: list[str] | None = None, policy: HttpPolicy | None = FULL_RETRIES,
) -> list[Run]:
    """Runs of one experiment, by name; none when the experiment does not exist yet. Without
    ``max_results`` every page is read."""
    mlflow_client = client(settings, policy)
    found = mlflow_client.get_experiment_by_name(experiment)
    if found is None:
        return []
    runs: list[Run] = []
    token = None
    while True:
        page_size = min(max_results - len(runs), 1000) if max_results is not None else 1000
        page = mlflow_client.search_runs([found.experiment_id], filter_string=filter_string, max_results=page_size,
                                         order_by=order_by, page_token=token)
        runs.extend(page)
        token = page.token
        if not token or (max_results is not None and len(runs) >= max_results):
            return runs


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
