"""Trace readers. Every reader returns the jobs it could use and, per reason, how many it skipped:
nothing is dropped silently.

Formats:
- ``muri``: Muri's CSV (``job_id,num_gpu,submit_time,iterations,model_name,batch_size,duration,...``),
  times in milliseconds; the duration is the job's measured runtime alone.
- ``gavel``: Gavel's tab-separated ``.trace`` (job type, command, step flag, data flag, total steps,
  arrival seconds, GPUs); runtime alone = steps / the measured isolated throughput on the cluster's GPU.
- ``tiresias``: the Tiresias/GPUSchedule CSV of the Horus authors' simulator
  (``job_id,num_gpu,submit_time,iterations,model_name,duration,interval``), seconds.
- ``native``: CSV ``job_id,arrival_s,gpus,duration_s,model,batch_size`` with optional ``dataset``; the
  model is a catalog name.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Mapping, Protocol, Sequence

import pandas as pd

from horus_airflow.errors import HorusError, InvalidJobError
from horus_airflow.registries import Registry
from horus_airflow.simulator.workloads import Workload, gavel_workload, trace_workload

class TraceError(HorusError):
    """A trace that cannot be read at all (missing file or columns, unknown format)."""


@dataclass(frozen=True)
class SimJob:
    """One job: when it arrives, its GPUs, how long it runs alone on the cluster's GPU type, and what it
    trains (for the policies' predictions and for measured interference). On a cluster that mixes GPU
    types, ``durations_s`` holds its runtime alone on each of them."""

    job_id: str
    arrival_s: float
    gpus: int
    duration_s: float
    workload: Workload
    durations_s: Mapping[str, float] = field(default_factory=dict)

    def duration_on(self, gpu_type: str) -> float:
        return self.durations_s[gpu_type] if self.durations_s else self.duration_s


@dataclass(frozen=True)
class Trace:
    jobs: tuple[SimJob, ...]
    skipped: dict[str, int] = field(default_factory=dict)
    source: str = ""


class TraceReader(Protocol):
    """Reads one trace format into jobs; rows it cannot use are counted in ``Trace.skipped`` by reason,
    never dropped silently. ``isolated`` holds measured isolated throughputs, for formats that give
    steps instead of durations."""

    name: str
    description: str
    runtimes_per_gpu_type: bool  # runtimes derived per GPU type (steps over measured throughputs): a mixed cluster can run it; False if absent

    def read(self, path: Path, gpu_type: str, isolated: pd.DataFrame | None) -> Trace: ...


TRACE_READERS: Registry[TraceReader] = Registry("trace format")
register_trace_reader = TRACE_READERS.register  # a format readable by ``horus simulate --trace-format`` and read_trace


def read_trace(path: Path | str, trace_format: str, gpu_type: str, isolated: pd.DataFrame | None = None) -> Trace:
    if trace_format not in TRACE_READERS:
        raise TraceError(f"unknown trace format {trace_format!r}; accepted: {', '.join(TRACE_READERS)}")
    path = Path(path)
    if not path.is_file():
        raise TraceError(f"trace not found: {str(path)!r}")
    return _usable(TRACE_READERS[trace_format].read(path, gpu_type, isolated), trace_format)


def read_trace_on(path: Path | str, trace_format: str, gpu_types: Sequence[str], isolated: pd.DataFrame | None = None) -> Trace:
    """The trace's jobs with their runtime alone on each GPU type, for a cluster that mixes them. Only a
    format whose runtimes come from steps and measured per-type throughputs can give them; a job without
    a measured throughput on one of the types is skipped and counted."""
    if len(gpu_types) == 1:
        return read_trace(path, trace_format, gpu_types[0], isolated)
    per_type = {name: getattr(TRACE_READERS[name], "runtimes_per_gpu_type", False) for name in TRACE_READERS}
    if not per_type.get(trace_format, True):  # an unknown format is named by read_trace
        able = ", ".join(name for name, ok in per_type.items() if ok)
        raise TraceError(f"a cluster that mixes GPU types ({', '.join(gpu_types)}) needs each job's runtime on every "
                         f"type; {trace_format} traces give one runtime. Accepted for mixed clusters: {able}")
    traces = [read_trace(path, trace_format, gpu_type, isolated) for gpu_type in gpu_types]
    runtimes = [{job.job_id: job.duration_s for job in trace.jobs} for trace in traces]
    jobs, skipped = [], Counter(traces[0].skipped)
    for job in traces[0].jobs:
        missing = next((gpu_type for gpu_type, known in zip(gpu_types, runtimes) if job.job_id not in known), None)
        if missing:
            skipped[f"no measured throughput on {missing}"] += 1
            continue
        jobs.append(replace(job, durations_s={gpu_type: known[job.job_id] for gpu_type, known in zip(gpu_types, runtimes)}))
    return _usable(Trace(tuple(jobs), dict(skipped), traces[0].source), trace_format)


Row = Callable[[dict[str, Any]], tuple[float, int, float, Workload]]


@dataclass(frozen=True)
class CsvTraceReader:
    """A CSV trace with a header row: ``columns`` must be present; ``row`` turns one row into (arrival
    seconds, GPUs, duration seconds alone, workload), raising ValueError or InvalidJobError for a row
    it cannot use."""

    name: str
    description: str
    columns: tuple[str, ...]
    row: Row
    runtimes_per_gpu_type: bool = False  # a duration column is one runtime, on a GPU the trace does not name

    def read(self, path: Path, gpu_type: str, isolated: pd.DataFrame | None) -> Trace:
        try:
            frame = pd.read_csv(path)
        except (UnicodeDecodeError, pd.errors.ParserError) as exc:
            raise TraceError(f"{self.name} trace {str(path)!r} is not a CSV text file ({type(exc).__name__}); "
                             f"expected a header row and comma-separated values (docs/EVALUATION.md)") from None
        except pd.errors.EmptyDataError:
            raise TraceError(f"{self.name} trace {str(path)!r} is empty; expected a header row and one row per job") from None
        missing = [c for c in self.columns if c not in frame.columns]
        if missing:
            raise TraceError(f"{self.name} trace {str(path)!r} lacks columns: {', '.join(missing)}; expected: {', '.join(self.columns)}")
        jobs, skipped = [], Counter()
        for values in frame.to_dict("records"):
            try:
                arrival, gpus, duration, workload = self.row(values)
            except _BatchBelowOne:
                skipped["batch size below 1"] += 1
                continue
            except InvalidJobError:
                skipped["unknown model"] += 1
                continue
            except (TypeError, ValueError, OverflowError):
                skipped["unreadable number"] += 1
                continue
            reason = _invalid(arrival, gpus, duration)
            if reason:
                skipped[reason] += 1
                continue
            jobs.append(SimJob(str(values["job_id"]), arrival, gpus, duration, workload))
        return Trace(tuple(sorted(jobs, key=lambda j: j.arrival_s)), dict(skipped), str(path))


def _philly_row(units_per_s: float) -> Row:
    def row(values: dict[str, Any]) -> tuple[float, int, float, Workload]:
        batch = int(values["batch_size"]) if "batch_size" in values else None
        if batch is not None and batch < 1:
            raise _BatchBelowOne(batch)
        return (float(values["submit_time"]) / units_per_s, int(values["num_gpu"]), float(values["duration"]) / units_per_s,
                trace_workload(str(values["model_name"]), batch))
    return row


def _native_row(values: dict[str, Any]) -> tuple[float, int, float, Workload]:
    return float(values["arrival_s"]), int(values["gpus"]), float(values["duration_s"]), _native_workload(values)


class _BatchBelowOne(ValueError):
    pass


def _usable(trace: Trace, trace_format: str) -> Trace:
    """A trace of which no row could be used is a mistake (an empty file, the wrong ``--trace-format``),
    not a simulation of nothing."""
    if trace.jobs:
        return trace
    why = ", ".join(f"{count} {reason}" for reason, count in sorted(trace.skipped.items())) or "it has no rows"
    raise TraceError(f"no job of {trace.source!r} can be used as a {trace_format} trace ({why}); check --trace-format "
                     f"(accepted: {', '.join(TRACE_READERS)}) and the file's columns (docs/EVALUATION.md)")


def _native_workload(values: dict[str, object]) -> Workload:
    dataset = values.get("dataset")
    dataset = None if dataset is None or (isinstance(dataset, float) and math.isnan(dataset)) else str(dataset)
    from horus_airflow.catalog import resolve

    batch = int(values["batch_size"])  # type: ignore[call-overload]
    if batch < 1:
        raise _BatchBelowOne(batch)
    resolved = resolve(str(values["model"]), dataset)
    return Workload(resolved.workload.name, resolved.dataset.name, batch, str(values["model"]))


def _invalid(arrival: float, gpus: int, duration: float) -> str | None:
    if not math.isfinite(arrival) or arrival < 0:
        return "negative or missing arrival"
    if gpus < 1:
        return "fewer than 1 GPU"
    if not math.isfinite(duration) or duration <= 0:
        return "non-positive duration"
    return None


@dataclass(frozen=True)
class GavelTraceReader:
    """Gavel's tab-separated traces: job type, command, step flag, data flag, total steps, arrival
    seconds, GPUs. Durations come from the measured isolated throughput of the job type on the GPU."""

    name: str = "gavel"
    description: str = "Gavel's per-VC Philly traces (steps; durations from measured isolated throughputs)"
    runtimes_per_gpu_type: bool = True

    def read(self, path: Path, gpu_type: str, isolated: pd.DataFrame | None) -> Trace:
        if isolated is None:
            raise TraceError("a Gavel trace needs the measured isolated throughputs (data/interference_seed/gavel_isolated.csv)")
        return _gavel(path, gpu_type, isolated)


def _gavel(path: Path, gpu_type: str, isolated: pd.DataFrame) -> Trace:
    rates = {(r.job_type, int(r.scale_factor)): float(r.steps_per_s) for r in isolated[isolated["gpu_type"] == gpu_type].itertuples()}
    if not rates:
        raise TraceError(f"no measured isolated throughputs for GPU type {gpu_type!r}; measured: "
                         f"{', '.join(sorted(isolated['gpu_type'].unique()))}")
    try:
        lines = path.read_text().splitlines()
    except UnicodeDecodeError:
        raise TraceError(f"gavel trace {str(path)!r} is not a text file; expected tab-separated lines of job type, "
                         "command, step flag, data flag, total steps, arrival seconds, GPUs") from None
    jobs, skipped = [], Counter()
    for number, line in enumerate(lines):
        fields = line.split("\t")
        if len(fields) != 7:
            skipped["not 7 tab-separated fields"] += 1
            continue
        job_type, _command, _flag, _data, steps, arrival, gpus = fields
        try:
            workload = gavel_workload(job_type)
            steps_f, arrival_f, gpus_i = float(steps), float(arrival), int(gpus)
        except InvalidJobError:
            skipped["unknown model"] += 1
            continue
        except ValueError:
            skipped["unreadable number"] += 1
            continue
        rate = rates.get((job_type, gpus_i))
        if rate is None or rate <= 0:
            skipped[f"no measured throughput for {gpus_i} GPUs"] += 1
            continue
        duration = steps_f / rate
        reason = _invalid(arrival_f, gpus_i, duration)
        if reason:
            skipped[reason] += 1
            continue
        jobs.append(SimJob(str(number), arrival_f, gpus_i, duration, workload))
    return Trace(tuple(sorted(jobs, key=lambda j: j.arrival_s)), dict(skipped), str(path))


for _reader in (
    CsvTraceReader("muri", "Muri's Philly-derived traces (milliseconds, with batch sizes)",
                   ("job_id", "num_gpu", "submit_time", "model_name", "batch_size", "duration"), _philly_row(1000.0)),
    GavelTraceReader(),
    CsvTraceReader("tiresias", "Tiresias-style Philly traces (seconds, no batch sizes)",
                   ("job_id", "num_gpu", "submit_time", "model_name", "duration"), _philly_row(1.0)),
    CsvTraceReader("native", "Horus's own CSV: job_id, arrival_s, gpus, duration_s, model, batch_size[, dataset]",
                   ("job_id", "arrival_s", "gpus", "duration_s", "model", "batch_size"), _native_row),
):
    register_trace_reader(_reader)
