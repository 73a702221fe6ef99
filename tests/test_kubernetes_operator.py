"""HorusKubernetesPodOperator: pods built by ``build_pod_request_obj`` for each binding mode, and whole
task runs through real Airflow (``dag.test()``) against the Kubernetes API TEST DOUBLE."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Iterator

import pytest
from kubernetes.client import models as k8s

from horus_airflow.backends.kubernetes import BOOKING_ANNOTATION, RESERVATION_LABEL, WAITS_KEY
from horus_airflow.operators.kubernetes import HorusKubernetesPodOperator
from horus_airflow.placement import ClusterState, GpuState, Resident
from tests.conftest import DAGS_FOLDER, REPO, load_dag_file
from tests.kube_double import FakeKubeApi, Lifecycle, gpu_node
from tests.servers import free_port


def _state_file(tmp_path: Path, busy: bool) -> str:
    """Two A100 nodes; with ``busy`` every GPU but n2/1 holds a heavy job and n2/1 a light one, so any
    placement shares a GPU."""
    gpus = []
    for node in ("n1", "n2"):
        for i in range(2):
            residents = ()
            if busy:
                light = node == "n2" and i == 1
                residents = (Resident("light" if light else "heavy", 20.0 if light else 95.0, 25.0, 4000.0 if light else 70_000.0),)
            gpus.append(GpuState(f"{node}/{i}", node, i, "a100-80gb", 81920.0, residents))
    path = tmp_path / f"state-{busy}.json"
    path.write_text(json.dumps(ClusterState(tuple(gpus), 7).to_dict()))
    return str(path)


def _operator(tmp_path: Path, binding: str, busy: bool, **kwargs) -> HorusKubernetesPodOperator:  # type: ignore[no-untyped-def]
    return HorusKubernetesPodOperator(
        task_id=f"t_{binding.replace('-', '_')}", model="resnet18", batch_size=32, image="trainer:1", binding=binding,
        dry_run_state=_state_file(tmp_path, busy), profile="horus-paper", **kwargs,
    )


def _env(pod: k8s.V1Pod) -> dict[str, str]:
    return {e.name: e.value for e in pod.spec.containers[0].env or []}


def _hostname_terms(pod: k8s.V1Pod) -> list[list[tuple[str, str, list[str]]]]:
    required = pod.spec.affinity.node_affinity.required_during_scheduling_ignored_during_execution
    return [[(e.key, e.operator, e.values) for e in t.match_expressions] for t in required.node_selector_terms]


@pytest.mark.parametrize("deferrable", [False, True])
def test_visible_devices_pins_node_and_gpu_indices(tmp_path: Path, deferrable: bool) -> None:
    pod = _operator(tmp_path, "visible-devices", busy=True, deferrable=deferrable).build_pod_request_obj(dry_run=True)
    assert _hostname_terms(pod) == [[("kubernetes.io/hostname", "In", ["n2"])]]
    assert _env(pod)["NVIDIA_VISIBLE_DEVICES"] == "1"
    assert not (pod.spec.containers[0].resources and pod.spec.containers[0].resources.limits)
    annotations = pod.metadata.annotations
    assert annotations["horus.ai/gpu-ids"] == "n2/1" and annotations["horus.ai/binding"] == "visible-devices"
    assert float(annotations["horus.ai/predicted-util"]) > 0
    assert json.loads(annotations["horus.ai/explanation"])["candidates"]


def test_hybrid_requests_a_gpu_when_alone_and_pins_when_shared(tmp_path: Path) -> None:
    alone = _operator(tmp_path, "hybrid", busy=False).build_pod_request_obj(dry_run=True)
    assert alone.spec.containers[0].resources.limits == {"nvidia.com/gpu": "1"}
    assert "NVIDIA_VISIBLE_DEVICES" not in _env(alone)
    assert _hostname_terms(alone)[0][0][2] in (["n1"], ["n2"])
    shared = _operator(tmp_path, "hybrid", busy=True).build_pod_request_obj(dry_run=True)
    assert _env(shared)["NVIDIA_VISIBLE_DEVICES"] == "1"
    assert not shared.spec.containers[0].resources.limits


def test_device_plugin_requests_gpus_and_refuses_to_share(tmp_path: Path) -> None:
    from airflow.sdk.exceptions import AirflowFailException

    alone = _operator(tmp_path, "device-plugin", busy=False, container_resources=k8s.V1ResourceRequirements(limits={"memory": "8Gi"})).build_pod_request_obj(dry_run=True)
    assert alone.spec.containers[0].resources.limits == {"memory": "8Gi", "nvidia.com/gpu": "1"}
    with pytest.raises(AirflowFailException, match="cannot co-locate"):
        _operator(tmp_path, "device-plugin", busy=True).build_pod_request_obj(dry_run=True)


def test_the_users_pod_template_and_affinity_are_kept(tmp_path: Path) -> None:
    template = tmp_path / "pod.yaml"
    template.write_text(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: from-template\n  labels: {team: vision}\nspec:\n"
        "  tolerations: [{key: gpu, operator: Exists}]\n"
        "  affinity:\n    nodeAffinity:\n      requiredDuringSchedulingIgnoredDuringExecution:\n        nodeSelectorTerms:\n"
        "        - matchExpressions: [{key: pool, operator: In, values: [training]}]\n"
        "  containers:\n  - name: base\n    image: from-template:1\n    env: [{name: NVIDIA_VISIBLE_DEVICES, value: all}]\n"
    )
    pod = _operator(tmp_path, "visible-devices", busy=True, pod_template_file=str(template)).build_pod_request_obj(dry_run=True)
    assert pod.metadata.labels["team"] == "vision" and pod.spec.tolerations[0].key == "gpu"
    assert _hostname_terms(pod) == [[("pool", "In", ["training"]), ("kubernetes.io/hostname", "In", ["n2"])]]
    assert _env(pod)["NVIDIA_VISIBLE_DEVICES"] == "1"  # the template's 'all' would defeat the pinning
    full = k8s.V1Pod(spec=k8s.V1PodSpec(containers=[k8s.V1Container(name="base", image="full:1", args=["--epochs", "3"])]))
    pod = _operator(tmp_path, "visible-devices", busy=True, full_pod_spec=full).build_pod_request_obj(dry_run=True)
    assert pod.spec.containers[0].args == ["--epochs", "3"] and _env(pod)["NVIDIA_VISIBLE_DEVICES"] == "1"


def test_a_dry_run_without_state_builds_the_pod_unplaced(tmp_path: Path) -> None:
    operator = HorusKubernetesPodOperator(task_id="t", model="resnet18", batch_size=32, image="trainer:1")
    pod = operator.build_pod_request_obj(dry_run=True)
    assert "not placed" in pod.metadata.annotations["horus.ai/placement-reason"]
    assert not pod.spec.affinity


def test_bad_input_is_refused_with_what_is_accepted(tmp_path: Path) -> None:
    from airflow.sdk.exceptions import AirflowFailException

    from horus_airflow.errors import BindingError, InvalidJobError, ProfileError

    with pytest.raises(BindingError, match="accepted: visible-devices, hybrid, device-plugin"):
        HorusKubernetesPodOperator(task_id="t", model="resnet18", batch_size=32, image="x", binding="mps")
    with pytest.raises(InvalidJobError, match="unknown model 'resnt18'"):  # at parse time
        HorusKubernetesPodOperator(task_id="t", model="resnt18", batch_size=32, image="x")
    with pytest.raises(InvalidJobError, match="gpus must be an integer from 1 to 64, got 0"):
        HorusKubernetesPodOperator(task_id="t", model="resnet18", batch_size=32, gpus=0, image="x")
    with pytest.raises(ProfileError, match="unknown placement profile 'horus-papr'"):
        HorusKubernetesPodOperator(task_id="t", model="resnet18", batch_size=32, image="x", profile="horus-papr")
    HorusKubernetesPodOperator(task_id="t", model="m.onnx", batch_size=32, image="x")  # the pod's image trains it
    operator = HorusKubernetesPodOperator(task_id="t", model="{{ params.model }}", batch_size=32, image="x",
                                          dry_run_state=_state_file(tmp_path, False))
    operator.model = "resnt18"  # as a template renders it: found when the pod is built, not retried
    with pytest.raises(AirflowFailException, match="resnt18"):
        operator.build_pod_request_obj(dry_run=True)
    operator.model, operator.profile = "resnet18", "horus-papr"
    with pytest.raises(AirflowFailException, match="unknown placement profile 'horus-papr'"):
        operator.build_pod_request_obj(dry_run=True)


# --- whole task runs through Airflow against the test double ------------------------------------
@pytest.fixture
def cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, horus_home: Path) -> Iterator[FakeKubeApi]:
    with FakeKubeApi(token="tok-SECRET-kubeconfig-123", lifecycle=Lifecycle(running_after_s=0.1, succeeded_after_s=0.6)) as api:
        for name in ("g1", "g2"):
            api.add_node(gpu_node(name, count=2))
        monkeypatch.setenv("HORUS_TEST_KUBECONFIG", str(api.kubeconfig(tmp_path / "kubeconfig.json")))
        monkeypatch.setenv("HORUS_K8S_NAMESPACE", "horus")
        yield api


def _run(dag_id: str, caplog: pytest.LogCaptureFixture):  # type: ignore[no-untyped-def]
    module = load_dag_file(DAGS_FOLDER / "horus_test_kubernetes.py")
    dag = next(d for d in (module.sync_dag, module.deferrable_dag, module.taskflow_dag) if d.dag_id == dag_id)
    with caplog.at_level(logging.INFO):
        return dag, dag.test()


def _xcom(dag_run, task_id: str, key: str):  # type: ignore[no-untyped-def]
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    with create_session() as session:
        row = session.query(XComModel).filter_by(dag_id=dag_run.dag_id, run_id=dag_run.run_id, task_id=task_id, key=key).one()
        return row.value if not isinstance(row.value, str) else json.loads(row.value)


def _held(cluster: FakeKubeApi) -> list[str]:
    """The ledger's bookings and queue entries: every key but the recent waits the credit policy reads."""
    ledger = cluster.configmap("horus", "horus-ledger")
    assert ledger is not None
    return [key for key in ledger["data"] if key != WAITS_KEY]


@pytest.mark.airflow
@pytest.mark.parametrize("dag_id,task_id", [
    ("horus_test_k8s_sync", "train_resnet18"),
    ("horus_test_k8s_deferrable", "train_bert"),
    ("horus_test_k8s_taskflow", "train"),
])
def test_a_task_places_binds_runs_and_releases(airflow_db: Path, cluster: FakeKubeApi, caplog: pytest.LogCaptureFixture, dag_id: str, task_id: str) -> None:
    _dag, dag_run = _run(dag_id, caplog)
    assert str(dag_run.state) == "success", [(ti.task_id, ti.state) for ti in dag_run.get_task_instances()]
    assert _held(cluster) == []  # released after the pod finished, and out of the queue
    placement = _xcom(dag_run, task_id, "horus_placement")
    assert placement["gpu_ids"] and placement["binding"] == "visible-devices" and placement["predicted"]["util"] > 0
    assert placement["explanation"]["candidates"]
    created = [p for p in cluster.requests if p.startswith("POST pods")]
    assert created, cluster.requests


@pytest.mark.airflow
def test_the_pod_carries_placement_and_no_secret_leaks(airflow_db: Path, cluster: FakeKubeApi, caplog: pytest.LogCaptureFixture) -> None:
    _dag, dag_run = _run("horus_test_k8s_sync", caplog)
    assert str(dag_run.state) == "success"
    [pod] = cluster.created
    labels, annotations = pod["metadata"]["labels"], pod["metadata"]["annotations"]
    placement = _xcom(dag_run, "train_resnet18", "horus_placement")
    assert labels[RESERVATION_LABEL] == placement["reservation_id"]
    booking = json.loads(annotations[BOOKING_ANNOTATION])
    assert [b["gpu_id"] for b in booking["bookings"]] == placement["gpu_ids"]
    assert annotations["horus.ai/gpu-ids"] == ",".join(placement["gpu_ids"])
    env = {e["name"]: e for e in pod["spec"]["containers"][0]["env"]}
    assert env["NVIDIA_VISIBLE_DEVICES"]["value"] == ",".join(str(i) for i in placement["gpu_indices"])
    assert pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0][
        "matchExpressions"] == [{"key": "kubernetes.io/hostname", "operator": "In", "values": [placement["node"]]}]
    assert "secretKeyRef" in env["API_TOKEN"]["valueFrom"]  # the pod still gets its secrets
    where_horus_writes = json.dumps(placement) + json.dumps(annotations) + caplog.text
    for secret in ("sk-do-not-log-0xC0FFEE", "tok-SECRET-kubeconfig-123", "training-secrets"):
        assert secret not in where_horus_writes


@pytest.mark.airflow
def test_the_manifests_grant_what_the_operator_calls_and_no_more(airflow_db: Path, cluster: FakeKubeApi, caplog: pytest.LogCaptureFixture) -> None:
    import yaml

    docs = list(yaml.safe_load_all((REPO / "deploy" / "kubernetes" / "rbac.yaml").read_text()))
    cluster_rules = [r for d in docs if d["kind"] == "ClusterRole" for r in d["rules"]]
    role_rules = [r for d in docs if d["kind"] == "Role" for r in d["rules"]]
    assert {v for r in cluster_rules for v in r["verbs"]} <= {"get", "list", "watch"}  # cluster-wide is read-only
    for dag_id in ("horus_test_k8s_sync", "horus_test_k8s_deferrable", "horus_test_k8s_taskflow"):
        _run(dag_id, caplog)
    cluster.lifecycle = Lifecycle(running_after_s=0.1, succeeded_after_s=0.3, exit_code=1)
    _run("horus_test_k8s_sync", caplog)  # a failed pod: KubernetesPodOperator labels it as checked

    def granted(rules: list[dict], verb: str, resource: str) -> bool:
        return any(resource in r["resources"] and verb in r["verbs"] for r in rules)

    for verb, resource, namespace in sorted(cluster.verbs):
        rules = cluster_rules if namespace == "" else role_rules
        assert granted(rules, verb, resource), f"{verb} {resource} in {namespace or 'all namespaces'} is not granted"
    # KubernetesPodOperator's defaults call these; the test DAGs turn them off to keep the double small.
    used = {(verb, resource) for verb, resource, _ in cluster.verbs} | {("get", "pods/log"), ("list", "events")}
    unused = [(v, res) for r in cluster_rules + role_rules for res in r["resources"] for v in r["verbs"] if (v, res) not in used]
    assert unused == [], f"granted but never called: {unused}"


@pytest.mark.airflow
def test_a_pod_stuck_pending_is_deleted_and_its_gpus_released(airflow_db: Path, cluster: FakeKubeApi, caplog: pytest.LogCaptureFixture) -> None:
    cluster.lifecycle = Lifecycle(running_after_s=None, succeeded_after_s=None)
    module = load_dag_file(DAGS_FOLDER / "horus_test_kubernetes.py")
    task = module.sync_dag.get_task("train_resnet18")
    task.startup_timeout_seconds = task.schedule_timeout_seconds = 1
    with caplog.at_level(logging.INFO):
        dag_run = module.sync_dag.test()
    assert str(dag_run.state) == "failed"
    assert _held(cluster) == []
    assert cluster.pods("jobs") == []


@pytest.mark.airflow
def test_a_failed_pod_fails_the_task_and_releases(airflow_db: Path, cluster: FakeKubeApi, caplog: pytest.LogCaptureFixture) -> None:
    cluster.lifecycle = Lifecycle(running_after_s=0.1, succeeded_after_s=0.3, exit_code=1)
    _dag, dag_run = _run("horus_test_k8s_sync", caplog)
    assert str(dag_run.state) == "failed"
    assert _held(cluster) == []


@pytest.mark.airflow
def test_a_pod_whose_profiling_run_cannot_be_logged_fails_its_task_as_a_local_one_does(
    airflow_db: Path, cluster: FakeKubeApi, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
) -> None:
    """The same failure behaviour on both backends (docs/EXTENDING.md): the pod ran, but MLflow cannot take
    its profiling run, so the task fails (to be retried) instead of losing the run quietly; GPUs released."""
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://127.0.0.1:{free_port()}")  # nothing listens
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "3")
    _dag, dag_run = _run("horus_test_k8s_sync", caplog)
    assert str(dag_run.state) == "failed"
    assert cluster.created and _held(cluster) == []
    printed = capfd.readouterr()
    assert "ran, but its profiling run was not logged" in printed.out + printed.err  # the task's log says why


def test_killing_or_clearing_a_task_releases_its_gpus(cluster: FakeKubeApi, tmp_path: Path) -> None:
    from horus_airflow.backends import acquire
    from horus_airflow.backends.kubernetes import (
        KubernetesBackend,
        KubernetesOptions,
        api_from_kubeconfig,
    )
    from horus_airflow.placement import load_profile
    from horus_airflow.predictor.demand import Demand, GpuDemand

    config = str(cluster.kubeconfig(tmp_path / "kc.json"))
    backend = KubernetesBackend(api_from_kubeconfig(config), KubernetesOptions(namespace="horus"))
    owner = "dag/train/manual__1/-1"
    acquire(backend, Demand("j", 1, {"a100-80gb": GpuDemand(30, 40, 1000)}), load_profile("exclusive"), owner, 5)
    operator = HorusKubernetesPodOperator(task_id="train", model="resnet18", batch_size=32, image="x", config_file=config)
    operator._owner = owner  # what build_pod_request_obj recorded when it placed the pod
    operator.on_kill()
    assert backend.active() == {}
    operator.on_kill()  # a second kill (or a clear after a kill) finds nothing left and does not fail


class _TaskInstance:
    dag_id, task_id, run_id, map_index, try_number = "dag", "train", "manual__1", -1, 1

    def xcom_push(self, key: str, value: object) -> None:
        raise AssertionError("nothing is pushed when the cluster cannot be read")


def test_a_kubeconfig_that_does_not_work_fails_the_task_in_one_line(tmp_path: Path, horus_home: Path) -> None:
    from airflow.sdk.exceptions import AirflowFailException

    broken = tmp_path / "kubeconfig"
    broken.write_text("apiVersion: v1\nkind: Config\nclusters: []\ncontexts: []\n")
    operator = HorusKubernetesPodOperator(task_id="train", model="resnet18", batch_size=32, image="x", config_file=str(broken))
    with pytest.raises(AirflowFailException) as caught:
        operator.build_pod_request_obj({"ti": _TaskInstance(), "run_id": "manual__1", "dag": None})  # type: ignore[arg-type]
    assert "\n" not in str(caught.value) and f"kubeconfig {broken} does not work" in str(caught.value)


@pytest.mark.airflow
def test_a_pods_profiling_run_gets_its_dcgm_telemetry_and_becomes_training_data(
    airflow_db: Path, cluster: FakeKubeApi, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    from horus_airflow.cli import main
    from horus_airflow.registry.retraining import all_profiling_runs, extract
    from horus_airflow.settings import Settings

    _dag, dag_run = _run("horus_test_k8s_sync", caplog)
    assert str(dag_run.state) == "success"
    [pod] = cluster.created
    name = pod["metadata"]["name"]
    [run] = all_profiling_runs(Settings.from_env())
    assert run.data.tags["horus.pod"] == f"jobs/{name}" and run.data.tags["horus.gpu_measured"] == "false"
    assert run.data.params["job.model"] == "resnet18" and float(run.data.params["predicted.gpu_util"]) > 0
    labels = f'gpu="0",modelName="NVIDIA A100-SXM4-80GB",Hostname="g1",pod="{name}",namespace="jobs"'
    export = tmp_path / "dcgm.txt"
    export.write_text("\n".join(f"DCGM_FI_DEV_GPU_UTIL{{{labels}}} {v}\nDCGM_FI_DEV_FB_USED{{{labels}}} {m}"
                                for v, m in ((60, 9000), (70, 9500))))
    assert main(["telemetry", "import", str(export)]) == 0
    [run] = all_profiling_runs(Settings.from_env())  # attached to the pod's run, not a new one
    assert run.data.metrics["gpu_util_mean"] == 65.0 and run.data.metrics["gpu_mem_mib_max"] == 9500.0
    assert run.data.tags["horus.gpu_measured"] == "true"
    extracted = extract([run])
    assert list(extracted.predictor_rows["origin_ref"]) == [run.info.run_id]


@pytest.mark.airflow
def test_a_deferrable_pod_task_waits_in_the_triggerer_until_a_round_books_it(
        airflow_db: Path, cluster: FakeKubeApi, caplog: pytest.LogCaptureFixture) -> None:
    """Every GPU is held when the task starts: it queues in the ledger ConfigMap and defers to the
    BookingTrigger (dag.test() runs triggers in line); 3 s after it queued the holders are released, a
    round books it, and the pod runs on the booked GPU and releases it."""
    import threading
    import time

    from horus_airflow.backends import acquire
    from horus_airflow.backends.kubernetes import KubernetesBackend, KubernetesOptions, api_from_kubeconfig
    from horus_airflow.placement import load_profile
    from horus_airflow.predictor import Demand, GpuDemand

    backend = KubernetesBackend(api_from_kubeconfig(os.environ["HORUS_TEST_KUBECONFIG"]), KubernetesOptions(namespace="horus"))
    held = [acquire(backend, Demand(f"holder{i}", 1, {"a100-80gb": GpuDemand(100, 100, 75_000)}), load_profile("exclusive"),
                    f"other/hold/{i}", 0) for i in range(4)]
    stop, queued_at = threading.Event(), []

    def release_once_queued() -> None:
        while not stop.is_set() and not any(e.owner.startswith("horus_test_k8s_deferrable/train_bert/") for e in backend.queue()[1]):
            time.sleep(0.2)
        queued_at.append(time.time())
        stop.wait(3.0)
        for acquired in held:
            backend.release(acquired.reservation)

    releaser = threading.Thread(target=release_once_queued)
    releaser.start()
    try:
        _dag, dag_run = _run("horus_test_k8s_deferrable", caplog)
    finally:
        stop.set()
        releaser.join()
    assert str(dag_run.state) == "success", [(ti.task_id, ti.state) for ti in dag_run.get_task_instances()]
    assert any(r.getMessage().startswith("queued as ") for r in caplog.records)
    assert any(r.name == "horus_airflow.triggers.booking" for r in caplog.records)  # it waited in the trigger
    [(pool, enqueued, booked)] = json.loads(cluster.configmap("horus", "horus-ledger")["data"][WAITS_KEY])
    assert pool == "horus_test_k8s_deferrable" and booked - enqueued >= 2.5 and queued_at
    placement = _xcom(dag_run, "train_bert", "horus_placement")
    assert placement["gpu_ids"] and placement["gpu_ids"][0] in {g for a in held for g in a.decision.gpu_ids}
    assert _held(cluster) == []  # the holders and the task released, nothing left queued
