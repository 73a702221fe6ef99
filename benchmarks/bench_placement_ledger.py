"""How fast placement is, and how the ledger holds up under racing processes.

Tables:
1. Placement on clusters of growing size (8 GPUs per node, 3 residents per GPU on average): the time
   to build the state's arrays (once per snapshot), one decision, and one five-job look-ahead round
   in which the first four jobs do not fit (the worst case: five decisions), for `exclusive` (the
   baseline, same run), `horus-paper` and `horus-ml` (learned interference on its 64 best candidates,
   trained on the shipped Gavel pairs). Targets: look-ahead within 1 ms median at 16x8 GPUs and
   20 ms at 1,024x8.
2. Memory the state and a decision take per GPU (tracemalloc peak), to show it stays linear.
3. Ledger: reserve+release round trips per second from one and from four racing processes.

    .venv/bin/python benchmarks/bench_placement_ledger.py
"""

from __future__ import annotations

import multiprocessing
import random
import statistics
import tempfile
import time
import tracemalloc
from pathlib import Path

from horus_airflow.backends import LocalBackend, acquire
from horus_airflow.interference import LearnedInterference
from horus_airflow.interference.pairs import read_pairs
from horus_airflow.placement import ClusterState, GpuState, Resident, Waiting, load_profile, place, schedule
from horus_airflow.predictor import Demand, GpuDemand
from horus_airflow.settings import Settings

A100 = "a100-80gb"
PAIRS = Path(__file__).resolve().parent.parent / "data" / "interference_seed" / "gavel_pairs.csv"
SIGNATURE = (12.0, 7.4, 10.0, 1.8, 0.99, 0.01, 0.0, 0.0, 2.9, 0.0)


def cluster(nodes: int, rng: random.Random) -> ClusterState:
    gpus = []
    for node in range(nodes):
        for index in range(8):
            residents = tuple(
                Resident(f"r{node}-{index}-{k}", rng.uniform(5, 35), 40.0, rng.uniform(1000, 12000), SIGNATURE)
                for k in range(rng.choice((1, 2, 3, 3, 4, 5)))
            )
            gpus.append(GpuState(f"n{node}/{index}", f"n{node}", index, A100, 81920, residents, rack=f"r{node // 32}"))
    return ClusterState(tuple(gpus))


def job(name: str, util: float, mem: float) -> Demand:
    return Demand(name, 1, {A100: GpuDemand(util, util * 1.1, mem)}, signature=SIGNATURE)


def median_ms(call: object, repeats: int) -> float:
    samples = []
    for _ in range(repeats):
        started = time.perf_counter()
        call()  # type: ignore[operator]
        samples.append((time.perf_counter() - started) * 1000)
    return statistics.median(samples)


def placement_table(learned: LearnedInterference) -> None:
    print("Placement: median milliseconds (8 GPUs per node, 3 residents per GPU on average)")
    print(f"{'nodes x GPUs':>13} {'arrays':>8} {'profile':>12} {'1 decision':>11} {'5-job look-ahead':>17} {'vs exclusive':>13}")
    for nodes in (16, 64, 256, 1024):
        rng = random.Random(nodes)
        state = cluster(nodes, rng)
        build = median_ms(lambda: ClusterState(state.gpus).arrays, 5)
        _ = state.arrays
        # Four jobs too big for any GPU's free memory come first, so a look-ahead round tries all five.
        waiting = [Waiting(job(f"big{i}", 5, 90000), i) for i in range(4)] + [Waiting(job("fits", 40, 2000), 4)]
        base = None
        for name in ("exclusive", "horus-paper", "horus-ml"):
            profile = load_profile(name)
            repeats = 30 if nodes <= 256 else 10
            one = median_ms(lambda: place(waiting[-1].demand, state, profile, learned), repeats)
            round_ms = median_ms(lambda: schedule(waiting, state, profile, learned), repeats)
            base = base or round_ms
            print(f"{nodes:>6} x 8   {build:>8.1f} {name:>12} {one:>11.2f} {round_ms:>17.2f} {round_ms / base:>12.1f}x")


def memory_table() -> None:
    print("\nMemory of a state's arrays plus one horus-paper decision (tracemalloc peak)")
    print(f"{'GPUs':>6} {'peak KiB':>10} {'bytes per GPU':>14}")
    profile = load_profile("horus-paper")
    for nodes in (16, 128, 1024):
        state = cluster(nodes, random.Random(nodes))
        tracemalloc.start()
        place(job("j", 40, 2000), ClusterState(state.gpus), profile)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        print(f"{nodes * 8:>6} {peak / 1024:>10.0f} {peak / (nodes * 8):>14.0f}")


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
    learned = LearnedInterference().fit(read_pairs(PAIRS))
    placement_table(learned)
    memory_table()
    print("\nLedger (SQLite, WAL, BEGIN IMMEDIATE): snapshot+place+reserve+release round trips per second")
    print(f"{'processes':>9} {'round trips/s':>14} {'conflicts':>10} {'ratio vs 1':>11}")
    single, _ = ledger_rate(1, 200)
    for processes in (1, 4):
        rate, conflicts = (single, 0) if processes == 1 else ledger_rate(processes, 200)
        print(f"{processes:>9} {rate:>14.0f} {conflicts:>10} {rate / single:>11.2f}")


if __name__ == "__main__":
    main()
