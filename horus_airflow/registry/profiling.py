"""MLflow: one profiling run per launched job (experiment ``horus-profiling``).

A run is written in one go after the job ends, and closed FAILED if writing breaks half-way, so no
run is ever left open. Predictions go in as params (``predicted.*``); metrics are only what was
measured.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path

from mlflow.entities import Metric, Param, Run, RunStatus

from horus_airflow.features.graph import GraphFeatures
from horus_airflow.jobs import JobSpec
from horus_airflow.placement import Decision, GpuState
from horus_airflow.predictor.demand import GpuDemand
from horus_airflow.registry.store import client, experiment_id
from horus_airflow.settings import Settings
from horus_airflow.telemetry import RunSummary

log = logging.getLogger(__name__)

PROFILING_EXPERIMENT = "horus-profiling"


@dataclass(frozen=True)
class ProfilingRecord:
    """Everything known about one job once it has run."""

    spec: JobSpec
    features: GraphFeatures
    predicted: GpuDemand
    predictor: str
    decision: Decision
    gpus: tuple[GpuState, ...]
    summary: RunSummary
    run_dir: Path
    context_tags: dict[str, str] = field(default_factory=dict)


def profiling_runs(settings: Settings, airflow_run_id: str) -> list[Run]:
    """The profiling runs an Airflow DAG run logged (none if nothing was ever logged)."""
    mlflow = client(settings)
    experiment = mlflow.get_experiment_by_name(PROFILING_EXPERIMENT)
    if experiment is None:
        return []
    return list(
        mlflow.search_runs([experiment.experiment_id], filter_string=f"tags.`airflow.run_id` = '{airflow_run_id}'")
    )


def log_profiling_run(settings: Settings, record: ProfilingRecord) -> str:
    mlflow = client(settings)
    run = mlflow.create_run(
        experiment_id(mlflow, settings, PROFILING_EXPERIMENT), run_name=record.spec.display_name, tags=_tags(record)
    )
    run_id = run.info.run_id
    try:
        timestamp = int(run.info.start_time)
        mlflow.log_batch(
            run_id,
            params=[Param(k, v) for k, v in _params(record).items()],
            metrics=[Metric(k, v, timestamp, 0) for k, v in record.summary.measured_metrics().items()],
        )
        (record.run_dir / "placement.json").write_text(json.dumps(record.decision.to_dict(), indent=2))
        mlflow.log_artifacts(run_id, str(record.run_dir), artifact_path="telemetry")
    except BaseException:
        mlflow.set_terminated(run_id, RunStatus.to_string(RunStatus.FAILED))
        raise
    status = RunStatus.FINISHED if record.summary.exit_code == 0 else RunStatus.FAILED
    mlflow.set_terminated(run_id, RunStatus.to_string(status))
    log.info("profiling run %s logged to %s", run_id, settings.mlflow_tracking_uri)
    return run_id


def _params(record: ProfilingRecord) -> dict[str, str]:
    spec = record.spec
    params = {
        "job.model": spec.model,
        "job.dataset": record.features.dataset,
        "job.batch_size": str(spec.batch_size),
        "job.precision": spec.precision,
        "job.gpus": str(spec.gpus),
        "job.steps": str(spec.steps),
        "predicted.gpu_util": f"{record.predicted.util:.2f}",
        "predicted.gpu_util_p90": f"{record.predicted.util_p90:.2f}",
        "predicted.gpu_mem_mib": f"{record.predicted.mem_mib:.0f}",
    }
    if spec.command:
        params["job.command"] = " ".join(spec.command)[:500]
    params.update(record.features.as_params())
    return params


def _tags(record: ProfilingRecord) -> dict[str, str]:
    first = record.gpus[0]
    residents = sorted({r.job_id for gpu in record.gpus for r in gpu.residents})
    return {
        "horus.run_kind": "profiling",
        "horus.gpu_ids": ",".join(g.gpu_id for g in record.gpus),
        "horus.gpu_type": first.gpu_type,
        "horus.gpu_declared": str(first.declared).lower(),
        "horus.gpu_measured": str(record.summary.gpu_measured).lower(),
        "horus.co_residents": ",".join(residents),
        "horus.placement.profile": record.decision.profile,
        "horus.placement.reason": record.decision.reason,
        "horus.predictor": record.predictor,
        "horus.exit_code": str(record.summary.exit_code),
        **record.context_tags,
    }
