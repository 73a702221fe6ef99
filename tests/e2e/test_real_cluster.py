"""End-to-end against a REAL Kubernetes cluster; runs only when HORUS_E2E_KUBECONFIG is set.

For example a kind cluster whose workers carry fake GPU labels (README, "Kubernetes"):

    kind create cluster --config deploy/kubernetes/kind-gpu-cluster.yaml
    tests/e2e/fake_gpus.sh
    HORUS_E2E_KUBECONFIG=~/.kube/config make test PYTEST_ARGS="tests/e2e"
"""

from __future__ import annotations

import os
from datetime import datetime
from pathlib import Path

import pytest

from horus_airflow.backends import acquire
from horus_airflow.backends.kubernetes import (
    KubernetesBackend,
    KubernetesOptions,
    api_from_kubeconfig,
)
from horus_airflow.errors import LedgerConflictError
from horus_airflow.placement import load_profile, place
from horus_airflow.predictor.demand import Demand, GpuDemand

KUBECONFIG = os.environ.get("HORUS_E2E_KUBECONFIG")
NAMESPACE = os.environ.get("HORUS_E2E_NAMESPACE", "horus")
pytestmark = pytest.mark.skipif(not KUBECONFIG, reason="HORUS_E2E_KUBECONFIG is not set: no real cluster to test against")


@pytest.fixture
def backend() -> KubernetesBackend:
    return KubernetesBackend(api_from_kubeconfig(KUBECONFIG), KubernetesOptions(namespace=NAMESPACE, ledger_name="horus-ledger-e2e"))


def _demand(job_id: str, backend: KubernetesBackend) -> Demand:
    types = {g.gpu_type for g in backend.snapshot().gpus}
    return Demand(job_id, 1, {t: GpuDemand(40.0, 50.0, 4000.0) for t in types})


def test_inventory_comes_from_feature_discovery_labels(backend: KubernetesBackend) -> None:
    state = backend.snapshot()
    assert state.gpus, "no node carries nvidia.com/gpu.product: run tests/e2e/fake_gpus.sh"
    assert all(g.memory_mib > 0 for g in state.gpus)


def test_ledger_round_trip_and_a_real_409(backend: KubernetesBackend) -> None:
    stale = backend.snapshot()
    first = acquire(backend, _demand("e2e-first", backend), load_profile("exclusive"), "e2e/first", 30)
    try:
        decision = place(_demand("e2e-second", backend), stale, load_profile("exclusive"))
        with pytest.raises(LedgerConflictError):
            backend.reserve(decision, _demand("e2e-second", backend), "e2e/second")
    finally:
        assert backend.release(first.reservation)
    assert first.reservation.reservation_id not in backend.active()


@pytest.mark.airflow
def test_a_pod_runs_pinned_to_its_gpus(airflow_db: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from airflow.sdk import DAG

    from horus_airflow.operators.kubernetes import HorusKubernetesPodOperator

    monkeypatch.setenv("HORUS_K8S_NAMESPACE", NAMESPACE)
    monkeypatch.setenv("HORUS_HOME", str(tmp_path / "horus"))
    with DAG(dag_id="horus_e2e_pod", schedule=None, start_date=datetime(2026, 1, 1), catchup=False) as dag:
        HorusKubernetesPodOperator(
            task_id="echo_gpus", model="resnet18", batch_size=32, namespace=NAMESPACE, image="busybox:1.36",
            cmds=["sh", "-c", "echo pinned to $NVIDIA_VISIBLE_DEVICES"], config_file=KUBECONFIG,
            service_account_name="horus-airflow", startup_timeout_seconds=300,
        )
    dag_run = dag.test()
    assert str(dag_run.state) == "success"
    backend = KubernetesBackend(api_from_kubeconfig(KUBECONFIG), KubernetesOptions(namespace=NAMESPACE))
    assert not [e for e in backend.active().values() if e.owner.startswith("horus_e2e_pod/")]
