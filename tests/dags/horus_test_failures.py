"""DAGs whose tasks must fail cleanly: bad input, and a training command that exits non-zero."""

from __future__ import annotations

from datetime import datetime

from airflow.sdk import DAG

from horus_airflow.operators import HorusTrainingOperator

# A literal typo is an import error at parse time (tests/test_airflow.py); one that a template renders is
# found when the task runs, and fails it without retries.
with DAG(dag_id="horus_test_bad_model", schedule=None, start_date=datetime(2026, 1, 1), catchup=False,
         params={"model": "resnt18"}) as bad_model:
    HorusTrainingOperator(task_id="typo", model="{{ params.model }}", batch_size=32, retries=2)

with DAG(dag_id="horus_test_failing_job", schedule=None, start_date=datetime(2026, 1, 1), catchup=False) as failing:
    HorusTrainingOperator(
        task_id="exits_3", model="mlp", batch_size=8, command=["python", "-c", "import sys; sys.exit(3)"]
    )
