"""DAGs that launch Horus pods on the Kubernetes API test double (tests/kube_double.py).

The kubeconfig path comes from HORUS_TEST_KUBECONFIG, which the tests set before running them.
"""

from __future__ import annotations

import os
from datetime import datetime

from airflow.sdk import DAG, task
from kubernetes.client import models as k8s

from horus_airflow.operators.kubernetes import HorusKubernetesPodOperator

_COMMON = dict(
    namespace="jobs",
    image="python:3.11-slim",
    config_file=os.environ.get("HORUS_TEST_KUBECONFIG"),
    get_logs=False,
    log_events_on_failure=False,
    startup_check_interval_seconds=0.2,
    poll_interval=0.2,
)

with DAG(dag_id="horus_test_k8s_sync", schedule=None, start_date=datetime(2026, 1, 1), catchup=False) as sync_dag:
    HorusKubernetesPodOperator(
        task_id="train_resnet18",
        model="resnet18",
        batch_size=64,
        cmds=["python", "-c", "print('train')"],
        env_vars=[k8s.V1EnvVar(name="WANDB_API_KEY", value="sk-do-not-log-0xC0FFEE"), k8s.V1EnvVar(name="API_TOKEN", value_from=k8s.V1EnvVarSource(
            secret_key_ref=k8s.V1SecretKeySelector(name="training-secrets", key="token")))],
        **_COMMON,
    )

with DAG(dag_id="horus_test_k8s_deferrable", schedule=None, start_date=datetime(2026, 1, 1), catchup=False) as deferrable_dag:
    HorusKubernetesPodOperator(task_id="train_bert", model="bert_base", batch_size=16, deferrable=True,
        cmds=["python", "-c", "print('train')"], **_COMMON,
    )

with DAG(dag_id="horus_test_k8s_taskflow", schedule=None, start_date=datetime(2026, 1, 1), catchup=False) as taskflow_dag:

    @task.horus_kubernetes(model="mobilenet_v3_small", batch_size=32, **_COMMON)
    def train() -> None:
        print("training")

    train()
