"""Faults for the stack tests: three training tasks long enough to stop a service under them; retried,
as a production DAG would be."""

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
