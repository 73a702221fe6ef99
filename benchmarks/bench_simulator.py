"""How fast the simulator is: wall time per profile for a 10,000-job trace on 128 nodes x 8 GPUs (1,024
GPUs, the paper's scale; target: under 30 s on two cores), how it grows with jobs and with GPUs, and
four profiles on a heavily queued cluster: the five shipped Gavel VCs merged into one stream of 5,637
jobs on 16 x 8 V100s at their recorded arrivals (target: under 300 s for the four).

    .venv/bin/python benchmarks/bench_simulator.py

The trace is Chronus' Philly-like MIX1 (data/traces/chronus, MIT). Its models are not in Gavel's
measured set, so ground truth for its pairs comes from the model fitted on V100 pairs only. The Horus
authors' simulator is not run here (its code is not part of this project), so no ratio against it is
claimed; the ratios are against the 2,500-job / 32-node runs of this table.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from horus_airflow.simulator.engine import Cluster
from horus_airflow.simulator.runner import run_simulation

TRACES = Path(__file__).resolve().parent.parent / "data" / "traces"
TRACE = TRACES / "chronus" / "trace_job_Philly_MIX1.csv"
QUEUED_PROFILES = ("exclusive", "gandiva-pack", "horus-paper", "horus-throughput")


def merged_gavel_vcs(folder: Path) -> Path:
    """The shipped Gavel VCs as one stream (each VC's arrivals as recorded): a shared cluster's load."""
    lines = [line for trace in sorted((TRACES / "gavel").glob("*.trace")) for line in trace.read_text().splitlines() if line.strip()]
    path = folder / "gavel-vcs.trace"
    path.write_text("\n".join(sorted(lines, key=lambda line: float(line.split("\t")[5]))) + "\n")
    return path


def timed(nodes: int, jobs: int, profile: str) -> tuple[float, int]:
    started = time.perf_counter()
    report = run_simulation(TRACE, "tiresias", Cluster(nodes, 8, "v100"), [profile], limit=jobs)
    return time.perf_counter() - started, report.results[0].finished


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--queued-only", action="store_true", help="only the heavily queued run of the five Gavel VCs")
    args = parser.parse_args()
    if not args.queued_only:
        scale()
    queued()


def scale() -> None:
    run_simulation(TRACE, "tiresias", Cluster(4, 8, "v100"), ["exclusive"], limit=50)  # features and models warm
    print("10,000 jobs on 128 x 8 V100s, per profile (target: under 30 s)")
    print(f"{'profile':<18}{'wall s':>8}{'finished':>10}")
    for profile in ("exclusive", "gandiva-pack", "horus-paper", "horus-ml", "horus-throughput"):
        seconds, finished = timed(128, 10_000, profile)
        print(f"{profile:<18}{seconds:>8.1f}{finished:>10}")
    print("\nGrowth, horus-paper")
    print(f"{'nodes x 8':>10}{'jobs':>8}{'wall s':>8}{'vs first':>10}")
    base = None
    for nodes, jobs in ((32, 2_500), (32, 5_000), (32, 10_000), (128, 10_000), (512, 10_000)):
        seconds, _ = timed(nodes, jobs, "horus-paper")
        base = base or seconds
        print(f"{nodes:>10}{jobs:>8}{seconds:>8.1f}{seconds / base:>9.1f}x")


def queued() -> None:
    """Timed from the start: reading the trace, predicting each workload's demand and fitting the models count."""
    with tempfile.TemporaryDirectory() as folder:
        trace = merged_gavel_vcs(Path(folder))
        started = time.perf_counter()
        report = run_simulation(trace, "gavel", Cluster(16, 8, "v100"), list(QUEUED_PROFILES))
        total = time.perf_counter() - started
    print(f"\nHeavy queueing: {report.results[0].finished:,} jobs of the five Gavel VCs on 16 x 8 V100s, "
          f"four profiles: {total:.0f} s in all (target: under 300 s)")
    print(f"{'profile':<18}{'wall s':>8}{'finished':>10}{'mean wait h':>13}{'OOM':>8}")
    for metrics, run in zip(report.results, report.runs):
        print(f"{metrics.profile:<18}{run.wall_s:>8.0f}{metrics.finished:>10}{metrics.avg_wait_s / 3600:>13.1f}{metrics.oom_events:>8}")


if __name__ == "__main__":
    main()
