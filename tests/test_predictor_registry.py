"""The predictor in a real MLflow store (SQLite under a temporary HORUS_HOME): training runs, the
registered model and its aliases, the champion cache and the fallbacks when the registry is away."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from horus_airflow.features import extract_features
from horus_airflow.features.gpus import GPU_SPECS
from horus_airflow.predictor import AnalyticPrior
from horus_airflow.predictor.dataset import TrainingDataError, read_training_data, validate
from horus_airflow.predictor.model import TrainedPredictor
from horus_airflow.registry import (
    CHAMPION,
    PREDICTOR_MODEL,
    client,
    load_predictor,
    promote,
    train_predictor,
)
from horus_airflow.run_schema import Experiment
from horus_airflow.settings import Settings

SEED = Path(__file__).resolve().parent.parent / "data" / "predictor_seed" / "predictor_seed.csv"


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.mark.integration
def test_training_registers_versions_and_aliases(horus_home: Path) -> None:
    settings = Settings.from_env()
    data = read_training_data(SEED)
    first = train_predictor(settings, data, str(SEED))
    assert first.version == "1" and set(first.aliases) == {"champion", "challenger"}
    second = train_predictor(settings, data, str(SEED))
    assert second.version == "2" and second.aliases == ("challenger",)
    mlflow = client(settings)
    assert str(mlflow.get_model_version_by_alias(PREDICTOR_MODEL, CHAMPION).version) == "1"
    promote(settings, "2")
    assert str(mlflow.get_model_version_by_alias(PREDICTOR_MODEL, CHAMPION).version) == "2"

    run = mlflow.get_run(first.run_id)
    assert run.info.status == "FINISHED"
    assert run.data.params["data.rows"] == "57" and run.data.params["trained_rows.gpu_mem_mib"] == "0"
    assert run.data.metrics["heldout.source.gpu_util.model.rmsle"] == pytest.approx(
        first.evaluation.pooled("source", "gpu_util").model.rmsle)
    assert run.data.metrics["transfer.gpu_util.worst_mae_ratio"] == pytest.approx(first.evaluation.worst_ratio())
    assert [i.dataset.name for i in run.inputs.dataset_inputs] == ["predictor-training-data"]
    version = mlflow.get_model_version(PREDICTOR_MODEL, "1")
    assert version.run_id == first.run_id


@pytest.mark.integration
def test_bad_training_data_logs_and_registers_nothing(horus_home: Path) -> None:
    settings = Settings.from_env()
    one_family = read_training_data(SEED).rows.query("family == 'resnet' and origin == 'alnair'")
    with pytest.raises(Exception, match="at least two values of a split column"):
        train_predictor(settings, validate(one_family), "resnet-only")
    with pytest.raises(TrainingDataError):
        validate(pd.DataFrame({"origin": ["x"]}))
    mlflow = client(settings)
    experiment = mlflow.get_experiment_by_name(Experiment.PREDICTOR_TRAINING)
    assert experiment is None or mlflow.search_runs([experiment.experiment_id]) == []
    assert mlflow.search_registered_models() == []


@pytest.mark.integration
def test_the_operator_side_loads_the_champion_then_its_cache_then_the_prior(
    horus_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = Settings.from_env()
    nothing = load_predictor(settings)
    assert isinstance(nothing, AnalyticPrior)
    features = extract_features("resnet50", 32)
    assert "no champion of horus-gpu-utilization registered" in nothing.predict("j", features, 1, [GPU_SPECS["v100"]]).explained()

    train_predictor(settings, read_training_data(SEED), str(SEED))
    champion = load_predictor(settings)
    assert isinstance(champion, TrainedPredictor) and champion.name == f"{PREDICTOR_MODEL}/1"
    assert (horus_home / "models" / PREDICTOR_MODEL / "v1" / "artifacts" / "predictor.json").is_file()
    online = champion.predict("j", features, 1, [GPU_SPECS["v100"]]).on("v100")

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://127.0.0.1:{_closed_port()}")
    offline = load_predictor(Settings.from_env())
    assert isinstance(offline, TrainedPredictor) and offline.name == f"{PREDICTOR_MODEL}/1"
    demand = offline.predict("j", features, 1, [GPU_SPECS["v100"]])
    assert demand.on("v100") == online and "registry unreachable, cached champion v1" in demand.explained()

    monkeypatch.setenv("HORUS_HOME", str(horus_home.parent / "elsewhere"))
    bare = load_predictor(Settings.from_env())
    assert isinstance(bare, AnalyticPrior)
    assert "registry unreachable" in bare.predict("j", features, 1, [GPU_SPECS["v100"]]).explained()


@pytest.mark.integration
def test_loading_the_champion_inside_airflow_warns_nothing(horus_home: Path) -> None:
    """skops finds a function's module by reading its name from every imported module, in import order;
    in a task, Airflow's deprecated aliases come first and each warns when read: 1,160 warnings went into
    every training task's log (half a minute of a task on a loaded machine)."""
    train_predictor(Settings.from_env(), read_training_data(SEED), str(SEED))
    task = (
        "import warnings\n"
        "import airflow.utils.timezone\n"  # imported before NumPy, as in a task process
        "from horus_airflow.registry import load_predictor\n"
        "from horus_airflow.settings import Settings\n"
        "with warnings.catch_warnings(record=True) as caught:\n"
        "    warnings.simplefilter('always')\n"
        "    print(type(load_predictor(Settings.from_env())).__name__)\n"
        "print(sum(issubclass(w.category, FutureWarning) for w in caught))\n"
    )
    done = subprocess.run([sys.executable, "-c", task], capture_output=True, text=True, check=True, timeout=300)
    assert done.stdout.split() == ["TrainedPredictor", "0"], done.stdout + done.stderr[-2000:]


@pytest.mark.integration
def test_many_workers_fetch_the_champion_at_once(horus_home: Path) -> None:
    """Workers placing at the same moment all fetch the champion: none may fail on another's staging file."""
    import threading

    from horus_airflow.registry.versions import fetch_champion

    settings = Settings.from_env()
    train_predictor(settings, read_training_data(SEED), str(SEED))
    results: list[object] = []

    def fetch() -> None:
        try:
            results.append(fetch_champion(settings, "horus-gpu-utilization"))
        except Exception as exc:  # noqa: BLE001 - asserted on below
            results.append(exc)

    threads = [threading.Thread(target=fetch) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert all(getattr(r, "version", None) == "1" for r in results), results
