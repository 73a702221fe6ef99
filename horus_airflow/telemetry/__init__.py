"""Telemetry: NVML sampling (absent, never invented, without a GPU), the ``horus run`` wrapper, and
importers for telemetry that clusters already collect (DCGM exporter through Prometheus)."""

from horus_airflow.telemetry.samples import (
    GpuReading,
    Sample,
    read_samples,
    samples_frame,
)
from horus_airflow.telemetry.wrapper import RunSummary, run

__all__ = ["GpuReading", "RunSummary", "Sample", "read_samples", "run", "samples_frame"]
