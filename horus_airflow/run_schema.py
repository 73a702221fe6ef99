"""Every MLflow name Horus writes or reads: experiments, run tags, params and metrics.

One place, so a reader of a run (the retraining DAG, the UI, the demo, an analyst's notebook) and its
writer cannot drift apart, and docs/TELEMETRY.md can list them. This module imports nothing: DAG files
and the UI may use it at parse time.
"""

from __future__ import annotations

from typing import Final


class Experiment:
    PROFILING: Final = "horus-profiling"
    PREDICTOR_TRAINING: Final = "horus-predictor-training"
    INTERFERENCE_TRAINING: Final = "horus-interference-training"
    RETRAINING: Final = "horus-retraining"
    RETRAINING_DATA: Final = "horus-retraining-data"  # tables the retraining DAG's tasks hand on
    SIMULATIONS: Final = "horus-simulations"


class Tag:
    """Run tags. Values are strings; booleans are ``"true"`` / ``"false"``."""

    RUN_KIND: Final = "horus.run_kind"  # profiling, predictor-training, interference-training, retraining, simulation
    DATA_SOURCE: Final = "horus.data_source"  # what a training run learned from
    OWNER: Final = "horus.owner"  # the task instance that logged the run, the same for every try
    LOGGING_ERROR: Final = "horus.logging_error"  # why a run is FAILED although its job may have succeeded
    SOURCE: Final = "horus.source"  # kubernetes, dcgm, horus-run; absent: the local backend
    SOURCE_ID: Final = "horus.source_id"  # an imported job's digest, so an import never logs twice
    TELEMETRY_SOURCE: Final = "horus.telemetry_source"
    IMPORT_KEY: Final = "horus.import.key"
    IMPORT_GPU_MODEL: Final = "horus.import.gpu_model"
    POD: Final = "horus.pod"  # namespace/name
    RESERVATION_ID: Final = "horus.reservation_id"
    GPU_IDS: Final = "horus.gpu_ids"
    GPU_TYPE: Final = "horus.gpu_type"
    GPU_DECLARED: Final = "horus.gpu_declared"  # the GPU came from HORUS_LOCAL_GPUS, not NVML
    GPU_MEASURED: Final = "horus.gpu_measured"  # GPU metrics were measured (NVML or DCGM)
    CO_RESIDENTS: Final = "horus.co_residents"
    CO_RESIDENT_PIDS: Final = "horus.co_resident_pids"
    PAIR_ID: Final = "horus.pair_id"  # two runs profiled together on one GPU
    PREDICTOR: Final = "horus.predictor"
    INTERFERENCE: Final = "horus.interference"
    EXIT_CODE: Final = "horus.exit_code"
    SAMPLE_PROBLEMS: Final = "horus.sample_problems"
    PLACEMENT_PROFILE: Final = "horus.placement.profile"
    PLACEMENT_REASON: Final = "horus.placement.reason"
    CAMPAIGN: Final = "horus.campaign"
    PROFILING_UNTIL_MS: Final = "horus.profiling_until_ms"  # the newest profiling run a retraining read
    AIRFLOW_DAG_ID: Final = "airflow.dag_id"
    AIRFLOW_TASK_ID: Final = "airflow.task_id"
    AIRFLOW_RUN_ID: Final = "airflow.run_id"
    AIRFLOW_TRY_NUMBER: Final = "airflow.try_number"
    AIRFLOW_MAP_INDEX: Final = "airflow.map_index"


class Param:
    """Run params: the job as declared, its prediction, and its graph features (``feature.*``)."""

    MODEL: Final = "job.model"
    BATCH_SIZE: Final = "job.batch_size"
    PRECISION: Final = "job.precision"
    GPUS: Final = "job.gpus"
    STEPS: Final = "job.steps"
    COMMAND: Final = "job.command"
    DATASET: Final = "job.dataset"
    PREDICTED_UTIL: Final = "predicted.gpu_util"
    PREDICTED_UTIL_P90: Final = "predicted.gpu_util_p90"
    PREDICTED_MEM_MIB: Final = "predicted.gpu_mem_mib"
    FEATURE_PREFIX: Final = "feature."
    TRAIN_FLOPS: Final = "feature.train_flops"


class Metric:
    """Measured metrics only (a prediction is a param). ``job.*`` are what the training script reported."""

    GPU_UTIL_MEAN: Final = "gpu_util_mean"
    GPU_UTIL_P90: Final = "gpu_util_p90"
    GPU_MEM_MIB_MAX: Final = "gpu_mem_mib_max"
    DURATION_S: Final = "duration_s"
    THROUGHPUT: Final = "job.throughput_samples_per_s"
    JOB_PREFIX: Final = "job."


def tag_equals(tag: str, value: str) -> str:
    """An MLflow filter clause; a value with a quote cannot be expressed and is refused."""
    return _equals("tags", tag, value)


def param_equals(param: str, value: str) -> str:
    return _equals("params", param, value)


def _equals(kind: str, key: str, value: str) -> str:
    if "'" in value:
        raise ValueError(f"{key} value {value!r} holds a quote, which an MLflow filter cannot express")
    return f"{kind}.`{key}` = '{value}'"
