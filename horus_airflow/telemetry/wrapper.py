"""``horus run``: run any training command, sample it, forward signals, keep its exit code.

Writes ``samples.jsonl`` (one sample per interval) and ``summary.json`` into the output folder. GPU
metrics are recorded only where NVML measured them; without NVML they are absent, never zero. A job
may report its own metrics (e.g. throughput) as a JSON object in the file ``$HORUS_METRICS_FILE``.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Sequence

import psutil

from horus_airflow.telemetry import nvml

log = logging.getLogger(__name__)

METRICS_FILE_ENV = "HORUS_METRICS_FILE"
SAMPLES_FILE = "samples.jsonl"
SUMMARY_FILE = "summary.json"
_CANNOT_START = 127  # what a shell returns for a command it cannot run


@dataclass(frozen=True)
class Sample:
    t_s: float
    cpu_percent: float
    host_rss_mib: float
    gpus: list[nvml.GpuReading] = field(default_factory=list)


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
    job_metrics: dict[str, float | str] = field(default_factory=dict)

    def measured_metrics(self) -> dict[str, float]:
        """Numeric measurements only, None dropped: what may be logged as metrics."""
        values: dict[str, float] = {}
        for key, value in asdict(self).items():
            if isinstance(value, (int, float)) and not isinstance(value, bool) and key != "exit_code":
                values[key] = float(value)
        for key, value in self.job_metrics.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                values[f"job.{key}"] = float(value)
        return values

    @classmethod
    def read(cls, folder: Path) -> "RunSummary | None":
        """The summary a wrapped run left in ``folder``; None if it never got to write one."""
        path = folder / SUMMARY_FILE
        return cls(**json.loads(path.read_text())) if path.is_file() else None

    def write(self, folder: Path) -> None:
        (folder / SUMMARY_FILE).write_text(json.dumps(asdict(self), indent=2))


def run(command: Sequence[str], out_dir: Path, interval_s: float = 0.2) -> RunSummary:
    """Run ``command`` to completion under sampling; the summary is also written to ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    metrics_file = out_dir / "job_metrics.json"
    env = {**os.environ, METRICS_FILE_ENV: str(metrics_file)}
    gpu_indices = _visible_gpu_indices() if nvml.init() else []
    started = time.monotonic()
    try:
        child = subprocess.Popen(list(command), env=env)
    except OSError as exc:
        log.error("cannot start %r: %s", command[0], exc)
        summary = RunSummary(_CANNOT_START, 0.0, 0, False, None, None, job_metrics={"error": str(exc)})
        summary.write(out_dir)
        return summary
    previous = {sig: signal.signal(sig, lambda s, _f: child.send_signal(s)) for sig in (signal.SIGTERM, signal.SIGINT)}
    samples: list[Sample] = []
    stop = threading.Event()
    sampler = threading.Thread(
        target=_sample_until, args=(child.pid, gpu_indices, interval_s, started, stop, samples), daemon=True
    )
    sampler.start()
    try:
        code = child.wait()
    finally:
        stop.set()
        sampler.join()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    duration = time.monotonic() - started
    summary = _summarise(128 - code if code < 0 else code, duration, samples, bool(gpu_indices), metrics_file)
    with (out_dir / SAMPLES_FILE).open("w") as handle:
        for sample in samples:
            handle.write(json.dumps(asdict(sample)) + "\n")
    summary.write(out_dir)
    return summary


def _visible_gpu_indices() -> list[int]:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return [gpu.index for gpu in nvml.discover_gpus()]
    return [int(part) for part in visible.split(",") if part.strip().isdigit()]


def _sample_until(
    pid: int, gpu_indices: list[int], interval_s: float, started: float, stop: threading.Event, out: list[Sample]
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
        gpus = nvml.read_gpus(gpu_indices, {p.pid for p in family}) if gpu_indices else []
        out.append(Sample(time.monotonic() - started, cpu, rss, gpus))


def _summarise(code: int, duration: float, samples: list[Sample], gpu_measured: bool, metrics_file: Path) -> RunSummary:
    job_metrics: dict[str, float | str] = {}
    if metrics_file.is_file():
        try:
            job_metrics = json.loads(metrics_file.read_text())
        except json.JSONDecodeError:
            log.warning("ignoring %s: not valid JSON", metrics_file)
    # The first CPU reading of each process is always 0 (psutil primes its counter), so skip it.
    cpu = [s.cpu_percent for s in samples[1:]]
    utils = sorted(r.util for s in samples for r in s.gpus)
    gpu_mem = [r.process_mem_mib or r.mem_used_mib for s in samples for r in s.gpus]
    return RunSummary(
        exit_code=code,
        duration_s=duration,
        samples=len(samples),
        gpu_measured=gpu_measured and bool(utils),
        cpu_percent_mean=sum(cpu) / len(cpu) if cpu else None,
        host_rss_mib_max=max((s.host_rss_mib for s in samples), default=None),
        gpu_util_mean=sum(utils) / len(utils) if utils else None,
        gpu_util_p50=_quantile(utils, 0.5),
        gpu_util_p90=_quantile(utils, 0.9),
        gpu_util_max=utils[-1] if utils else None,
        gpu_mem_mib_max=max(gpu_mem, default=None),
        job_metrics=job_metrics,
    )


def _quantile(ordered: list[float], q: float) -> float | None:
    if not ordered:
        return None
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]
