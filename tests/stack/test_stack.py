"""The project in the multi-service stack, without Docker: real PostgreSQL, ``mlflow server`` on it and
``airflow standalone`` on it (LocalExecutor), all on 127.0.0.1 (tests/stack/local_stack.py). DAGs are
triggered through Airflow's REST API, results read back from the MLflow server and the ledger."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from mlflow.entities import Run

from horus_airflow.backends.ledger import JournalEntry, LedgerReader, QueueEntry, SqliteLedger
from horus_airflow.backends.local import parse_inventory
from horus_airflow.backends.scheduler import ROUND_BOOKINGS
from horus_airflow.placement import Profile, load_profile
from horus_airflow.placement.rounds import scheduling_round
from horus_airflow.placement.state import ClusterState, Resident
from horus_airflow.registry import load_predictor
from horus_airflow.run_schema import Tag
from horus_airflow.registry.profiling import profiling_runs
from horus_airflow.settings import Settings
from horus_airflow.telemetry import RunSummary
from horus_airflow.telemetry.wrapper import SAMPLES_FILE
from tests.stack.local_stack import (
    DATABASES,
    EXECUTOR,
    POSTGRES_MAJOR,
    REPO,
    SERVICES,
    LocalStack,
    alive_in_session,
    parent_of,
    postgres_bin,
    processes_running,
    wait_for,
)

pytestmark = pytest.mark.stack


@pytest.fixture(scope="module")
def stack() -> Iterator[LocalStack]:
    root = Path(tempfile.mkdtemp(prefix="horus-stack-"))
    dags = root / "dags"
    dags.mkdir()
    for dag in [*(REPO / "dags").glob("*.py"), *(Path(__file__).parent / "dags").glob("*.py"), *(Path(__file__).parent / "dags").glob("*.yaml")]:
        shutil.copy(dag, dags / dag.name)
    running = LocalStack(root / "services", dags_folder=dags)
    try:
        yield running.start()
    finally:
        pids = dict(running.pids)
        running.stop()
        for name, pid in pids.items():  # every process it started is gone, its whole session too
            assert alive_in_session(pid) == [], name


@pytest.fixture(scope="module")
def bootstrapped(stack: LocalStack) -> LocalStack:
    """The stack with both models registered (champion version 1), whichever test asks first: every
    test that needs them says so, so the tests run in any order."""
    done = subprocess.run([sys.executable, str(REPO / "model_registry" / "bootstrap.py")], env=stack.env(), check=False, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return stack


@pytest.fixture(scope="module")
def example_run(bootstrapped: LocalStack) -> dict:  # type: ignore[type-arg]
    """One run of the example DAG (its profiling runs, task logs and XComs), for the tests that read them."""
    return bootstrapped.trigger("horus_training_example", timeout_s=600)


def runs_of(stack: LocalStack, airflow_run_id: str) -> list[Run]:
    """The profiling runs a DAG run logged to the stack's MLflow server."""
    return profiling_runs(Settings.from_env(stack.env()), airflow_run_id)


def mlflow_client(stack: LocalStack):  # type: ignore[no-untyped-def]
    from mlflow.tracking import MlflowClient

    return MlflowClient(stack.mlflow_url)


def test_compose_matches_the_local_stack() -> None:
    text = (REPO / "docker-compose.yaml").read_text()
    compose = yaml.safe_load(text)
    services = compose["services"]
    assert {name for name, service in services.items() if "profiles" not in service} == set(SERVICES)
    assert {name for name, service in services.items() if "celery" in service.get("profiles", [])} == {"redis", "airflow-worker"}
    assert services["postgres"]["image"] == f"postgres:{POSTGRES_MAJOR}"
    binaries = postgres_bin()
    if binaries is not None:  # the Debian package the suite runs is the same major version
        assert binaries.parent.name == str(POSTGRES_MAJOR)
    common = compose["x-airflow-common"]["environment"]
    assert common["AIRFLOW__CORE__EXECUTOR"] == f"${{AIRFLOW_EXECUTOR:-{EXECUTOR}}}"
    assert common["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"].startswith("postgresql+psycopg2://")
    assert common["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"].endswith("/airflow")
    suite = LocalStack(Path("/nonexistent"))
    suite.ports = {"postgres": 1, "mlflow": 2, "airflow": 3, "scheduler-health": 4}
    env = suite.env()
    for name in common:  # every setting compose gives Airflow, the suite gives too (Celery's: in its Celery stack)
        assert name in env or name.startswith("AIRFLOW__CELERY__"), name
    celery = LocalStack(Path("/nonexistent"), executor="CeleryExecutor")
    celery.ports = {**suite.ports, "redis": 5}
    for name in ("AIRFLOW__CELERY__BROKER_URL", "AIRFLOW__CELERY__RESULT_BACKEND"):  # the same drivers as compose's
        assert celery.env()[name].split("://")[0] == common[name].split("://")[0], name
    mlflow_command = " ".join(services["mlflow"]["command"].split())
    assert "--backend-store-uri postgresql+psycopg2://" in mlflow_command and "/mlflow" in mlflow_command
    assert "--artifacts-destination" in mlflow_command
    init_sql = (REPO / "deploy" / "postgres-init.sql").read_text().lower()
    assert all(db in init_sql or db == "airflow" for db in DATABASES)
    for name, service in services.items():
        for port in service.get("ports", []):  # nothing listens beyond loopback on the host
            assert str(port).startswith("127.0.0.1:"), (name, port)
        if name != "airflow-init":  # what the fault tests restart, the deployment restarts too
            assert service.get("restart") == "always" and "healthcheck" in service, name
    for secret in ("POSTGRES_PASSWORD", "AIRFLOW_JWT_SECRET", "AIRFLOW_ADMIN_PASSWORD"):  # no working default password
        assert f"${{{secret}:?" in text and f"${{{secret}:-" not in text, secret
    example = dict(line.split("=", 1) for line in (REPO / ".env.example").read_text().splitlines() if "=" in line and not line.startswith("#"))
    assert all(example[secret] == "" for secret in ("POSTGRES_PASSWORD", "AIRFLOW_JWT_SECRET", "AIRFLOW_ADMIN_PASSWORD"))


def test_bootstrap_registers_both_models_on_the_mlflow_server(bootstrapped: LocalStack) -> None:
    client = mlflow_client(bootstrapped)
    for name in ("horus-gpu-utilization", "horus-interference"):
        assert client.get_registered_model(name).aliases["champion"] == "1"


def test_the_example_dag_runs_on_postgres_and_logs_to_the_mlflow_server(bootstrapped: LocalStack, example_run: dict) -> None:  # type: ignore[type-arg]
    stack, run = bootstrapped, example_run
    states = stack.task_states("horus_training_example", run["dag_run_id"])
    assert run["state"] == "success", (states, stack.log_tail("airflow"))
    client = mlflow_client(stack)
    runs = runs_of(stack, run["dag_run_id"])
    assert {r.data.tags["airflow.task_id"] for r in runs} == {s.split("[")[0] for s in states}
    for profiling in runs:
        assert profiling.info.status == "FINISHED" and profiling.data.tags["horus.reservation_id"]
        assert profiling.data.tags["horus.predictor"].startswith("horus-gpu-utilization/1")  # the champion, over REST
        assert "telemetry/placement.json" in {a.path for a in client.list_artifacts(profiling.info.run_id, "telemetry")}
    assert LedgerReader(stack.horus_home / "ledger.sqlite").live(now=9e12) == []  # every GPU released


def test_the_profiling_dag_logs_jobs_alone_and_in_pairs_to_the_mlflow_server(stack: LocalStack) -> None:
    conf = {"workloads": ["mlp:16@mnist"], "pairs": ["mlp:16@mnist+mlp:32@mnist"], "steps": 3}
    run = stack.trigger("horus_profile_models", conf, timeout_s=600)
    assert run["state"] == "success", (stack.task_states("horus_profile_models", run["dag_run_id"]), stack.log_tail("airflow"))
    runs = runs_of(stack, run["dag_run_id"])
    alone = [r for r in runs if "horus.pair_id" not in r.data.tags]
    paired = [r for r in runs if "horus.pair_id" in r.data.tags]
    assert len(alone) == 1 and len(paired) == 2 and len({r.data.tags["horus.pair_id"] for r in paired}) == 1
    assert {r.data.params["job.batch_size"] for r in paired} == {"16", "32"}
    assert all(r.info.status == "FINISHED" and r.data.tags["horus.placement.profile"] == "exclusive" for r in runs)
    assert LedgerReader(stack.horus_home / "ledger.sqlite").live(now=9e12) == []


def test_the_retraining_dag_registers_through_the_mlflow_server(bootstrapped: LocalStack) -> None:
    stack = bootstrapped
    client = mlflow_client(stack)
    before = len(client.search_model_versions("name = 'horus-gpu-utilization'"))
    run = stack.trigger("horus_retrain_predictor", {"force": True}, timeout_s=600)
    assert run["state"] == "success", (stack.task_states("horus_retrain_predictor", run["dag_run_id"]), stack.log_tail("airflow"))
    versions = client.search_model_versions("name = 'horus-gpu-utilization'")
    assert len(versions) == before + 1
    assert client.get_registered_model("horus-gpu-utilization").aliases["challenger"] == str(before + 1)
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
    runs = runs_of(stack, run["dag_run_id"])
    assert len(runs) == 50 and {r.data.tags["horus.reservation_id"] for r in runs} == {e.reservation_id for e in entries}
    outcomes = []
    quoted = urllib.parse.quote(run["dag_run_id"], safe="")
    for index in range(50):
        entry = stack.request("GET", f"/api/v2/dags/horus_stack_load/dagRuns/{quoted}/taskInstances/train/xcomEntries/return_value"
                                     f"?map_index={index}&deserialize=true&stringify=false")
        value = entry["value"]
        outcomes.append(value if isinstance(value, dict) else json.loads(value))
    conflicts = sum(o["ledger_conflicts"] for o in outcomes)
    latencies = sorted(o["placement_s"] for o in outcomes)
    span = max(e.created_at for e in entries) - min(e.created_at for e in entries)
    print(f"\n50 placements in {span:.1f} s ({50 / max(span, 1e-9):.2f} per second), {conflicts} ledger conflicts re-decided, "
          f"placement latency median {statistics.median(latencies):.3f} s, p95 {latencies[47]:.3f} s, peak {peak} tasks on one GPU")



def _replay_rounds(queued: list[QueueEntry], booked_at: dict[str, float], journal: list[JournalEntry], profile: Profile,
                   gpus: str) -> tuple[int, list[str]]:
    """Every live round again, offline: the queue and the GPUs as they stood when the round booked (the
    ledger's compare-and-swap makes that what it read), fed to the simulator's ``scheduling_round``; skips
    carried from round to round as the replay counts them. Returns the rounds and their disagreements."""
    inventory = parse_inventory(gpus)
    position = {gpu.gpu_id: i for i, gpu in enumerate(inventory)}
    rounds: dict[str, list[QueueEntry]] = defaultdict(list)
    for q in queued:
        rounds[str(q.round)].append(q)
    skips = {q.entry_id: 0 for q in queued}
    entry_of = {q.demand.job_id: q.entry_id for q in queued}
    disagreements = []
    for round_id, booked in sorted(rounds.items(), key=lambda item: booked_at[str(item[1][0].reservation_id)]):
        at = booked_at[str(booked[0].reservation_id)]
        residents: dict[int, list[Resident]] = defaultdict(list)
        for e in journal:
            if e.created_at < at and (e.released_at is None or e.released_at > at):
                for b in e.bookings:
                    residents[position[b.gpu_id]].append(Resident(e.job_id, b.util, b.util_p90, b.mem_mib, b.signature))
        state = ClusterState(tuple(replace(gpu, residents=tuple(residents[i])) for i, gpu in enumerate(inventory)))
        waiting = [replace(q, skips=skips[q.entry_id]).waiting(at) for q in queued
                   if q.enqueued_at < at <= booked_at[str(q.reservation_id)]]
        result = scheduling_round(waiting, state, profile, limit=ROUND_BOOKINGS)
        replayed = {entry_of[c.job.demand.job_id] for c in result.chosen}
        if replayed != {q.entry_id for q in booked}:
            disagreements.append(f"round {round_id} at {at:.2f}: live booked {sorted(q.owner for q in booked)}, "
                                 f"schedule() chose {sorted(c.job.demand.job_id for c in result.chosen)}")
        skips.update({entry_of[h.job.demand.job_id]: h.job.skips for h in result.held})
    return len(rounds), disagreements


@pytest.mark.timeout(1800)
def test_sixty_deferrable_tasks_wait_in_the_triggerer_in_the_policys_order_through_a_triggerer_restart(stack: LocalStack) -> None:
    """60 tasks on the stack's 8 GPUs, one in ten a gang of all eight: while queued they hold no worker slot (deferred to
    the triggerer); the triggerer is killed with tasks queued and a new one started; no GPU is ever
    booked twice; every gang is booked within its bound; every round booked what the simulator's
    ``scheduling_round`` chooses for the same queue and GPUs."""
    dag_id = "horus_stack_queue"
    gpus = stack.env()["HORUS_LOCAL_GPUS"]
    gang_gpus = len(parse_inventory(gpus))  # the DAG's gangs take the whole machine
    run_id = stack.start_run(dag_id)
    prefix = f"{dag_id}/train/{run_id}/"
    ledger = LedgerReader(stack.horus_home / "ledger.sqlite")
    quoted = urllib.parse.quote(run_id, safe="")
    waiting_samples, running_while_waiting, most_deferred, deferred_at_kill = 0, 0, 0, 0
    killed_at: float | None = None
    restarted = False
    deadline = time.monotonic() + 1500
    while stack.request("GET", f"/api/v2/dags/{dag_id}/dagRuns/{quoted}")["state"] not in ("success", "failed"):
        assert time.monotonic() < deadline, stack.log_tail("airflow")
        waiting = [e.owner for e in ledger.queue(time.time()) if e.owner.startswith(prefix)]
        states = stack.task_states(dag_id, run_id)
        deferred = list(states.values()).count("deferred")
        most_deferred = max(most_deferred, deferred)
        waiting_samples += len(waiting)
        running_while_waiting += sum(states.get(f"train[{owner.rsplit('/', 1)[1]}]") == "running" for owner in waiting)
        if killed_at is None and len(waiting) >= 15 and deferred >= 10:
            stack.kill_triggerer()
            killed_at, deferred_at_kill = time.monotonic(), deferred
        if killed_at is not None and not restarted and time.monotonic() - killed_at > 15:
            stack.start_triggerer()
            restarted = True
        time.sleep(1.0)
    states = stack.task_states(dag_id, run_id)
    assert len(states) == 60 and set(states.values()) == {"success"}, (states, stack.log_tail("airflow"))
    assert restarted and deferred_at_kill >= 10

    # no worker slot while queued: a waiting task is deferred, but in the instant between queuing and deferring
    assert most_deferred >= 20 and waiting_samples > 0
    assert running_while_waiting <= 0.1 * waiting_samples, (running_while_waiting, waiting_samples)

    journal = [e for e in ledger.journal(10_000) if e.owner.startswith(prefix)]
    assert len(journal) == 60 and all(e.status(now=9e12) == "released" for e in journal)
    per_gpu: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for e in journal:
        for b in e.bookings:
            per_gpu[b.gpu_id].append((e.created_at, e.released_at or 9e12))
    for spans in per_gpu.values():  # whole GPUs: one booking at a time on each
        spans.sort()
        assert all(end <= start for (_, end), (start, _) in zip(spans, spans[1:])), spans
    assert sorted(len(e.bookings) for e in journal) == [1] * 54 + [gang_gpus] * 6

    booked_at = {e.reservation_id: e.created_at for e in journal}
    with contextlib.closing(sqlite3.connect(stack.horus_home / "ledger.sqlite")) as conn:
        ids = [row[0] for row in conn.execute("SELECT entry_id FROM queue WHERE owner LIKE ?", (prefix + "%",))]
    ledger = SqliteLedger(stack.horus_home / "ledger.sqlite")
    entries = [ledger.queue_entry(entry_id) for entry_id in ids]
    queued = sorted((e for e in entries if e is not None and e.reservation_id is not None and e.left_at is not None),
                    key=lambda e: e.enqueued_at)
    assert len(ids) == len(queued) == 60  # every task queued, was booked and took its booking: none left or expired
    profile = load_profile(str(Path(__file__).parent / "dags" / "horus_stack_queue.yaml"))
    bound = profile.queue.max_skips
    booked = {q.entry_id: booked_at[str(q.reservation_id)] for q in queued}
    overtaken = {g.entry_id: sum(q.enqueued_at > g.enqueued_at and booked[q.entry_id] < booked[g.entry_id] for q in queued)
                 for g in queued if g.demand.gpus == gang_gpus}
    for gang in (q for q in queued if q.entry_id in overtaken):  # at most `bound` times, by the ledger's times and by its count
        assert overtaken[gang.entry_id] <= bound and gang.skips <= bound, (gang.owner, overtaken[gang.entry_id], gang.skips)
    rounds, disagreements = _replay_rounds(queued, booked_at, journal, profile, gpus)
    assert disagreements == [], disagreements
    waits = sorted(booked[q.entry_id] - q.enqueued_at for q in queued)
    print(f"\n60 deferrable tasks on {gang_gpus} GPUs, gangs of {gang_gpus}: {rounds} booking rounds, each the one scheduling_round() replays; "
          f"peak {most_deferred} tasks deferred, {running_while_waiting} of {waiting_samples} waiting samples running "
          f"(between queuing and deferring); triggerer killed with {deferred_at_kill} deferred and restarted; wait median "
          f"{statistics.median(waits):.0f} s, max {waits[-1]:.0f} s; gangs overtaken at most "
          f"{max(overtaken.values())} times (bound {bound})")


@pytest.mark.parametrize(("service", "stop_signal", "restarted_after"), [
    ("mlflow", signal.SIGKILL, ()),
    # Airflow's scheduler, DAG processor and triggerer exit (the scheduler may hang instead) when their
    # database goes away; a deployment restarts them (compose's `restart: always`, a liveness probe): so does this suite
    ("postgres", signal.SIGINT, ("airflow",)),
])
def test_a_service_going_away_under_running_tasks_loses_nothing(
    stack: LocalStack, service: str, stop_signal: int, restarted_after: tuple[str, ...],
) -> None:
    """The MLflow server killed, or PostgreSQL (Airflow's and MLflow's database) restarted in fast mode as
    ``pg_ctl restart`` does, for 20 s while three tasks train."""
    client = mlflow_client(stack)
    experiment = client.get_experiment_by_name("horus-profiling")
    before = {r.info.run_id for r in client.search_runs([experiment.experiment_id], max_results=1000)} if experiment else set()
    run_id = stack.start_run("horus_stack_fault")
    wait_for(lambda: list(stack.task_states("horus_stack_fault", run_id).values()).count("running") == 3, 180, poll_s=0.5)
    stack.kill(service, stop_signal)  # every task is training: none can log its profiling run now
    wait_for(lambda: not stack.is_up(service), 30)
    time.sleep(20)
    stack.restart(service)
    for dependent in restarted_after:
        stack.restart(dependent)
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
    health = stack.request("GET", "/api/v2/monitor/health")
    assert health["scheduler"]["status"] == "healthy" and health["metadatabase"]["status"] == "healthy", health
    tries = stack.request("GET", f"/api/v2/dags/horus_stack_fault/dagRuns/{urllib.parse.quote(run_id, safe='')}/taskInstances")
    print(f"\n{service} down 20 s under 3 running tasks: tries {sorted(ti['try_number'] for ti in tries['task_instances'])}, "
          f"{len(logged)} profiling runs ({len(finished)} finished)")


def test_a_task_starting_while_mlflow_is_down_predicts_with_the_cached_champion(bootstrapped: LocalStack) -> None:
    """The tracking server is down when a task predicts its demand: the champion cached on this machine
    serves (not the analytic prior), and the profiling run is logged once the server is back."""
    stack = bootstrapped
    load_predictor(Settings.from_env(stack.env()))  # what any earlier task on this machine did: cache the champion
    cached = json.loads((stack.horus_home / "models" / "horus-gpu-utilization" / "champion.json").read_text())["version"]
    stack.kill("mlflow")
    wait_for(lambda: not stack.is_up("mlflow"), 30)
    run_id = stack.start_run("horus_stack_mlflow_down")
    task_logs = stack.root / "airflow" / "logs" / "dag_id=horus_stack_mlflow_down"

    def predicted_from_the_cache() -> bool:
        return any(f"using cached horus-gpu-utilization version {cached}" in log.read_text(errors="replace")
                   for log in task_logs.rglob("*.log"))

    wait_for(predicted_from_the_cache, 300, lambda: stack.log_tail("airflow"))
    stack.restart("mlflow")
    final = stack.trigger_wait("horus_stack_mlflow_down", run_id, timeout_s=300)
    assert final["state"] == "success", (stack.task_states("horus_stack_mlflow_down", run_id), stack.log_tail("airflow"))
    logged = runs_of(stack, run_id)
    assert [(r.info.status, r.data.tags["horus.predictor"]) for r in logged] == [("FINISHED", f"horus-gpu-utilization/{cached}")]
    assert LedgerReader(stack.horus_home / "ledger.sqlite").live(now=9e12) == []
    print(f"\nmlflow down when the task predicted: placed with the cached horus-gpu-utilization/{cached}, "
          f"its profiling run logged after the restart")


def test_a_worker_killed_under_its_job_is_retried_and_its_gpu_comes_back(stack: LocalStack) -> None:
    """SIGKILL the LocalExecutor worker and its task process while the job trains on a booked GPU: nothing
    of that try can clean up. The job stops with its launcher, the scheduler finds the missing heartbeats,
    the retry releases the dead try's booking and trains again."""
    run_id = stack.start_run("horus_stack_worker_kill")
    wrappers: dict[int, list[str]] = {}

    def training() -> bool:  # this stack's job, not another wrapper running on the machine
        running = processes_running("horus_airflow.cli", "run", "--launcher-pid")
        wrappers.update({pid: argv for pid, argv in running.items() if argv[argv.index("--out") + 1].startswith(str(stack.horus_home))})
        return bool(wrappers)

    wait_for(training, 300, lambda: stack.log_tail("airflow"))
    [(wrapper, argv)] = wrappers.items()
    samples = Path(argv[argv.index("--out") + 1]) / SAMPLES_FILE
    wait_for(lambda: samples.is_file() and samples.stat().st_size > 0, 60)  # it trains, sampled, on its booked GPU
    task_process = int(argv[argv.index("--launcher-pid") + 1])
    worker = parent_of(task_process)
    os.kill(worker, signal.SIGKILL)  # first, so that it cannot report its task's death
    os.kill(task_process, signal.SIGKILL)
    wait_for(lambda: wrapper not in processes_running("horus_airflow.cli", "run"), 30)  # no job outlives its worker
    final = stack.trigger_wait("horus_stack_worker_kill", run_id, timeout_s=600)
    quoted = urllib.parse.quote(run_id, safe="")
    [ti] = stack.request("GET", f"/api/v2/dags/horus_stack_worker_kill/dagRuns/{quoted}/taskInstances")["task_instances"]
    assert final["state"] == "success" and ti["try_number"] == 2, (ti, stack.log_tail("airflow"))
    ledger = LedgerReader(stack.horus_home / "ledger.sqlite")
    dead, retry = sorted((e for e in ledger.journal(10_000) if e.owner == f"horus_stack_worker_kill/train/{run_id}/-1"),
                         key=lambda e: e.created_at)
    assert dead.released_at is not None and dead.released_at <= retry.created_at  # released by the retry, not left to expire
    assert retry.status(now=9e12) == "released" and ledger.live(now=9e12) == []
    killed = RunSummary.read(stack.horus_home / "runs" / dead.job_id)  # the dead try's telemetry is kept on disk
    assert killed is not None and killed.exit_code == 128 + signal.SIGTERM and killed.samples > 0
    logged = runs_of(stack, run_id)
    assert [(r.info.status, r.data.tags["airflow.try_number"]) for r in logged] == [("FINISHED", "2")]
    print(f"\nworker killed under its job: try 2 placed {retry.created_at - dead.created_at:.0f} s after try 1, on "
          f"{retry.bookings[0].gpu_id}, after releasing try 1's booking; try 1's {killed.samples} samples kept on disk")


def test_a_full_artifact_disk_fails_the_logging_and_the_retry_logs_everything(stack: LocalStack, example_run: dict) -> None:  # type: ignore[type-arg]
    """The MLflow server's artifact filesystem full while a task logs its profiling run: the run keeps what
    the server acknowledged (params, metrics) and says why it is FAILED, the task is retried once the disk
    has room, and no earlier artifact is damaged."""
    if not stack.artifacts_mounted:
        pytest.skip("filling the artifact disk needs a filesystem of its own: mounting a tmpfs needs root (CAP_SYS_ADMIN)")
    client = mlflow_client(stack)
    experiment = client.get_experiment_by_name("horus-profiling")
    [earlier] = client.search_runs([experiment.experiment_id], "attributes.status = 'FINISHED'", max_results=1)
    placement_before = Path(client.download_artifacts(earlier.info.run_id, "telemetry/placement.json", tempfile.mkdtemp())).read_bytes()
    filler = stack.artifacts / "filler"
    with filler.open("wb") as disk, contextlib.suppress(OSError):  # ENOSPC ends it
        while True:
            disk.write(b"\0" * (1 << 20))
    run_id = stack.start_run("horus_stack_disk_full")
    quoted = urllib.parse.quote(run_id, safe="")

    def first_try_failed() -> bool:
        [ti] = stack.request("GET", f"/api/v2/dags/horus_stack_disk_full/dagRuns/{quoted}/taskInstances")["task_instances"]
        return ti["try_number"] >= 2 or ti["state"] in ("up_for_retry", "failed")

    wait_for(first_try_failed, 600, lambda: stack.log_tail("airflow"), poll_s=1.0)
    filler.unlink()
    final = stack.trigger_wait("horus_stack_disk_full", run_id, timeout_s=600)
    assert final["state"] == "success", (stack.task_states("horus_stack_disk_full", run_id), stack.log_tail("airflow"))
    logged = runs_of(stack, run_id)
    refused = [r for r in logged if r.info.status == "FAILED"]
    [complete] = [r for r in logged if r.info.status == "FINISHED"]
    assert refused and all(r.data.tags.get(Tag.LOGGING_ERROR) and r.data.metrics["duration_s"] > 0 for r in refused)
    assert {"telemetry/placement.json", "telemetry/samples.parquet", "telemetry/summary.json"} <= {
        a.path for a in client.list_artifacts(complete.info.run_id, "telemetry")}
    assert all(r.info.status != "RUNNING" for r in logged)
    again = Path(client.download_artifacts(earlier.info.run_id, "telemetry/placement.json", tempfile.mkdtemp())).read_bytes()
    assert again == placement_before  # what was stored before the disk filled is intact
    assert LedgerReader(stack.horus_home / "ledger.sqlite").live(now=9e12) == []
    print(f"\nartifact disk full: {len(refused)} profiling run(s) FAILED with the reason "
          f"({refused[0].data.tags[Tag.LOGGING_ERROR][:80]}...), then try {complete.data.tags['airflow.try_number']} logged everything")


def test_no_secret_reaches_a_log_an_xcom_or_mlflow(stack: LocalStack, example_run: dict) -> None:  # type: ignore[type-arg]
    """After at least the example DAG ran (and, in file order, every DAG above): the stack's passwords and
    JWT secret appear in no log file, XCom value, rendered template field, DAG run conf, audit log entry or
    MLflow param or tag."""
    import psycopg2

    secret_values = {"postgres password": stack.password, "admin password": stack.admin_password, "jwt secret": stack.jwt_secret}
    leaks = []
    logs = [*stack.root.glob("*.log"), *(stack.root / "airflow" / "logs").rglob("*.log"), *stack.horus_home.rglob("*.log"),
            *stack.horus_home.rglob("*.json*")]
    assert len(logs) > 10  # the task logs are there to be read
    for path in logs:
        text = path.read_text(errors="replace")
        leaks += [(name, str(path)) for name, value in secret_values.items() if value in text]
    stored = {
        "airflow": ["SELECT value::text FROM xcom", "SELECT rendered_fields::text FROM rendered_task_instance_fields",
                    "SELECT conf::text FROM dag_run", "SELECT extra FROM log"],
        "mlflow": ["SELECT value FROM params", "SELECT value FROM tags", "SELECT value FROM model_version_tags",
                   "SELECT value FROM registered_model_tags"],
    }
    rows = 0
    for database, queries in stored.items():
        with contextlib.closing(psycopg2.connect(host="127.0.0.1", port=stack.ports["postgres"], user="horus",
                                                 password=stack.password, dbname=database)) as conn, conn.cursor() as cursor:
            for query in queries:
                cursor.execute(query)
                for (value,) in cursor.fetchall():
                    rows += 1
                    leaks += [(name, f"{database}: {query}") for name, secret in secret_values.items() if value and secret in value]
    assert rows > 100  # XComs, params and tags of every run above were read
    assert leaks == []
