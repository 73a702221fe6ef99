"""A seeded Horus home for the UI tests, built through the real code paths: placements go through the
placer and the SQLite ledger, a job runs under the telemetry wrapper and logs its profiling run, the
registry is bootstrapped from the shipped seed data, and a simulation replays a shipped trace.

Two values are TEST INPUT, not measurements, and say so: the GPU telemetry line of the live job (this
machine has no GPU) and one profiling run's GPU metrics (so the predicted-vs-measured plot has a point).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from horus_airflow.backends.base import acquire
from horus_airflow.backends.ledger import LedgerReader
from horus_airflow.backends.local import LocalBackend
from horus_airflow.jobs import JobSpec
from horus_airflow.pipeline import run_job
from horus_airflow.placement import load_profile
from horus_airflow.predictor.demand import Demand, GpuDemand
from horus_airflow.registry.bootstrap import bootstrap
from horus_airflow.registry.profiling import ProfilingRecord, log_profiling_run
from horus_airflow.settings import Settings
from horus_airflow.simulator.engine import Cluster
from horus_airflow.simulator.report import log_simulation
from horus_airflow.simulator.runner import run_simulation
from horus_airflow.telemetry import RunSummary
from horus_airflow.telemetry.samples import GpuReading, Sample
from horus_airflow.telemetry.wrapper import SAMPLES_FILE

REPO = Path(__file__).resolve().parent.parent
LIVE_OWNER = "ui_dag/train_big/manual__2026-01-01T00:00:00+00:00/-1"
TEST_INPUT_UTIL = 87.0  # the live job's GPU utilization in its samples file: test input, not a measurement


@dataclass(frozen=True)
class Seeded:
    settings: Settings
    finished_reservation: str
    live_reservation: str
    live_gpu: str
    simulation_run: str


def seed(settings: Settings) -> Seeded:
    bootstrap(settings)
    outcome = run_job(
        JobSpec(model="resnet18", batch_size=32, command=(sys.executable, "-c", "pass"), name="finished_job"),
        settings, owner="ui_dag/finished_job/manual__2026-01-01T00:00:00+00:00/-1",
        context_tags={"airflow.dag_id": "ui_dag", "airflow.task_id": "finished_job"},
    )
    backend = LocalBackend(settings)
    live = Demand("train_big-0001", 1, {"a100-80gb": GpuDemand(55.0, 70.0, 30_000.0)})
    acquired = acquire(backend, live, load_profile("horus-paper"), LIVE_OWNER, timeout_s=5)
    [gpu] = acquired.reservation.gpu_ids
    index = backend.gpu(gpu).index
    run_dir = settings.runs_dir / live.job_id
    run_dir.mkdir(parents=True, exist_ok=True)
    line = Sample(3.0, 99.0, 2048.0, (GpuReading(index, util=TEST_INPUT_UTIL, mem_used_mib=28_000.0),)).to_json()
    (run_dir / SAMPLES_FILE).write_text(line + "\n" + line[:20])  # the wrapper is writing its next line

    record = ProfilingRecord(
        JobSpec(model="resnet50", batch_size=64), None, GpuDemand(62.0, 75.0, 20_000.0), "test input", None,
        (backend.gpu(gpu),), RunSummary(0, 30.0, 150, True, 90.0, 3000.0, gpu_util_mean=71.0, gpu_mem_mib_max=19_000.0),
        settings.runs_dir / "measured-test-input", {"horus.source": "test input"},
    )
    record.run_dir.mkdir(parents=True, exist_ok=True)
    log_profiling_run(settings, record)

    report = run_simulation(REPO / "data/traces/gavel/7f04ca.trace", "gavel", Cluster(2, 4, "v100"), ["exclusive", "horus-paper"],
                            REPO / "data/interference_seed/gavel_pairs.csv", REPO / "data/interference_seed/gavel_isolated.csv",
                            1.0, 30, None)
    simulation = log_simulation(settings, report)
    assert outcome.exit_code == 0
    finished = _reservation_of(settings, outcome.job_id)
    return Seeded(settings, finished, acquired.reservation.reservation_id, gpu, simulation)


def _reservation_of(settings: Settings, job_id: str) -> str:
    return next(e.reservation_id for e in LedgerReader(settings.ledger_path).journal(50) if e.job_id == job_id)
