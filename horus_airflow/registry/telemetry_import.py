"""Import GPU telemetry a cluster already collected (DCGM exporter series, read by
:mod:`horus_airflow.telemetry.dcgm`) as profiling runs: attached to the run of the pod Horus placed when
there is one, else a run of its own. Importing the same export twice logs nothing twice."""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from mlflow import entities
from mlflow.entities import RunTag

from horus_airflow.features.gpus import gpu_spec, gpu_type_from_nvml
from horus_airflow.jobs import JobSpec
from horus_airflow.placement import GpuState
from horus_airflow.registry.profiling import ProfilingRecord, log_profiling_run
from horus_airflow.run_schema import Experiment, Metric, Tag, tag_equals
from horus_airflow.registry.store import client, search
from horus_airflow.settings import Settings
from horus_airflow.telemetry import RunSummary, samples_frame
from horus_airflow.telemetry.dcgm import ImportedJob
from horus_airflow.telemetry.wrapper import SAMPLES_FILE, SAMPLES_PARQUET, UNKNOWN_EXIT, summarise

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ImportReport:
    """What an import logged (group key -> MLflow run id), what it had already imported, and what it
    could not read."""

    logged: dict[str, str]
    already_imported: dict[str, str]
    left_out: dict[str, int]


def import_jobs(
    settings: Settings, jobs: list[ImportedJob], specs: Mapping[str, JobSpec], source_digest: str, work_dir: Path,
    left_out: Mapping[str, int] | None = None,
) -> ImportReport:
    """Log one profiling run per imported job. A job whose key is a pod Horus placed on Kubernetes gets
    its telemetry attached to that pod's profiling run (which holds its features, prediction and
    placement). Otherwise a new run: a job named in ``specs`` gets its graph features; one that is not is
    still logged (the retraining DAG sets it aside as 'run without features'). Importing the same export
    again logs nothing twice: each run carries ``horus.source_id``."""
    logged, already = {}, {}
    for job in jobs:
        source_id = hashlib.sha256(f"{source_digest}/{job.key}".encode()).hexdigest()[:24]
        found = search(settings, Experiment.PROFILING, tag_equals(Tag.SOURCE_ID, source_id), max_results=1)
        if found:
            already[job.key] = found[0].info.run_id
            continue
        run_dir = work_dir / source_id
        run_dir.mkdir(parents=True, exist_ok=True)
        summary = _write_imported(job, run_dir)
        # a pod's name never holds a quote (DNS-1123), and a filter could not express one
        pod_run = [] if "'" in job.key else search(settings, Experiment.PROFILING, f"tags.`{Tag.POD}` LIKE '%/{job.key}'", max_results=1)
        if pod_run and pod_run[0].data.tags.get(Tag.GPU_MEASURED) != "true":
            logged[job.key] = _attach(settings, pod_run[0].info.run_id, summary, run_dir, source_id)
            continue
        spec = specs.get(job.key)
        gpu_type = gpu_type_from_nvml(job.model_name, int(job.memory_mib))
        memory = job.memory_mib or (gpu_spec(gpu_type).memory_mib if gpu_type else 0.0)
        host = job.hostname or "unknown"
        gpus = tuple(GpuState(f"{host}/{i}", host, i, gpu_type, memory) for i in job.gpu_indices) if gpu_type else ()
        tags = {Tag.SOURCE: "dcgm", Tag.SOURCE_ID: source_id, Tag.IMPORT_KEY: job.key,
                Tag.IMPORT_GPU_MODEL: job.model_name}
        record = ProfilingRecord(spec, spec.features() if spec else None, None, "none (imported)", None, gpus, summary,
                                 run_dir, tags, co_residents=(), run_name=f"imported-{job.key}")
        logged[job.key] = log_profiling_run(settings, record)
    return ImportReport(logged, already, dict(left_out or {}))


def _write_imported(job: ImportedJob, run_dir: Path) -> RunSummary:
    with (run_dir / SAMPLES_FILE).open("w") as sink:
        sink.writelines(s.to_json() + "\n" for s in job.samples)
    samples_frame(job.samples).to_parquet(run_dir / SAMPLES_PARQUET, index=False)
    duration = job.samples[-1].t_s if job.samples else 0.0
    summary = summarise(UNKNOWN_EXIT, duration, list(job.samples), {}, job.problems)
    summary.write(run_dir)
    return summary


def _attach(settings: Settings, run_id: str, summary: RunSummary, run_dir: Path, source_id: str) -> str:
    """Add imported GPU telemetry to the profiling run of the pod it measured (which already holds the
    job's features, prediction and placement)."""
    mlflow = client(settings)
    timestamp = int(mlflow.get_run(run_id).info.start_time)
    mlflow.log_batch(run_id, metrics=[entities.Metric(k, v, timestamp, 0) for k, v in summary.measured_metrics().items() if k != Metric.DURATION_S],
                     tags=[RunTag(Tag.GPU_MEASURED, str(summary.gpu_measured).lower()), RunTag(Tag.SOURCE_ID, source_id),
                           RunTag(Tag.TELEMETRY_SOURCE, "dcgm")])
    mlflow.log_artifacts(run_id, str(run_dir), artifact_path="telemetry")
    log.info("DCGM telemetry attached to profiling run %s", run_id)
    return run_id
