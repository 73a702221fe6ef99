"""Faults for the stack tests: training tasks long enough to stop a service or kill a worker under them;
retried, as a production DAG would be."""

from __future__ import annotations

import sys
from datetime import timedelta

from airflow.sdk import DAG

from horus_airflow.operators.training import HorusTrainingOperator

with DAG(dag_id="horus_stack_fault", schedule=None, catchup=False, tags=["horus", "test"]) as dag:
    HorusTrainingOperator.partial(
        task_id="train", model="resnet18", dataset="cifar10", command=[sys.executable, "-c", "import time; time.sleep(12)"],
        retries=3, retry_delay=timedelta(seconds=5),
    ).expand(batch_size=[32, 64, 128])

with DAG(dag_id="horus_stack_worker_kill", schedule=None, catchup=False, tags=["horus", "test"]) as worker_kill:
    HorusTrainingOperator(
        task_id="train", model="resnet18", dataset="cifar10", batch_size=32,
        command=[sys.executable, "-c", "import time; time.sleep(20)"], retries=2, retry_delay=timedelta(seconds=5),
    )

with DAG(dag_id="horus_stack_disk_full", schedule=None, catchup=False, tags=["horus", "test"]) as disk_full:
    HorusTrainingOperator(
        task_id="train", model="resnet18", dataset="cifar10", batch_size=32,
        command=[sys.executable, "-c", "import time; time.sleep(2)"], retries=3, retry_delay=timedelta(seconds=10),
    )

with DAG(dag_id="horus_stack_mlflow_down", schedule=None, catchup=False, tags=["horus", "test"]) as mlflow_down:
    HorusTrainingOperator(
        task_id="train", model="resnet18", dataset="cifar10", batch_size=32,
        command=[sys.executable, "-c", "import time; time.sleep(2)"], retries=2, retry_delay=timedelta(seconds=10),
    )
