"""Reports of a simulation: the JSON results, a PNG plot and an MLflow run (experiment
``horus-simulations``) so analysts can browse and compare simulations."""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import mlflow  # noqa: E402
import numpy as np  # noqa: E402

from horus_airflow.registry.store import logged_run  # noqa: E402
from horus_airflow.settings import Settings  # noqa: E402
from horus_airflow.simulator.engine import SimulationRun  # noqa: E402
from horus_airflow.simulator.metrics import ProfileMetrics, comparison_table  # noqa: E402
from horus_airflow.run_schema import Experiment, Tag



@dataclass(frozen=True)
class SimulationReport:
    trace: str
    trace_format: str
    cluster: str
    truth: str
    results: list[ProfileMetrics]
    runs: list[SimulationRun]
    wall_s: float

    def as_json(self) -> dict[str, object]:
        return {
            "trace": self.trace, "trace_format": self.trace_format, "cluster": self.cluster, "truth": self.truth,
            "profiles": {m.profile: m.as_dict() for m in self.results}, "wall_s": self.wall_s,
        }


def write_json(report: SimulationReport, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report.as_json(), indent=2))


def plot(report: SimulationReport, path: Path) -> None:
    """JCT CDF, queue length, GPU busy fraction and summed predicted utilization over time, one line per
    profile."""
    figure, (cdf, queue, busy, summed) = plt.subplots(1, 4, figsize=(21, 4.5))
    for run in report.runs:
        jct = np.sort([f.jct_s / 3600 for f in run.finished])
        if len(jct):
            cdf.plot(jct, np.arange(1, len(jct) + 1) / len(jct), label=run.profile)
        times = np.array([s.time_s / 3600 for s in run.samples])
        queue.step(times, [s.queued for s in run.samples], where="post", label=run.profile)
        busy.step(times, [s.busy_fraction for s in run.samples], where="post", label=run.profile)
        summed.step(times, [s.summed_util for s in run.samples], where="post", label=run.profile)
    cdf.set(xscale="log", xlabel="job completion time (h)", ylabel="fraction of jobs", title="JCT CDF")
    queue.set(xlabel="time (h)", ylabel="jobs waiting", title="Queue length")
    busy.set(xlabel="time (h)", ylabel="fraction of GPUs busy", title="GPU busy fraction", ylim=(0, 1.05))
    summed.set(xlabel="time (h)", ylabel="mean per GPU (1 = 100 %)", title="Summed predicted utilization", ylim=(0, 1.05))
    for axis in (cdf, queue, busy, summed):
        axis.legend(fontsize=8)
    figure.suptitle(f"{Path(report.trace).name} on {report.cluster}")
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)


def log_simulation(settings: Settings, report: SimulationReport) -> str:
    """One MLflow run per simulation: parameters, each profile's metrics, the JSON, table and plot."""
    tags = {Tag.RUN_KIND: "simulation"}
    with logged_run(settings, Experiment.SIMULATIONS, f"simulate-{Path(report.trace).stem}", tags) as run_id:
        mlflow.log_params({"trace": report.trace[:500], "trace_format": report.trace_format, "cluster": report.cluster,
                           "truth": report.truth[:500], "profiles": ",".join(m.profile for m in report.results)})
        mlflow.log_metrics({f"{m.profile}.{key}": float(value) for m in report.results
                            for key, value in m.as_dict().items() if isinstance(value, (int, float))})
        mlflow.log_metric("wall_s", report.wall_s)
        with tempfile.TemporaryDirectory() as tmp:
            write_json(report, Path(tmp) / "simulation.json")
            plot(report, Path(tmp) / "simulation.png")
            (Path(tmp) / "comparison.txt").write_text(comparison_table(report.results))
            mlflow.log_artifacts(tmp)
    return run_id
