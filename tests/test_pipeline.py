"""The operator's path without Airflow: bad input leaves no reservation and no MLflow run."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
from mlflow.entities import Run

from horus_airflow.backends import SqliteLedger
from horus_airflow.backends.ledger import Booking
from horus_airflow.errors import InvalidJobError, InventoryError, NoPlacementError
from horus_airflow.jobs import JobSpec
from horus_airflow.pipeline import run_job
from horus_airflow.predictor.dataset import read_training_data
from horus_airflow.registry import (
    client,
    experiment_id,
    train_predictor,
)
from horus_airflow.run_schema import Experiment, Metric, Param, Tag
from horus_airflow.settings import Settings


def _nothing_left(settings: Settings) -> None:
    if settings.ledger_path.exists():
        assert SqliteLedger(settings.ledger_path).active(now=0)[1] == {}
    mlflow = client(settings)
    assert mlflow.search_runs([e.experiment_id for e in mlflow.search_experiments()]) == []


@pytest.mark.integration
@pytest.mark.parametrize(
    ("inventory", "message"),
    [("2xa100", "unknown GPU type 'a100'"), ("two a100s", "does not parse"), ("0xt4", "count must be at least 1")],
)
def test_bad_inventory_fails_before_anything_is_reserved(
    horus_home: Path, monkeypatch: pytest.MonkeyPatch, inventory: str, message: str
) -> None:
    monkeypatch.setenv("HORUS_LOCAL_GPUS", inventory)
    settings = Settings.from_env()
    with pytest.raises(InventoryError, match=message) as error:
        run_job(JobSpec(model="mlp", batch_size=8), settings, owner="t")
    assert "COUNTxTYPE" in str(error.value) or "Accepted:" in str(error.value)
    _nothing_left(settings)


@pytest.mark.integration
def test_unknown_model_fails_before_anything_is_reserved(horus_home: Path) -> None:
    settings = Settings.from_env()
    with pytest.raises(InvalidJobError, match="Did you mean: resnet18"):
        run_job(JobSpec(model="resnet19", batch_size=8), settings, owner="t")
    _nothing_left(settings)


@pytest.mark.integration
def test_a_job_too_big_for_any_gpu_fails_at_once(horus_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HORUS_LOCAL_GPUS", "1xk80")
    settings = Settings.from_env()
    with pytest.raises(NoPlacementError, match="cannot fit even on idle GPUs"):
        run_job(JobSpec(model="resnet50", batch_size=512), settings, owner="t", placement_timeout_s=3600)
    _nothing_left(settings)


@pytest.mark.integration
def test_a_job_sharing_a_gpu_records_its_co_residents(horus_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HORUS_LOCAL_GPUS", "1xa100-80gb")
    settings = Settings.from_env()
    ledger = SqliteLedger(settings.ledger_path)
    ledger.reserve(0, "neighbour", "other-worker", [Booking("local/0", 40, 44, 2000)], now=time.time(), lease_s=600)
    outcome = run_job(JobSpec(model="mlp", batch_size=8, steps=2), settings, owner="t")
    assert outcome.exit_code == 0 and outcome.gpu_ids == ("local/0",)
    run = client(settings).get_run(outcome.mlflow_run_id)
    assert run.data.tags["horus.co_residents"] == "neighbour"
    assert "shares with 1 job(s)" in run.data.tags["horus.placement.reason"]
    assert [r.job_id for r in ledger.active(now=time.time())[1]["local/0"]] == ["neighbour"]
    _only_schema_names(run)


def _only_schema_names(run: Run) -> None:
    """Every name a profiling run carries is one the run schema lists (so readers can rely on it)."""
    def names(group: type) -> set[str]:
        return {v for k, v in vars(group).items() if k.isupper()}

    assert {k for k in run.data.tags if not k.startswith("mlflow.")} <= names(Tag)
    assert {k for k in run.data.params if not k.startswith(Param.FEATURE_PREFIX)} <= names(Param)
    assert {k for k in run.data.metrics if not k.startswith(Metric.JOB_PREFIX)} >= {Metric.DURATION_S}


@pytest.mark.integration
def test_a_retry_closes_the_run_its_killed_try_left_half_written(horus_home: Path) -> None:
    """A try killed while it logged (Airflow restarted under it) leaves its run RUNNING; the next try of
    the same task instance marks it FAILED with the reason, and leaves other tasks' runs alone."""
    settings = Settings.from_env()
    mlflow = client(settings)
    experiment = experiment_id(mlflow, settings, Experiment.PROFILING)
    killed = mlflow.create_run(experiment, tags={Tag.OWNER: "dag/train/run/0", "airflow.try_number": "1"}).info.run_id
    sibling = mlflow.create_run(experiment, tags={Tag.OWNER: "dag/train/run/1", "airflow.try_number": "1"}).info.run_id
    outcome = run_job(JobSpec(model="mlp", batch_size=8, steps=2), settings, owner="dag/train/run/0")
    assert mlflow.get_run(killed).info.status == "FAILED"
    assert "ended before closing it" in mlflow.get_run(killed).data.tags[Tag.LOGGING_ERROR]
    assert mlflow.get_run(sibling).info.status == "RUNNING"
    retry = mlflow.get_run(outcome.mlflow_run_id)
    assert retry.info.status == "FINISHED" and retry.data.tags[Tag.OWNER] == "dag/train/run/0"


@pytest.mark.integration
def test_an_onnx_model_without_a_command_fails_before_anything_is_reserved(horus_home: Path, tmp_path: Path) -> None:
    settings = Settings.from_env()
    graph = tmp_path / "net.onnx"
    graph.write_bytes(b"")
    with pytest.raises(InvalidJobError, match="cannot be trained by the built-in trainer: give command="):
        run_job(JobSpec(model=str(graph), batch_size=8), settings, owner="t")
    _nothing_left(settings)


@pytest.mark.integration
def test_a_job_is_predicted_by_the_registered_champion(horus_home: Path) -> None:
    settings = Settings.from_env()
    seed = Path(__file__).resolve().parent.parent / "data" / "predictor_seed" / "predictor_seed.csv"
    train_predictor(settings, read_training_data(seed), str(seed))
    outcome = run_job(JobSpec(model="dqn", dataset="cartpole", batch_size=32, steps=2), settings, owner="t")
    assert outcome.predictor == "horus-gpu-utilization/1"
    run = client(settings).get_run(outcome.mlflow_run_id)
    assert run.data.tags["horus.predictor"] == "horus-gpu-utilization/1"
    assert "predicted by horus-gpu-utilization/1" in run.data.tags["horus.placement.reason"]
    assert run.data.params["feature.input_kind"] == "state"


@pytest.mark.integration
def test_a_job_that_runs_out_of_gpu_memory_next_to_another_is_kept_apart_from_it(horus_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HORUS_LOCAL_GPUS", "1xa100-80gb")
    settings = Settings.from_env()
    ledger = SqliteLedger(settings.ledger_path)
    neighbour = (11.0, 7.0, 9.0, 1.5, 0.0, 0.9, 0.1, 0.0, 2.5, 1.0)
    ledger.reserve(0, "neighbour", "other-worker", [Booking("local/0", 40, 44, 2000, neighbour)], now=time.time(), lease_s=600)
    crash = (sys.executable, "-c", "import sys; print('torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB'); sys.exit(1)")
    outcome = run_job(JobSpec(model="mlp", batch_size=8, command=crash), settings, owner="t")
    assert outcome.exit_code == 1
    [(a, b)] = ledger.crashed_pairs()
    assert neighbour in (a, b) and len({a, b}) == 2
    failing = (sys.executable, "-c", "import sys; print('ValueError: bad shape'); sys.exit(1)")
    assert run_job(JobSpec(model="resnet18", batch_size=8, command=failing), settings, owner="u").exit_code == 1
    assert len(ledger.crashed_pairs()) == 1  # only an out-of-memory crash is remembered
