"""Gangs under a stream of small jobs: what holding GPUs for a starving gang, with backfill, buys.

    .venv/bin/python benchmarks/bench_gang_holds.py [--jobs 2000] [--nodes 8] [--arrival-scale 1] [--bound-s 600]

The first jobs of Chronus' Philly-like MIX1 trace (data/traces/chronus, MIT: 92 % one-GPU jobs, gangs of
2 to 32 GPUs) on N x 8 V100s, so that jobs queue. Two shipped profiles' queue policies, each in three
forms measured in the same run on the same jobs:

- ``backfill`` (``backfill: true``): a starving job that does not fit gets the GPUs that free up first held for it, other jobs
  use the rest, and a job predicted to end before the held GPUs free up may use them;
- ``strict`` (the default): while a starving job does not fit, no other job starts;
- ``no bound``: no starvation guard (``max_skips`` a million, no ``max_wait_s``): small jobs may overtake
  a gang for as long as they keep coming.

``horus-paper`` (look-ahead of five) starves a job passed over ten times, as shipped; ``horus-throughput``
(least remaining time with aging) ships with no bound, so its bounded forms use ``max_wait_s = --bound-s``.
Wait is start minus arrival; "gangs" are jobs of 4 GPUs or more. Ratios are against each profile's
``strict`` form.

``--heavy`` runs instead ``horus-paper`` strict and with backfill on the first 3,000 jobs of the five
Gavel VCs merged (bench_simulator.py's heavily queued scenario, 16 x 8 V100s), counting OOM crashes.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from dataclasses import replace
from pathlib import Path

from bench_simulator import merged_gavel_vcs
from horus_airflow.placement import load_profile
from horus_airflow.simulator.engine import Cluster, SimulationRun
from horus_airflow.simulator.runner import run_simulation

TRACE = Path(__file__).resolve().parent.parent / "data" / "traces" / "chronus" / "trace_job_Philly_MIX1.csv"
GANG = 4


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--nodes", type=int, default=8)
    parser.add_argument("--arrival-scale", type=float, default=1.0)
    parser.add_argument("--bound-s", type=float, default=600.0, help="max_wait_s of horus-throughput's bounded forms")
    parser.add_argument("--heavy", action="store_true", help="horus-paper on 3,000 jobs of the merged Gavel VCs")
    args = parser.parse_args()
    if args.heavy:
        heavy()
        return
    variants = []
    for name in ("horus-paper", "horus-throughput"):
        shipped = load_profile(name)
        bounded = shipped.queue if name == "horus-paper" else replace(shipped.queue, max_wait_s=args.bound_s)
        variants += [
            replace(shipped, name=f"{name} backfill", queue=replace(bounded, backfill=True)),
            replace(shipped, name=f"{name} strict", queue=replace(bounded, backfill=False)),
            replace(shipped, name=f"{name} no bound", queue=replace(bounded, max_skips=1_000_000, max_wait_s=float("inf"))),
        ]
    report = run_simulation(TRACE, "tiresias", Cluster(args.nodes, 8, "v100"), variants,
                            arrival_scale=args.arrival_scale, limit=args.jobs)
    rows = {run.profile: _row(run) for run in report.runs}
    gangs = sum(1 for job in report.runs[0].finished if job.gpus >= GANG)
    print(f"{args.jobs} MIX1 jobs ({gangs} gangs of >= {GANG} GPUs) on {args.nodes} x 8 V100s, arrivals x{args.arrival_scale:g}")
    header = ("profile / queue form", "mean JCT s", "vs strict", "p95 JCT s", "makespan s", "vs strict",
              "gang wait mean", "gang wait max", "1-GPU wait", "GPUs busy", "wall s")
    print(f"{header[0]:<28}" + "".join(f"{h:>15}" for h in header[1:]))
    for name, row in rows.items():
        base = rows[name.rsplit(" ", 1)[0].removesuffix(" no") + " strict"]
        values = (f"{row['jct']:.0f}", f"{row['jct'] / base['jct']:.2f}", f"{row['p95']:.0f}",
                  f"{row['makespan']:.0f}", f"{row['makespan'] / base['makespan']:.2f}", f"{row['gang_wait']:.0f}",
                  f"{row['gang_max']:.0f}", f"{row['small_wait']:.0f}", f"{row['busy']:.1%}", f"{row['wall']:.1f}")
        print(f"{name:<28}" + "".join(f"{v:>15}" for v in values))
    unfinished = {run.profile: run.unfinished for run in report.runs if run.unfinished}
    if unfinished:
        print(f"unfinished (never placed): {unfinished}")


def heavy() -> None:
    paper = load_profile("horus-paper")
    forms = [replace(paper, name=f"horus-paper {label}", queue=replace(paper.queue, backfill=on))
             for label, on in (("strict", False), ("backfill", True))]
    with tempfile.TemporaryDirectory() as folder:
        report = run_simulation(merged_gavel_vcs(Path(folder)), "gavel", Cluster(16, 8, "v100"), forms, limit=3000)
    print("3,000 jobs of the five Gavel VCs merged on 16 x 8 V100s, recorded arrivals")
    print(f"{'profile / queue form':<24}{'mean JCT h':>12}{'mean wait h':>13}{'OOM crashes':>13}{'wall s':>9}")
    for metrics, run in zip(report.results, report.runs):
        print(f"{metrics.profile:<24}{metrics.avg_jct_s / 3600:>12.1f}{metrics.avg_wait_s / 3600:>13.1f}"
              f"{metrics.oom_events:>13}{run.wall_s:>9.0f}")


def _row(run: SimulationRun) -> dict[str, float]:
    waits = [(job.gpus, job.start_s - job.arrival_s) for job in run.finished]
    gangs = [w for gpus, w in waits if gpus >= GANG] or [0.0]
    small = [w for gpus, w in waits if gpus == 1] or [0.0]
    jcts = sorted(job.jct_s for job in run.finished)
    span = max(job.finish_s for job in run.finished) - min(job.arrival_s for job in run.finished)
    busy = run.busy_gpu_s / (span * run.cluster.total_gpus)
    return {"jct": statistics.fmean(jcts), "p95": jcts[int(0.95 * (len(jcts) - 1))], "makespan": span,
            "gang_wait": statistics.fmean(gangs), "gang_max": max(gangs), "small_wait": statistics.fmean(small),
            "busy": busy, "wall": run.wall_s}


if __name__ == "__main__":
    main()
