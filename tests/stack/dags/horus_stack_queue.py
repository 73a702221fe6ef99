"""Load for the stack's queue test: 60 deferrable training tasks at once on the stack's eight declared
GPUs, one in ten a gang of all eight, placed with whole GPUs and the paper's look-ahead
(horus_stack_queue.yaml). Far more demand than GPUs: most tasks wait in the ledger's queue, deferred to
the triggerer, while a scheduling round books them in the queue policy's order."""

from __future__ import annotations

import sys
from pathlib import Path

from airflow.sdk import DAG

from horus_airflow.operators.training import HorusTrainingOperator

TASKS = 60
GANG_EVERY = 10
GANG = 8  # the stack's whole machine (HORUS_LOCAL_GPUS), as a multi-GPU training job takes one node
PROFILE = str(Path(__file__).with_name("horus_stack_queue.yaml"))
SLOTS = 16  # as horus_stack_load: the DAG's own limit on running tasks (apache/airflow#71914)

with DAG(dag_id="horus_stack_queue", schedule=None, catchup=False, max_active_tasks=SLOTS, tags=["horus", "test"]) as dag:
    HorusTrainingOperator.partial(
        task_id="train", model="resnet18", dataset="cifar10", profile=PROFILE, deferrable=True,
        command=[sys.executable, "-c", "import time; time.sleep(2)"], placement_timeout=1200, retries=0,
    ).expand_kwargs([{"batch_size": 16 * (1 + i % 8), "gpus": GANG if i % GANG_EVERY == GANG_EVERY - 1 else 1}
                     for i in range(TASKS)])
