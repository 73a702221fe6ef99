"""Telemetry samples as data: what one instant of a job looked like, how a run's samples summarise,
and how they are read back from files that may be cut short.

A value that was not measured is ``None``, never zero. A value that arrives as NaN, infinite, negative
or beyond what any GPU can show (1e308 % busy, an exabyte of memory: a broken exporter, a driver
glitch) is treated as not measured, and counted.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable

import pandas as pd


@dataclass(frozen=True)
class GpuReading:
    """One GPU at one instant. Device-wide values see every process on the GPU; ``process_*`` values
    only the watched job's processes; ``co_resident_pids`` are the other processes computing on it."""

    index: int
    util: float | None = None
    mem_used_mib: float | None = None
    process_mem_mib: float | None = None
    power_w: float | None = None
    mem_util: float | None = None
    sm_active: float | None = None
    process_sm_util: float | None = None
    process_mem_util: float | None = None
    co_resident_pids: tuple[int, ...] = ()


@dataclass(frozen=True)
class Sample:
    t_s: float
    cpu_percent: float | None
    host_rss_mib: float | None
    gpus: tuple[GpuReading, ...] = ()

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_mapping(cls, raw: dict[str, Any], problems: Counter[str]) -> Sample:
        gpus = tuple(
            GpuReading(
                index=int(g["index"]),
                **{k: measured(g.get(k), k, problems) for k in _GPU_VALUES},
                co_resident_pids=tuple(int(p) for p in g.get("co_resident_pids", ())),
            )
            for g in raw.get("gpus", ())
        )
        return cls(float(raw["t_s"]), measured(raw.get("cpu_percent"), "cpu_percent", problems),
                   measured(raw.get("host_rss_mib"), "host_rss_mib", problems), gpus)


_GPU_VALUES = ("util", "mem_used_mib", "process_mem_mib", "power_w", "mem_util", "sm_active", "process_sm_util", "process_mem_util")


# The most a reading can physically be: percentages 100; memory 1 TiB (no GPU holds more); power
# 5 kW (a GPU board draws at most about 1.2 kW); a process's CPU use 100 % per core of a 1,024-core host.
_PLAUSIBLE_MAX = {
    "util": 100.0, "mem_util": 100.0, "sm_active": 100.0, "process_sm_util": 100.0, "process_mem_util": 100.0,
    "mem_used_mib": 1_048_576.0, "process_mem_mib": 1_048_576.0, "fb_free": 1_048_576.0, "power_w": 5_000.0,
    "cpu_percent": 102_400.0,
}


def measured(value: Any, name: str, problems: Counter[str], scale: float = 1.0) -> float | None:
    """``value`` × ``scale`` as a float, or None when absent; NaN, infinite, negative or impossibly large
    values (``_PLAUSIBLE_MAX``) count as problems."""
    if value is None:
        return None
    try:
        number = float(value) * scale
    except (TypeError, ValueError):
        problems[f"{name} not a number"] += 1
        return None
    if math.isnan(number) or math.isinf(number) or number < 0:
        problems[f"{name} NaN, infinite or negative"] += 1
        return None
    if number > _PLAUSIBLE_MAX.get(name, math.inf):
        problems[f"{name} above {_PLAUSIBLE_MAX[name]:g}"] += 1
        return None
    return number


@dataclass(frozen=True)
class SampleFile:
    """Samples read back from a JSON-lines file, with what had to be left out and why."""

    samples: tuple[Sample, ...]
    problems: dict[str, int] = field(default_factory=dict)


def read_samples(path: Path) -> SampleFile:
    """Every readable line of ``path``; a line cut short (the writer was killed) or garbled is counted,
    not fatal, and the lines around it are kept."""
    problems: Counter[str] = Counter()
    samples = []
    for line in path.read_text(errors="replace").splitlines():
        if not line.strip():
            continue
        try:
            samples.append(Sample.from_mapping(json.loads(line), problems))
        except (json.JSONDecodeError, KeyError, TypeError, ValueError):
            problems["unreadable line (cut short or garbled)"] += 1
    return SampleFile(tuple(samples), dict(problems))


def samples_frame(samples: Iterable[Sample]) -> pd.DataFrame:
    """One row per sample and GPU (a row with ``gpu_index`` empty where no GPU was measured): the
    Parquet artifact of a profiling run."""
    rows = []
    for sample in samples:
        base = {"t_s": sample.t_s, "cpu_percent": sample.cpu_percent, "host_rss_mib": sample.host_rss_mib}
        if not sample.gpus:
            rows.append({**base, "gpu_index": None})
        for gpu in sample.gpus:
            rows.append({**base, "gpu_index": gpu.index, **{k: getattr(gpu, k) for k in _GPU_VALUES},
                         "co_resident_pids": ",".join(str(p) for p in gpu.co_resident_pids)})
    frame = pd.DataFrame(rows)
    for column in ("cpu_percent", "host_rss_mib", *_GPU_VALUES):
        if column in frame:
            frame[column] = frame[column].astype("Float64")
    if "gpu_index" in frame:
        frame["gpu_index"] = frame["gpu_index"].astype("Int64")
    return frame


@dataclass(frozen=True)
class GpuSummary:
    """The GPU side of a run's summary, named as in :class:`~horus_airflow.telemetry.RunSummary`;
    every field None when nothing was measured."""

    gpu_util_mean: float | None = None
    gpu_util_p50: float | None = None
    gpu_util_p90: float | None = None
    gpu_util_max: float | None = None
    gpu_mem_mib_max: float | None = None
    gpu_sm_active_mean: float | None = None
    gpu_process_sm_util_mean: float | None = None
    gpu_power_w_mean: float | None = None
    co_resident_pids: list[int] = field(default_factory=list)


def summarise_gpus(samples: Iterable[Sample]) -> GpuSummary:
    readings = [r for s in samples for r in s.gpus]
    utils = sorted(r.util for r in readings if r.util is not None)
    memory = [m for r in readings if (m := r.process_mem_mib or r.mem_used_mib) is not None]
    return GpuSummary(
        gpu_util_mean=_mean(utils),
        gpu_util_p50=quantile(utils, 0.5),
        gpu_util_p90=quantile(utils, 0.9),
        gpu_util_max=utils[-1] if utils else None,
        gpu_mem_mib_max=max(memory, default=None),
        gpu_sm_active_mean=_mean([r.sm_active for r in readings if r.sm_active is not None]),
        gpu_process_sm_util_mean=_mean([r.process_sm_util for r in readings if r.process_sm_util is not None]),
        gpu_power_w_mean=_mean([r.power_w for r in readings if r.power_w is not None]),
        co_resident_pids=sorted({p for r in readings for p in r.co_resident_pids}),
    )


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def quantile(ordered: list[float], q: float) -> float | None:
    if not ordered:
        return None
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]
