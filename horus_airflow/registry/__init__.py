"""MLflow at the edge: profiling runs, predictor training runs, the registered predictor and its cache."""

from horus_airflow.registry.interference import (
    INTERFERENCE_MODEL,
    load_interference,
    train_interference,
)
from horus_airflow.registry.predictor import (
    PREDICTOR_MODEL,
    TrainingOutcome,
    champion_version,
    load_predictor,
    promote,
    train_predictor,
)
from horus_airflow.registry.profiling import (
    ProfilingRecord,
    close_abandoned_runs,
    log_profiling_run,
    profiling_runs,
)
from horus_airflow.registry.store import (  # first: sets MLflow's defaults
    client,
    experiment_id,
)
from horus_airflow.registry.versions import CHALLENGER, CHAMPION  # noqa: I001

__all__ = [
    "CHALLENGER",
    "CHAMPION",
    "INTERFERENCE_MODEL",
    "PREDICTOR_MODEL",
    "ProfilingRecord",
    "TrainingOutcome",
    "champion_version",
    "client",
    "close_abandoned_runs",
    "experiment_id",
    "load_interference",
    "load_predictor",
    "log_profiling_run",
    "profiling_runs",
    "promote",
    "train_interference",
    "train_predictor",
]
