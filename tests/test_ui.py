"""The Horus view's JSON API and pages, in process: real Airflow auth manager and tokens, a seeded SQLite
ledger and MLflow store, the Kubernetes source against the API-server test double. The browser tests
are in test_ui_browser.py."""

from __future__ import annotations

import hashlib
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from horus_airflow.backends.base import acquire
from horus_airflow.backends.kubernetes import (
    BOOKING_ANNOTATION,
    RESERVATION_LABEL,
    KubernetesBackend,
    KubernetesOptions,
    api_from_kubeconfig,
)
from horus_airflow.backends.ledger import Booking, LedgerReader, SqliteLedger
from horus_airflow.placement import load_profile
from horus_airflow.predictor.demand import Demand, GpuDemand
from horus_airflow.settings import Settings
from horus_airflow.ui import create_app
from horus_airflow.ui.model import TaskRef
from tests.kube_double import FakeKubeApi, gpu_node
from tests.servers import free_port
from tests.ui_seed import TEST_INPUT_UTIL, Seeded, seed

ROUTES = ["/", "/queue", "/api/v1/queue", "/decisions", "/predictor", "/simulations", "/static/horus.js", "/api/v1", "/api/v1/openapi.json",
          "/api/v1/cluster", "/api/v1/decisions", "/api/v1/decisions/abc", "/api/v1/predictor", "/api/v1/simulations",
          f"/api/v1/simulations/{'a' * 32}/artifacts/simulation.png"]


@pytest.fixture(scope="module")
def seeded(tmp_path_factory: pytest.TempPathFactory) -> Seeded:
    home = tmp_path_factory.mktemp("ui") / "horus"
    return seed(Settings.from_env({"HORUS_HOME": str(home), "HORUS_LOCAL_GPUS": "2xa100-80gb"}))


def client_for(settings: Settings, token: str | None) -> TestClient:
    client = TestClient(create_app(lambda: settings, cache_s=0.0, stale_s=0.0))
    if token:
        client.cookies.set("_token", token)
    return client


@pytest.fixture
def api(seeded: Seeded, token: str) -> TestClient:
    return client_for(seeded.settings, token)


# --- access ----------------------------------------------------------------------------------------
@pytest.mark.integration
@pytest.mark.parametrize("path", ROUTES)
def test_anonymous_requests_are_refused_everywhere(seeded: Seeded, token: str, path: str) -> None:
    anonymous = client_for(seeded.settings, None)
    response = anonymous.get(path)
    assert response.status_code == 401
    if "/api/" in path:
        assert response.json()["detail"] == "Not authenticated"
    elif "/static/" not in path:
        assert "Sign in to Airflow" in response.text
    forged = client_for(seeded.settings, token[:-4] + "AAAA")
    assert forged.get(path).status_code in (401, 403)


def test_a_bearer_token_works_too_and_the_docs_are_not_public(seeded: Seeded, token: str) -> None:
    plain = client_for(seeded.settings, None)
    assert plain.get("/api/v1/cluster", headers={"Authorization": f"Bearer {token}"}).status_code == 200
    for public_by_default in ("/docs", "/redoc", "/openapi.json"):
        assert plain.get(public_by_default).status_code in (401, 404)


def test_every_route_is_read_only(seeded: Seeded, token: str, api: TestClient) -> None:
    app = api.app
    methods = {m for route in app.routes for m in getattr(route, "methods", ()) or ()}
    assert methods <= {"GET", "HEAD"}, methods
    before = hashlib.sha256(seeded.settings.ledger_path.read_bytes()).hexdigest()
    for path in ROUTES:
        api.get(path)
        for method in ("post", "put", "patch", "delete"):
            assert getattr(api, method)(path).status_code in (404, 405), (method, path)
    assert hashlib.sha256(seeded.settings.ledger_path.read_bytes()).hexdigest() == before


# --- cluster map -----------------------------------------------------------------------------------
def test_the_map_shows_every_gpu_the_live_task_and_predicted_vs_measured(api: TestClient, seeded: Seeded) -> None:
    body = api.get("/api/v1/cluster").json()
    assert body["source"] == "local" and body["totals"] == {"nodes": 1, "gpus": 2, "busy_gpus": 1}
    gpus = {g["gpu_id"]: g for node in body["nodes"] for g in node["gpus"]}
    assert set(gpus) == {"local/0", "local/1"}
    busy = gpus[seeded.live_gpu]
    assert busy["predicted"] == {"util": 55.0, "util_p90": 70.0, "mem_mib": 30000}
    assert busy["measured"]["util"] == TEST_INPUT_UTIL and busy["measured"]["mem_mib"] == 28000.0
    [task] = [body["tasks"][i] for i in busy["tasks"]]
    assert task["reservation_id"] == seeded.live_reservation
    assert task["task"]["dag_id"] == "ui_dag" and task["task"]["ui_path"].startswith("dags/ui_dag/runs/manual__2026-01-01T00%3A00%3A00%2B00%3A00/tasks/train_big")
    idle = next(g for gid, g in gpus.items() if gid != seeded.live_gpu)
    assert idle["tasks"] == [] and idle["measured"] is None and idle["declared"]
    assert body["dag_ids"] == ["ui_dag"] and body["gpu_types"] == ["a100-80gb"]


def test_map_filters_and_bad_filters(api: TestClient, seeded: Seeded) -> None:
    by_dag = api.get("/api/v1/cluster", params={"dag_id": "ui_dag"}).json()
    assert [g["gpu_id"] for n in by_dag["nodes"] for g in n["gpus"]] == [seeded.live_gpu]
    assert api.get("/api/v1/cluster", params={"dag_id": "other"}).json()["nodes"] == []
    assert api.get("/api/v1/cluster", params={"node": "LOC"}).json()["totals"]["gpus"] == 2
    wrong_type = api.get("/api/v1/cluster", params={"gpu_type": "h100-80gb"})
    assert wrong_type.status_code == 400 and "present: a100-80gb" in wrong_type.json()["detail"]
    malformed = api.get("/api/v1/cluster", params={"dag_id": "no spaces; drop"})
    assert malformed.status_code == 400 and "dag_id" in malformed.json()["detail"]


@pytest.mark.integration
def test_an_empty_home_says_what_to_do(tmp_path: Path, token: str) -> None:
    empty = client_for(Settings.from_env({"HORUS_HOME": str(tmp_path / "empty"), "HORUS_LOCAL_GPUS": "1xt4"}), token)
    body = empty.get("/api/v1/cluster").json()
    assert body["totals"]["gpus"] == 1 and "No placements yet" in body["notes"][0] and "make demo" in body["notes"][0]
    assert empty.get("/api/v1/decisions").json()["decisions"] == []
    assert not (tmp_path / "empty" / "ledger.sqlite").exists()  # reading never creates the ledger
    no_gpus = client_for(Settings.from_env({"HORUS_HOME": str(tmp_path / "empty")}), token).get("/api/v1/cluster").json()
    assert no_gpus["nodes"] == [] and "HORUS_LOCAL_GPUS" in no_gpus["notes"][0]
    versions = empty.get("/api/v1/predictor").json()
    assert [m["versions"] for m in versions["models"]] == [[], []] and versions["profiling"]["points"] == []
    assert empty.get("/api/v1/simulations").json() == {"simulations": []}


def test_a_bad_source_setting_is_a_clear_503(tmp_path: Path, token: str) -> None:
    wrong = client_for(Settings.from_env({"HORUS_HOME": str(tmp_path), "HORUS_UI_SOURCE": "slurm"}), token)
    response = wrong.get("/api/v1/cluster")
    assert response.status_code == 503 and "accepted: local, kubernetes" in response.json()["detail"]


# --- queue -----------------------------------------------------------------------------------------
@pytest.mark.integration
def test_the_queue_shows_each_waiting_task_its_place_and_why_it_waits(tmp_path: Path, token: str) -> None:
    from horus_airflow.backends import LocalBackend
    from horus_airflow.backends.scheduler import run_round

    settings = Settings.from_env({"HORUS_HOME": str(tmp_path / "q"), "HORUS_LOCAL_GPUS": "1xa100-80gb"})
    client = client_for(settings, token)
    assert client.get("/api/v1/queue").json() == {"source": "local", "note": None, "queue": []}  # no ledger yet
    backend = LocalBackend(settings)
    backend.ledger.reserve(0, "holder", "other_dag/hold/r/-1", [Booking("local/0", 90, 95, 70_000)], backend.now(), 600)
    for name, util, priority in (("first", 40, 0), ("second", 30, 0), ("urgent", 20, 3)):
        backend.enqueue(f"q_dag/{name}/manual__1/-1", Demand(f"{name}-1", 1, {"a100-80gb": GpuDemand(util, 50, 8_000)}), "exclusive",
                        priority=priority)
    run_round(backend)
    body = client.get("/api/v1/queue").json()
    assert [(q["position"], q["task"]["task_id"], q["priority"]) for q in body["queue"]] == [(1, "urgent", 3), (2, "first", 0),
                                                                                              (3, "second", 0)]
    urgent, first, second = body["queue"]
    assert first["predicted"] == {"a100-80gb": {"util": 40.0, "mem_mib": 8000}}
    assert urgent["reason"].startswith("no feasible GPU (local/0: memory-fit")  # the head of the queue: the one fifo tries
    assert "waits its turn: the fifo queue policy" in second["reason"] and first["waited_s"] >= 0


# --- decisions -------------------------------------------------------------------------------------
def test_decisions_list_newest_first_and_page(api: TestClient, seeded: Seeded) -> None:
    rows = api.get("/api/v1/decisions").json()["decisions"]
    assert [r["reservation_id"] for r in rows] == [seeded.live_reservation, seeded.finished_reservation]
    live, finished = rows
    assert live["status"] == "live" and finished["status"] == "released"
    assert live["profile"] == "horus-paper" and live["gpu_ids"] == [seeded.live_gpu] and "lowest cost" in live["reason"]
    first = api.get("/api/v1/decisions", params={"limit": 1}).json()
    assert [r["reservation_id"] for r in first["decisions"]] == [seeded.live_reservation]
    older = api.get("/api/v1/decisions", params={"limit": 1, "before": first["next_before"]}).json()
    assert [r["reservation_id"] for r in older["decisions"]] == [seeded.finished_reservation]
    assert api.get("/api/v1/decisions", params={"dag_id": "nobody"}).json()["decisions"] == []
    for bad in ({"limit": 0}, {"limit": 501}, {"limit": "ten"}, {"before": "yesterday"}):
        response = api.get("/api/v1/decisions", params=bad)
        assert response.status_code == 400 and next(iter(bad)) in response.json()["detail"]


def test_a_decision_opens_its_explanation_and_its_profiling_run(api: TestClient, seeded: Seeded) -> None:
    body = api.get(f"/api/v1/decisions/{seeded.finished_reservation}").json()
    explanation = body["explanation"]
    assert explanation["gpu_ids"] == body["gpu_ids"]
    chosen = next(c for c in explanation["candidates"] if c["gpu_id"] in body["gpu_ids"])
    assert chosen["passed"] and {v["plugin"] for v in chosen["verdicts"]} and chosen["cost_parts"]
    [run] = body["mlflow_runs"]
    assert run["name"] == "finished_job" and run["status"] == "FINISHED" and run["url"] is None  # no MLflow UI URL set
    assert body["task"]["task_id"] == "finished_job" and body["mlflow_error"] is None
    assert api.get("/api/v1/decisions/0123abcd").status_code == 404
    assert api.get("/api/v1/decisions/not%20an%20id").status_code == 400


def test_mlflow_links_use_the_configured_ui(seeded: Seeded, token: str) -> None:
    settings = Settings.from_env({"HORUS_HOME": str(seeded.settings.home), "HORUS_LOCAL_GPUS": "2xa100-80gb",
                                  "HORUS_MLFLOW_UI_URL": "https://mlflow.example.org/"})
    [run] = client_for(settings, token).get(f"/api/v1/decisions/{seeded.finished_reservation}").json()["mlflow_runs"]
    assert run["url"] == f"https://mlflow.example.org/#/experiments/{run['experiment_id']}/runs/{run['run_id']}"


# --- MLflow pages ----------------------------------------------------------------------------------
def test_predictor_versions_champion_and_predicted_vs_measured(api: TestClient) -> None:
    body = api.get("/api/v1/predictor").json()
    models = {m["name"]: m["versions"] for m in body["models"]}
    [utilization] = models["horus-gpu-utilization"]
    assert "champion" in utilization["aliases"] and utilization["metrics"]["heldout.source.gpu_util.model.rmsle"] > 0
    assert "champion" in models["horus-interference"][0]["aliases"]
    [point] = body["profiling"]["points"]
    assert (point["predicted_util"], point["measured_util"]) == (62.0, 71.0) and point["model"] == "resnet50"
    assert body["profiling"]["without_gpu_measurement"] == 1  # the finished job ran on the CPU
    assert api.get("/api/v1/predictor", params={"points": 0}).status_code == 400


def test_simulations_and_their_plots(api: TestClient, seeded: Seeded) -> None:
    [simulation] = api.get("/api/v1/simulations").json()["simulations"]
    assert simulation["run_id"] == seeded.simulation_run
    assert set(simulation["metrics"]) == {"exclusive", "horus-paper"} and "makespan_s" in simulation["metrics"]["exclusive"]
    assert "simulation.png" in simulation["artifacts"]
    png = api.get(f"/api/v1/simulations/{seeded.simulation_run}/artifacts/simulation.png")
    assert png.status_code == 200 and png.headers["content-type"] == "image/png" and png.content[:4] == b"\x89PNG"
    assert api.get(f"/api/v1/simulations/{seeded.simulation_run}/artifacts/MLmodel").status_code == 404
    assert api.get(f"/api/v1/simulations/{seeded.simulation_run}/artifacts/..%2F..%2Fetc%2Fpasswd").status_code in (400, 404)
    assert api.get(f"/api/v1/simulations/{'0' * 32}/artifacts/simulation.png").status_code == 404


def test_a_missing_mlflow_server_is_a_503_with_the_reason(seeded: Seeded, token: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    uri = f"http://127.0.0.1:{free_port()}"
    settings = Settings.from_env({"HORUS_HOME": str(seeded.settings.home), "HORUS_LOCAL_GPUS": "2xa100-80gb", "MLFLOW_TRACKING_URI": uri})
    api = client_for(settings, token)
    for path in ("/api/v1/predictor", "/api/v1/simulations"):
        response = api.get(path)
        assert response.status_code == 503 and f"MLflow at {uri} could not" in response.json()["detail"]
    detail = api.get(f"/api/v1/decisions/{seeded.finished_reservation}").json()  # the ledger still explains it
    assert detail["explanation"] and detail["mlflow_runs"] == [] and uri in detail["mlflow_error"]
    assert api.get("/api/v1/cluster").status_code == 200


# --- the ledger's journal ----------------------------------------------------------------------------
def test_the_journal_keeps_released_and_expired_reservations_with_their_decisions(tmp_path: Path) -> None:
    ledger = SqliteLedger(tmp_path / "ledger.sqlite")
    first = ledger.reserve(0, "a", "d/t/r/-1", [Booking("local/0", 10, 20, 100), Booking("local/1", 10, 20, 100)], now=1.0, lease_s=10)
    ledger.reserve(1, "b", "d/t/r/-1", [Booking("local/0", 30, 40, 100)], now=2.0, lease_s=100)
    ledger.release(first.reservation_id, now=3.0)
    reader = LedgerReader(tmp_path / "ledger.sqlite")
    entries = reader.journal(10)
    assert [e.job_id for e in entries] == ["b", "a"] and [len(e.bookings) for e in entries] == [1, 2]
    assert [e.status(now=5.0) for e in entries] == ["live", "released"] and entries[0].status(now=500.0) == "expired"
    assert entries[0].note is None  # reserved without a decision
    assert [e.job_id for e in reader.live(now=5.0)] == ["b"] and reader.entry(first.reservation_id).job_id == "a"
    with pytest.raises(sqlite3.OperationalError, match="readonly"):
        reader._connect().execute("DELETE FROM reservations")


def test_a_ledger_written_before_decisions_were_journaled_is_still_read(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite"
    SqliteLedger(path).reserve(0, "old", "o", [Booking("local/0", 1, 1, 1)], now=1.0, lease_s=10)
    with sqlite3.connect(path) as conn:
        conn.execute("DROP TABLE decisions")
    [entry] = LedgerReader(path).journal(5)
    assert entry.job_id == "old" and entry.note is None


@pytest.mark.parametrize(("owner", "expected"), [
    ("dag/task/manual__2026-01-01T00:00:00+00:00/-1", TaskRef("dag", "task", "manual__2026-01-01T00:00:00+00:00", -1)),
    ("dag/task/custom/run/with/slashes/3", TaskRef("dag", "task", "custom/run/with/slashes", 3)),
    ("horus-cli", None), ("a/b/c/not-a-number", None),
])
def test_owners_name_their_task_instance(owner: str, expected: TaskRef | None) -> None:
    assert TaskRef.parse(owner) == expected


# --- Kubernetes source -----------------------------------------------------------------------------
@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[FakeKubeApi, Path]]:
    with FakeKubeApi() as fake:
        fake.add_node(gpu_node("gpu-a", count=4))
        fake.add_node(gpu_node("gpu-b", count=4, product="Tesla-V100-SXM2-32GB", memory_mib=32768, cordoned=True))
        yield fake, fake.kubeconfig(tmp_path / "kubeconfig.json")


@pytest.mark.integration
def test_the_kubernetes_source_reads_nodes_bookings_and_pods_without_writing(cluster: tuple[FakeKubeApi, Path], token: str, tmp_path: Path) -> None:
    fake, kubeconfig = cluster
    settings = Settings.from_env({"HORUS_HOME": str(tmp_path / "h"), "HORUS_UI_SOURCE": "kubernetes", "HORUS_KUBECONFIG": str(kubeconfig)})
    api = client_for(settings, token)
    empty = api.get("/api/v1/cluster").json()
    assert empty["totals"]["gpus"] == 8 and "No Horus task holds a GPU" in empty["notes"][0]
    assert fake.configmap("horus", "horus-ledger") is None  # the reader does not create the ledger

    backend = KubernetesBackend(api_from_kubeconfig(str(kubeconfig)), KubernetesOptions(namespace="horus"))
    demand = Demand("pod-job-1", 1, {"a100-80gb": GpuDemand(40.0, 50.0, 20_000.0)})
    acquired = acquire(backend, demand, load_profile("horus-paper"), "kdag/train/manual__1/-1", timeout_s=5)
    entry = backend.entry_of(acquired.reservation)
    fake.add_pod("jobs", {"metadata": {"name": "train-pod", "labels": {RESERVATION_LABEL: entry.reservation_id},
                                       "annotations": {BOOKING_ANNOTATION: entry.to_json(), **acquired.decision.annotations()}},
                          "spec": {"nodeName": "gpu-a", "containers": [{"name": "c"}]}})
    fake.verbs.clear()
    body = api.get("/api/v1/cluster", params={"dag_id": "kdag"}).json()
    [node] = body["nodes"]
    [gpu] = node["gpus"]
    assert gpu["gpu_id"] in acquired.decision.gpu_ids and gpu["measured"] is None and gpu["predicted"]["util"] == 40.0
    assert body["tasks"][0]["task"]["dag_id"] == "kdag"
    [row] = api.get("/api/v1/decisions").json()["decisions"]
    assert row["status"] == "running" and row["profile"] == "horus-paper" and row["reason"] == acquired.decision.reason
    assert api.get(f"/api/v1/decisions/{row['reservation_id']}").json()["explanation"]["gpu_ids"] == list(acquired.decision.gpu_ids)
    assert {verb for verb, _, _ in fake.verbs} <= {"get", "list"}, fake.verbs
    queued = backend.enqueue("kdag/later/manual__1/-1", Demand("later-1", 1, {"a100-80gb": GpuDemand(30.0, 40.0, 70_000.0)}), "horus-paper")
    fake.verbs.clear()
    body = api.get("/api/v1/queue").json()
    assert body["note"] is None and [(q["position"], q["task"]["task_id"]) for q in body["queue"]] == [(1, "later")]
    assert queued.entry_id in fake.configmap("horus", "horus-ledger")["data"][f"queue.{queued.entry_id}"]
    assert {verb for verb, _, _ in fake.verbs} <= {"get", "list"}, fake.verbs


def test_an_unreachable_kubernetes_api_is_a_503(tmp_path: Path, token: str) -> None:
    kubeconfig = tmp_path / "kc.yaml"
    kubeconfig.write_text(f"""apiVersion: v1
kind: Config
clusters: [{{name: c, cluster: {{server: "http://127.0.0.1:{free_port()}"}}}}]
users: [{{name: u, user: {{token: t}}}}]
contexts: [{{name: x, context: {{cluster: c, user: u}}}}]
current-context: x
""")
    settings = Settings.from_env({"HORUS_HOME": str(tmp_path / "h"), "HORUS_UI_SOURCE": "kubernetes", "HORUS_KUBECONFIG": str(kubeconfig)})
    response = client_for(settings, token).get("/api/v1/cluster")
    assert response.status_code == 503 and "list nodes failed" in response.json()["detail"]


def test_one_reading_serves_every_viewer_and_is_refreshed_in_the_background(tmp_path: Path, token: str) -> None:
    settings = Settings.from_env({"HORUS_HOME": str(tmp_path / "h"), "HORUS_LOCAL_GPUS": "1xt4"})
    now = [1000.0]
    api = TestClient(create_app(lambda: settings, cache_s=2.0, stale_s=30.0, clock=lambda: now[0]))
    api.cookies.set("_token", token)
    assert api.get("/api/v1/cluster").json()["totals"]["busy_gpus"] == 0
    SqliteLedger(settings.ledger_path).reserve(0, "late", "d/t/r/-1", [Booking("local/0", 50, 60, 1000)], now=time.time(), lease_s=600)
    now[0] += 1.9
    assert api.get("/api/v1/cluster").json()["totals"]["busy_gpus"] == 0  # younger than cache_s: served as it is
    now[0] += 0.2
    assert api.get("/api/v1/cluster").json()["totals"]["busy_gpus"] == 0  # stale: served, and refreshed meanwhile
    deadline = time.monotonic() + 10
    while api.get("/api/v1/cluster").json()["totals"]["busy_gpus"] == 0:
        assert time.monotonic() < deadline, "the background refresh never landed"
        time.sleep(0.05)


def test_decisions_filter_by_dag_in_the_ledger_itself(tmp_path: Path) -> None:
    ledger = SqliteLedger(tmp_path / "ledger.sqlite")
    for i, owner in enumerate(["team_a/t/r/-1", "teamXa/t/r/-1", "TEAM_A/t/r/-1", "team_a/u/r/-1"]):
        ledger.reserve(i, f"j{i}", owner, [Booking("local/0", 1, 1, 1)], now=float(i), lease_s=10)
    reader = LedgerReader(tmp_path / "ledger.sqlite")
    assert [e.job_id for e in reader.journal(10, owner_prefix="team_a/")] == ["j3", "j0"]  # exact: no wildcard, case kept
    assert [e.job_id for e in reader.journal(1, before=3.0, owner_prefix="team_a/")] == ["j0"]


def test_placements_of_dags_the_viewer_may_not_read_are_hidden(api: TestClient, seeded: Seeded, monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow.api_fastapi.app import get_auth_manager

    manager = get_auth_manager()
    allowed = manager.is_authorized_dag
    monkeypatch.setattr(manager, "is_authorized_dag", lambda *, details=None, **kw: details.id != "ui_dag" and allowed(details=details, **kw))
    body = api.get("/api/v1/cluster").json()
    [task] = body["tasks"]
    assert task == {"job_id": "hidden", "reservation_id": None, "task": None, "external": False, "util": 55.0, "util_p90": 70.0, "mem_mib": 30000}
    assert body["dag_ids"] == [] and body["totals"]["busy_gpus"] == 1  # the GPU is still shown as taken
    assert api.get("/api/v1/decisions").json()["decisions"] == []
    assert api.get(f"/api/v1/decisions/{seeded.live_reservation}").status_code == 404
    monkeypatch.setattr(manager, "is_authorized_dag", allowed)
    assert api.get("/api/v1/cluster").json()["tasks"][0]["task"]["dag_id"] == "ui_dag"
