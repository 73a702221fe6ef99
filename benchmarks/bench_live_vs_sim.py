"""Live against simulated: one small trace through the live scheduler and through the simulator.

    .venv/bin/python benchmarks/bench_live_vs_sim.py [--jobs 40] [--gpus 4] [--time-scale 0.025]

The live side is the path a queued task takes, in real processes and wall time: each job, at its
(scaled) arrival and in trace order, queues its demand in a fresh SQLite ledger of a local backend with N
declared V100s (`enqueue_demand`); a thread per job then waits as the blocking operator does (`wait_for_booking`: a
scheduling round every 0.25 s, its lease renewed), then runs `sleep` for its scaled duration and releases
its booking, which runs rounds on the GPUs it freed, as the operators' release does. Airflow is not in the loop: it only hosts that wait (`dag.test()` tests cover the
operator). The simulated side is `simulate()` on the same jobs, demands and interference model.

Printed per profile: Kendall's tau between the live booking order (when a round booked each job, from
the ledger's journal) and the simulated start order (1: the same order; jobs booked or started at one
instant are ordered by arrival in both), how many jobs hold the same
place in both orders, and the makespans (live scaled back to trace seconds).
Each live replay is compared with two simulations: one whose jobs suffer what measured Gavel pairs say
(slowed when co-located, crashed when a pair does not fit in memory), as production jobs would, and
one whose jobs are, like the replay's `sleep`s, never slowed (the like-for-like check of the scheduler).
What is left then is the live path's own: jobs queued one by one where the simulator sees every
arrival of an instant at once, and the start lag of a booked task's next look (0.25 s, about 10 s of
trace time at the default scale).

Jobs: the first of Chronus' Philly-like MIX1 trace (data/traces/chronus, MIT), one-GPU jobs and, from
the first gangs of up to N GPUs in the trace, up to four gangs put in at their own arrival.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path

from scipy.stats import kendalltau

from horus_airflow.backends import LocalBackend
from horus_airflow.backends.ledger import LedgerReader, QueueEntry
from horus_airflow.backends.scheduler import enqueue_demand, rounds_after_release, wait_for_booking
from horus_airflow.interference.pairs import read_pairs
from horus_airflow.placement import Profile, load_profile
from horus_airflow.settings import Settings
from horus_airflow.simulator.engine import Cluster, Demands, simulate
from horus_airflow.simulator.runner import DATA, common_jobs
from horus_airflow.simulator.traces import SimJob, Trace, read_trace
from horus_airflow.simulator.truth import TruthOutcome, split_models

ROOT = Path(__file__).resolve().parent.parent
TRACE = ROOT / "data" / "traces" / "chronus" / "trace_job_Philly_MIX1.csv"
POLL_S = 0.25
GANGS = 4


@dataclass(frozen=True)
class Replay:
    profile: str
    truth: str
    tau: float
    same_place: int
    sim_makespan_s: float
    live_makespan_s: float
    wall_s: float


class SleepTruth:
    """What a `sleep` suffers next to others: nothing; it always fits. The like-for-like simulation of
    the live replay (its jobs are sleeps), beside the simulation with measured pairs."""

    def outcome(self, job_types, runners, gpu) -> TruthOutcome:  # type: ignore[no-untyped-def]
        return TruthOutcome(tuple(1.0 for _ in job_types), True, 0, 0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=40)
    parser.add_argument("--gpus", type=int, default=4)
    parser.add_argument("--time-scale", type=float, default=0.025, help="live seconds per trace second")
    parser.add_argument("--profiles", default="exclusive,horus-paper")
    args = parser.parse_args()
    cluster = Cluster(1, args.gpus, "v100")
    truth, model = split_models(read_pairs(ROOT / DATA / "gavel_pairs.csv"), cluster.gpu_type)
    profiles = [load_profile(name) for name in args.profiles.split(",")]
    trace = common_jobs(_jobs(args.jobs, args.gpus), cluster, profiles, model)
    print(f"{len(trace.jobs)} MIX1 jobs ({sum(j.gpus > 1 for j in trace.jobs)} gangs) on {args.gpus} V100s; "
          f"live at {args.time_scale:g} s per trace second, rounds every {POLL_S} s")
    print(f"{'profile':<14}{'simulated with':<17}{'kendall tau':>12}{'same place':>12}{'sim makespan s':>16}"
          f"{'live makespan s':>17}{'difference':>12}{'live wall s':>13}")
    for profile in profiles:
        for row in replay(trace, cluster, profile, truth, model, args.time_scale):
            print(f"{row.profile:<14}{row.truth:<17}{row.tau:>12.2f}{row.same_place:>9}/{len(trace.jobs):<2}"
                  f"{row.sim_makespan_s:>16.0f}{row.live_makespan_s:>17.0f}"
                  f"{row.live_makespan_s / row.sim_makespan_s - 1:>+12.1%}{row.wall_s:>13.1f}")


def _jobs(count: int, gpus: int) -> Trace:
    """The first one-GPU jobs by arrival, with the trace's first few gangs that fit put in among them."""
    trace = read_trace(TRACE, "tiresias", "v100")
    singles = [j for j in trace.jobs if j.gpus == 1][: count - GANGS]
    gangs = [j for j in trace.jobs if 1 < j.gpus <= gpus][:GANGS]
    start = min(j.arrival_s for j in singles)
    span = max(j.arrival_s for j in singles) - start
    placed = [replace(g, arrival_s=start + span * (i + 1) / (len(gangs) + 1)) for i, g in enumerate(gangs)]
    return Trace(tuple(sorted([*singles, *placed], key=lambda j: j.arrival_s)), {}, trace.source)


def replay(trace: Trace, cluster: Cluster, profile: Profile, truth, model, scale: float) -> list[Replay]:  # type: ignore[no-untyped-def]
    """One live replay, compared with the simulation under measured pairs and under sleeps' truth."""
    with tempfile.TemporaryDirectory() as home:
        os.environ["HORUS_HOME"], os.environ["HORUS_LOCAL_GPUS"] = home, f"{cluster.gpus_per_node}x{cluster.gpu_type}"
        booked, live_start, wall = _live(trace, cluster, Settings.from_env(), profile, model, scale)
    arrival = {job.job_id: (job.arrival_s, n) for n, job in enumerate(trace.jobs)}
    first = min(j.arrival_s for j in trace.jobs)
    live_order = sorted(booked, key=lambda i: (booked[i], arrival[i]))
    live_rank = {job_id: n for n, job_id in enumerate(live_order)}
    live_end = max(live_start[j.job_id] + j.duration_s for j in trace.jobs) - first
    rows = []
    for label, fate in (("measured pairs", truth), ("sleeps", SleepTruth())):
        simulated = simulate(trace, cluster, profile, fate, model)
        sim_start = {job.job_id: job.start_s for job in simulated.finished}
        sim_order = sorted(sim_start, key=lambda i: (sim_start[i], arrival[i]))
        tau = kendalltau(range(len(sim_order)), [live_rank[i] for i in sim_order]).statistic
        sim_end = max(job.finish_s for job in simulated.finished) - first
        rows.append(Replay(profile.name, label, float(tau), sum(a == b for a, b in zip(sim_order, live_order)),
                           sim_end, live_end, wall))
    return rows


def _live(trace: Trace, cluster: Cluster, settings: Settings, profile: Profile, model, scale: float) -> tuple[dict[str, float], dict[str, float], float]:  # type: ignore[no-untyped-def]
    """When a round booked each job (the ledger's time) and when its `sleep` started, both in trace
    seconds, and the wall time the replay took. A job starts at its task's next look after the booking."""
    demands = Demands(cluster.gpu_types)  # what simulate() predicts for the same cluster
    first = min(j.arrival_s for j in trace.jobs)
    started: dict[str, float] = {}
    reservations: dict[str, str] = {}
    errors: list[BaseException] = []
    t0 = time.time() + 0.5

    def task(index: int, job: SimJob, entry: QueueEntry) -> None:
        try:
            backend = LocalBackend(settings)
            acquired = wait_for_booking(backend, entry, profile, 600, model, poll_s=POLL_S)
            started[job.job_id] = first + (time.time() - t0) / scale
            reservations[job.job_id] = acquired.reservation.reservation_id
            subprocess.run(["sleep", f"{job.duration_s * scale:.3f}"], check=True)
            backend.release(acquired.reservation)
            rounds_after_release(backend, lambda: model)  # as the operators' release (PlacementService.release)
        except BaseException as exc:  # reported after the join: a lost job would skew the table
            errors.append(exc)

    arrivals = LocalBackend(settings)
    threads = []
    for index, job in enumerate(trace.jobs):  # queued in trace order, each at its scaled arrival
        time.sleep(max(0.0, t0 + (job.arrival_s - first) * scale - time.time()))
        entry = enqueue_demand(arrivals, demands.of(job, index), profile, f"replay/{index}", model,
                               expected_runtime_s=job.duration_s * scale)
        threads.append(threading.Thread(target=task, args=(index, job, entry)))
        threads[-1].start()
    for thread in threads:
        thread.join()
    if errors:
        raise RuntimeError(f"{len(errors)} live jobs failed, the first: {errors[0]!r}")
    wall = time.time() - t0
    journal = LedgerReader(settings.ledger_path)
    booked = {job_id: first + (journal.entry(rid).created_at - t0) / scale for job_id, rid in reservations.items()}
    return booked, started, wall


if __name__ == "__main__":
    main()
