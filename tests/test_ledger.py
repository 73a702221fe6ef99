"""The SQLite ledger: compare-and-swap reservations, leases, idempotent release, real concurrency."""

from __future__ import annotations

import multiprocessing
import sqlite3
from pathlib import Path

import pytest

from horus_airflow.backends import LocalBackend, acquire
from horus_airflow.backends.ledger import Booking, SqliteLedger
from horus_airflow.errors import LedgerConflictError, NoPlacementError
from horus_airflow.placement import load_profile
from horus_airflow.placement.state import crashed_pair
from horus_airflow.predictor import Demand, GpuDemand
from horus_airflow.settings import Settings


def test_reserve_is_refused_when_the_ledger_moved(tmp_path: Path) -> None:
    ledger = SqliteLedger(tmp_path / "l.sqlite")
    version, _ = ledger.active(now=0)
    ledger.reserve(version, "a", "w1", [Booking("g/0", 50, 55, 100)], now=0, lease_s=60)
    with pytest.raises(LedgerConflictError):
        ledger.reserve(version, "b", "w2", [Booking("g/0", 50, 55, 100)], now=0, lease_s=60)


def test_expired_leases_free_their_gpu_and_release_is_idempotent(tmp_path: Path) -> None:
    ledger = SqliteLedger(tmp_path / "l.sqlite")
    reservation = ledger.reserve(0, "a", "w1", [Booking("g/0", 50, 55, 100)], now=100, lease_s=60)
    assert ledger.active(now=159)[1]["g/0"][0].job_id == "a"
    assert ledger.active(now=161)[1] == {}
    assert not ledger.renew(reservation.reservation_id, now=161, lease_s=60)
    assert ledger.release(reservation.reservation_id, now=170)
    assert not ledger.release(reservation.reservation_id, now=171)


def test_renewal_keeps_a_live_lease(tmp_path: Path) -> None:
    ledger = SqliteLedger(tmp_path / "l.sqlite")
    reservation = ledger.reserve(0, "a", "w1", [Booking("g/0", 50, 55, 100)], now=0, lease_s=60)
    assert ledger.renew(reservation.reservation_id, now=50, lease_s=60)
    assert "g/0" in ledger.active(now=100)[1]


def _worker(home: str, job: str, barrier: multiprocessing.synchronize.Barrier, results: multiprocessing.Queue) -> None:
    settings = Settings.from_env({"HORUS_HOME": home, "HORUS_LOCAL_GPUS": "1xa100-80gb"})
    backend = LocalBackend(settings)
    need = Demand(job, 1, {"a100-80gb": GpuDemand(30, 33, 1000)})
    barrier.wait()
    try:
        got = acquire(backend, need, load_profile("horus-paper"), owner=job, timeout_s=0.0, poll_s=0.0)
        results.put((job, "reserved", got.conflicts))
    except NoPlacementError:
        results.put((job, "refused", 0))


@pytest.mark.integration
def test_concurrent_processes_never_share_one_slot_beyond_the_limit(tmp_path: Path) -> None:
    """Twelve processes race for one GPU that takes four residents: exactly four win."""
    workers = 12
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(workers), ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(str(tmp_path), f"job{i}", barrier, results)) for i in range(workers)]
    for proc in procs:
        proc.start()
    outcomes = [results.get(timeout=120) for _ in procs]
    for proc in procs:
        proc.join(timeout=60)
    reserved = [o for o in outcomes if o[1] == "reserved"]
    assert len(reserved) == 4, outcomes
    with sqlite3.connect(tmp_path / "ledger.sqlite") as conn:
        (live,) = conn.execute("SELECT COUNT(*) FROM reservations WHERE released_at IS NULL").fetchone()
        (distinct,) = conn.execute("SELECT COUNT(DISTINCT job_id) FROM reservations").fetchone()
    assert live == distinct == 4


def test_a_retry_releases_what_the_dead_try_of_its_task_instance_still_holds(tmp_path: Path) -> None:
    settings = Settings.from_env({"HORUS_HOME": str(tmp_path), "HORUS_LOCAL_GPUS": "1xa100-80gb"})
    backend = LocalBackend(settings)
    need = Demand("j", 1, {"a100-80gb": GpuDemand(60, 70, 1000)})
    dead_try = acquire(backend, need, load_profile("horus-paper"), owner="dag/train/run/0", timeout_s=0.0)
    other = acquire(backend, Demand("k", 1, {"a100-80gb": GpuDemand(30, 33, 1000)}), load_profile("horus-paper"),
                    owner="dag/train/run/1", timeout_s=0.0)
    assert backend.release_owner("dag/train/run/0") == 1
    assert backend.release_owner("dag/train/run/0") == 0
    _version, residents = backend.ledger.active(now=0)
    assert [r.job_id for r in residents["local/0"]] == ["k"]  # another task instance keeps its booking
    assert not backend.release(dead_try.reservation) and backend.release(other.reservation)


def test_crashed_pairs_are_kept_once_bump_the_version_and_reach_the_snapshot(tmp_path: Path) -> None:
    settings = Settings.from_env({"HORUS_HOME": str(tmp_path), "HORUS_LOCAL_GPUS": "1xa100-80gb"})
    backend = LocalBackend(settings)
    image, text = (12.0, 7.4, 0.1 + 0.2), (11.0, 7.0, 1e-17)  # reprs that must read back exactly
    before = backend.snapshot().version
    assert backend.record_crash(image, [text, ()]) == 1  # a partner without a signature cannot be told apart: ignored
    assert backend.record_crash(text, [image]) == 0  # the same unordered pair
    assert backend.record_crash((), [image]) == 0
    state = backend.snapshot()
    assert state.version == before + 1
    assert state.crashed_pairs == frozenset({crashed_pair(image, text)})
    assert state.arrays.crash_partners[image] == frozenset({text})
