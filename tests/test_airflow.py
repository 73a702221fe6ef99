"""Real Airflow on the embedded SQLite stack: DAG files import, and dag.test() runs the whole path."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from horus_airflow.backends import SqliteLedger
from horus_airflow.backends.ledger import Reservation
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


@pytest.mark.parametrize(("dags", "heavy"), [
    (REPO / "dags", ("torch", "mlflow", "lightgbm", "kubernetes")),
    # the Kubernetes operator needs the kubernetes client, but the placer, predictor and registry only when a task runs
    (REPO / "tests" / "dags" / "horus_test_kubernetes.py", ("torch", "mlflow", "lightgbm")),
], ids=["dags-folder", "kubernetes-dag"])
def test_parsing_dags_imports_no_heavy_library(dags: Path, heavy: tuple[str, ...]) -> None:
    """The DAG processor parses every file again and again: PyTorch, MLflow and LightGBM load only when a task runs."""
    probe = (
        "import sys\n"
        "from airflow.dag_processing.dagbag import DagBag\n"
        f"bag = DagBag(dag_folder={str(dags)!r})\n"
        "assert bag.import_errors == {} and bag.dags, bag.import_errors\n"
        f"print(sorted(m for m in {heavy!r} if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=False, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "[]"


_INVALID_OPERATORS = {  # arguments -> what the import error must say
    'model="resnt18", batch_size=32': "unknown model 'resnt18'. Did you mean: resnet18",
    'model="resnet18", batch_size=0': "batch_size must be an integer from 1 to 1048576, got 0",
    'model="resnet18", batch_size=2_000_000': "batch_size must be an integer from 1 to 1048576",
    'model="resnet18", batch_size="32"': "batch_size must be an integer from 1 to 1048576, got '32'",
    'model="resnet18", batch_size=32, precision="fp16"': "precision must be one of fp32, amp, got 'fp16'",
    'model="resnet18", batch_size=32, gpus=0': "gpus must be an integer from 1 to 64, got 0",
    'model="resnet18", batch_size=32, steps=0': "steps must be an integer from 1 to",
    'model="resnet18", batch_size=32, profile="horus-papr"': "unknown placement profile 'horus-papr'. Did you mean: horus-paper",
    'model="lstm_lm", batch_size=32, dataset="imagenet"': "datasets that fit 'lstm_lm': wikitext103, wikitext2",
    'model="resnet18", batch_size=32, dataset="cifar"': "unknown dataset 'cifar'",
    'model="m.onnx", batch_size=32': "an ONNX model ('m.onnx') cannot be trained by the built-in trainer",
    'model="resnet18", batch_size=32, command="python \'train.py"': "does not split into arguments (No closing quotation)",
    'model="resnet18", batch_size=32, placement_timeout=0': "placement_timeout (seconds to wait for GPUs) must be > 0",
    'model="resnet18", batch_size=32, queue_priority=1.5': "queue_priority (higher is placed first) must be a whole number",
    'model="resnet18", batch_size=32, queue_priority=2**40': "queue_priority (higher is placed first) must be a whole number >= -1e+09",
}


def test_every_invalid_operator_argument_is_an_import_error_naming_it(tmp_path: Path) -> None:
    """Airflow shows a DAG's mistakes when it parses the file, not when a task runs hours later."""
    from airflow.dag_processing.dagbag import DagBag

    for number, arguments in enumerate(_INVALID_OPERATORS):
        (tmp_path / f"dag_{number}.py").write_text(
            "from airflow.sdk import DAG\nfrom horus_airflow.operators import HorusTrainingOperator\n"
            f"with DAG(dag_id='invalid_{number}', schedule=None):\n"
            f"    HorusTrainingOperator(task_id='train', {arguments})\n"
        )
    errors = DagBag(dag_folder=str(tmp_path)).import_errors
    for number, message in enumerate(_INVALID_OPERATORS.values()):
        error = errors.get(str(tmp_path / f"dag_{number}.py"), "")
        assert message in error, (list(_INVALID_OPERATORS)[number], error[-500:])


def test_a_string_command_runs_as_a_shell_would_split_it() -> None:
    from horus_airflow.operators.checks import command_argv

    assert command_argv("python train.py --name 'my run'") == ("python", "train.py", "--name", "my run")
    assert command_argv(["python", "train.py"]) == ("python", "train.py")


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
    """A typo a template renders is found when the task runs: it fails on its first try, not retried."""
    from airflow.utils.state import TaskInstanceState

    dag_run = load_dag_file(DAGS_FOLDER / "horus_test_failures.py").bad_model.test()
    [ti] = dag_run.get_task_instances()
    assert str(dag_run.state) == "failed" and ti.state == TaskInstanceState.FAILED and ti.try_number == 1
    assert _active_reservations(Settings.from_env()) == 0
    assert profiling_runs(Settings.from_env(), dag_run.run_id) == []


def test_failing_job_releases_its_gpu_and_logs_a_failed_run(airflow_db: Path) -> None:
    (run,) = profiling_runs(Settings.from_env(), _run_failing_dag("failing"))
    assert run.info.status == "FAILED"
    assert run.data.tags["horus.exit_code"] == "3"


def _hold_every_gpu(settings: Settings, lease_s: float) -> list[Reservation]:
    from horus_airflow.backends import LocalBackend
    from horus_airflow.backends.ledger import Booking

    backend = LocalBackend(settings)
    return [backend.ledger.reserve(backend.snapshot().version, f"holder{g.index}", f"other/{g.index}",
                                   [Booking(g.gpu_id, 100, 100, 70_000)], backend.now(), lease_s) for g in backend.gpus]


def test_a_deferrable_task_waits_in_the_triggerer_and_runs_when_a_round_books_it(airflow_db: Path) -> None:
    """Both GPUs are busy when the task starts: it queues and defers (dag.test() runs the trigger in line);
    3 s after it queued the holders are released, a round books the task, and it resumes, runs and releases."""
    import sqlite3
    import threading
    import time

    from horus_airflow.backends import LocalBackend

    settings = Settings.from_env()
    held = _hold_every_gpu(settings, 600)
    backend = LocalBackend(settings)
    stop = threading.Event()

    def release_once_queued() -> None:
        while not stop.is_set() and not any(e.owner.startswith("horus_test_deferrable/queued/") for e in backend.queue()[1]):
            time.sleep(0.2)
        stop.wait(3.0)
        for reservation in held:
            backend.release(reservation)

    releaser = threading.Thread(target=release_once_queued)
    releaser.start()
    try:
        dag_run = load_dag_file(DAGS_FOLDER / "horus_test_deferrable.py").waits.test()
    finally:
        stop.set()
        releaser.join()
    assert str(dag_run.state) == "success"
    with sqlite3.connect(settings.ledger_path) as conn:
        [(enqueued, left, reason, booked_at)] = conn.execute(
            "SELECT q.enqueued_at, q.left_at, q.reason, r.created_at FROM queue q JOIN reservations r USING (reservation_id) "
            "WHERE q.owner LIKE 'horus_test_deferrable/queued/%'").fetchall()
    assert booked_at - enqueued >= 2.5 and left is not None and "[round " in reason
    [run] = profiling_runs(settings, dag_run.run_id)
    assert run.info.status == "FINISHED" and run.data.tags["horus.placement.profile"] == "exclusive"
    assert _active_reservations(settings) == 0


def test_a_deferrable_task_not_placed_by_its_timeout_fails_and_leaves_the_queue(airflow_db: Path) -> None:
    import sqlite3

    from horus_airflow.backends import LocalBackend

    settings = Settings.from_env()
    held = _hold_every_gpu(settings, 600)
    try:
        dag_run = load_dag_file(DAGS_FOLDER / "horus_test_deferrable.py").times_out.test()
    finally:
        for reservation in held:
            LocalBackend(settings).release(reservation)
    assert str(dag_run.state) == "failed"
    with sqlite3.connect(settings.ledger_path) as conn:
        rows = conn.execute("SELECT left_at, reason, reservation_id FROM queue "
                            "WHERE owner LIKE 'horus_test_deferrable_timeout/never_placed/%'").fetchall()
    assert rows and all(left is not None and booking is None for left, _, booking in rows)
    assert any("not placed before its deadline" in reason for _, reason, _ in rows)
    assert profiling_runs(settings, dag_run.run_id) == [] and _active_reservations(settings) == 0
