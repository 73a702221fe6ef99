"""Per-profile metrics of a simulation, and the comparison table against ``exclusive``."""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass

import numpy as np

from horus_airflow.simulator.engine import SimulationRun


@dataclass(frozen=True)
class ProfileMetrics:
    """``gpu_util``: time-averaged fraction of GPUs holding at least one job. ``summed_util``: the
    policies' predicted utilization summed per GPU (capped at 100 %), averaged; a prediction, not a
    measurement. ``work_rate``: useful work per GPU in isolated-GPU equivalents. Slowdowns are run time
    over run time alone, for jobs that shared a GPU at some point."""

    profile: str
    makespan_s: float
    avg_jct_s: float
    median_jct_s: float
    p95_jct_s: float
    avg_wait_s: float
    gpu_util: float
    summed_util: float
    work_rate: float
    avg_slowdown: float
    p95_slowdown: float
    worst_slowdown: float
    oom_events: int
    finished: int
    unfinished: int
    skipped: int
    skipped_reasons: dict[str, int]

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def summarize(run: SimulationRun) -> ProfileMetrics:
    done = run.finished
    gpus = run.cluster.total_gpus
    if done:
        start, end = min(f.arrival_s for f in done), max(f.finish_s for f in done)
        jct = np.array([f.jct_s for f in done])
        shared = [f.slowdown for f in done if f.colocated]
        window = max(end - start, 1e-9)
        return ProfileMetrics(
            run.profile, end - start, float(jct.mean()), float(np.median(jct)), float(np.percentile(jct, 95)),
            float(statistics.fmean(f.start_s - f.arrival_s for f in done)),
            run.busy_gpu_s / (gpus * window), run.predicted_util_gpu_s / (gpus * window), run.work_gpu_s / (gpus * window),
            float(statistics.fmean(shared)) if shared else 1.0, float(np.percentile(shared, 95)) if shared else 1.0,
            max(shared) if shared else 1.0,
            run.oom_events, len(done), run.unfinished, sum(run.skipped.values()), dict(run.skipped),
        )
    return ProfileMetrics(run.profile, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, run.oom_events, 0,
                          run.unfinished, sum(run.skipped.values()), dict(run.skipped))


_COLUMNS = (("makespan_s", "makespan h", 3600.0), ("avg_jct_s", "mean JCT h", 3600.0), ("median_jct_s", "median JCT h", 3600.0),
            ("p95_jct_s", "p95 JCT h", 3600.0), ("avg_wait_s", "mean wait h", 3600.0), ("gpu_util", "GPU busy", 1.0),
            ("work_rate", "work/GPU", 1.0), ("avg_slowdown", "mean slowdown", 1.0), ("p95_slowdown", "p95 slowdown", 1.0),
            ("worst_slowdown", "worst slowdown", 1.0),
            ("oom_events", "OOM", 1.0), ("finished", "finished", 1.0))


def comparison_table(results: list[ProfileMetrics], baseline: str = "exclusive") -> str:
    """Absolute values, then each value as a ratio of the baseline profile's (when it ran)."""
    width = max([14, *(len(m.profile) + 1 for m in results)])
    header = f"{'profile':<{width}}" + "".join(f"{label:>15}" for _, label, _ in _COLUMNS)
    lines = [header]
    for m in results:
        lines.append(f"{m.profile:<{width}}" + "".join(f"{getattr(m, key) / scale:>15.3f}" for key, _, scale in _COLUMNS))
    base = next((m for m in results if m.profile == baseline), None)
    if base is not None:
        lines.append(f"\nratio to {baseline}")
        lines.append(header)
        for m in results:
            cells = []
            for key, _, _ in _COLUMNS:
                denominator = getattr(base, key)
                cells.append(f"{getattr(m, key) / denominator:>15.3f}" if denominator else f"{'-':>15}")
            lines.append(f"{m.profile:<{width}}" + "".join(cells))
    return "\n".join(lines)
