"""Real Airflow on the embedded SQLite stack: DAG files import, and dag.test() runs the whole path."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from horus_airflow.backends import SqliteLedger
from horus_airflow.registry import profiling_runs
from horus_airflow.settings import Settings
from tests.conftest import DAGS_FOLDER, REPO, load_dag_file

pytestmark = pytest.mark.airflow


@pytest.mark.parametrize("dag_file", sorted((REPO / "dags").glob("*.py")), ids=lambda p: p.name)
def test_dag_files_import_without_errors(dag_file: Path) -> None:
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(dag_file))
    assert bag.import_errors == {}
    assert bag.dags


def test_parsing_the_dags_folder_imports_no_heavy_library() -> None:
    """The DAG processor parses every file again and again: PyTorch, MLflow and LightGBM load only when a task runs."""
    probe = (
        "import sys\n"
        "from airflow.dag_processing.dagbag import DagBag\n"
        f"bag = DagBag(dag_folder={str(REPO / 'dags')!r})\n"
        "assert bag.import_errors == {}, bag.import_errors\n"
        "print(sorted(m for m in ('torch', 'mlflow', 'lightgbm', 'kubernetes') if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=False, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "[]"


def _active_reservations(settings: Settings) -> int:
    _version, residents = SqliteLedger(settings.ledger_path).active(now=0.0)
    return sum(len(r) for r in residents.values())


def test_example_dag_runs_end_to_end(airflow_db: Path) -> None:
    from airflow.utils.state import TaskInstanceState

    dag = load_dag_file(DAGS_FOLDER / "horus_training_example.py").dag
    dag_run = dag.test()
    assert str(dag_run.state) == "success"
    states = {ti.task_id: ti.state for ti in dag_run.get_task_instances()}
    assert states and all(state == TaskInstanceState.SUCCESS for state in states.values()), states

    settings = Settings.from_env()
    runs = profiling_runs(settings, dag_run.run_id)
    assert {r.data.tags["airflow.task_id"] for r in runs} == set(states)
    for run in runs:
        assert run.info.status == "FINISHED"
        tags, params, metrics = run.data.tags, run.data.params, run.data.metrics
        assert tags["horus.gpu_ids"].startswith("local/")
        assert tags["horus.gpu_declared"] == "true"
        assert tags["horus.placement.reason"]
        assert float(params["predicted.gpu_util"]) > 0
        assert int(params["feature.train_flops"]) > int(params["feature.forward_flops"]) > 0
        assert metrics["job.throughput_samples_per_s"] > 0
        # Declared GPUs, no NVML: no GPU metric may appear.
        assert not [name for name in metrics if name.startswith("gpu_")]
    assert _active_reservations(settings) == 0


def _run_failing_dag(attribute: str) -> str:
    """dag.test() a DAG that must fail; it must leave no GPU reserved. Returns its run id."""
    dag_run = getattr(load_dag_file(DAGS_FOLDER / "horus_test_failures.py"), attribute).test()
    assert str(dag_run.state) == "failed"
    assert _active_reservations(Settings.from_env()) == 0
    return dag_run.run_id


def test_bad_model_fails_at_once_and_leaves_nothing_behind(airflow_db: Path) -> None:
    assert profiling_runs(Settings.from_env(), _run_failing_dag("bad_model")) == []


def test_failing_job_releases_its_gpu_and_logs_a_failed_run(airflow_db: Path) -> None:
    (run,) = profiling_runs(Settings.from_env(), _run_failing_dag("failing"))
    assert run.info.status == "FAILED"
    assert run.data.tags["horus.exit_code"] == "3"
