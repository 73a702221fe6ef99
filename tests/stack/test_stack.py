"""The project in the multi-service stack, without Docker: real PostgreSQL, ``mlflow server`` on it and
``airflow standalone`` on it (LocalExecutor), all on 127.0.0.1 (tests/stack/local_stack.py). DAGs are
triggered through Airflow's REST API, results read back from the MLflow server and the ledger."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.parse
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from horus_airflow.backends.ledger import LedgerReader
from horus_airflow.placement import load_profile
from tests.stack.local_stack import (
    DATABASES,
    EXECUTOR,
    POSTGRES_MAJOR,
    REPO,
    SERVICES,
    LocalStack,
    alive_in_group,
    http_ok,
    postgres_bin,
    wait_for,
)

pytestmark = pytest.mark.stack


@pytest.fixture(scope="module")
def stack() -> Iterator[LocalStack]:
    root = Path(tempfile.mkdtemp(prefix="horus-stack-"))
    dags = root / "dags"
    dags.mkdir()
    for dag in [*(REPO / "dags").glob("*.py"), *(Path(__file__).parent / "dags").glob("*.py")]:
        shutil.copy(dag, dags / dag.name)
    running = LocalStack(root / "services", dags_folder=dags)
    try:
        yield running.start()
    finally:
        pids = dict(running.pids)
        running.stop()
        for name, pid in pids.items():  # every process it started is gone, its group too
            assert alive_in_group(pid) == [], name


def mlflow_client(stack: LocalStack):  # type: ignore[no-untyped-def]
    from mlflow.tracking import MlflowClient

    return MlflowClient(stack.mlflow_url)


def test_compose_matches_the_local_stack() -> None:
    compose = yaml.safe_load((REPO / "docker-compose.yaml").read_text())
    services = compose["services"]
    assert set(services) == set(SERVICES)
    assert services["postgres"]["image"] == f"postgres:{POSTGRES_MAJOR}"
    binaries = postgres_bin()
    if binaries is not None:  # the Debian package the suite runs is the same major version
        assert binaries.parent.name == str(POSTGRES_MAJOR)
    common = compose["x-airflow-common"]["environment"]
    assert common["AIRFLOW__CORE__EXECUTOR"] == EXECUTOR
    assert common["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"].startswith("postgresql+psycopg2://")
    assert common["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"].endswith("/airflow")
    suite = LocalStack(Path("/nonexistent"))
    suite.ports = {"postgres": 1, "mlflow": 2, "airflow": 3}
    env = suite.env()
    for name in common:  # every setting compose gives Airflow, the suite gives too
        assert name in env, name
    mlflow_command = " ".join(services["mlflow"]["command"].split())
    assert "--backend-store-uri postgresql+psycopg2://" in mlflow_command and "/mlflow" in mlflow_command
    assert "--artifacts-destination" in mlflow_command
    init_sql = (REPO / "deploy" / "postgres-init.sql").read_text().lower()
    assert all(db in init_sql or db == "airflow" for db in DATABASES)
    for name, service in services.items():  # nothing listens beyond loopback on the host
        for port in service.get("ports", []):
            assert str(port).startswith("127.0.0.1:"), (name, port)
    assert "POSTGRES_PASSWORD:?" in (REPO / "docker-compose.yaml").read_text()  # no working default password


def test_bootstrap_registers_both_models_on_the_mlflow_server(stack: LocalStack) -> None:
    done = subprocess.run([sys.executable, str(REPO / "model_registry" / "bootstrap.py")], env=stack.env(), check=False, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    client = mlflow_client(stack)
    for name in ("horus-gpu-utilization", "horus-interference"):
        assert client.get_registered_model(name).aliases["champion"] == "1"


def test_the_example_dag_runs_on_postgres_and_logs_to_the_mlflow_server(stack: LocalStack) -> None:
    run = stack.trigger("horus_training_example", timeout_s=600)
    states = stack.task_states("horus_training_example", run["dag_run_id"])
    assert run["state"] == "success", (states, stack.log_tail("airflow"))
    client = mlflow_client(stack)
    experiment = client.get_experiment_by_name("horus-profiling")
    runs = client.search_runs([experiment.experiment_id], f"tags.`airflow.run_id` = '{run['dag_run_id']}'")
    assert {r.data.tags["airflow.task_id"] for r in runs} == {s.split("[")[0] for s in states}
    for profiling in runs:
        assert profiling.info.status == "FINISHED" and profiling.data.tags["horus.reservation_id"]
        assert profiling.data.tags["horus.predictor"].startswith("horus-gpu-utilization/1")  # the champion, over REST
        assert "telemetry/placement.json" in {a.path for a in client.list_artifacts(profiling.info.run_id, "telemetry")}
    assert LedgerReader(stack.horus_home / "ledger.sqlite").live(now=9e12) == []  # every GPU released


def test_the_retraining_dag_registers_through_the_mlflow_server(stack: LocalStack) -> None:
    run = stack.trigger("horus_retrain_predictor", {"force": True}, timeout_s=600)
    assert run["state"] == "success", (stack.task_states("horus_retrain_predictor", run["dag_run_id"]), stack.log_tail("airflow"))
    client = mlflow_client(stack)
    versions = client.search_model_versions("name = 'horus-gpu-utilization'")
    assert len(versions) == 2 and client.get_registered_model("horus-gpu-utilization").aliases["challenger"] == "2"
    retraining = client.get_experiment_by_name("horus-retraining")
    [report] = client.search_runs([retraining.experiment_id], max_results=5)
    assert report.info.status == "FINISHED"


def test_fifty_tasks_at_once_never_over_commit_and_leave_nothing_behind(stack: LocalStack) -> None:
    run = stack.trigger("horus_stack_load", timeout_s=900)
    states = stack.task_states("horus_stack_load", run["dag_run_id"])
    assert run["state"] == "success" and len(states) == 50 and set(states.values()) == {"success"}, states
    ledger = LedgerReader(stack.horus_home / "ledger.sqlite")
    entries = [e for e in ledger.journal(10_000) if e.owner.startswith(f"horus_stack_load/train/{run['dag_run_id']}/")]
    assert len(entries) == 50 and all(e.status(now=9e12) == "released" for e in entries)
    limit = next(f.limit for f in load_profile("horus-paper").filters if f.name == "max-residents")
    per_gpu: dict[str, list[tuple[float, int, float]]] = defaultdict(list)
    for e in entries:
        for b in e.bookings:
            per_gpu[b.gpu_id] += [(e.created_at, 1, b.mem_mib), (e.released_at or 9e12, -1, -b.mem_mib)]
    peak = 0
    for events in per_gpu.values():
        residents, memory = 0, 0.0
        for _, step, mem in sorted(events, key=lambda ev: (ev[0], ev[1])):  # a release before a booking at the same instant
            residents, memory = residents + step, memory + mem
            assert residents <= limit and memory <= 81920
            peak = max(peak, residents)
    assert peak > 1  # the tasks really ran at the same time and shared GPUs
    client = mlflow_client(stack)
    experiment = client.get_experiment_by_name("horus-profiling")
    runs = client.search_runs([experiment.experiment_id], f"tags.`airflow.run_id` = '{run['dag_run_id']}'", max_results=100)
    assert len(runs) == 50 and {r.data.tags["horus.reservation_id"] for r in runs} == {e.reservation_id for e in entries}
    conflicts = 0
    quoted = urllib.parse.quote(run["dag_run_id"], safe="")
    for index in range(50):
        entry = stack.request("GET", f"/api/v2/dags/horus_stack_load/dagRuns/{quoted}/taskInstances/train/xcomEntries/return_value"
                                     f"?map_index={index}&deserialize=true&stringify=false")
        value = entry["value"]
        conflicts += (value if isinstance(value, dict) else json.loads(value))["ledger_conflicts"]
    span = max(e.created_at for e in entries) - min(e.created_at for e in entries)
    print(f"\n50 placements in {span:.1f} s ({50 / max(span, 1e-9):.1f} per second), {conflicts} ledger conflicts re-decided, "
          f"peak {peak} tasks on one GPU")



def test_the_mlflow_server_going_away_under_running_tasks_loses_nothing(stack: LocalStack) -> None:
    client = mlflow_client(stack)
    experiment = client.get_experiment_by_name("horus-profiling")
    before = {r.info.run_id for r in client.search_runs([experiment.experiment_id], max_results=1000)} if experiment else set()
    run_id = stack.start_run("horus_stack_fault")
    wait_for(lambda: list(stack.task_states("horus_stack_fault", run_id).values()).count("running") == 3, 180, poll_s=0.5)
    stack.kill("mlflow")  # every task is training: none can log its profiling run now
    wait_for(lambda: not http_ok(f"{stack.mlflow_url}/health"), 30)
    time.sleep(20)
    stack.restart("mlflow")
    final = stack.trigger_wait("horus_stack_fault", run_id, timeout_s=600)
    states = stack.task_states("horus_stack_fault", run_id)
    assert final["state"] == "success", (states, stack.log_tail("airflow"))
    after = client.search_runs([client.get_experiment_by_name("horus-profiling").experiment_id], max_results=1000)
    assert before <= {r.info.run_id for r in after}  # what was logged before the outage is still there
    logged = [r for r in after if r.data.tags.get("airflow.run_id") == run_id]
    finished = {r.data.tags["airflow.task_id"] + r.data.params["job.batch_size"] for r in logged if r.info.status == "FINISHED"}
    assert finished == {"train32", "train64", "train128"}, [(r.info.status, r.data.params.get("job.batch_size")) for r in logged]
    assert all(r.info.status != "RUNNING" for r in logged)  # no run left half-written
    assert LedgerReader(stack.horus_home / "ledger.sqlite").live(now=9e12) == []
    tries = stack.request("GET", f"/api/v2/dags/horus_stack_fault/dagRuns/{urllib.parse.quote(run_id, safe='')}/taskInstances")
    print(f"\nMLflow down 20 s under 3 running tasks: tries {sorted(ti['try_number'] for ti in tries['task_instances'])}, "
          f"{len(logged)} profiling runs ({len(finished)} finished)")
