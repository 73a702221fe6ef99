"""Telemetry: NVML sampling (absent, never invented, without a GPU) and the ``horus run`` wrapper."""

from horus_airflow.telemetry.wrapper import RunSummary, run

__all__ = ["RunSummary", "run"]
