"""``horus demo``: run the example DAG on the embedded stack and print what Horus decided."""

from __future__ import annotations

import importlib.util
import logging
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

from horus_airflow.registry import profiling_runs
from horus_airflow.registry.bootstrap import bootstrap
from horus_airflow.settings import Settings
from horus_airflow.run_schema import Metric, Param, Tag

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


# What `make demo` declares on a machine without an NVIDIA GPU: placement runs, the jobs train on the CPU.
DEMO_GPUS = "2xa100-80gb"


def run_demo(settings: Settings, dags_folder: Path, seed_data: Path | None = None, pairs: Path | None = None) -> int:
    settings = _with_gpus(settings)
    prepare_airflow(settings, dags_folder)
    for step in bootstrap(settings, seed_data, pairs):
        print(f"{step.model}: {step.message}")
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


def _with_gpus(settings: Settings) -> Settings:
    """This machine's GPUs, or, where NVML finds none and none are declared, the demo's declared ones."""
    from horus_airflow.telemetry import nvml

    if settings.local_gpus or nvml.discover_gpus():
        return settings
    print(f"no NVIDIA GPU found and HORUS_LOCAL_GPUS unset: declaring HORUS_LOCAL_GPUS={DEMO_GPUS} for this demo "
          "(placement runs on them; the jobs train on the CPU)")
    os.environ["HORUS_LOCAL_GPUS"] = DEMO_GPUS  # the example DAG's tasks read it
    return replace(settings, local_gpus=DEMO_GPUS)


def summary_table(settings: Settings, airflow_run_id: str) -> str:
    runs = profiling_runs(settings, airflow_run_id)
    header = ("task", "GPU", "predictor", "pred util %", "pred mem MiB", "measured", "MLflow run id", "reason")
    rows = [header]
    for run in sorted(runs, key=lambda r: r.data.tags.get(Tag.AIRFLOW_TASK_ID, "")):
        tags, params, metrics = run.data.tags, run.data.params, run.data.metrics
        gpu = f"{tags[Tag.GPU_IDS]} {tags[Tag.GPU_TYPE]}"
        if tags.get(Tag.GPU_DECLARED) == "true":
            gpu += " (declared)"
        measured = (
            f"util {metrics[Metric.GPU_UTIL_MEAN]:.0f}%" if Metric.GPU_UTIL_MEAN in metrics else "no GPU metric"
        )
        if Metric.THROUGHPUT in metrics:
            measured += f", {metrics[Metric.THROUGHPUT]:.0f} samples/s"
        rows.append(
            (
                tags.get(Tag.AIRFLOW_TASK_ID, run.info.run_name),
                gpu,
                tags[Tag.PREDICTOR],
                f"{float(params[Param.PREDICTED_UTIL]):.0f}",
                params[Param.PREDICTED_MEM_MIB],
                measured,
                run.info.run_id,
                tags[Tag.PLACEMENT_REASON],
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
    mlflow_ui = "http://127.0.0.1:5000"
    # Both bind 127.0.0.1: the demo's stores have no access control worth exposing to the network.
    return (
        "\nBrowse the results:\n"
        f"  MLflow UI:  {bin_dir / 'mlflow'} ui --backend-store-uri {settings.mlflow_tracking_uri} "
        f"--host 127.0.0.1 --port 5000    # then open {mlflow_ui}\n"
        f"  Airflow UI: PATH={bin_dir}:$PATH HORUS_HOME={settings.home} {declared}HORUS_MLFLOW_UI_URL={mlflow_ui} "
        "AIRFLOW__API__HOST=127.0.0.1 "
        f"AIRFLOW_HOME={settings.airflow_home} AIRFLOW__CORE__DAGS_FOLDER={dags_folder.resolve()} "
        f"AIRFLOW__CORE__PLUGINS_FOLDER={settings.project_file('plugins')} "
        "AIRFLOW__CORE__LOAD_EXAMPLES=False airflow standalone    # then open http://127.0.0.1:8080, user admin, "
        f"password in {settings.airflow_home / 'simple_auth_manager_passwords.json.generated'}; "
        "\"Horus\" in the menu shows the placements"
    )
