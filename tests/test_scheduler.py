"""The live scheduler: the queue in the SQLite ledger, scheduling rounds with the simulator's schedule(),
and the blocking wait through the queue (backends/scheduler.py, placement/rounds.py)."""

from __future__ import annotations

import multiprocessing
import os
import sqlite3
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from horus_airflow.backends import LocalBackend
from horus_airflow.backends.ledger import Booking, DecisionNote, RoundBooking
from horus_airflow.backends.scheduler import QueueingBackend, enqueue_demand, run_round, wait_in_queue
from horus_airflow.errors import LedgerConflictError, NoPlacementError
from horus_airflow.placement import ClusterState, GpuState, Resident, Waiting, load_profile, schedule
from horus_airflow.placement.rounds import scheduling_round
from horus_airflow.predictor.demand import Demand, GpuDemand
from horus_airflow.settings import Settings

if TYPE_CHECKING:
    from horus_airflow.triggers import BookingTrigger


def _demand(job_id: str, util: float, gpus: int = 1, mem_mib: float = 4_000) -> Demand:
    return Demand(job_id, gpus, {"a100-80gb": GpuDemand(util, min(100.0, util + 5), mem_mib)}, signature=(util,))


def _cluster(gpus: int, busy: int = 0) -> ClusterState:
    return ClusterState(tuple(
        GpuState(f"n/{i}", "n", i, "a100-80gb", 81_920,
                 residents=(Resident(f"held{i}", 100.0, 100.0, 80_000),) if i < busy else ())
        for i in range(gpus)))


@pytest.fixture
def backend(horus_home: Path, monkeypatch: pytest.MonkeyPatch) -> LocalBackend:
    monkeypatch.setenv("HORUS_LOCAL_GPUS", "2xa100-80gb")
    return LocalBackend(Settings.from_env())


def test_a_round_places_in_the_policy_order_each_on_the_state_the_last_left() -> None:
    waiting = [Waiting(_demand(f"j{i}", util), float(i)) for i, util in enumerate([60, 30, 90, 20, 50, 10])]
    profile = load_profile("horus-paper")  # look-ahead of five: lowest predicted utilization first
    result = scheduling_round(waiting, _cluster(4), profile)
    order = [c.job.demand.job_id for c in result.chosen]
    expected, state, queue = [], _cluster(4), list(waiting)
    while True:  # what the simulator does: schedule() again on the state with the last booking in it
        done = schedule(queue, state, profile)
        if done.job is None:
            break
        expected.append(done.job.demand.job_id)
        queue = [w for w in queue if w is not done.job]
        state = scheduling_round([done.job], state, profile).state
    assert order == expected and order[0] == "j3"  # j5 (10 %) is the sixth: outside the window of five
    assert sum(len(g.residents) for g in result.state.gpus) == len(order)
    assert all(sum(r.util for r in g.residents) <= 200 for g in result.state.gpus)
    assert {h.job.demand.job_id for h in result.held} == {f"j{i}" for i in range(6)} - set(order)


def test_what_a_round_leaves_waiting_says_why_and_older_jobs_passed_over_count_a_skip() -> None:
    waiting = [Waiting(_demand("big", 50, gpus=2), 0.0), Waiting(_demand("small", 50), 1.0)]
    result = scheduling_round(waiting, _cluster(2, busy=1), load_profile("horus-paper"))
    assert [c.job.demand.job_id for c in result.chosen] == ["small"]
    [held] = result.held
    assert held.job.demand.job_id == "big" and held.job.skips == 1 and held.reason
    fifo = scheduling_round(waiting, _cluster(2, busy=1), load_profile("exclusive"))  # head of line: nothing overtakes
    assert fifo.chosen == () and [h.job.demand.job_id for h in fifo.held] == ["big", "small"]
    assert "waits its turn: the fifo queue policy" in fifo.held[1].reason


def test_the_queue_survives_in_the_ledger_and_a_round_books_it_in_one_swap(backend: LocalBackend) -> None:
    first = backend.enqueue("d/a/r/-1", _demand("a", 40), "exclusive")
    second = backend.enqueue("d/b/r/-1", _demand("b", 40), "exclusive")
    third = backend.enqueue("d/c/r/-1", _demand("c", 40), "exclusive")
    reopened = LocalBackend(backend.settings)  # another process, or this one after a restart
    version, entries = reopened.queue()
    assert [e.entry_id for e in entries] == [first.entry_id, second.entry_id, third.entry_id]
    assert entries[0].demand == _demand("a", 40) and version == reopened.snapshot().version
    outcome = run_round(reopened)
    assert [e.entry_id for e, _, _ in outcome.booked] == [first.entry_id, second.entry_id] and outcome.waiting == 1
    assert "round " + outcome.round_id in backend.queue_entry(first.entry_id).reason
    waiting = backend.queue_entry(third.entry_id)
    assert waiting.status(backend.now()) == "waiting" and waiting.reason.startswith("no feasible GPU (local/0: max-residents")
    assert sorted(r.job_id for g in backend.snapshot().gpus for r in g.residents) == ["a", "b"]


def test_two_rounds_on_one_version_never_both_book(backend: LocalBackend) -> None:
    backend.enqueue("d/a/r/-1", _demand("a", 40), "exclusive")
    state = backend.snapshot()
    version, entries = backend.queue()
    run_round(backend)  # another process's round wins the version
    stale = RoundBooking(entries[0].entry_id, (Booking("local/1", 40, 45, 4_000),), DecisionNote("exclusive", "stale", "{}"))
    with pytest.raises(LedgerConflictError):
        backend.book_round(version, "late", [stale], {}, {})
    assert version == state.version
    assert sum(len(g.residents) for g in backend.snapshot().gpus) == 1


def test_a_task_that_stops_waiting_leaves_the_queue_and_frees_a_booking_it_never_took(backend: LocalBackend) -> None:
    hold = backend.ledger.reserve(0, "held", "d/h/r/-1", [Booking("local/0", 100, 100, 70_000), Booking("local/1", 100, 100, 70_000)],
                                  backend.now(), 600)
    profile = load_profile("exclusive")
    with pytest.raises(NoPlacementError, match="not placed within 0 s"):
        wait_in_queue(backend, _demand("late", 30), profile, "d/late/r/-1", 0.0, sleep=lambda s: None)
    assert backend.queue()[1] == []
    entry = backend.enqueue("d/x/r/-1", _demand("x", 30), "exclusive")
    backend.release(hold)
    run_round(backend)
    assert backend.queue_entry(entry.entry_id).status(backend.now()) == "booked"
    assert backend.leave(entry.entry_id, "the task was cleared")
    assert all(not g.residents for g in backend.snapshot().gpus)


def test_a_demand_no_idle_gpu_could_take_is_refused_before_it_is_queued(backend: LocalBackend) -> None:
    with pytest.raises(NoPlacementError, match="cannot fit even on idle GPUs"):
        wait_in_queue(backend, _demand("huge", 30, gpus=3), load_profile("exclusive"), "d/h/r/-1", 60)
    assert backend.queue()[1] == [] and backend.queue_entry("nothing") is None


def test_an_entry_whose_owner_died_expires_with_its_lease(backend: LocalBackend, monkeypatch: pytest.MonkeyPatch) -> None:
    entry = backend.enqueue("d/dead/r/-1", _demand("dead", 30), "exclusive")
    later = backend.now() + backend.settings.lease_seconds + 1
    monkeypatch.setattr(backend, "clock", lambda: later)
    assert backend.queue()[1] == [] and backend.queue_entry(entry.entry_id).status(later) == "expired"
    assert run_round(backend).booked == () and all(not g.residents for g in backend.snapshot().gpus)
    assert isinstance(backend, QueueingBackend)


def _worker(home: str, name: str, hold_s: float) -> None:
    os.environ["HORUS_HOME"], os.environ["HORUS_LOCAL_GPUS"] = home, "2xa100-80gb"
    backend = LocalBackend(Settings.from_env())
    acquired = wait_in_queue(backend, _demand(name, 60), load_profile("exclusive"), f"d/{name}/r/-1", 120, poll_s=0.05)
    time.sleep(hold_s)
    backend.release(acquired.reservation)


@pytest.mark.integration
def test_many_processes_waiting_at_once_never_share_an_exclusive_gpu(horus_home: Path) -> None:
    context = multiprocessing.get_context("spawn")
    workers = [context.Process(target=_worker, args=(str(horus_home), f"job{i}", 0.2)) for i in range(8)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(180)
    assert [w.exitcode for w in workers] == [0] * 8
    with sqlite3.connect(horus_home / "ledger.sqlite") as conn:
        rows = conn.execute("SELECT gpu_id, created_at, released_at FROM reservations ORDER BY gpu_id, created_at").fetchall()
        left = conn.execute("SELECT COUNT(*) FROM queue WHERE left_at IS NULL").fetchone()[0]
    assert len(rows) == 8 and left == 0
    for (gpu, _, released), (next_gpu, created, _) in zip(rows, rows[1:]):
        assert gpu != next_gpu or created >= released, "two jobs held one exclusive GPU at once"


@pytest.mark.airflow
def test_the_booking_trigger_survives_serialization_waits_fires_and_leaves_when_killed(backend: LocalBackend) -> None:
    import asyncio

    from horus_airflow.triggers import BookingTrigger

    hold = backend.ledger.reserve(0, "held", "d/h/r/-1", [Booking("local/0", 100, 100, 70_000), Booking("local/1", 100, 100, 70_000)],
                                  backend.now(), 600)
    entry = backend.enqueue("d/t/r/-1", _demand("t", 30), "exclusive")
    path, kwargs = BookingTrigger(entry.entry_id, time.time() + 60, poll_s=0.05).serialize()
    assert path == "horus_airflow.triggers.booking.BookingTrigger" and kwargs["environment"]["HORUS_HOME"] == os.environ["HORUS_HOME"]
    trigger = BookingTrigger(**kwargs)  # as the triggerer rebuilds it

    async def release_later() -> None:
        await asyncio.sleep(0.5)
        backend.release(hold)

    async def both() -> dict[str, object]:
        _, payload = await asyncio.gather(release_later(), _first(trigger))
        return payload

    payload = asyncio.run(both())
    assert payload["status"] == "booked" and payload["entry_id"] == entry.entry_id and payload["waited_s"] >= 0.4
    killed = backend.enqueue("d/k/r/-1", _demand("k", 30, gpus=2), "exclusive")
    asyncio.run(BookingTrigger(killed.entry_id, time.time() + 60).on_kill())
    assert backend.queue_entry(killed.entry_id).status(backend.now()) == "left"
    late = backend.enqueue("d/l/r/-1", _demand("l", 30, gpus=2), "exclusive")
    expired = asyncio.run(_first(BookingTrigger(late.entry_id, time.time() - 1)))
    assert expired["status"] == "timeout" and backend.queue_entry(late.entry_id).left_at is not None


async def _first(trigger: "BookingTrigger") -> dict[str, object]:
    async for event in trigger.run():
        return event.payload
    raise AssertionError("no event")


def test_credit_goes_to_the_pool_whose_jobs_waited_longest_and_most(backend: LocalBackend, tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Pool a queued one job first; pool b three just after. FIFO would start a's; Horus+ credit (median
    wait times jobs waiting) starts b's, from the ledger's waiting history."""
    from horus_airflow.backends.scheduler import pool_credits

    profile = tmp_path / "credit.yaml"
    profile.write_text("name: exclusive-credit\nfilters:\n  - name: max-residents\n    args: {limit: 1}\n"
                       "  - name: memory-fit\nscores:\n  - name: fragmentation\nqueue: {policy: credit}\n")
    clock = [1000.0]
    monkeypatch.setattr(backend, "clock", lambda: clock[0])
    hold = backend.ledger.reserve(0, "held", "x/h/r/-1", [Booking("local/0", 100, 100, 70_000), Booking("local/1", 100, 100, 70_000)],
                                  clock[0], 600)
    backend.enqueue("a/t0/r/-1", _demand("a0", 30), str(profile), pool="a")
    for i in range(3):
        clock[0] += 10
        backend.enqueue(f"b/t{i}/r/-1", _demand(f"b{i}", 30), str(profile), pool="b")
    clock[0] = 1200.0
    backend.release(hold)
    waits = backend.waits(3600)
    assert sorted(waits["b"]) == [170.0, 180.0, 190.0] and waits["a"] == [200.0]
    assert pool_credits(waits, {"a": 1, "b": 3}) == {"a": 200.0, "b": 540.0}
    booked = [entry.demand.job_id for entry, _, _ in run_round(backend).booked]
    assert booked == ["b0", "b1"]  # two GPUs: b's oldest two, not a's older job


@pytest.mark.integration
def test_the_expected_runtime_is_the_median_of_the_same_workloads_profiling_runs(horus_home: Path) -> None:
    from horus_airflow.jobs import JobSpec
    from horus_airflow.registry.profiling import expected_runtime_s
    from horus_airflow.registry.store import client, experiment_id
    from horus_airflow.run_schema import Experiment, Metric, Param, Tag

    settings = Settings.from_env()
    spec = JobSpec(model="resnet18", batch_size=32, steps=10)
    assert expected_runtime_s(settings, spec, "cifar10") is None  # never ran
    mlflow = client(settings)
    experiment = experiment_id(mlflow, settings, Experiment.PROFILING)
    for seconds, batch, code in ((100.0, 32, "0"), (140.0, 32, "0"), (120.0, 32, "0"), (5.0, 64, "0"), (1.0, 32, "3")):
        run = mlflow.create_run(experiment, tags={Tag.EXIT_CODE: code})
        params = {Param.MODEL: "resnet18", Param.DATASET: "cifar10", Param.BATCH_SIZE: str(batch), Param.PRECISION: "fp32",
                  Param.STEPS: "10", Param.GPUS: "1"}
        for key, value in params.items():
            mlflow.log_param(run.info.run_id, key, value)
        mlflow.log_metric(run.info.run_id, Metric.DURATION_S, seconds)
        mlflow.set_terminated(run.info.run_id, "FINISHED")
    assert expected_runtime_s(settings, spec, "cifar10") == 120.0  # other batch sizes and failed runs left out
    assert expected_runtime_s(settings, JobSpec(model="resnet18", batch_size=32, steps=10, command=("python", "t.py")),
                              "cifar10") is None  # another command is another workload


def test_a_gang_past_its_bound_is_held_for_and_only_a_job_ending_in_time_backfills(backend: LocalBackend) -> None:
    """The ledger knows when each round's booking should end (booked at + expected runtime): the gang,
    passed over once, holds both GPUs until the long job's end; a later long job waits, a short one
    backfills the GPU that freed."""
    from horus_airflow.placement.profiles import parse_profile

    strict = parse_profile({"name": "one-per-gpu", "filters": [{"name": "memory-fit"}, {"name": "max-residents", "args": {"limit": 1}}],
                            "scores": [{"name": "horus-cost"}], "queue": {"policy": "lookahead", "k": 5, "max_skips": 1, "backfill": True}})
    rounds = lambda: run_round(backend, profiles=lambda name: strict)  # noqa: E731
    first = backend.enqueue("d/a/r/-1", _demand("a", 40), strict.name, expected_runtime_s=100.0)
    rounds()
    gang = backend.enqueue("d/g/r/-1", _demand("gang", 40, gpus=2), strict.name)
    backend.enqueue("d/long/r/-1", _demand("long", 40), strict.name, expected_runtime_s=1_000.0)
    assert [e.demand.job_id for e, _, _ in rounds().booked] == ["long"]
    assert {r.ends_at is not None for g in backend.snapshot().gpus for r in g.residents} == {True}
    later = backend.enqueue("d/long2/r/-1", _demand("long2", 40), strict.name, expected_runtime_s=1_000.0)
    short = backend.enqueue("d/short/r/-1", _demand("short", 40), strict.name, expected_runtime_s=10.0)
    backend.release(backend.reservation(backend.queue_entry(first.entry_id).reservation_id))
    assert [e.demand.job_id for e, _, _ in rounds().booked] == ["short"]
    assert "local/0,local/1 held for gang, which waited past its bound" in backend.queue_entry(gang.entry_id).reason
    assert "held for gang" in backend.queue_entry(later.entry_id).reason
    assert backend.queue_entry(short.entry_id).status(backend.now()) == "booked"


def test_limited_rounds_carry_on_where_the_last_stopped(backend: LocalBackend) -> None:
    waiting = [Waiting(_demand(f"j{i}", util), float(i)) for i, util in enumerate([60, 30, 90, 20, 50, 10, 40, 70])]
    profile = load_profile("horus-paper")
    whole = [c.job.demand.job_id for c in scheduling_round(waiting, _cluster(4), profile).chosen]
    order, state, queue = [], _cluster(4), list(waiting)
    while True:
        part = scheduling_round(queue, state, profile, limit=2)
        order += [c.job.demand.job_id for c in part.chosen]
        assert len(part.chosen) <= 2 and part.more == (len(part.chosen) == 2 and bool(part.held))
        if not part.more:
            break
        assert any("stopped at its limit of 2 bookings" in h.reason for h in part.held)
        queue, state = [h.job for h in part.held], part.state
    assert order == whole and len(whole) > 2
    for i in range(3):
        backend.enqueue(f"d/{i}/r/-1", _demand(f"e{i}", 40), "exclusive")
    limited = run_round(backend, max_bookings=1)
    assert len(limited.booked) == 1 and limited.more
    assert "stopped at its limit of 1 bookings" in backend.queue()[1][0].reason


def test_a_round_writes_only_the_reasons_it_changed_and_an_entry_it_did_not_reach_keeps_its_skips(
        backend: LocalBackend, monkeypatch: pytest.MonkeyPatch) -> None:
    first = backend.enqueue("d/a/r/-1", _demand("a", 40), "exclusive")
    backend.enqueue("d/b/r/-1", _demand("b", 40), "exclusive")
    late = backend.enqueue("d/c/r/-1", _demand("c", 40), "horus-paper")
    version, _ = backend.queue()
    backend.book_round(version, "earlier", [], {late.entry_id: "passed over before"}, {late.entry_id: 3})
    limited = run_round(backend, max_bookings=1)
    assert [e.entry_id for e, _, _ in limited.booked] == [first.entry_id] and limited.more
    kept = backend.queue_entry(late.entry_id)
    assert kept.skips == 3 and "stopped at its limit of 1 bookings" in kept.reason  # not reset by a round that never reached it
    backend.enqueue("d/d/r/-1", _demand("d", 40), "exclusive")  # no GPU left for it
    run_round(backend)
    run_round(backend)  # its reason as the full cluster gives it (the last round decided it before c was booked)
    writes: list[int] = []
    book_round = backend.book_round
    monkeypatch.setattr(backend, "book_round", lambda *args: writes.append(len(args[2])) or book_round(*args))
    reasons = {e.entry_id: (e.reason, e.skips) for e in backend.queue()[1]}
    assert reasons and all(reason for reason, _ in reasons.values())
    again = run_round(backend)
    assert again.booked == () and writes == []  # the same reasons as the last round: nothing written
    assert {e.entry_id: (e.reason, e.skips) for e in backend.queue()[1]} == reasons


def test_an_entry_queued_with_a_profile_file_is_placed_by_it_in_a_round_run_elsewhere(backend: LocalBackend, tmp_path: Path) -> None:
    """The triggerer (or another worker) runs the round: it loads the entry's profile from what the entry
    keeps, the file's path, not the name written inside the file, which no other process could find."""
    path = tmp_path / "whole-gpus.yaml"
    path.write_text((Path(__file__).parents[1] / "horus_airflow" / "placement" / "profiles" / "exclusive.yaml").read_text()
                    .replace("name: exclusive", "name: whole-gpus"))
    profile = load_profile(str(path))
    assert profile.name == "whole-gpus" and profile.reference == str(path.resolve())
    entry = enqueue_demand(backend, _demand("a", 40), profile, "d/a/r/-1")
    assert entry.profile == str(path.resolve())
    outcome = run_round(LocalBackend(backend.settings))  # another process: loads profiles by what the entries keep
    assert [e.entry_id for e, _, _ in outcome.booked] == [entry.entry_id]
    assert outcome.booked[0][2].profile == "whole-gpus" and backend.queue_entry(entry.entry_id).status(backend.now()) == "booked"
    assert load_profile("exclusive").reference == "exclusive"


def test_a_release_books_the_queue_onto_the_gpus_it_freed_at_once(backend: LocalBackend, monkeypatch: pytest.MonkeyPatch,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    """As the simulator decides at each job's end: the waiting entry is booked by the release itself, not
    by a later look (which may see later arrivals). A round that fails leaves the release standing."""
    from horus_airflow.backends import scheduler
    from horus_airflow.service import PlacementService

    service = PlacementService(backend.settings, "exclusive", backend)
    gang = backend.enqueue("d/g/r/-1", _demand("gang", 40, gpus=2), "exclusive")
    run_round(backend)
    waiting = backend.enqueue("d/a/r/-1", _demand("a", 40), "exclusive")
    run_round(backend)
    assert backend.queue_entry(waiting.entry_id).status(backend.now()) == "waiting"
    booked = backend.reservation(backend.queue_entry(gang.entry_id).reservation_id or "")
    assert booked is not None and service.release(booked)
    assert backend.queue_entry(waiting.entry_id).status(backend.now()) == "booked"
    assert not service.release(booked)  # idempotent

    later = backend.enqueue("d/b/r/-1", _demand("b", 40, gpus=2), "exclusive")
    run_round(backend)
    monkeypatch.setattr(scheduler, "run_round", lambda *args: (_ for _ in ()).throw(sqlite3.OperationalError("disk I/O error")))
    with caplog.at_level("WARNING"):
        assert service.release_owner("d/a/r/-1") == 1
    assert "the scheduling round after a release failed (OperationalError: disk I/O error)" in caplog.text
    assert backend.queue_entry(later.entry_id).status(backend.now()) == "waiting"
    assert all(not g.residents for g in backend.snapshot().gpus)


def test_a_later_entry_of_a_higher_priority_is_booked_first_and_a_ledger_without_priorities_gets_them(
        backend: LocalBackend) -> None:
    from horus_airflow.backends.ledger import LedgerReader
    from horus_airflow.ui.model import queue_rows

    hold = backend.ledger.reserve(0, "held", "d/h/r/-1", [Booking("local/0", 100, 100, 70_000)], backend.now(), 600)
    old = backend.enqueue("d/old/r/-1", _demand("old", 40), "exclusive")
    urgent = backend.enqueue("d/urgent/r/-1", _demand("urgent", 40), "exclusive", priority=10)
    assert LocalBackend(backend.settings).queue_entry(urgent.entry_id).priority == 10
    assert [r.entry.entry_id for r in queue_rows(LedgerReader(backend.settings.ledger_path).queue(backend.now()), backend.now())] \
        == [urgent.entry_id, old.entry_id]
    outcome = run_round(backend)  # fifo: the head of the queue is the highest priority's oldest
    assert [e.entry_id for e, _, _ in outcome.booked] == [urgent.entry_id]
    assert backend.queue_entry(old.entry_id).skips == 0
    backend.release(hold)

    with sqlite3.connect(backend.settings.ledger_path) as conn:  # as a ledger written before priorities was
        conn.execute("ALTER TABLE queue DROP COLUMN priority")
    assert [e.priority for e in LedgerReader(backend.settings.ledger_path).queue(backend.now())] == [0]
    reopened = LocalBackend(backend.settings)
    assert reopened.queue_entry(old.entry_id).priority == 0 and [e.entry_id for e in reopened.queue()[1]] == [old.entry_id]
    assert [e.entry_id for e, _, _ in run_round(reopened).booked] == [old.entry_id]
