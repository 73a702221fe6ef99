"""Trace-driven simulator: the operator's own placement engine on replayed cluster traces, with ground
truth from measured co-location data."""

from horus_airflow.simulator.engine import Cluster, SimulationRun, simulate
from horus_airflow.simulator.metrics import ProfileMetrics, comparison_table, summarize
from horus_airflow.simulator.runner import run_simulation
from horus_airflow.simulator.traces import FORMATS, SimJob, Trace, read_trace

__all__ = [
    "FORMATS",
    "Cluster",
    "ProfileMetrics",
    "SimJob",
    "SimulationRun",
    "Trace",
    "comparison_table",
    "read_trace",
    "run_simulation",
    "simulate",
    "summarize",
]
