"""MLflow: one profiling run per launched job (experiment ``horus-profiling``).

A run is written in one go after the job ends, and closed FAILED if writing breaks half-way, so no
run is ever left open. Predictions go in as params (``predicted.*``); metrics are only what was
measured.
"""

from __future__ import annotations

import json
import logging
import os
import platform
import statistics
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from mlflow import entities
from mlflow.entities import Run, RunStatus
from mlflow.tracking import MlflowClient

from horus_airflow.backends.ledger import Booking
from horus_airflow.errors import ProfilingLogError
from horus_airflow.features.gpus import gpu_spec, gpu_type_from_nvml
from horus_airflow.features.graph import GraphFeatures
from horus_airflow.jobs import JobSpec
from horus_airflow.placement import Decision, GpuState
from horus_airflow.predictor.demand import GpuDemand
from horus_airflow.run_schema import Experiment, Metric, Param, Tag, param_equals, tag_equals
from horus_airflow.registry.store import QUICK, client, experiment_id, search
from horus_airflow.settings import Settings
from horus_airflow.telemetry import RunSummary, nvml

log = logging.getLogger(__name__)

@dataclass(frozen=True)
class ProfilingRecord:
    """Everything known about one job once it has run. Jobs Horus placed carry their spec, features,
    prediction and decision; wrapped (``horus run``) or imported (DCGM) jobs may lack some: the run is
    still kept, and the retraining DAG sets aside the ones it cannot learn from, saying why.
    ``co_residents`` names the jobs that shared the GPU (default: the residents at placement time)."""

    spec: JobSpec | None
    features: GraphFeatures | None
    predicted: GpuDemand | None
    predictor: str
    decision: Decision | None
    gpus: tuple[GpuState, ...]
    summary: RunSummary
    run_dir: Path
    context_tags: dict[str, str] = field(default_factory=dict)
    co_residents: tuple[str, ...] | None = None
    run_name: str = ""


def profiling_runs(settings: Settings, airflow_run_id: str) -> list[Run]:
    """The profiling runs an Airflow DAG run logged (none if nothing was ever logged)."""
    return search(settings, Experiment.PROFILING, tag_equals(Tag.AIRFLOW_RUN_ID, airflow_run_id))


def close_abandoned_runs(settings: Settings, owner: str) -> list[str]:
    """Mark FAILED, with the reason, the profiling runs an earlier try of ``owner`` left RUNNING: that try
    was killed while it logged, so the run is half-written and nothing else would close it. Airflow runs
    one try of a task instance at a time, so no run of ``owner`` is being written now. The tracking
    server gets the client's full retries; if it still cannot be reached, :class:`ProfilingLogError`."""
    try:
        by_owner = tag_equals(Tag.OWNER, owner)
    except ValueError as exc:  # Airflow's owners hold no quote
        raise ProfilingLogError(f"owner {owner!r} cannot be searched for in MLflow: {exc}") from None
    mlflow = client(settings)
    try:
        abandoned = [r.info.run_id for r in search(settings, Experiment.PROFILING, f"{by_owner} and attributes.status = 'RUNNING'")]
        for run_id in abandoned:
            mlflow.set_tag(run_id, Tag.LOGGING_ERROR, "the try that logged this run ended before closing it; "
                                                      "a later try of the same task closed it")
            mlflow.set_terminated(run_id, RunStatus.to_string(RunStatus.FAILED))
    except Exception as exc:  # noqa: BLE001 (connection errors surface as requests/urllib3 types)
        raise ProfilingLogError(
            f"the profiling runs an earlier try of {owner} left RUNNING could not be closed at "
            f"{settings.mlflow_tracking_uri} ({type(exc).__name__}: {str(exc)[:300]}); no new run is logged before they are"
        ) from exc
    if abandoned:
        log.warning("closed %d profiling run(s) an earlier try of %s left RUNNING: %s", len(abandoned), owner, ", ".join(abandoned))
    return abandoned


def log_profiling_run(settings: Settings, record: ProfilingRecord) -> str:
    """Log ``record`` as one run. A record of a task instance (tag ``horus.owner``) is logged only once the
    runs its earlier, killed tries left RUNNING are closed, so that no half-written run outlives a retry."""
    owner = record.context_tags.get(Tag.OWNER)
    if owner is not None:
        close_abandoned_runs(settings, owner)
    mlflow = client(settings)
    name = record.run_name or (record.spec.display_name if record.spec else record.run_dir.name)
    started_ms, ended_ms = _job_times_ms(record.summary)  # the job's, so MLflow shows how long it really ran
    run = mlflow.create_run(experiment_id(mlflow, settings, Experiment.PROFILING), start_time=started_ms,
                            run_name=name, tags=_tags(record))
    run_id = run.info.run_id
    try:
        timestamp = int(run.info.start_time)
        mlflow.log_batch(
            run_id,
            params=[entities.Param(k, v) for k, v in _params(record).items()],
            metrics=[entities.Metric(k, v, timestamp, 0) for k, v in record.summary.measured_metrics().items()],
        )
        if record.decision is not None:
            (record.run_dir / "placement.json").write_text(json.dumps(record.decision.to_dict(), indent=2))
        mlflow.log_artifacts(run_id, str(record.run_dir), artifact_path="telemetry")
    except BaseException as exc:
        problem = f"{type(exc).__name__}: {exc}"[:1000]
        closed = _close_failed(mlflow, run_id, problem)
        if not isinstance(exc, Exception):  # interrupted: Airflow's SIGTERM, Ctrl-C
            raise
        state = "it is marked FAILED" if closed else "it could not be closed either, and the task's next try closes it"
        raise ProfilingLogError(
            f"profiling run {run_id} could not be logged completely to {settings.mlflow_tracking_uri} ({problem}); "
            f"{state}, and the job's telemetry is kept in {record.run_dir}"
        ) from exc
    status = RunStatus.FAILED if record.summary.exit_code > 0 else RunStatus.FINISHED  # -1: unknown, e.g. imported
    mlflow.set_terminated(run_id, RunStatus.to_string(status), end_time=ended_ms)
    log.info("profiling run %s logged to %s", run_id, settings.mlflow_tracking_uri)
    return run_id


def _close_failed(mlflow: MlflowClient, run_id: str, problem: str) -> bool:
    """Close a half-written run FAILED, saying why a run whose job succeeded failed; each step is tried on its
    own, as the tracking server may be what broke. False if the run stays open (the next try closes it)."""
    try:
        mlflow.set_tag(run_id, Tag.LOGGING_ERROR, problem)
    except Exception as exc:  # noqa: BLE001 (connection errors surface as requests/urllib3 types)
        log.warning("could not tag profiling run %s with why it failed: %s", run_id, exc)
    try:
        mlflow.set_terminated(run_id, RunStatus.to_string(RunStatus.FAILED))
    except Exception as exc:  # noqa: BLE001
        log.warning("could not close half-written profiling run %s: %s", run_id, exc)
        return False
    return True


def _job_times_ms(summary: RunSummary) -> tuple[int | None, int | None]:
    if summary.started_at is None:
        return None, None  # MLflow's own clock: when the run was logged
    return int(summary.started_at * 1000), int((summary.started_at + summary.duration_s) * 1000)


def _params(record: ProfilingRecord) -> dict[str, str]:
    params: dict[str, str] = {}
    spec = record.spec
    if spec is not None:
        params.update({
            Param.MODEL: spec.model,
            Param.BATCH_SIZE: str(spec.batch_size),
            Param.PRECISION: spec.precision,
            Param.GPUS: str(spec.gpus),
            Param.STEPS: str(spec.steps),
        })
        if spec.command:
            params[Param.COMMAND] = " ".join(spec.command)[:500]
    if record.predicted is not None:
        params.update({
            Param.PREDICTED_UTIL: f"{record.predicted.util:.2f}",
            Param.PREDICTED_UTIL_P90: f"{record.predicted.util_p90:.2f}",
            Param.PREDICTED_MEM_MIB: f"{record.predicted.mem_mib:.0f}",
        })
    if record.features is not None:
        params[Param.DATASET] = record.features.dataset
        params.update(record.features.as_params())
    return params


def _tags(record: ProfilingRecord) -> dict[str, str]:
    residents = record.co_residents
    if residents is None:
        residents = tuple(sorted({r.job_id for gpu in record.gpus for r in gpu.residents}))
    tags = {
        Tag.RUN_KIND: "profiling",
        Tag.GPU_IDS: ",".join(g.gpu_id for g in record.gpus),
        Tag.GPU_MEASURED: str(record.summary.gpu_measured).lower(),
        Tag.CO_RESIDENTS: ",".join(residents),
        Tag.CO_RESIDENT_PIDS: ",".join(str(p) for p in record.summary.co_resident_pids)[:500],
        Tag.PREDICTOR: record.predictor,
        Tag.EXIT_CODE: str(record.summary.exit_code),
    }
    if record.gpus:
        tags[Tag.GPU_TYPE] = record.gpus[0].gpu_type
        tags[Tag.GPU_DECLARED] = str(record.gpus[0].declared).lower()
    if record.decision is not None:
        tags[Tag.PLACEMENT_PROFILE] = record.decision.profile
        tags[Tag.PLACEMENT_REASON] = record.decision.reason
    if record.summary.sample_problems:
        tags[Tag.SAMPLE_PROBLEMS] = json.dumps(record.summary.sample_problems)[:500]
    return {**tags, **record.context_tags}


def log_wrapped_run(settings: Settings, spec: JobSpec, features: GraphFeatures, summary: RunSummary, run_dir: Path) -> str:
    """A profiling run for a command wrapped by ``horus run --job``: the GPUs NVML saw (none without a
    driver) and, where their type is known, the champion's prediction for them."""
    from horus_airflow.registry.predictor import load_predictor

    wanted = os.environ.get("CUDA_VISIBLE_DEVICES")
    visible = None if wanted is None else {int(p) for p in wanted.split(",") if p.strip().isdigit()}
    gpus = tuple(
        GpuState(f"{platform.node()}/{g.index}", platform.node(), g.index, gpu_type, float(g.memory_mib))
        for g in nvml.discover_gpus()
        if (visible is None or g.index in visible) and (gpu_type := gpu_type_from_nvml(g.name, g.memory_mib))
    )
    predicted, predictor = None, "none (no known GPU)"
    if gpus:
        demand = load_predictor(settings).predict(spec.display_name, features, spec.gpus, [gpu_spec(gpus[0].gpu_type)])
        predicted, predictor = demand.on(gpus[0].gpu_type), demand.predictor
    record = ProfilingRecord(spec, features, predicted, predictor, None, gpus, summary, run_dir, {Tag.SOURCE: "horus-run"}, co_residents=())
    return log_profiling_run(settings, record)


def log_pod_run(
    settings: Settings, spec: JobSpec, features: GraphFeatures, bookings: Sequence[Booking], gpu_type: str, predictor: str,
    co_residents: str, explanation: str, exit_code: int, tags: dict[str, str],
) -> str:
    """The profiling run of a Kubernetes pod Horus placed. Its GPU telemetry is not measured by Horus;
    the DCGM import attaches it to this run later (tag ``horus.pod``)."""
    memory = gpu_spec(gpu_type).memory_mib
    gpus = tuple(
        GpuState(b.gpu_id, b.gpu_id.rsplit("/", 1)[0], int(b.gpu_id.rsplit("/", 1)[1]), gpu_type, memory) for b in bookings
    )
    first = bookings[0]
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp)
        (run_dir / "placement.json").write_text(explanation)
        summary = RunSummary(exit_code, 0.0, 0, False, None, None)
        record = ProfilingRecord(spec, features, GpuDemand(first.util, first.util_p90, first.mem_mib), predictor, None, gpus,
                                 summary, run_dir, tags, co_residents=tuple(filter(None, co_residents.split(","))))
        return log_profiling_run(settings, record)


def expected_runtime_s(settings: Settings, spec: JobSpec, dataset: str, latest: int = 20) -> float | None:
    """How long the same workload ran before: the median ``duration_s`` of its ``latest`` successful
    profiling runs (same model, dataset, batch size, precision, steps, GPUs and command), for the queue
    policies that order by runtime. None when it never ran, or when MLflow cannot be asked quickly (the
    job then waits without an expected runtime, as a first run does)."""
    clauses = " and ".join([param_equals(Param.MODEL, spec.model), param_equals(Param.DATASET, dataset),
                            param_equals(Param.BATCH_SIZE, str(spec.batch_size)), param_equals(Param.PRECISION, spec.precision),
                            param_equals(Param.STEPS, str(spec.steps)), param_equals(Param.GPUS, str(spec.gpus)),
                            tag_equals(Tag.EXIT_CODE, "0"), "attributes.status = 'FINISHED'"])
    command = " ".join(spec.command)[:500] if spec.command else None
    try:
        runs = search(settings, Experiment.PROFILING, clauses, max_results=latest, order_by=["attributes.start_time DESC"],
                      policy=QUICK)
    except Exception as exc:  # noqa: BLE001  (any failure to reach MLflow: a wait without a runtime, not a failed task)
        log.warning("no expected runtime for %s: MLflow could not be searched (%s)", spec.model, exc)
        return None
    durations = [run.data.metrics[Metric.DURATION_S] for run in runs
                 if Metric.DURATION_S in run.data.metrics and run.data.params.get(Param.COMMAND) == command]
    return statistics.median(durations) if durations else None
