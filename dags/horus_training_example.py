"""Four small training jobs, each placed by Horus on a GPU of this machine and profiled to MLflow.

Run it with ``make demo`` (embedded SQLite stack), or trigger it from the Airflow UI. Without an
NVIDIA GPU, set ``HORUS_LOCAL_GPUS`` (``make demo`` declares ``2xa100-80gb``): placement then runs on
the declared GPUs while the jobs themselves train on the CPU, and their runs are tagged so.
"""

from __future__ import annotations

from datetime import datetime

from airflow.sdk import DAG

from horus_airflow.operators import HorusTrainingOperator

with DAG(
    dag_id="horus_training_example",
    description="Train four small models on GPUs chosen by the Horus placer",
    schedule=None,
    start_date=datetime(2026, 1, 1),
    catchup=False,
    tags=["horus", "example"],
) as dag:
    HorusTrainingOperator(task_id="resnet18_cifar10", model="resnet18", dataset="cifar10", batch_size=32, steps=10)
    HorusTrainingOperator(task_id="mlp_mnist", model="mlp", dataset="mnist", batch_size=64, steps=20)
    HorusTrainingOperator(task_id="lstm_wikitext2", model="lstm_lm", dataset="wikitext2", batch_size=16, steps=3)
    HorusTrainingOperator(task_id="dqn_cartpole", model="dqn", dataset="cartpole", batch_size=128, steps=50)
