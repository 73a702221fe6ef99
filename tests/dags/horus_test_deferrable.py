"""A deferrable task that finds every GPU busy: it queues, defers to BookingTrigger and runs once a round
books it (or fails at its placement timeout)."""

from __future__ import annotations

from datetime import datetime

from airflow.sdk import DAG

from horus_airflow.operators import HorusTrainingOperator

with DAG(dag_id="horus_test_deferrable", schedule=None, start_date=datetime(2026, 1, 1), catchup=False) as waits:
    HorusTrainingOperator(task_id="queued", model="mlp", batch_size=8, steps=2, profile="exclusive", deferrable=True,
                          poll_interval=0.5, placement_timeout=120)

with DAG(dag_id="horus_test_deferrable_timeout", schedule=None, start_date=datetime(2026, 1, 1), catchup=False) as times_out:
    HorusTrainingOperator(task_id="never_placed", model="mlp", batch_size=8, steps=2, profile="exclusive",
                          deferrable=True, poll_interval=0.5, placement_timeout=3)
