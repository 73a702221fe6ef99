"""Load for the stack tests: 50 training tasks at once, each a short command placed by Horus on the
declared GPUs. The scheduler runs them concurrently (LocalExecutor), so their workers race on the
ledger."""

from __future__ import annotations

import sys

from airflow.sdk import DAG

from horus_airflow.operators.training import HorusTrainingOperator

TASKS = 50

with DAG(dag_id="horus_stack_load", schedule=None, catchup=False, max_active_tasks=TASKS, tags=["horus", "test"]) as dag:
    HorusTrainingOperator.partial(
        task_id="train", model="resnet18", dataset="cifar10", command=[sys.executable, "-c", "import time; time.sleep(3)"],
        placement_timeout=900, retries=0,
    ).expand(batch_size=[16 + i for i in range(TASKS)])
