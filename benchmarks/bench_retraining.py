"""How long the retraining DAG's work takes on 10,000 profiling runs (target: within 2 minutes on two
cores), against the same pipeline on the 57 shipped seed rows as the baseline, in the same run.

Setup (not timed as retraining): N profiling runs are written to a fresh MLflow SQLite store with the
params, tags and metrics a real profiling run has (graph features, GPU type, measured utilization and
memory), cycling through the 57 measured seed rows. They exist to time the pipeline: nothing here
measures accuracy.

Timed, as the DAG's tasks do it: extract (read every run from MLflow and turn it into rows), build
(seed + profiling rows, validated), train and register the challenger, score it and the champion on the
held-out families, promote if the policy passes, log the report.

    .venv/bin/python benchmarks/bench_retraining.py [--runs 10000]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from dataclasses import fields
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=10_000)
    args = parser.parse_args()
    os.environ["HORUS_HOME"] = tempfile.mkdtemp(prefix="horus-bench-retrain-")
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    os.environ.pop("MLFLOW_TRACKING_URI", None)
    import logging

    logging.disable(logging.WARNING)
    import pandas as pd
    from mlflow.entities import Metric, Param

    from horus_airflow.features.graph import GraphFeatures
    from horus_airflow.predictor.dataset import ValidatedData, read_training_data
    from horus_airflow.registry import retraining as R
    from horus_airflow.run_schema import Experiment
    from horus_airflow.registry.store import client, experiment_id
    from horus_airflow.settings import Settings

    settings = Settings.from_env()
    seed = read_training_data(REPO / "data" / "predictor_seed" / "predictor_seed.csv").rows
    policy = R.PromotionPolicy.load(REPO / "model_registry" / "promotion_policy.yaml")
    names = [f.name for f in fields(GraphFeatures)]

    def pipeline(rows_source: pd.DataFrame | None) -> dict[str, float]:
        times: dict[str, float] = {}
        start = time.perf_counter()
        extracted = R.extract(R.all_profiling_runs(settings)) if rows_source is None else None
        times["extract"] = time.perf_counter() - start
        start = time.perf_counter()
        profiling = extracted.predictor_rows if extracted is not None else seed.iloc[:0]
        data = R.build_predictor_data(seed if rows_source is None else rows_source, profiling)
        times["build + validate"] = time.perf_counter() - start
        start = time.perf_counter()
        comparison = R.compare_predictor(settings, ValidatedData(data.rows, data.rejected), policy.predictor, "benchmark")
        times["train, register, compare"] = time.perf_counter() - start
        start = time.perf_counter()
        promoted = R.promote_if_passed(settings, comparison)
        R.log_report(settings, [comparison], {"runs_read": len(data.rows)}, {comparison.model: promoted})
        times["promote + report"] = time.perf_counter() - start
        times["rows"] = len(data.rows)
        return times

    baseline = pipeline(seed)

    mlflow_client = client(settings)
    experiment = experiment_id(mlflow_client, settings, Experiment.PROFILING)
    start = time.perf_counter()
    records = seed.reset_index(drop=True)
    for i in range(args.runs):
        row = records.iloc[i % len(records)]
        features = GraphFeatures.from_mapping(row[names].to_dict())
        run = mlflow_client.create_run(experiment, tags={"horus.run_kind": "profiling", "horus.gpu_measured": "true",
                                                         "horus.gpu_type": row["gpu_type"], "horus.co_residents": ""})
        metrics = [Metric(k, float(row[t]), 0, 0) for k, t in (("gpu_util_mean", "gpu_util"), ("gpu_util_p90", "gpu_util_p90"),
                                                               ("gpu_mem_mib_max", "gpu_mem_mib")) if pd.notna(row[t])]
        mlflow_client.log_batch(run.info.run_id, params=[Param(k, v) for k, v in features.as_params().items()], metrics=metrics)
        mlflow_client.set_terminated(run.info.run_id)
        if (i + 1) % 1000 == 0:
            print(f"  setup: {i + 1} runs written ({time.perf_counter() - start:.0f} s)", file=sys.stderr, flush=True)
    setup_s = time.perf_counter() - start
    measured = pipeline(None)

    total = {k: sum(v for name, v in t.items() if name != "rows") for k, t in (("base", baseline), ("big", measured))}
    print(f"\nRetraining pipeline, {args.runs} profiling runs in a MLflow SQLite store (setup writing them: {setup_s:.0f} s, not counted)\n")
    print(f"| {'step':<28} | {'57 seed rows (baseline)':>24} | {f'{args.runs} runs':>12} |")
    print(f"|{'-' * 30}|{'-' * 26}|{'-' * 14}|")
    for step in ("extract", "build + validate", "train, register, compare", "promote + report"):
        print(f"| {step:<28} | {baseline[step]:>22.2f} s | {measured[step]:>10.2f} s |")
    print(f"| {'total':<28} | {total['base']:>22.2f} s | {total['big']:>10.2f} s |")
    print(f"| {'rows trained on':<28} | {int(baseline['rows']):>24} | {int(measured['rows']):>12} |")
    print(f"\n{args.runs} runs: {total['big']:.1f} s against the 120 s target: {'met' if total['big'] < 120 else 'NOT met'} "
          f"({total['big'] / total['base']:.1f}x the baseline)")


if __name__ == "__main__":
    main()
