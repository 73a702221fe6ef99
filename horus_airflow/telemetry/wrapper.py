"""``horus run``: run any training command, sample it, forward signals, keep its exit code.

Writes into the output folder: ``samples.jsonl`` (appended and flushed every interval, so a wrapper
that is killed leaves what it had), ``samples.parquet`` (the same, one row per sample and GPU) and
``summary.json``. GPU metrics are recorded only where NVML measured them; without NVML they are
absent, never zero. A job may report its own metrics (e.g. throughput) as a JSON object in the file
``$HORUS_METRICS_FILE``.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import threading
import time
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import IO, Sequence

import psutil

from horus_airflow.telemetry import nvml
from horus_airflow.telemetry.samples import (
    Sample,
    read_samples,
    samples_frame,
    summarise_gpus,
)

log = logging.getLogger(__name__)

METRICS_FILE_ENV = "HORUS_METRICS_FILE"
SAMPLES_FILE = "samples.jsonl"
SAMPLES_PARQUET = "samples.parquet"
SUMMARY_FILE = "summary.json"
_CANNOT_START = 127  # what a shell returns for a command it cannot run
UNKNOWN_EXIT = -1  # the wrapper died, or the telemetry was imported


@dataclass(frozen=True)
class RunSummary:
    """What one wrapped run measured. GPU fields are None when no GPU was measured."""

    exit_code: int
    duration_s: float
    samples: int
    gpu_measured: bool
    cpu_percent_mean: float | None
    host_rss_mib_max: float | None
    gpu_util_mean: float | None = None
    gpu_util_p50: float | None = None
    gpu_util_p90: float | None = None
    gpu_util_max: float | None = None
    gpu_mem_mib_max: float | None = None
    gpu_sm_active_mean: float | None = None
    gpu_process_sm_util_mean: float | None = None
    gpu_power_w_mean: float | None = None
    co_resident_pids: list[int] = field(default_factory=list)
    sample_problems: dict[str, int] = field(default_factory=dict)
    job_metrics: dict[str, float | str] = field(default_factory=dict)
    started_at: float | None = None  # Unix seconds when the command started; None when not known (imports)

    def measured_metrics(self) -> dict[str, float]:
        """Numeric measurements only, None dropped: what may be logged as metrics."""
        values: dict[str, float] = {}
        for key, value in asdict(self).items():
            if isinstance(value, (int, float)) and not isinstance(value, bool) and key not in ("exit_code", "started_at"):
                values[key] = float(value)
        for key, value in self.job_metrics.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                values[f"job.{key}"] = float(value)
        return values

    @classmethod
    def read(cls, folder: Path) -> "RunSummary | None":
        """The summary a wrapped run left in ``folder``. If the wrapper died before writing one, the
        summary is rebuilt from the samples it had flushed (exit code unknown: -1); None without either."""
        path = folder / SUMMARY_FILE
        if path.is_file():
            known = {f.name for f in fields(cls)}
            return cls(**{k: v for k, v in json.loads(path.read_text()).items() if k in known})
        if (folder / SAMPLES_FILE).is_file():
            read = read_samples(folder / SAMPLES_FILE)
            duration = read.samples[-1].t_s if read.samples else 0.0
            return summarise(UNKNOWN_EXIT, duration, list(read.samples), job_metrics(folder / "job_metrics.json"), read.problems)
        return None

    def write(self, folder: Path) -> None:
        (folder / SUMMARY_FILE).write_text(json.dumps(asdict(self), indent=2))


def run(
    command: Sequence[str], out_dir: Path, interval_s: float = 0.2, source: nvml.GpuSource | None = None,
    launcher_pid: int | None = None,
) -> RunSummary:
    """Run ``command`` to completion under sampling; the summary is also written to ``out_dir``.
    ``source`` defaults to NVML on the visible GPUs, or none where NVML is missing.

    With ``launcher_pid`` (the process that holds the job's GPU reservation), the command is stopped
    when that process is gone: a launcher killed with SIGKILL cannot stop it, and its lease will
    expire, after which the GPU may be given to another job while this one still trains on it."""
    out_dir.mkdir(parents=True, exist_ok=True)
    metrics_file = out_dir / "job_metrics.json"
    env = {**os.environ, METRICS_FILE_ENV: str(metrics_file)}
    if source is None and nvml.init():
        source = nvml.NvmlSource(_visible_gpu_indices())
    started, started_at = time.monotonic(), time.time()
    try:
        child = subprocess.Popen(list(command), env=env)
    except OSError as exc:
        log.error("cannot start %r: %s", command[0], exc)
        summary = RunSummary(_CANNOT_START, 0.0, 0, False, None, None, job_metrics={"error": str(exc)}, started_at=started_at)
        summary.write(out_dir)
        return summary
    previous = {sig: signal.signal(sig, lambda s, _f: child.send_signal(s)) for sig in (signal.SIGTERM, signal.SIGINT)}
    samples: list[Sample] = []
    stop = threading.Event()
    with (out_dir / SAMPLES_FILE).open("w") as sink:
        sampler = threading.Thread(
            target=_sample_until, args=(child.pid, source, interval_s, started, stop, samples, sink), daemon=True
        )
        sampler.start()
        try:
            code = _wait(child, launcher_pid, interval_s)
        finally:
            stop.set()
            sampler.join()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            if source is not None:
                source.close()
    duration = time.monotonic() - started
    summary = replace(summarise(128 - code if code < 0 else code, duration, samples, job_metrics(metrics_file)), started_at=started_at)
    samples_frame(samples).to_parquet(out_dir / SAMPLES_PARQUET, index=False)
    summary.write(out_dir)
    return summary


def _wait(child: subprocess.Popen[bytes], launcher_pid: int | None, poll_s: float, grace_s: float = 10.0) -> int:
    """The child's return code; it is stopped (SIGTERM, SIGKILL after ``grace_s``) once the launcher is gone,
    which a re-parented wrapper sees as a parent pid that changed."""
    while True:
        try:
            return child.wait(timeout=max(poll_s, 0.05))
        except subprocess.TimeoutExpired:
            if launcher_pid is None or os.getppid() == launcher_pid:
                continue
        log.warning("launcher %d is gone: stopping the job (pid %d), its GPU reservation is no longer held", launcher_pid, child.pid)
        child.terminate()
        try:
            return child.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            child.kill()
            return child.wait()


def _visible_gpu_indices() -> list[int]:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return [gpu.index for gpu in nvml.discover_gpus()]
    return [int(part) for part in visible.split(",") if part.strip().isdigit()]


def _sample_until(
    pid: int, source: nvml.GpuSource | None, interval_s: float, started: float, stop: threading.Event,
    out: list[Sample], sink: IO[str],
) -> None:
    try:
        root = psutil.Process(pid)
    except psutil.NoSuchProcess:
        return
    tracked: dict[int, psutil.Process] = {}
    while not stop.wait(interval_s):
        try:
            family = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return
        cpu = rss = 0.0
        for proc in family:
            proc = tracked.setdefault(proc.pid, proc)
            try:
                cpu += proc.cpu_percent(None)
                rss += proc.memory_info().rss / (1024 * 1024)
            except psutil.NoSuchProcess:
                continue
        gpus = tuple(source.read({p.pid for p in family})) if source is not None else ()
        sample = Sample(time.monotonic() - started, cpu, rss, gpus)
        out.append(sample)
        sink.write(sample.to_json() + "\n")
        sink.flush()


def job_metrics(metrics_file: Path) -> dict[str, float | str]:
    """What the job reported about itself (e.g. throughput); {} when nothing or garbage."""
    if not metrics_file.is_file():
        return {}
    try:
        reported = json.loads(metrics_file.read_text())
    except json.JSONDecodeError:
        log.warning("ignoring %s: not valid JSON", metrics_file)
        return {}
    return reported if isinstance(reported, dict) else {}


def summarise(
    code: int, duration: float, samples: list[Sample], reported: dict[str, float | str], problems: dict[str, int] | None = None
) -> RunSummary:
    # The first CPU reading of each process is always 0 (psutil primes its counter), so skip it.
    cpu = [s.cpu_percent for s in samples[1:] if s.cpu_percent is not None]
    rss = [s.host_rss_mib for s in samples if s.host_rss_mib is not None]
    gpu = summarise_gpus(samples)
    return RunSummary(
        exit_code=code,
        duration_s=duration,
        samples=len(samples),
        gpu_measured=gpu.gpu_util_mean is not None,
        cpu_percent_mean=sum(cpu) / len(cpu) if cpu else None,
        host_rss_mib_max=max(rss, default=None),
        **asdict(gpu),
        sample_problems=dict(problems or {}),
        job_metrics=reported,
    )
