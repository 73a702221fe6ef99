"""Refresh the utilization/memory predictor and the interference model from MLflow profiling runs.

extract -> build_dataset -> retrain_predictor / retrain_interference -> promote -> report

- **extract** reads every run of ``horus-profiling`` and turns it into a predictor row (a job alone), a
  pair side (two jobs profiled together) or a row set aside with its reason (no GPU measured, no
  features, failed, duplicate...). When nothing is newer than what the last retraining read, the rest
  is skipped (``force`` overrides).
- **build_dataset** adds the shipped seed rows and validates everything once (schema, ranges,
  duplicates): bad rows are set aside and counted, good rows are never lost.
- **retrain_*** train a challenger without some held-out families, log it (dataset via ``mlflow.data``),
  register it as ``challenger``, and score it and the current champion on the same held-out rows.
- **promote** moves ``champion`` only where ``mlflow.validate_evaluation_results`` passes the thresholds
  in ``model_registry/promotion_policy.yaml``. It is the last step that writes to the registry, so a run
  that fails anywhere before leaves the champion untouched; re-running is safe.
- **report** logs what happened to the experiment ``horus-retraining``.

Tasks hand tables on as CSV artifacts of one MLflow run per DAG run (experiment
``horus-retraining-data``; its id travels by XCom), never through a local disk: with the Celery or
Kubernetes executor the next task runs on another worker.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from datetime import datetime
from typing import Any

from airflow.sdk import DAG, Param, get_current_context, task
from airflow.sdk.exceptions import AirflowSkipException

PARAMS = {
    "seed_data": Param("data/predictor_seed/predictor_seed.csv", type="string", description="seed rows (HORUS_PROJECT_ROOT-relative)"),
    "seed_pairs": Param("data/interference_seed/gavel_pairs.csv", type="string", description="seed co-location pairs"),
    "policy": Param("model_registry/promotion_policy.yaml", type="string", description="promotion thresholds"),
    "force": Param(False, type="boolean", description="retrain even when no profiling run is new"),
}


with DAG(
    dag_id="horus_retrain_predictor",
    description="Retrain the predictor and the interference model from profiling runs; promote only when better",
    schedule=None,
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,
    tags=["horus", "mlops"],
    params=PARAMS,
) as dag:

    @task
    def extract(params: dict[str, Any] | None = None) -> dict[str, Any]:
        from horus_airflow.registry.retraining import (
            all_profiling_runs,
            last_retraining_until_ms,
            stage_tables,
        )
        from horus_airflow.registry.retraining import extract as extract_runs
        from horus_airflow.settings import Settings

        settings = Settings.from_env()
        extracted = extract_runs(all_profiling_runs(settings))
        last = last_retraining_until_ms(settings)
        if extracted.newest_ms <= last and not (params or {}).get("force"):
            raise AirflowSkipException(f"no profiling run since the last retraining ({extracted.runs_read} runs read)")
        data_run = stage_tables(settings, get_current_context()["run_id"], extracted.tables())
        reasons = extracted.set_aside["reason"].value_counts().to_dict() if len(extracted.set_aside) else {}
        return {"data_run": data_run, "runs_read": extracted.runs_read, "predictor_rows": len(extracted.predictor_rows),
                "pairs": len(extracted.pairs), "set_aside": len(extracted.set_aside), "set_aside_reasons": reasons,
                "newest_ms": extracted.newest_ms}

    @task
    def build_dataset(extracted: dict[str, Any], params: dict[str, Any] | None = None) -> dict[str, Any]:
        import pandas as pd

        from horus_airflow.registry.retraining import build_predictor_data, stage_tables, staged_table
        from horus_airflow.settings import Settings

        settings = Settings.from_env()
        seed = pd.read_csv(settings.project_file((params or {})["seed_data"]))
        data = build_predictor_data(seed, staged_table(settings, extracted["data_run"], "profiling_rows"))
        stage_tables(settings, get_current_context()["run_id"], {"rows": data.rows, "rejected": data.rejected}, extracted["data_run"])
        reasons = data.rejected["reason"].value_counts().to_dict() if len(data.rejected) else {}
        return {**extracted, "rows": len(data.rows), "rejected": len(data.rejected), "rejected_reasons": reasons}

    @task
    def retrain_predictor(dataset: dict[str, Any], params: dict[str, Any] | None = None) -> dict[str, Any]:
        from horus_airflow.predictor.dataset import ValidatedData
        from horus_airflow.registry.retraining import PromotionPolicy, compare_predictor, staged_table
        from horus_airflow.settings import Settings

        settings = Settings.from_env()
        policy = PromotionPolicy.load(settings.project_file((params or {})["policy"]))
        data_run = dataset["data_run"]
        data = ValidatedData(staged_table(settings, data_run, "rows"), staged_table(settings, data_run, "rejected"))
        comparison = compare_predictor(settings, data, policy.predictor, source=f"retraining data run {data_run}")
        return json.loads(json.dumps(asdict(comparison)))

    @task
    def retrain_interference(extracted: dict[str, Any], params: dict[str, Any] | None = None) -> dict[str, Any]:
        from horus_airflow.interference.pairs import read_pairs
        from horus_airflow.registry.retraining import (
            PromotionPolicy,
            compare_interference,
            staged_table,
        )
        from horus_airflow.settings import Settings

        if not extracted["pairs"]:
            raise AirflowSkipException("no co-located pair was profiled: the interference model is left as it is")
        settings = Settings.from_env()
        policy = PromotionPolicy.load(settings.project_file((params or {})["policy"]))
        seed = read_pairs(settings.project_file((params or {})["seed_pairs"]))
        profiled = staged_table(settings, extracted["data_run"], "profiling_pairs")
        comparison = compare_interference(settings, seed, profiled, policy.interference,
                                          source=f"retraining data run {extracted['data_run']}")
        return json.loads(json.dumps(asdict(comparison)))

    @task(trigger_rule="none_failed")
    def promote(predictor: dict[str, Any] | None, interference: dict[str, Any] | None) -> dict[str, bool]:
        from horus_airflow.registry.retraining import Comparison, promote_if_passed
        from horus_airflow.settings import Settings

        settings = Settings.from_env()
        done = {}
        for raw in (predictor, interference):
            if raw:
                comparison = Comparison.from_dict(raw)
                done[comparison.model] = promote_if_passed(settings, comparison)
        return done

    @task(trigger_rule="none_failed")
    def report(dataset: dict[str, Any], predictor: dict[str, Any] | None, interference: dict[str, Any] | None,
               promoted: dict[str, bool]) -> str:
        from horus_airflow.registry.retraining import Comparison, log_report
        from horus_airflow.settings import Settings

        comparisons = [Comparison.from_dict(raw) for raw in (predictor, interference) if raw]
        return log_report(Settings.from_env(), comparisons, dataset, promoted or {})

    extracted = extract()
    dataset = build_dataset(extracted)
    predictor = retrain_predictor(dataset)
    interference = retrain_interference(extracted)
    promoted = promote(predictor, interference)
    report(dataset, predictor, interference, promoted)
