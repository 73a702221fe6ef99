"""How fast the simulator is: wall time per profile for a 10,000-job trace on 128 nodes x 8 GPUs (target:
under 30 s on two cores), and how it grows with jobs and with GPUs.

    .venv/bin/python benchmarks/bench_simulator.py

The trace is Chronus' Philly-like MIX1 (data/traces/chronus, MIT). Its models are not in Gavel's
measured set, so ground truth for its pairs comes from the model fitted on V100 pairs only. The Horus
authors' simulator is not run here (its code is not part of this project), so no ratio against it is
claimed; the ratios are against the 2,500-job / 32-node runs of this table.
"""

from __future__ import annotations

import time
from pathlib import Path

from horus_airflow.simulator.engine import Cluster
from horus_airflow.simulator.runner import run_simulation

TRACE = Path(__file__).resolve().parent.parent / "data" / "traces" / "chronus" / "trace_job_Philly_MIX1.csv"


def timed(nodes: int, jobs: int, profile: str) -> tuple[float, int]:
    started = time.perf_counter()
    report = run_simulation(TRACE, "tiresias", Cluster(nodes, 8, "v100"), [profile], limit=jobs)
    return time.perf_counter() - started, report.results[0].finished


def main() -> None:
    run_simulation(TRACE, "tiresias", Cluster(4, 8, "v100"), ["exclusive"], limit=50)  # features and models warm
    print("10,000 jobs on 128 x 8 V100s, per profile (target: under 30 s)")
    print(f"{'profile':<14}{'wall s':>8}{'finished':>10}")
    for profile in ("exclusive", "gandiva-pack", "horus-paper", "horus-ml"):
        seconds, finished = timed(128, 10_000, profile)
        print(f"{profile:<14}{seconds:>8.1f}{finished:>10}")
    print("\nGrowth, horus-paper")
    print(f"{'nodes x 8':>10}{'jobs':>8}{'wall s':>8}{'vs first':>10}")
    base = None
    for nodes, jobs in ((32, 2_500), (32, 5_000), (32, 10_000), (128, 10_000), (512, 10_000)):
        seconds, _ = timed(nodes, jobs, "horus-paper")
        base = base or seconds
        print(f"{nodes:>10}{jobs:>8}{seconds:>8.1f}{seconds / base:>9.1f}x")


if __name__ == "__main__":
    main()
