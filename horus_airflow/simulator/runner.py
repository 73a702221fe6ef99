"""One simulation end to end: read the trace, split measured data into ground truth and the policies'
model, run every profile on the same jobs and cluster, summarise."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import Callable, Sequence

import pandas as pd

from horus_airflow.interference.pairs import read_pairs
from horus_airflow.placement import load_profile
from horus_airflow.interference import InterferenceModel
from horus_airflow.placement import Profile
from horus_airflow.simulator.engine import Cluster, DemandPredictor, Demands, Placeable, simulate
from horus_airflow.simulator.metrics import summarize
from horus_airflow.simulator.report import SimulationReport
from horus_airflow.simulator.traces import Trace, TraceError, read_trace_on
from horus_airflow.simulator.truth import split_models

DATA = Path("data") / "interference_seed"


def run_simulation(
    trace_path: Path,
    trace_format: str,
    cluster: Cluster,
    profiles: Sequence[str | Profile],
    pairs_path: Path = DATA / "gavel_pairs.csv",
    isolated_path: Path = DATA / "gavel_isolated.csv",
    arrival_scale: float = 1.0,
    limit: int | None = None,
    progress: Callable[[str, int, int], None] | None = None,
    predictor: DemandPredictor | None = None,
) -> SimulationReport:
    """``profiles``: shipped profiles' names, or profiles built in code. ``arrival_scale`` > 1 compresses
    arrival times (more load on the same cluster); ``limit`` keeps the first jobs by arrival;
    ``predictor`` predicts the policies' demands (default: the analytic prior)."""
    if arrival_scale <= 0:
        raise TraceError(f"arrival scale must be > 0, got {arrival_scale}")
    loaded_profiles = [p if isinstance(p, Profile) else load_profile(p) for p in profiles]
    isolated = pd.read_csv(isolated_path) if trace_format == "gavel" else None
    trace = read_trace_on(trace_path, trace_format, cluster.gpu_types, isolated)
    jobs = trace.jobs[:limit] if limit else trace.jobs
    jobs = tuple(replace(job, arrival_s=job.arrival_s / arrival_scale) for job in jobs)
    trace = Trace(jobs, trace.skipped, trace.source)
    truth, policy_model = split_models(read_pairs(pairs_path), cluster.gpu_types)
    trace = common_jobs(trace, cluster, loaded_profiles, policy_model, predictor)
    started = time.perf_counter()
    runs = []
    for profile in loaded_profiles:
        callback = (lambda done, total, name=profile.name: progress(name, done, total)) if progress else None
        began = time.perf_counter()
        runs.append(simulate(trace, cluster, profile, truth, policy_model, progress=callback, predictor=predictor))
        runs[-1].wall_s = time.perf_counter() - began
    return SimulationReport(
        trace=str(trace_path), trace_format=trace_format,
        cluster=cluster.describe(),
        truth=(f"measured Gavel pairs on each GPU's type ({', '.join(cluster.gpu_types)}); unmeasured pairs from a model "
               f"fitted only on that type's pairs; policies' learned model fitted on the GPU types the cluster does not "
               f"have; policies' demands from {predictor.name if predictor else 'the analytic prior'}"),
        results=[summarize(run) for run in runs], runs=runs, wall_s=time.perf_counter() - started,
    )


def common_jobs(trace: Trace, cluster: Cluster, profiles: list[Profile], model: InterferenceModel,
                predictor: DemandPredictor | None = None) -> Trace:
    """Keep the jobs every profile can place on the idle cluster, so all profiles are measured on the
    same jobs; the others are counted under the first profile that cannot place them."""
    demands = Demands(cluster.gpu_types, predictor)
    checks = [Placeable(cluster.gpus(), profile, model) for profile in profiles]
    kept, skipped = [], dict(trace.skipped)
    for job in trace.jobs:
        reason = next((r for r in (check.reason(job, demands) for check in checks) if r), None)
        if reason:
            skipped[reason] = skipped.get(reason, 0) + 1
        else:
            kept.append(job)
    return Trace(tuple(kept), skipped, trace.source)
