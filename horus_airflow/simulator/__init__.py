"""Trace-driven simulator: the operator's own placement engine on replayed cluster traces, with ground
truth from measured co-location data."""

from horus_airflow.simulator.engine import Cluster, SimulationRun, simulate
from horus_airflow.simulator.metrics import ProfileMetrics, comparison_table, summarize
from horus_airflow.simulator.runner import run_simulation
from horus_airflow.simulator.traces import TRACE_READERS, SimJob, Trace, TraceReader, read_trace, register_trace_reader

__all__ = [
    "TRACE_READERS",
    "TraceReader",
    "register_trace_reader",
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
