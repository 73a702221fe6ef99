"""Import GPU telemetry that a cluster already collects: NVIDIA DCGM exporter metrics, as exported from
Prometheus.

Two formats:

- ``prometheus-json``: the answer of Prometheus's HTTP API ``/api/v1/query_range`` (a ``matrix``) or
  ``/api/v1/query`` (a ``vector``), e.g. ``curl .../api/v1/query_range?query={__name__=~"DCGM_FI_.*"}&...``;
- ``prometheus-text``: the text exposition format the exporter serves on ``/metrics``. Lines that carry
  a timestamp (ms) keep it; scrapes saved one after another without timestamps (``while :; do curl
  .../metrics; sleep 1; done >> scrapes.txt``) are numbered by occurrence, ``interval_s`` apart.

Series are grouped into jobs by a label (``pod`` by default, which the exporter adds on Kubernetes) and
turned into the same :class:`~horus_airflow.telemetry.samples.Sample` objects ``horus run`` writes, so
one summary and one profiling-run format serve both. NaN, infinite or negative values are left out and
counted, never read as zero.
"""

from __future__ import annotations

import json
import re
from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Callable, Protocol

from horus_airflow.errors import HorusError
from horus_airflow.registries import Registry
from horus_airflow.telemetry.samples import GpuReading, Sample, measured
from horus_airflow.validation import in_range

# DCGM field -> (GpuReading field, factor to our unit)
DCGM_FIELDS: dict[str, tuple[str, float]] = {
    "DCGM_FI_DEV_GPU_UTIL": ("util", 1.0),  # percent
    "DCGM_FI_PROF_SM_ACTIVE": ("sm_active", 100.0),  # ratio 0-1
    "DCGM_FI_DEV_FB_USED": ("mem_used_mib", 1.0),  # MiB
    "DCGM_FI_DEV_POWER_USAGE": ("power_w", 1.0),  # W
    "DCGM_FI_DEV_MEM_COPY_UTIL": ("mem_util", 1.0),  # percent
}
_FB_FREE = "DCGM_FI_DEV_FB_FREE"
_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)(?:\s+(-?\d+))?\s*$")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


class TelemetryImportError(HorusError, ValueError):
    """A telemetry export that cannot be read at all."""


@dataclass(frozen=True)
class Series:
    metric: str
    labels: tuple[tuple[str, str], ...]
    points: tuple[tuple[float, str], ...]  # (seconds, raw value)

    def label(self, name: str) -> str:
        return dict(self.labels).get(name, "")


@dataclass(frozen=True)
class ImportedJob:
    """One job's telemetry: its group key (e.g. the pod), the GPUs it ran on and their samples."""

    key: str
    model_name: str
    memory_mib: float
    hostname: str
    gpu_indices: tuple[int, ...]
    samples: tuple[Sample, ...]
    problems: dict[str, int]


class TelemetryFormat(Protocol):
    """One export format: ``recognizes`` says whether a text is in it (to guess the format of a file),
    ``parse`` reads its series; scrapes without timestamps are numbered ``interval_s`` apart."""

    name: str

    def recognizes(self, text: str) -> bool: ...

    def parse(self, text: str, interval_s: float) -> list[Series]: ...


TELEMETRY_FORMATS: Registry[TelemetryFormat] = Registry("telemetry format")
register_telemetry_format = TELEMETRY_FORMATS.register  # readable by ``horus telemetry import --format``, guessed in this order


@dataclass(frozen=True)
class _Format:
    name: str
    recognize: Callable[[str], bool]
    read: Callable[[str, float], list[Series]]

    def recognizes(self, text: str) -> bool:
        return self.recognize(text)

    def parse(self, text: str, interval_s: float) -> list[Series]:
        return self.read(text, interval_s)


def parse(text: str, fmt: str, interval_s: float = 1.0) -> list[Series]:
    if fmt not in TELEMETRY_FORMATS:
        raise TelemetryImportError(f"unknown telemetry format {fmt!r}; accepted: {', '.join(TELEMETRY_FORMATS)}")
    return TELEMETRY_FORMATS[fmt].parse(text, interval_s)


def _parse_json(text: str) -> list[Series]:
    try:
        answer = json.loads(text)
        data = answer["data"]
        kind, results = data["resultType"], data["result"]
    except (json.JSONDecodeError, KeyError, TypeError) as exc:
        raise TelemetryImportError(
            f"not a Prometheus API answer ({exc}); expected {{'status': 'success', 'data': {{'resultType': 'matrix', 'result': [...]}}}}"
        ) from None
    if kind not in ("matrix", "vector"):
        raise TelemetryImportError(f"Prometheus resultType {kind!r} cannot be imported; accepted: matrix, vector")
    if not isinstance(results, list):
        raise TelemetryImportError(f"Prometheus result is {type(results).__name__}; expected a list of series")
    series = []
    for number, result in enumerate(results):
        try:
            labels = dict(result.get("metric", {}))
            if not all(isinstance(v, str) for v in labels.values()):
                raise ValueError(f"label values must be strings, got {labels!r}"[:300])
            name = labels.pop("__name__", "")
            raw = result.get("values") or ([result["value"]] if "value" in result else [])
            series.append(Series(name, tuple(sorted(labels.items())), tuple((_timestamp(t), str(v)) for t, v in raw)))
        except (TypeError, ValueError, AttributeError) as exc:
            raise TelemetryImportError(
                f"series {number} of the Prometheus answer does not read ({exc}); expected {{'metric': {{labels}}, "
                "'values': [[UNIX_SECONDS, \"VALUE\"], ...]}; nothing was imported"
            ) from None
    return series


def _timestamp(raw: object) -> float:
    """Unix seconds, as Prometheus writes them (a number, or a numeric string)."""
    try:
        return in_range(float(raw) if isinstance(raw, str) else raw, "timestamp", 0.0)
    except ValueError:
        raise ValueError(f"timestamp {raw!r} is not a time in Unix seconds") from None


def _parse_text(text: str, interval_s: float) -> list[Series]:
    points: dict[tuple[str, tuple[tuple[str, str], ...]], list[tuple[float, str]]] = defaultdict(list)
    unreadable = 0
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        match = _LINE.match(line)
        if not match:
            unreadable += 1
            continue
        name, label_text, value, stamp = match.groups()
        labels = tuple(sorted((k, v.replace('\\"', '"').replace("\\\\", "\\")) for k, v in _LABEL.findall(label_text or "")))
        key = (name, labels)
        t = int(stamp) / 1000.0 if stamp else len(points[key]) * interval_s
        points[key].append((t, value))
    if not points:
        raise TelemetryImportError(f"no metric line in the text ({unreadable} unreadable lines); expected the exposition format of /metrics")
    return [Series(name, labels, tuple(p)) for (name, labels), p in points.items()]


def group_jobs(series: list[Series], group_by: str = "pod") -> tuple[list[ImportedJob], dict[str, int]]:
    """Jobs by the ``group_by`` label, and counts of what was left out (series without the label,
    metrics that are not DCGM fields Horus reads)."""
    left_out: Counter[str] = Counter()
    by_job: dict[str, list[Series]] = defaultdict(list)
    for s in series:
        if s.metric not in DCGM_FIELDS and s.metric != _FB_FREE:
            left_out[f"metric {s.metric or '(unnamed)'} not read"] += 1
        elif not s.label(group_by):
            left_out[f"series without label {group_by!r}"] += 1
        else:
            by_job[s.label(group_by)].append(s)
    return [_job(key, group) for key, group in sorted(by_job.items())], dict(left_out)


def _job(key: str, series: list[Series]) -> ImportedJob:
    problems: Counter[str] = Counter()
    values: dict[float, dict[int, dict[str, float | None]]] = defaultdict(lambda: defaultdict(dict))
    free: list[float] = []
    for s in series:
        index = _gpu_index(s)
        for t, raw in s.points:
            if s.metric == _FB_FREE:
                if (v := measured(raw, "fb_free", problems)) is not None:
                    free.append(v)
                continue
            field, factor = DCGM_FIELDS[s.metric]
            values[t][index][field] = measured(raw, field, problems, factor)
    start = min(values, default=0.0)
    samples = tuple(
        Sample(t - start, None, None, tuple(
            GpuReading(index=i, **fields) for i, fields in sorted(gpus.items())
        ))
        for t, gpus in sorted(values.items())
    )
    first = series[0]
    used = [r.mem_used_mib for s in samples for r in s.gpus if r.mem_used_mib is not None]
    memory = (max(used, default=0.0) + max(free, default=0.0)) if free else 0.0
    indices = tuple(sorted({_gpu_index(s) for s in series}))
    return ImportedJob(key, first.label("modelName"), memory, first.label("Hostname") or first.label("instance"), indices, samples, dict(problems))


def _gpu_index(series: Series) -> int:
    raw = series.label("gpu") or series.label("device").removeprefix("nvidia")
    return int(raw) if raw.isdigit() else 0


def guess_format(text: str) -> str:
    """The first registered format that recognizes the text (JSON for an API answer, else the text format)."""
    for fmt in TELEMETRY_FORMATS.values():
        if fmt.recognizes(text):
            return fmt.name
    raise TelemetryImportError(f"the export is in no known format; accepted: {', '.join(TELEMETRY_FORMATS)}")


register_telemetry_format(_Format("prometheus-json", lambda text: text.lstrip().startswith("{"), lambda text, _interval: _parse_json(text)))
register_telemetry_format(_Format("prometheus-text", lambda text: True, _parse_text))
