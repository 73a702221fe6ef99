"""Where the Horus view reads from, read-only: the cluster (the local SQLite ledger or the Kubernetes
API), live telemetry of local jobs, and MLflow (registered models, profiling and simulation runs).

Nothing here writes: the ledger is opened with SQLite ``mode=ro``, the Kubernetes reader never
reconciles or creates the ledger, and MLflow is only searched and downloaded from.
"""

from __future__ import annotations

import json
import logging
import math
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from horus_airflow.backends.ledger import JournalEntry, LedgerReader
from horus_airflow.backends.local import discover_inventory
from horus_airflow.errors import HorusError
from horus_airflow.placement import ClusterState
from horus_airflow.run_schema import Experiment, Metric, Param, Tag, tag_equals
from horus_airflow.registry.store import QUICK, client, http_policy, search
from horus_airflow.settings import Settings
from horus_airflow.telemetry.samples import Sample
from horus_airflow.telemetry.wrapper import SAMPLES_FILE
from horus_airflow.ui.model import ClusterMap, DecisionRow, Measured, Placement, QueueRow, queue_rows

if TYPE_CHECKING:  # the kubernetes client is an optional dependency: imported only by that source
    from horus_airflow.backends.kubernetes import (
        KubernetesBackend,
        LedgerEntry,
        ReadOnlyView,
    )

log = logging.getLogger(__name__)

REGISTERED_MODELS = ("horus-gpu-utilization", "horus-interference")
SOURCES = ("local", "kubernetes")
SHOWN_ARTIFACTS = (".png", ".json", ".txt")
_TAIL_BYTES = 16_384


class SourceUnavailable(HorusError):
    """A store the view reads from cannot be reached or read; the message says which and why."""


class ClusterSource(Protocol):
    name: str

    def cluster(self) -> ClusterMap: ...

    def decisions(self, limit: int, before: float | None, dag_id: str | None) -> list[DecisionRow]: ...

    def decision(self, reservation_id: str) -> DecisionRow | None: ...

    def queue(self) -> tuple[list[QueueRow], str | None]:
        """The waiting tasks in queue order, and a note when this source keeps no queue."""
        ...


def cluster_source(settings: Settings) -> ClusterSource:
    """The source ``HORUS_UI_SOURCE`` names; anything else is refused with what is accepted."""
    if settings.ui_source == "local":
        return LocalSource(settings)
    if settings.ui_source == "kubernetes":
        return KubernetesSource(settings)
    raise HorusError(f"HORUS_UI_SOURCE={settings.ui_source!r} is not a source; accepted: {', '.join(SOURCES)}")


class LocalSource:
    """This machine's GPUs, the SQLite ledger and the telemetry its jobs are writing now."""

    name = "local"

    def __init__(self, settings: Settings, clock: Callable[[], float] = time.time) -> None:
        self.settings = settings
        self.clock = clock
        self.ledger = LedgerReader(settings.ledger_path)

    def cluster(self) -> ClusterMap:
        now = self.clock()
        notes = []
        try:
            gpus = discover_inventory(self.settings.local_gpus)
        except HorusError as exc:
            return ClusterMap(self.name, now, ClusterState(()), {}, {}, (f"No GPUs to show: {exc}",))
        version, residents = self.ledger.active(now)
        live = self.ledger.live(now)
        state = ClusterState(tuple(replace(g, residents=tuple(residents.get(g.gpu_id, ()))) for g in gpus), version)
        if not self.ledger.exists:
            notes.append(f"No placements yet: the ledger {self.settings.ledger_path.name} under HORUS_HOME does not "
                         "exist. Run a DAG with HorusTrainingOperator (make demo does) and its tasks appear here.")
        elif not live:
            notes.append("No task holds a GPU now. Recent placements are on the Decisions page.")
        placements = {e.job_id: Placement(e.reservation_id, e.job_id, e.owner) for e in live}
        return ClusterMap(self.name, now, state, placements, live_measurements(self.settings.runs_dir, live, now), tuple(notes))

    def decisions(self, limit: int, before: float | None, dag_id: str | None) -> list[DecisionRow]:
        now = self.clock()
        return [_journal_row(e, now) for e in self.ledger.journal(limit, before, f"{dag_id}/" if dag_id else "")]

    def decision(self, reservation_id: str) -> DecisionRow | None:
        entry = self.ledger.entry(reservation_id)
        return None if entry is None else _journal_row(entry, self.clock())

    def queue(self) -> tuple[list[QueueRow], str | None]:
        now = self.clock()
        return queue_rows(self.ledger.queue(now), now), None


def _journal_row(entry: JournalEntry, now: float) -> DecisionRow:
    first = entry.bookings[0]
    note = entry.note
    return DecisionRow(
        entry.reservation_id, entry.job_id, entry.owner, entry.created_at, entry.status(now),
        tuple(b.gpu_id for b in entry.bookings), first.util, first.util_p90, first.mem_mib,
        note.profile if note else "", note.reason if note else "placed before decisions were journaled",
        note.explanation if note else None,
    )


def live_measurements(runs_dir: Path, live: Iterable[JournalEntry], now: float) -> dict[str, Measured]:
    """The last GPU reading each live local job's telemetry wrapper wrote (``runs/<job>/samples.jsonl``),
    by GPU id; a GPU NVML did not measure (a declared GPU) has none."""
    measured: dict[str, Measured] = {}
    for entry in live:
        path = runs_dir / entry.job_id / SAMPLES_FILE
        sample = _last_sample(path)
        if sample is None:
            continue
        age = max(0.0, now - path.stat().st_mtime)
        for reading in sample.gpus:
            if reading.util is None and reading.mem_used_mib is None:
                continue
            gpu_id = f"{entry.bookings[0].gpu_id.rsplit('/', 1)[0]}/{reading.index}"
            current = measured.get(gpu_id)
            if current is None or age < current.age_s:
                measured[gpu_id] = Measured(reading.util, reading.mem_used_mib, age)
    return measured


def _last_sample(path: Path) -> Sample | None:
    """The newest complete line of a samples file the wrapper may be writing right now."""
    try:
        with path.open("rb") as handle:
            handle.seek(0, 2)
            size = handle.tell()
            handle.seek(max(0, size - _TAIL_BYTES))
            lines = handle.read().decode(errors="replace").splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        try:
            return Sample.from_mapping(json.loads(line), Counter())
        except (json.JSONDecodeError, KeyError, TypeError, ValueError):
            continue
    return None


class KubernetesSource:
    """The cluster as the Kubernetes API shows it (GPU nodes, the ledger ConfigMap, Horus pods with their
    placement annotations); read-only, see :meth:`KubernetesBackend.view`."""

    name = "kubernetes"

    def __init__(self, settings: Settings, clock: Callable[[], float] = time.time) -> None:
        self.settings = settings
        self.clock = clock
        self._backend: KubernetesBackend | None = None

    def _view(self) -> ReadOnlyView:
        from horus_airflow.backends.kubernetes import (
            KubernetesBackend,
            KubernetesOptions,
            api_from_kubeconfig,
        )

        if self._backend is None:
            api = api_from_kubeconfig(self.settings.kubeconfig, self.settings.kube_context)
            options = KubernetesOptions(namespace=self.settings.kubernetes_namespace, attempts=2, request_timeout_s=5.0)
            self._backend = KubernetesBackend(api, options, clock=self.clock)
        try:
            return self._backend.view()
        except HorusError as exc:
            raise SourceUnavailable(str(exc)) from None

    def cluster(self) -> ClusterMap:
        view = self._view()
        placements = {e.job_id: Placement(rid, e.job_id, e.owner) for rid, e in view.entries.items()}
        if not view.state.gpus:
            notes = ("No GPU nodes found: nodes need the GPU feature discovery label nvidia.com/gpu.product (docs/KUBERNETES.md).",)
        elif not placements:
            notes = ("No Horus task holds a GPU now. Run a DAG with HorusKubernetesPodOperator and its pods appear here.",)
        else:
            notes = ()
        return ClusterMap(self.name, self.clock(), view.state, placements, {}, notes)

    def decisions(self, limit: int, before: float | None, dag_id: str | None) -> list[DecisionRow]:
        return [r for r in self._rows() if (before is None or r.created_at < before)
                and (dag_id is None or r.owner.startswith(f"{dag_id}/"))][:limit]

    def decision(self, reservation_id: str) -> DecisionRow | None:
        return next((r for r in self._rows() if r.reservation_id == reservation_id), None)

    def queue(self) -> tuple[list[QueueRow], str | None]:
        now = self.clock()
        return queue_rows(self._view().queue, now), None

    def _rows(self) -> list[DecisionRow]:
        """Placements whose pods still exist (finished pods are deleted by default; their decisions stay
        in their MLflow profiling runs) and bookings whose pods are not created yet."""
        from horus_airflow.backends.kubernetes import BOOKING_ANNOTATION, LedgerEntry

        view = self._view()
        rows: dict[str, DecisionRow] = {}
        for pod in view.pods:
            if not pod.reservation_id or BOOKING_ANNOTATION not in pod.annotations:
                continue
            try:
                entry = LedgerEntry.from_json(pod.annotations[BOOKING_ANNOTATION])
            except (ValueError, KeyError, TypeError):
                continue
            status = "deleting" if pod.deleting else pod.phase.lower()
            rows[entry.reservation_id] = _entry_row(entry, status, pod.annotations)
        for rid, entry in view.entries.items():
            rows.setdefault(rid, _entry_row(entry, "reserved, no pod yet", {}))
        return sorted(rows.values(), key=lambda r: r.created_at, reverse=True)


def _entry_row(entry: LedgerEntry, status: str, annotations: Mapping[str, str]) -> DecisionRow:
    first = entry.bookings[0]
    return DecisionRow(
        entry.reservation_id, entry.job_id, entry.owner, entry.created_at, status,
        tuple(b.gpu_id for b in entry.bookings), first.util, first.util_p90, first.mem_mib,
        annotations.get("horus.ai/profile", ""), annotations.get("horus.ai/placement-reason", "(pod not created yet)"),
        annotations.get("horus.ai/explanation"),
    )


# --- MLflow ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ModelVersionRow:
    name: str
    version: str
    created_at: float
    run_id: str | None
    aliases: tuple[str, ...]
    metrics: dict[str, float]


@dataclass(frozen=True)
class ProfilingPoint:
    """A profiling run that measured its GPU, with what was predicted for it."""

    run_id: str
    experiment_id: str
    name: str
    model: str
    gpu_type: str
    started_at: float
    predicted_util: float | None
    measured_util: float | None
    predicted_mem_mib: float | None
    measured_mem_mib: float | None


@dataclass(frozen=True)
class SimulationRun:
    run_id: str
    experiment_id: str
    name: str
    started_at: float
    params: dict[str, str]
    metrics: dict[str, dict[str, float]]  # profile -> metric -> value
    artifacts: tuple[str, ...]


class MlflowReader:
    """Searches of the tracking server, each failure turned into :class:`SourceUnavailable`."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    def _call(self, what: str, fn: Callable[[], Any]) -> Any:
        try:
            with http_policy(QUICK):
                return fn()
        except Exception as exc:  # noqa: BLE001 - MlflowException, and requests/urllib3/sqlalchemy errors of a store gone away
            first = (str(exc).splitlines() or [type(exc).__name__])[0][:300]
            raise SourceUnavailable(f"MLflow at {self.settings.mlflow_tracking_uri} could not {what}: {type(exc).__name__}: {first}") from None

    def run_url(self, experiment_id: str, run_id: str) -> str | None:
        base = self.settings.mlflow_ui_url or (
            self.settings.mlflow_tracking_uri if self.settings.mlflow_tracking_uri.startswith(("http://", "https://")) else None)
        return f"{base.rstrip('/')}/#/experiments/{experiment_id}/runs/{run_id}" if base else None

    def model_versions(self, name: str, limit: int) -> list[ModelVersionRow]:
        mlflow = client(self.settings)

        def read() -> list[ModelVersionRow]:
            try:
                aliases = mlflow.get_registered_model(name).aliases
            except Exception as exc:
                if "RESOURCE_DOES_NOT_EXIST" in str(getattr(exc, "error_code", "")) or "not found" in str(exc):
                    return []
                raise
            by_version: dict[str, list[str]] = {}
            for alias, version in aliases.items():
                by_version.setdefault(str(version), []).append(alias)
            versions = sorted(mlflow.search_model_versions(f"name = '{name}'"), key=lambda v: int(v.version))[-limit:]
            rows = []
            for v in versions:
                metrics = _finite(mlflow.get_run(v.run_id).data.metrics) if v.run_id else {}
                rows.append(ModelVersionRow(name, str(v.version), v.creation_timestamp / 1000, v.run_id,
                                            tuple(sorted(by_version.get(str(v.version), ()))), metrics))
            return rows

        return self._call(f"list the versions of {name}", read)

    def profiling_points(self, limit: int) -> tuple[list[ProfilingPoint], int]:
        """The latest profiling runs that measured their GPU, and how many of the latest ``limit`` did not."""
        def read() -> tuple[list[ProfilingPoint], int]:
            runs = search(self.settings, Experiment.PROFILING, tag_equals(Tag.GPU_MEASURED, "true"),
                          order_by=["attributes.start_time DESC"], max_results=limit, policy=QUICK)
            unmeasured = search(self.settings, Experiment.PROFILING, f"tags.`{Tag.GPU_MEASURED}` != 'true'", max_results=limit,
                                policy=QUICK)
            points = [ProfilingPoint(
                r.info.run_id, r.info.experiment_id, r.info.run_name or r.info.run_id, r.data.params.get(Param.MODEL, "?"),
                r.data.tags.get(Tag.GPU_TYPE, "?"), r.info.start_time / 1000,
                _number(r.data.params.get(Param.PREDICTED_UTIL)), r.data.metrics.get(Metric.GPU_UTIL_MEAN),
                _number(r.data.params.get(Param.PREDICTED_MEM_MIB)), r.data.metrics.get(Metric.GPU_MEM_MIB_MAX),
            ) for r in runs]
            return points, len(unmeasured)

        return self._call("search the profiling runs", read)

    def runs_of_reservation(self, reservation_id: str) -> list[dict[str, Any]]:
        def read() -> list[dict[str, Any]]:
            runs = search(self.settings, Experiment.PROFILING, tag_equals(Tag.RESERVATION_ID, reservation_id),
                          max_results=10, policy=QUICK)
            return [{"run_id": r.info.run_id, "experiment_id": r.info.experiment_id, "name": r.info.run_name,
                     "status": r.info.status, "url": self.run_url(r.info.experiment_id, r.info.run_id)} for r in runs]

        return self._call("search the profiling runs", read)

    def simulations(self, limit: int) -> list[SimulationRun]:
        mlflow = client(self.settings)

        def read() -> list[SimulationRun]:
            found = []
            for r in search(self.settings, Experiment.SIMULATIONS, "attributes.status = 'FINISHED'",
                            order_by=["attributes.start_time DESC"], max_results=limit, policy=QUICK):
                metrics: dict[str, dict[str, float]] = {}
                for key, value in _finite(r.data.metrics).items():
                    profile, _, metric = key.partition(".")
                    if metric:
                        metrics.setdefault(profile, {})[metric] = value
                artifacts = tuple(a.path for a in mlflow.list_artifacts(r.info.run_id) if a.path.endswith(SHOWN_ARTIFACTS))
                found.append(SimulationRun(r.info.run_id, r.info.experiment_id, r.info.run_name or r.info.run_id, r.info.start_time / 1000,
                                           dict(r.data.params), metrics, artifacts))
            return found

        return self._call("search the simulation runs", read)

    def simulation_artifact(self, run_id: str, name: str) -> bytes | None:
        """One top-level artifact of a simulation run; None when the run is not a simulation or has no
        such artifact (only the listed names are ever fetched, so no path can escape the run)."""
        mlflow = client(self.settings)

        def read() -> bytes | None:
            experiment = mlflow.get_experiment_by_name(Experiment.SIMULATIONS)
            try:
                run = mlflow.get_run(run_id)
            except Exception as exc:
                if "RESOURCE_DOES_NOT_EXIST" in str(getattr(exc, "error_code", "")):
                    return None
                raise
            if experiment is None or run.info.experiment_id != experiment.experiment_id:
                return None
            if name not in {a.path for a in mlflow.list_artifacts(run_id)} or not name.endswith(SHOWN_ARTIFACTS):
                return None
            with tempfile.TemporaryDirectory() as tmp:
                return Path(mlflow.download_artifacts(run_id, name, tmp)).read_bytes()

        return self._call(f"read artifact {name} of run {run_id}", read)


def _number(text: str | None) -> float | None:
    try:
        value = None if text is None else float(text)
    except ValueError:
        return None
    return value if value is not None and math.isfinite(value) else None


def _finite(metrics: Mapping[str, float]) -> dict[str, float]:
    """JSON has no NaN: a metric that came out NaN (an R² on one row) is left out."""
    return {k: v for k, v in metrics.items() if math.isfinite(v)}

