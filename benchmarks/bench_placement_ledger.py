"""How fast the walking skeleton's hot path is: one placement decision, and one ledger round trip.

Prints two tables. Placement: microseconds per decision on clusters of growing size, for the paper's
profile and for `exclusive` (the baseline, same run). Ledger: reserve+release round trips per second
from one process and from four racing processes (the baseline is the single process, same run).

    .venv/bin/python benchmarks/bench_placement_ledger.py
"""

from __future__ import annotations

import multiprocessing
import random
import tempfile
import time

from horus_airflow.backends import LocalBackend, acquire
from horus_airflow.placement import ClusterState, GpuState, Resident, load_profile, place
from horus_airflow.predictor import Demand, GpuDemand
from horus_airflow.settings import Settings

A100 = "a100-80gb"


def cluster(gpus: int, rng: random.Random) -> ClusterState:
    states = []
    for i in range(gpus):
        residents = tuple(
            Resident(f"r{i}-{k}", rng.uniform(10, 60), 70.0, rng.uniform(1000, 15000)) for k in range(rng.randint(0, 2))
        )
        states.append(GpuState(f"n{i // 8}/{i % 8}", f"n{i // 8}", i % 8, A100, 81920, residents))
    return ClusterState(tuple(states))


def time_placement(gpus: int, profile_name: str, repeats: int) -> float:
    rng = random.Random(gpus)
    state, profile = cluster(gpus, rng), load_profile(profile_name)
    demands = [Demand(f"j{i}", 1, {A100: GpuDemand(rng.uniform(10, 90), 95, rng.uniform(500, 20000))}) for i in range(repeats)]
    started = time.perf_counter()
    for need in demands:
        place(need, state, profile)
    return (time.perf_counter() - started) / repeats * 1e6


def _ledger_worker(home: str, cycles: int, barrier, out) -> None:  # type: ignore[no-untyped-def]
    backend = LocalBackend(Settings.from_env({"HORUS_HOME": home, "HORUS_LOCAL_GPUS": "8xa100-80gb"}))
    profile = load_profile("horus-paper")
    conflicts = 0
    barrier.wait()
    started = time.perf_counter()
    for i in range(cycles):
        got = acquire(backend, Demand(f"j{i}", 1, {A100: GpuDemand(30, 33, 1000)}), profile, "bench", timeout_s=60, poll_s=0.001)
        conflicts += got.conflicts
        backend.release(got.reservation)
    out.put((time.perf_counter() - started, conflicts))


def ledger_rate(processes: int, cycles: int) -> tuple[float, int]:
    ctx = multiprocessing.get_context("spawn")
    with tempfile.TemporaryDirectory() as home:
        barrier, out = ctx.Barrier(processes), ctx.Queue()
        procs = [ctx.Process(target=_ledger_worker, args=(home, cycles, barrier, out)) for _ in range(processes)]
        for proc in procs:
            proc.start()
        results = [out.get(timeout=600) for _ in procs]
        for proc in procs:
            proc.join()
    wall = max(r[0] for r in results)
    return processes * cycles / wall, sum(r[1] for r in results)


def main() -> None:
    print("Placement: microseconds per decision (lower is better)")
    print(f"{'GPUs':>6} {'exclusive':>12} {'horus-paper':>12} {'ratio':>7}")
    for gpus in (8, 64, 512, 2048):
        repeats = max(20, 20000 // gpus)
        base = time_placement(gpus, "exclusive", repeats)
        paper = time_placement(gpus, "horus-paper", repeats)
        print(f"{gpus:>6} {base:>12.1f} {paper:>12.1f} {paper / base:>7.2f}")
    print("\nLedger (SQLite, WAL, BEGIN IMMEDIATE): snapshot+place+reserve+release round trips per second")
    print(f"{'processes':>9} {'round trips/s':>14} {'conflicts':>10} {'ratio vs 1':>11}")
    single, _ = ledger_rate(1, 200)
    for processes in (1, 4):
        rate, conflicts = (single, 0) if processes == 1 else ledger_rate(processes, 200)
        print(f"{processes:>9} {rate:>14.0f} {conflicts:>10} {rate / single:>11.2f}")


if __name__ == "__main__":
    main()
