"""``horus demo``: run the example DAG on the embedded stack and print what Horus decided."""

from __future__ import annotations

import importlib.util
import logging
import os
import subprocess
import sys
from pathlib import Path

from horus_airflow.predictor.dataset import read_training_data
from horus_airflow.interference.pairs import read_pairs
from horus_airflow.registry import (
    INTERFERENCE_MODEL,
    PREDICTOR_MODEL,
    champion_version,
    profiling_runs,
    train_interference,
    train_predictor,
    versions,
)
from horus_airflow.settings import Settings

log = logging.getLogger(__name__)

DEMO_DAG_ID = "horus_training_example"


def prepare_airflow(settings: Settings, dags_folder: Path) -> None:
    """Point Airflow at HORUS_HOME and our dags folder, then migrate its SQLite metadata DB."""
    os.environ.setdefault("AIRFLOW_HOME", str(settings.airflow_home))
    os.environ.setdefault("AIRFLOW__CORE__DAGS_FOLDER", str(dags_folder.resolve()))
    os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
    settings.airflow_home.mkdir(parents=True, exist_ok=True)
    migrate_log = settings.home / "airflow-db-migrate.log"
    with migrate_log.open("w") as out:
        done = subprocess.run([sys.executable, "-m", "airflow", "db", "migrate"], stdout=out, stderr=subprocess.STDOUT)
    if done.returncode != 0:
        raise RuntimeError(f"'airflow db migrate' failed (exit {done.returncode}); see {migrate_log}")


def ensure_champion(settings: Settings, seed_data: Path | None) -> None:
    """A first champion from the shipped seed data, so the demo predicts with a trained model."""
    existing = champion_version(settings)
    if existing is not None:
        print(f"predictor: {PREDICTOR_MODEL} version {existing} is champion")
        return
    if seed_data is None:
        print("predictor: no champion registered and no seed data given; the analytic prior predicts")
        return
    outcome = train_predictor(settings, read_training_data(seed_data), str(seed_data))
    util = outcome.evaluation.overall("gpu_util")
    print(
        f"predictor: trained on {seed_data} and registered {PREDICTOR_MODEL} version {outcome.version} as "
        f"{', '.join(outcome.aliases)}; held-out-family utilization RMSLE {util.model.rmsle:.3f} "
        f"(analytic prior {util.prior.rmsle:.3f}), MLflow run {outcome.run_id}"
    )


def ensure_interference_champion(settings: Settings, pairs: Path | None) -> None:
    """A first learned interference model from the shipped co-location pairs."""
    existing = versions.champion_version(settings, INTERFERENCE_MODEL)
    if existing is not None:
        print(f"interference: {INTERFERENCE_MODEL} version {existing} is champion")
        return
    if pairs is None:
        print("interference: no champion registered and no pairs given; horus-ml falls back to the default proxy curve")
        return
    outcome = train_interference(settings, read_pairs(pairs), str(pairs))
    pooled = {s.scheme: s for s in outcome.scores if s.held_out == "all"}
    print(
        f"interference: trained on {pairs} and registered {INTERFERENCE_MODEL} version {outcome.version} as "
        f"{', '.join(outcome.aliases)}; unseen job types MAE {pooled['job type'].learned_mae:.3f} "
        f"(proxy {pooled['job type'].proxy_mae:.3f}), unseen GPU types MAE {pooled['GPU type'].learned_mae:.3f} "
        f"(proxy {pooled['GPU type'].proxy_mae:.3f})"
    )


def run_demo(settings: Settings, dags_folder: Path, seed_data: Path | None = None, pairs: Path | None = None) -> int:
    prepare_airflow(settings, dags_folder)
    ensure_champion(settings, seed_data)
    ensure_interference_champion(settings, pairs)
    dag_file = dags_folder / f"{DEMO_DAG_ID}.py"
    spec = importlib.util.spec_from_file_location(DEMO_DAG_ID, dag_file)
    if spec is None or spec.loader is None:
        raise FileNotFoundError(f"example DAG not found at {dag_file}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    dag_run = module.dag.test()
    print(summary_table(settings, dag_run.run_id))
    print(f"\nDAG run {dag_run.run_id}: {dag_run.state}")
    print(open_ui_commands(settings, dags_folder))
    return 0 if str(dag_run.state) == "success" else 1


def summary_table(settings: Settings, airflow_run_id: str) -> str:
    runs = profiling_runs(settings, airflow_run_id)
    header = ("task", "GPU", "predictor", "pred util %", "pred mem MiB", "measured", "MLflow run id", "reason")
    rows = [header]
    for run in sorted(runs, key=lambda r: r.data.tags.get("airflow.task_id", "")):
        tags, params, metrics = run.data.tags, run.data.params, run.data.metrics
        gpu = f"{tags['horus.gpu_ids']} {tags['horus.gpu_type']}"
        if tags.get("horus.gpu_declared") == "true":
            gpu += " (declared)"
        measured = (
            f"util {metrics['gpu_util_mean']:.0f}%" if "gpu_util_mean" in metrics else "no GPU metric"
        )
        if "job.throughput_samples_per_s" in metrics:
            measured += f", {metrics['job.throughput_samples_per_s']:.0f} samples/s"
        rows.append(
            (
                tags.get("airflow.task_id", run.info.run_name),
                gpu,
                tags["horus.predictor"],
                f"{float(params['predicted.gpu_util']):.0f}",
                params["predicted.gpu_mem_mib"],
                measured,
                run.info.run_id,
                tags["horus.placement.reason"],
            )
        )
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(header) - 1)]
    lines = []
    for row in rows:
        lines.append("  ".join(str(cell).ljust(width) for cell, width in zip(row, widths)) + "  " + row[-1])
    lines.insert(1, "  ".join("-" * w for w in widths) + "  " + "-" * 6)
    return "\n".join(lines)


def open_ui_commands(settings: Settings, dags_folder: Path) -> str:
    bin_dir = Path(sys.executable).parent
    # `airflow standalone` starts its services as `airflow ...` from PATH, hence the PATH prefix.
    declared = f"HORUS_LOCAL_GPUS={settings.local_gpus} " if settings.local_gpus else ""
    return (
        "\nBrowse the results:\n"
        f"  MLflow UI:  {bin_dir / 'mlflow'} ui --backend-store-uri {settings.mlflow_tracking_uri} "
        "--host 127.0.0.1 --port 5000    # then open http://127.0.0.1:5000\n"
        f"  Airflow UI: PATH={bin_dir}:$PATH HORUS_HOME={settings.home} {declared}"
        f"AIRFLOW_HOME={settings.airflow_home} AIRFLOW__CORE__DAGS_FOLDER={dags_folder.resolve()} "
        "AIRFLOW__CORE__LOAD_EXAMPLES=False airflow standalone    # then open http://127.0.0.1:8080, user admin, "
        f"password in {settings.airflow_home / 'simple_auth_manager_passwords.json.generated'}"
    )
