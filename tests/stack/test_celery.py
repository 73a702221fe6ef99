"""The DAGs under CeleryExecutor (compose's ``--profile celery``): Debian's Redis as the broker and two
Celery workers, each with its own HORUS_HOME and temp dir, as if on two machines. A cluster policy
(celery_settings/airflow_local_settings.py) sends a task and the task after it to different workers,
so whatever one task hands the next must travel through MLflow or XCom, never a local disk."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import pytest

from horus_airflow.registry.retraining import staged_table
from horus_airflow.run_schema import Experiment, Tag, tag_equals
from horus_airflow.registry.store import search
from horus_airflow.settings import Settings
from tests.stack.local_stack import CELERY, REPO, LocalStack, alive_in_session

pytestmark = pytest.mark.stack


@pytest.fixture(scope="module")
def celery_stack() -> Iterator[LocalStack]:
    if shutil.which("redis-server") is None:
        pytest.fail("redis-server is not installed: apt-get install redis-server (make test does this)")
    root = Path(tempfile.mkdtemp(prefix="horus-celery-"))
    dags = root / "dags"
    dags.mkdir()
    for dag in (REPO / "dags").glob("*.py"):
        shutil.copy(dag, dags / dag.name)
    running = LocalStack(root / "services", dags_folder=dags, executor=CELERY, workers=2)
    try:
        running.start()
        done = subprocess.run([sys.executable, str(REPO / "model_registry" / "bootstrap.py")], env=running.env(),
                              check=False, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
        yield running
    finally:
        pids = dict(running.pids)
        running.stop()
        for name, pid in pids.items():
            assert alive_in_session(pid) == [], name


def task_instances(stack: LocalStack, dag_id: str, run_id: str) -> list[dict]:  # type: ignore[type-arg]
    quoted = urllib.parse.quote(run_id, safe="")
    return stack.request("GET", f"/api/v2/dags/{dag_id}/dagRuns/{quoted}/taskInstances?limit=500")["task_instances"]


def test_the_retraining_dag_hands_its_tables_on_through_mlflow_between_workers(celery_stack: LocalStack) -> None:
    stack = celery_stack
    run = stack.trigger("horus_retrain_predictor", {"force": True}, timeout_s=900)
    tis = {ti["task_id"]: ti for ti in task_instances(stack, "horus_retrain_predictor", run["dag_run_id"])}
    assert run["state"] == "success", ({t: ti["state"] for t, ti in tis.items()}, stack.log_tail("airflow"))
    # each table crossed workers: extract on one, build_dataset (which reads extract's) on the other, and so on
    assert tis["extract"]["queue"] == "worker-0" and tis["build_dataset"]["queue"] == "worker-1"
    assert tis["retrain_predictor"]["queue"] == "worker-0" and tis["build_dataset"]["state"] == "success"
    assert tis["retrain_predictor"]["state"] == "success" and tis["report"]["state"] == "success"
    for index in range(stack.workers):
        home = stack.worker_root(index) / "horus"
        assert not (home / "retraining").exists()  # nothing staged on a worker's disk
        assert list((stack.worker_root(index) / "tmp").glob("horus-staged-*")) == []  # nor left in its temp dir
    settings = Settings.from_env(stack.env())
    [data_run] = search(settings, Experiment.RETRAINING_DATA, tag_equals(Tag.AIRFLOW_RUN_ID, run["dag_run_id"]))
    assert data_run.info.status == "FINISHED" and len(staged_table(settings, data_run.info.run_id, "rows")) > 0


def test_the_training_and_profiling_dags_run_on_both_workers(celery_stack: LocalStack) -> None:
    stack = celery_stack
    for dag_id, conf in (("horus_training_example", {}),
                         ("horus_profile_models", {"workloads": ["mlp:16@mnist"], "pairs": ["mlp:16@mnist+mlp:32@mnist"], "steps": 3})):
        run = stack.trigger(dag_id, conf, timeout_s=900)
        tis = task_instances(stack, dag_id, run["dag_run_id"])
        assert run["state"] == "success", ([(ti["task_id"], ti["state"]) for ti in tis], stack.log_tail("airflow"))
        assert {ti["queue"] for ti in tis} == {"worker-0", "worker-1"}
    trained = [stack.worker_root(index) / "horus" / "runs" for index in range(stack.workers)]
    assert all(folder.is_dir() and any(folder.iterdir()) for folder in trained)  # each worker trained jobs of its own
