"""The whole path of one training task: spec -> features -> demand -> placement -> reserve -> run ->
profiling run -> release. The Airflow operator is a thin face over :func:`run_job`."""

from __future__ import annotations

import logging
import sys
import uuid
from dataclasses import dataclass, replace
from typing import Callable

from horus_airflow.backends import LocalBackend, acquire
from horus_airflow.backends.local import LaunchedJob
from horus_airflow.catalog import is_onnx
from horus_airflow.errors import InvalidJobError
from horus_airflow.features import GraphFeatures
from horus_airflow.features.gpus import gpu_spec
from horus_airflow.jobs import JobSpec
from horus_airflow.placement import load_profile
from horus_airflow.predictor import Demand
from horus_airflow.interference import signature
from horus_airflow.registry import ProfilingRecord, load_interference, load_predictor, log_profiling_run
from horus_airflow.settings import Settings
from horus_airflow.telemetry import RunSummary

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class JobOutcome:
    """What a task reports back (XCom, the demo's summary table)."""

    job_id: str
    model: str
    gpu_ids: tuple[str, ...]
    gpu_type: str
    gpu_declared: bool
    predicted_util: float
    predicted_mem_mib: float
    predictor: str
    reason: str
    mlflow_run_id: str
    exit_code: int
    ledger_conflicts: int


def predict_demand(
    spec: JobSpec, job_id: str, gpu_types: list[str], settings: Settings
) -> tuple[GraphFeatures, Demand]:
    """Features of the job's graph, then the champion predictor's (or the prior's) demand per GPU type."""
    features = spec.features()
    demand = load_predictor(settings).predict(job_id, features, spec.gpus, [gpu_spec(t) for t in gpu_types])
    return features, replace(demand, signature=signature(features))


def training_command(spec: JobSpec) -> list[str]:
    """The user's command, or the built-in trainer for a catalog model or a user's module."""
    if spec.command:
        return list(spec.command)
    if is_onnx(spec.model):
        raise InvalidJobError(
            f"an ONNX model ({spec.model!r}) cannot be trained by the built-in trainer: give command=[...] "
            "that trains it; Horus predicts its demand from the graph"
        )
    command = [sys.executable, "-m", "horus_airflow.catalog.train", "--model", spec.model]
    command += ["--batch-size", str(spec.batch_size), "--steps", str(spec.steps)]
    if spec.dataset:
        command += ["--dataset", spec.dataset]
    if spec.seq_len:
        command += ["--seq-len", str(spec.seq_len)]
    if spec.precision == "amp":
        command.append("--amp")
    return command


def run_job(
    spec: JobSpec,
    settings: Settings,
    owner: str,
    profile_name: str | None = None,
    placement_timeout_s: float = 600.0,
    context_tags: dict[str, str] | None = None,
    on_launch: Callable[[LaunchedJob], None] | None = None,
) -> JobOutcome:
    """Run one job end to end. Bad input fails before anything is reserved or logged; once a GPU is
    reserved it is released whatever happens."""
    profile = load_profile(profile_name or settings.profile)
    backend = LocalBackend(settings)
    job_id = f"{spec.display_name}-{uuid.uuid4().hex[:8]}"
    command = training_command(spec)
    features, demand = predict_demand(spec, job_id, sorted({g.gpu_type for g in backend.gpus}), settings)
    interference, interference_label = load_interference(settings)
    acquired = acquire(backend, demand, profile, owner, placement_timeout_s, interference)
    decision, reservation = acquired.decision, acquired.reservation
    placed_on = tuple(gpu for gpu in acquired.state.gpus if gpu.gpu_id in decision.gpu_ids)
    log.info("placed %s: %s", job_id, decision.reason)
    run_dir = settings.runs_dir / job_id
    try:
        job = backend.launch(command, reservation, run_dir)
        if on_launch:
            on_launch(job)
        summary: RunSummary = backend.wait(job, reservation)
    finally:
        backend.release(reservation)
    predicted = demand.on(placed_on[0].gpu_type)
    run_id = log_profiling_run(
        settings,
        ProfilingRecord(
            spec, features, predicted, demand.predictor, decision, placed_on, summary, run_dir,
            {"horus.interference": interference_label, **(context_tags or {})},
        ),
    )
    return JobOutcome(
        job_id=job_id,
        model=spec.model,
        gpu_ids=decision.gpu_ids,
        gpu_type=placed_on[0].gpu_type,
        gpu_declared=placed_on[0].declared,
        predicted_util=predicted.util,
        predicted_mem_mib=predicted.mem_mib,
        predictor=demand.predictor,
        reason=decision.reason,
        mlflow_run_id=run_id,
        exit_code=summary.exit_code,
        ledger_conflicts=acquired.conflicts,
    )
