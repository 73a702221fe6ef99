"""Profile catalog workloads on the GPUs at hand, alone and in chosen pairs, as MLflow profiling runs.

Each workload runs alone on a GPU nobody else uses (profile ``exclusive``); each pair runs its two jobs
at once on one such GPU. Every job becomes a run in the experiment ``horus-profiling``: the retraining
DAG (``horus_retrain_predictor``) learns utilization and memory from the runs alone, and interference
from the pairs compared with the same jobs alone.

Trigger it with other workloads as params, e.g. ``{"workloads": ["resnet50:64@imagenet"],
"pairs": ["resnet50:64@imagenet+lstm_lm:20"], "steps": 100}``. Without an NVIDIA GPU it still runs (on
declared GPUs, see ``HORUS_LOCAL_GPUS``); the runs then record that no GPU was measured, and the
retraining DAG sets them aside.
"""

from __future__ import annotations

from dataclasses import asdict
from datetime import datetime
from typing import Any

from airflow.sdk import DAG, Param, get_current_context, task

from horus_airflow.operators.owner import task_owner
from horus_airflow.run_schema import Tag

WORKLOADS = ["resnet18:32@cifar10", "mobilenet_v3_small:64@cifar10", "lstm_lm:16@wikitext2", "mlp:64@mnist"]
PAIRS = ["resnet18:32@cifar10+lstm_lm:16@wikitext2", "mobilenet_v3_small:64@cifar10+mlp:64@mnist"]


def _owner_and_tags() -> tuple[str, dict[str, str]]:
    ti = get_current_context()["ti"]
    owner = task_owner(ti)
    tags = {Tag.AIRFLOW_DAG_ID: ti.dag_id, Tag.AIRFLOW_TASK_ID: ti.task_id, Tag.AIRFLOW_RUN_ID: ti.run_id,
            Tag.AIRFLOW_MAP_INDEX: str(ti.map_index), Tag.CAMPAIGN: ti.run_id}
    return owner, tags


with DAG(
    dag_id="horus_profile_models",
    description="Profile catalog workloads alone and in pairs; log each job as an MLflow profiling run",
    schedule=None,
    start_date=datetime(2026, 1, 1),
    catchup=False,
    tags=["horus", "profiling"],
    params={
        "workloads": Param(WORKLOADS, type="array", description="MODEL:BATCH[:amp][@DATASET], each run alone"),
        "pairs": Param(PAIRS, type="array", description="SPEC+SPEC, each pair run together on one GPU"),
        "steps": Param(30, type="integer", minimum=1, description="training steps per job"),
    },
) as dag:

    @task
    def workloads(params: dict[str, Any] | None = None) -> list[str]:
        from horus_airflow.jobs import JobSpec

        items = list((params or {})["workloads"])
        for item in items:
            JobSpec.parse(item)  # every spec is checked before any job runs
        return items

    @task
    def pairs(params: dict[str, Any] | None = None) -> list[str]:
        from horus_airflow.errors import InvalidJobError
        from horus_airflow.jobs import JobSpec

        items = list((params or {})["pairs"])
        for item in items:
            parts = item.split("+")
            if len(parts) != 2:
                raise InvalidJobError(f"pair {item!r} is not SPEC+SPEC, e.g. resnet18:32@cifar10+lstm_lm:16@wikitext2")
            for part in parts:
                JobSpec.parse(part)
        return items

    @task(retries=1)
    def profile_alone(workload: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        from horus_airflow.jobs import JobSpec
        from horus_airflow.pipeline import run_job
        from horus_airflow.settings import Settings

        owner, tags = _owner_and_tags()
        spec = JobSpec.parse(workload, steps=int((params or {})["steps"]))
        return asdict(run_job(spec, Settings.from_env(), owner, profile_name="exclusive", context_tags=tags))

    @task(retries=1)
    def profile_pair(pair: str, params: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        from horus_airflow.jobs import JobSpec
        from horus_airflow.pipeline import profile_pair as run_pair
        from horus_airflow.settings import Settings

        owner, tags = _owner_and_tags()
        steps = int((params or {})["steps"])
        first, second = (JobSpec.parse(part, steps=steps) for part in pair.split("+"))
        return [asdict(o) for o in run_pair(first, second, Settings.from_env(), owner, context_tags=tags)]

    profile_alone.expand(workload=workloads())
    profile_pair.expand(pair=pairs())
