"""The Kubernetes backend, ledger and operator against the API server TEST DOUBLE (tests/kube_double.py).

The official ``kubernetes`` client talks HTTP to a small fake server on 127.0.0.1: it is not Kubernetes.
tests/e2e/ holds the suite for a real cluster.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Iterator

import pytest

from horus_airflow.backends import acquire
from horus_airflow.backends.kubernetes import (
    BOOKING_ANNOTATION,
    RESERVATION_LABEL,
    KubernetesBackend,
    KubernetesOptions,
    LedgerEntry,
    PodView,
    api_from_kubeconfig,
    reconcile,
)
from horus_airflow.backends.ledger import Booking
from horus_airflow.backends.scheduler import run_round, wait_in_queue
from horus_airflow.errors import (
    KubernetesApiError,
    KubernetesConfigError,
    LedgerConflictError,
    NoPlacementError,
)
from horus_airflow.placement import load_profile
from horus_airflow.predictor.demand import Demand, GpuDemand
from tests.kube_double import FakeKubeApi, Fault, gpu_node

FAST = KubernetesOptions(namespace="horus", request_timeout_s=0.5, attempts=4, backoff_s=0.01)


def demand(job_id: str, util: float = 40.0, mem: float = 20_000.0, gpus: int = 1) -> Demand:
    return Demand(job_id, gpus, {"a100-80gb": GpuDemand(util, util * 1.2, mem), "v100-32gb": GpuDemand(util, util * 1.2, mem / 3)})


@pytest.fixture
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeKubeApi]:
    with FakeKubeApi() as api:
        api.add_node(gpu_node("a1", count=4))
        api.add_node(gpu_node("a2", count=4, allocatable=3))
        api.add_node(gpu_node("cordoned", count=4, cordoned=True))
        api.add_node(gpu_node("notready", count=4, ready=False))
        api.add_node(gpu_node("weird", product="Acme-Tensor-9000", count=4))
        monkeypatch.setenv("HORUS_TEST_KUBECONFIG", str(api.kubeconfig(tmp_path / "kubeconfig.json")))
        monkeypatch.setenv("HORUS_K8S_NAMESPACE", "horus")
        yield api


def backend_for(fake: FakeKubeApi, tmp_path: Path, options: KubernetesOptions = FAST, **kwargs) -> KubernetesBackend:  # type: ignore[no-untyped-def]
    return KubernetesBackend(api_from_kubeconfig(str(fake.kubeconfig(tmp_path / "kc.json"))), options, **kwargs)


def entry(rid: str, created: float = 0.0, lease: float = 100.0, deadline: float = 600.0, gpu: str = "a1/0") -> LedgerEntry:
    return LedgerEntry(rid, f"job-{rid}", f"owner-{rid}", created, created + lease, created + deadline, (Booking(gpu, 40, 50, 1000),))


def pod_view(rid: str, phase: str = "Running", booking: str | None = None, deleting: bool = False) -> PodView:
    return PodView("jobs", f"pod-{rid}", phase, "a1", rid, deleting, 0, booking)


# --- inventory ----------------------------------------------------------------------------------
def test_inventory_reads_feature_discovery_labels_and_allocatable(fake: FakeKubeApi, tmp_path: Path) -> None:
    state = backend_for(fake, tmp_path).snapshot()
    by_node: dict[str, list] = {}
    for gpu in state.gpus:
        by_node.setdefault(gpu.node, []).append(gpu)
    assert sorted(by_node) == ["a1", "a2", "cordoned", "notready"]  # the unknown product is left out
    assert len(by_node["a1"]) == 4 and len(by_node["a2"]) == 3  # allocatable caps the labelled count
    assert all(g.gpu_type == "a100-80gb" and g.memory_mib == 81920 for g in state.gpus)
    assert all(g.healthy for g in by_node["a1"] + by_node["a2"])
    assert not any(g.healthy for g in by_node["cordoned"] + by_node["notready"])


def test_gpus_taken_by_pods_outside_horus_are_shown_as_taken(fake: FakeKubeApi, tmp_path: Path) -> None:
    fake.add_pod("other", {"metadata": {"name": "foreign"}, "spec": {"nodeName": "a1", "containers": [
        {"name": "c", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "2"}}}]}})
    state = backend_for(fake, tmp_path).snapshot()
    a1 = [g for g in state.gpus if g.node == "a1"]
    assert [bool(g.residents) for g in a1] == [False, False, True, True]
    assert a1[3].residents[0].job_id == "external:a1" and a1[3].used_mem_mib == a1[3].memory_mib


def test_unplaceable_nodes_are_explained(fake: FakeKubeApi, tmp_path: Path) -> None:
    from horus_airflow.placement import place

    state = backend_for(fake, tmp_path).snapshot()
    decision = place(demand("j"), state, load_profile("horus-paper"))
    verdicts = {c.gpu_id: c for c in decision.candidates}
    assert not verdicts["cordoned/0"].passed and "node-healthy" in json.dumps(verdicts["cordoned/0"].to_dict())


# --- ledger -------------------------------------------------------------------------------------
def test_reserve_writes_the_ledger_and_release_is_idempotent(fake: FakeKubeApi, tmp_path: Path) -> None:
    backend = backend_for(fake, tmp_path)
    acquired = acquire(backend, demand("j1"), load_profile("horus-paper"), "dag/t/run/-1", 5)
    stored = fake.configmap("horus", "horus-ledger")
    assert stored is not None and list(stored["data"]) == [acquired.reservation.reservation_id]
    assert LedgerEntry.from_json(stored["data"][acquired.reservation.reservation_id]).owner == "dag/t/run/-1"
    resident = {g.gpu_id: g for g in backend.snapshot().gpus}[acquired.decision.gpu_ids[0]].residents
    assert [r.job_id for r in resident] == ["j1"]
    assert backend.release(acquired.reservation) is True
    assert backend.release(acquired.reservation) is False
    assert backend.release_owner("dag/t/run/-1") == 0
    assert fake.configmap("horus", "horus-ledger")["data"] == {}


def test_a_stale_resource_version_is_a_conflict_and_acquire_decides_again(fake: FakeKubeApi, tmp_path: Path) -> None:
    from horus_airflow.placement import place

    backend, other = backend_for(fake, tmp_path), backend_for(fake, tmp_path)
    stale = backend.snapshot()
    acquire(other, demand("first"), load_profile("exclusive"), "o1", 5)
    decision = place(demand("second"), stale, load_profile("exclusive"))
    with pytest.raises(LedgerConflictError):
        backend.reserve(decision, demand("second"), "o2")
    assert fake.conflicts == 0  # refused before writing: the version was already known to be stale
    acquired = acquire(backend, demand("second"), load_profile("exclusive"), "o2", 5, state=stale)
    assert acquired.conflicts == 1
    assert len(backend.active()) == 2
    assert len({e.bookings[0].gpu_id for e in backend.active().values()}) == 2


def test_an_owner_that_already_holds_a_booking_gets_it_back(fake: FakeKubeApi, tmp_path: Path) -> None:
    backend = backend_for(fake, tmp_path)
    first = acquire(backend, demand("j"), load_profile("exclusive"), "dag/t/run/-1", 5)
    again = acquire(backend, demand("j"), load_profile("exclusive"), "dag/t/run/-1", 5)
    assert again.reservation.reservation_id == first.reservation.reservation_id
    assert len(backend.active()) == 1


# --- reconciliation -----------------------------------------------------------------------------
def test_reconcile_rules() -> None:
    entries = {rid: entry(rid) for rid in ("fresh", "expired", "running", "failed", "evicted", "stuck", "deleting")}
    entries["expired"] = entry("expired", created=-200)
    pods = {
        "running": pod_view("running"),
        "failed": pod_view("failed", "Failed"),
        "evicted": pod_view("evicted", "Failed"),
        "stuck": pod_view("stuck", "Pending"),
        "deleting": pod_view("deleting", deleting=True),
        "orphan": pod_view("orphan", booking=entry("orphan").to_json()),
        "garbled": pod_view("garbled", booking="{not json"),
    }
    result = reconcile(entries, pods, now=50.0)
    assert set(result.entries) == {"fresh", "running", "stuck", "orphan"}
    assert set(result.dropped) == {"expired", "failed", "evicted", "deleting"}
    assert result.adopted == ("orphan",)
    later = reconcile(entries, pods, now=601.0)
    assert "stuck" in later.dropped and [p.name for p in later.stuck] == ["pod-stuck"]
    assert "running" in later.entries  # a live pod keeps its booking past the lease


def test_snapshot_drops_finished_pods_and_deletes_pods_stuck_pending(fake: FakeKubeApi, tmp_path: Path) -> None:
    now = [1000.0]
    backend = backend_for(fake, tmp_path, KubernetesOptions(namespace="horus", attempts=2, backoff_s=0.01, lease_s=30, pending_deadline_s=120), clock=lambda: now[0])
    done = acquire(backend, demand("done"), load_profile("exclusive"), "o-done", 5)
    stuck = acquire(backend, demand("stuck"), load_profile("exclusive"), "o-stuck", 5)
    for name, acquired, phase in (("p-done", done, "Succeeded"), ("p-stuck", stuck, "Pending")):
        fake.add_pod("jobs", {"metadata": {"name": name, "labels": {RESERVATION_LABEL: acquired.reservation.reservation_id}},
                              "spec": {"containers": [{"name": "base", "image": "x"}]}}, phase=phase)
    backend.snapshot()
    assert set(backend.active()) == {stuck.reservation.reservation_id}
    now[0] += 121
    backend.snapshot()
    assert backend.active() == {}
    assert [p["metadata"]["name"] for p in fake.pods("jobs")] == ["p-done"]


def test_running_pods_rebuild_a_lost_ledger(fake: FakeKubeApi, tmp_path: Path) -> None:
    lost = entry("lost", created=0, gpu="a2/1")
    fake.add_pod("jobs", {"metadata": {"name": "survivor", "labels": {RESERVATION_LABEL: "lost"},
                                       "annotations": {BOOKING_ANNOTATION: lost.to_json()}},
                          "spec": {"nodeName": "a2", "containers": [{"name": "base", "image": "x"}]}}, phase="Running")
    backend = backend_for(fake, tmp_path)
    state = backend.snapshot()
    assert [r.job_id for r in {g.gpu_id: g for g in state.gpus}["a2/1"].residents] == ["job-lost"]
    assert set(backend.active()) == {"lost"}


# --- API faults ---------------------------------------------------------------------------------
@pytest.mark.parametrize("status", [429, 500, 503])
def test_transient_errors_are_retried(fake: FakeKubeApi, tmp_path: Path, status: int) -> None:
    backend = backend_for(fake, tmp_path)
    fake.inject(Fault("GET", "/nodes", status=status, times=2))
    fake.inject(Fault("PUT", "configmaps", status=status, times=2))
    acquired = acquire(backend, demand("j"), load_profile("horus-paper"), "o", 5)
    assert backend.retries == 4
    assert set(backend.active()) == {acquired.reservation.reservation_id}


def test_a_server_that_keeps_failing_fails_clearly_and_leaves_no_booking(fake: FakeKubeApi, tmp_path: Path) -> None:
    backend = backend_for(fake, tmp_path)
    backend.snapshot()
    fake.inject(Fault("PUT", "configmaps", status=500, times=FAST.attempts))
    with pytest.raises(KubernetesApiError, match=r"write the ledger failed 4 times, last with 500"):
        acquire(backend, demand("j"), load_profile("horus-paper"), "o", 5)
    assert backend.active() == {}


@pytest.mark.parametrize("landed", [True, False], ids=["timed-out-after-landing", "timed-out-before-writing"])
def test_a_write_that_timed_out_is_booked_exactly_once(fake: FakeKubeApi, tmp_path: Path, landed: bool) -> None:
    backend = backend_for(fake, tmp_path)
    backend.snapshot()
    fake.inject(Fault("PUT", "configmaps", hang_s=1.0, apply=landed))
    acquired = acquire(backend, demand("j"), load_profile("horus-paper"), "o", 5)
    assert set(backend.active()) == {acquired.reservation.reservation_id}


def test_a_broken_kubeconfig_is_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "kubeconfig"
    bad.write_text("apiVersion: v1\nkind: Config\nclusters: []\ncontexts: []\n")
    with pytest.raises(KubernetesConfigError) as caught:
        api_from_kubeconfig(str(bad))
    assert "\n" not in str(caught.value) and str(bad) in str(caught.value)
    with pytest.raises(KubernetesConfigError, match="does not work"):
        api_from_kubeconfig(str(tmp_path / "missing"))


def test_an_unreachable_server_is_one_line(fake: FakeKubeApi, tmp_path: Path) -> None:
    backend = backend_for(fake, tmp_path, KubernetesOptions(attempts=2, backoff_s=0.01, request_timeout_s=0.5))
    fake.stop()
    with pytest.raises(KubernetesApiError) as caught:
        backend.snapshot()
    assert "\n" not in str(caught.value) and "list nodes failed 2 times" in str(caught.value)


# --- concurrency --------------------------------------------------------------------------------
@pytest.mark.integration
@pytest.mark.parametrize("profile", ["exclusive", "horus-paper"])
def test_many_placements_at_once_never_over_commit(fake: FakeKubeApi, tmp_path: Path, profile: str) -> None:
    errors: list[BaseException] = []
    backends = [backend_for(fake, tmp_path, KubernetesOptions(namespace="horus", attempts=8, backoff_s=0.01)) for _ in range(6)]
    first_read = threading.Barrier(len(backends))

    class Racing:
        """The worker's backend, holding its first snapshot until every worker has read the same ledger
        version: the first writes then really race, however the threads are scheduled."""

        def __init__(self, backend: KubernetesBackend) -> None:
            self.backend, self.waited = backend, False

        def __getattr__(self, name: str):  # type: ignore[no-untyped-def]
            return getattr(self.backend, name)

        def snapshot(self):  # type: ignore[no-untyped-def]
            state = self.backend.snapshot()
            if not self.waited:
                self.waited = True
                first_read.wait()
            return state

    redecided: list[int] = []

    def worker(index: int) -> None:
        racing = Racing(backends[index])
        for j in range(4):
            try:
                redecided.append(acquire(racing, demand(f"w{index}-{j}", util=35, mem=30_000), load_profile(profile), f"w{index}-{j}", 0,
                                         poll_s=0).conflicts)
            except Exception as exc:  # noqa: BLE001 - collected and asserted on below
                errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(backends))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    booked = backends[0].active()
    per_gpu: dict[str, list[Booking]] = {}
    for e in booked.values():
        for b in e.bookings:
            per_gpu.setdefault(b.gpu_id, []).append(b)
    limit = 1 if profile == "exclusive" else 2  # two 30 GB jobs fit an 80 GB A100, three do not
    assert per_gpu and all(len(b) <= limit for b in per_gpu.values()), per_gpu
    assert all(sum(x.mem_mib for x in b) <= 81920 for b in per_gpu.values())
    assert len(booked) + len(errors) == 24
    assert len(booked) == 7 * limit  # every healthy GPU is used to its limit, and no more
    assert all("not placed within" in str(e) for e in errors), errors
    # every worker but the first to write found the ledger changed under its first decision (on reading it
    # again, or by the API server's 409) and decided again: the workers really raced
    assert sum(redecided) >= len(backends) - 1


# --- the queue ------------------------------------------------------------------------------------
def test_a_round_books_the_queue_in_order_in_one_write_and_the_rest_wait_with_a_reason(fake: FakeKubeApi, tmp_path: Path) -> None:
    backend = backend_for(fake, tmp_path)
    entries = [backend.enqueue(f"dag/t{i}/run/-1", demand(f"j{i}"), "exclusive", priority=int(i == 8)) for i in range(9)]
    writes = fake.requests["PUT horus-ledger"]
    outcome = run_round(backend, max_bookings=0)
    assert fake.requests["PUT horus-ledger"] == writes + 1  # bookings and reasons in one PUT
    in_order = [entries[8], *entries[:8]]  # FIFO on 7 healthy GPUs, the higher priority first
    assert [entry.entry_id for entry, _, _ in outcome.booked] == [e.entry_id for e in in_order[:7]]
    assert len({r.gpu_ids for _, r, _ in outcome.booked}) == 7 and outcome.booked[0][0].priority == 1
    version, waiting = backend.queue()
    assert [e.entry_id for e in waiting] == [e.entry_id for e in entries[6:8]]
    assert "no feasible GPU" in waiting[0].reason and waiting[1].reason == "a queued job with the same demand does not fit now"
    for entry, _, _ in outcome.booked[:1]:
        backend.take(entry.entry_id)
        backend.release(backend.reservation(entry.reservation_id or "") or outcome.booked[0][1])
    again = run_round(backend)
    assert [entry.entry_id for entry, _, _ in again.booked] == [entries[6].entry_id]  # the oldest waiting goes next
    assert backend.queue_entry(entries[8].entry_id) is None  # taken: out of the ConfigMap
    assert set(backend.waits(3600)) == {"default"}


def test_rounds_racing_from_several_workers_never_book_an_entry_or_a_gpu_twice(fake: FakeKubeApi, tmp_path: Path) -> None:
    backends = [backend_for(fake, tmp_path, KubernetesOptions(namespace="horus", attempts=8, backoff_s=0.01)) for _ in range(4)]
    for i in range(12):
        backends[i % 4].enqueue(f"o{i}", demand(f"j{i}"), "exclusive")
    errors: list[BaseException] = []

    def rounds(backend: KubernetesBackend) -> None:
        try:
            for _ in range(3):
                run_round(backend, max_bookings=2)
        except Exception as exc:  # noqa: BLE001 - asserted on below
            errors.append(exc)

    threads = [threading.Thread(target=rounds, args=(b,)) for b in backends]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    booked = backends[0].active()
    gpus = [b.gpu_id for e in booked.values() for b in e.bookings]
    assert len(booked) == 7 and len(set(gpus)) == 7  # every healthy GPU once, no more
    queued = backends[0]._read_ledger().queue.values()
    assert sorted(e.reservation_id for e in queued if e.reservation_id) == sorted(booked)  # one booking per entry


def test_a_task_waits_in_the_queue_and_takes_its_booking_when_a_gpu_frees(fake: FakeKubeApi, tmp_path: Path) -> None:
    backend = backend_for(fake, tmp_path)
    held = [acquire(backend, demand(f"busy{i}"), load_profile("exclusive"), f"busy{i}", 0) for i in range(7)]
    looks: list[str] = []

    def sleep(_s: float) -> None:  # while the task waits, a job finishes
        looks.append(backend.queue()[1][0].reason)
        backend.release(held[0].reservation)

    acquired = wait_in_queue(backend, demand("late"), load_profile("exclusive"), "dag/late/run/-1", 60, sleep=sleep)
    assert acquired.decision.gpu_ids == held[0].decision.gpu_ids and len(looks) == 1 and "no feasible GPU" in looks[0]
    assert backend.entry_of(acquired.reservation).owner == "dag/late/run/-1"
    assert backend.queue()[1] == []


def test_leaving_releases_a_booking_never_taken_and_a_restarted_task_gets_its_booking_back(fake: FakeKubeApi, tmp_path: Path) -> None:
    backend = backend_for(fake, tmp_path)
    gone = backend.enqueue("dag/a/run/-1", demand("a"), "exclusive")
    run_round(backend)
    assert backend.leave(gone.entry_id, "the task was cleared") and not backend.leave(gone.entry_id, "again")
    assert backend.active() == {}
    kept = acquire(backend, demand("b"), load_profile("exclusive"), "dag/b/run/-1", 0)
    again = backend.enqueue("dag/b/run/-1", demand("b"), "exclusive")
    assert again.status(backend.now()) == "booked" and again.reservation_id == kept.reservation.reservation_id
    assert len(backend.active()) == 1


def test_an_entry_for_a_gpu_type_no_node_has_stays_queued_with_its_reason(fake: FakeKubeApi, tmp_path: Path) -> None:
    backend = backend_for(fake, tmp_path)
    only_v100 = Demand("v", 1, {"v100-32gb": GpuDemand(40, 48, 1000)})
    entry = backend.enqueue("dag/v/run/-1", only_v100, "exclusive")
    run_round(backend)
    seen = backend.queue_entry(entry.entry_id)
    assert seen is not None and seen.status(backend.now()) == "waiting" and seen.reason


def test_a_queue_that_would_overflow_the_configmap_refuses_the_task_and_keeps_the_rest(
        fake: FakeKubeApi, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import horus_airflow.backends.kubernetes as kubernetes

    monkeypatch.setattr(kubernetes, "_QUEUE_FULL_BYTES", 700)  # a few entries' worth, not ~400
    backend = backend_for(fake, tmp_path)
    first = backend.enqueue("dag/a/run/-1", demand("a"), "exclusive")
    with pytest.raises(NoPlacementError, match=r"not queued: the ledger ConfigMap horus/horus-ledger would hold [\d,]+ bytes with 2 queue entries"):
        backend.enqueue("dag/b/run/-1", demand("b"), "exclusive")
    assert [e.entry_id for e in backend.queue()[1]] == [first.entry_id] and backend.active() == {}
