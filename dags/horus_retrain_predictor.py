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
"""

from __future__ import annotations

import json
from dataclasses import asdict
from datetime import datetime
from pathlib import Path
from typing import Any

from airflow.sdk import DAG, Param, get_current_context, task
from airflow.sdk.exceptions import AirflowSkipException

PARAMS = {
    "seed_data": Param("data/predictor_seed/predictor_seed.csv", type="string", description="seed rows (HORUS_PROJECT_ROOT-relative)"),
    "seed_pairs": Param("data/interference_seed/gavel_pairs.csv", type="string", description="seed co-location pairs"),
    "policy": Param("model_registry/promotion_policy.yaml", type="string", description="promotion thresholds"),
    "force": Param(False, type="boolean", description="retrain even when no profiling run is new"),
}


def _staging() -> Path:
    from horus_airflow.settings import Settings

    run_id = get_current_context()["run_id"]
    folder = Settings.from_env().home / "retraining" / "".join(c if c.isalnum() or c in "-_." else "_" for c in run_id)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


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
        )
        from horus_airflow.registry.retraining import extract as extract_runs
        from horus_airflow.settings import Settings

        settings = Settings.from_env()
        extracted = extract_runs(all_profiling_runs(settings))
        last = last_retraining_until_ms(settings)
        if extracted.newest_ms <= last and not (params or {}).get("force"):
            raise AirflowSkipException(f"no profiling run since the last retraining ({extracted.runs_read} runs read)")
        folder = _staging()
        extracted.write(folder)
        reasons = extracted.set_aside["reason"].value_counts().to_dict() if len(extracted.set_aside) else {}
        return {"folder": str(folder), "runs_read": extracted.runs_read, "predictor_rows": len(extracted.predictor_rows),
                "pairs": len(extracted.pairs), "set_aside": len(extracted.set_aside), "set_aside_reasons": reasons,
                "newest_ms": extracted.newest_ms}

    @task
    def build_dataset(extracted: dict[str, Any], params: dict[str, Any] | None = None) -> dict[str, Any]:
        import pandas as pd

        from horus_airflow.registry.retraining import build_predictor_data
        from horus_airflow.settings import Settings

        folder = Path(extracted["folder"])
        seed = pd.read_csv(Settings.from_env().project_file((params or {})["seed_data"]))
        data = build_predictor_data(seed, pd.read_csv(folder / "profiling_rows.csv"))
        data.rows.to_csv(folder / "rows.csv", index=False)
        data.rejected.to_csv(folder / "rejected.csv", index=False)
        reasons = data.rejected["reason"].value_counts().to_dict() if len(data.rejected) else {}
        return {**extracted, "rows": len(data.rows), "rejected": len(data.rejected), "rejected_reasons": reasons}

    @task
    def retrain_predictor(dataset: dict[str, Any], params: dict[str, Any] | None = None) -> dict[str, Any]:
        import pandas as pd

        from horus_airflow.predictor.dataset import ValidatedData
        from horus_airflow.registry.retraining import PromotionPolicy, compare_predictor
        from horus_airflow.settings import Settings

        settings = Settings.from_env()
        policy = PromotionPolicy.load(settings.project_file((params or {})["policy"]))
        folder = Path(dataset["folder"])
        data = ValidatedData(pd.read_csv(folder / "rows.csv"), pd.read_csv(folder / "rejected.csv"))
        comparison = compare_predictor(settings, data, policy.predictor, source=f"retraining {folder.name}")
        return json.loads(json.dumps(asdict(comparison)))

    @task
    def retrain_interference(extracted: dict[str, Any], params: dict[str, Any] | None = None) -> dict[str, Any]:
        import pandas as pd

        from horus_airflow.interference.pairs import read_pairs
        from horus_airflow.registry.retraining import (
            PromotionPolicy,
            compare_interference,
        )
        from horus_airflow.settings import Settings

        if not extracted["pairs"]:
            raise AirflowSkipException("no co-located pair was profiled: the interference model is left as it is")
        settings = Settings.from_env()
        policy = PromotionPolicy.load(settings.project_file((params or {})["policy"]))
        folder = Path(extracted["folder"])
        seed = read_pairs(settings.project_file((params or {})["seed_pairs"]))
        profiled = pd.read_csv(folder / "profiling_pairs.csv")
        comparison = compare_interference(settings, seed, profiled, policy.interference, source=f"retraining {folder.name}")
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
