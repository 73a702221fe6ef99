"""Load for the stack tests: 50 training tasks at once, each a short command placed by Horus on the
declared GPUs. The scheduler runs them concurrently (LocalExecutor), so their workers race on the
ledger."""

from __future__ import annotations

import sys

from airflow.sdk import DAG

from horus_airflow.operators.training import HorusTrainingOperator

TASKS = 50

# Airflow 3.3's LocalExecutor does not count what it has dispatched against `parallelism`
# (apache/airflow#71914), so the scheduler hands it every task it may run. The workloads beyond its 16
# workers fill the queue's pipe and block the scheduler's loop until a task ends; at 30 s without its
# heartbeat the scheduler counted itself dead and reset 44 running tasks. The DAG's own limit holds.
SLOTS = 16

with DAG(dag_id="horus_stack_load", schedule=None, catchup=False, max_active_tasks=SLOTS, tags=["horus", "test"]) as dag:
    HorusTrainingOperator.partial(
        task_id="train", model="resnet18", dataset="cifar10", command=[sys.executable, "-c", "import time; time.sleep(3)"],
        placement_timeout=900, retries=0,
    ).expand(batch_size=[16 + i for i in range(TASKS)])
