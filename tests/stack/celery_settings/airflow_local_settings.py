"""Airflow cluster policy for the Celery stack: every task goes to the queue of one of the two workers,
so that a task and the one after it run on different workers, as on machines of their own (each worker
has its own HORUS_HOME and temp dir). What one task hands the next must then travel through MLflow or
XCom: a file left on a worker's disk is not there for the next task."""

from __future__ import annotations

import zlib

# the retraining DAG: each task on the other worker than the task it reads from
_QUEUE_OF = {"extract": 0, "build_dataset": 1, "retrain_predictor": 0, "retrain_interference": 1, "promote": 0, "report": 1}


def task_policy(task) -> None:  # type: ignore[no-untyped-def]
    index = _QUEUE_OF.get(task.task_id, zlib.crc32(task.task_id.encode()) % 2)
    task.queue = f"worker-{index}"
