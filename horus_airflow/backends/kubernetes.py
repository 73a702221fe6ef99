"""Kubernetes backend: GPU inventory from node labels, a reservation ledger on the API server, and
reconciliation against the pods that really run.

- **Inventory.** Nodes labelled by NVIDIA GPU feature discovery (``nvidia.com/gpu.product``,
  ``nvidia.com/gpu.count``, ``nvidia.com/gpu.memory``); a node offers ``min(count, allocatable
  nvidia.com/gpu)`` GPUs. Cordoned or NotReady nodes stay in the state as unhealthy, so explanations say
  why they were skipped. GPUs that pods outside Horus requested are shown as taken.
- **Ledger.** One ConfigMap (``horus-ledger``), one key per reservation. Every write is a PUT carrying
  the ``resourceVersion`` the placer decided on: a 409 means someone wrote in between, and the caller
  re-reads and decides again.
- **Reconciliation,** on every snapshot: a reservation lives while its pod (label
  ``horus.ai/reservation``) is Pending or Running, or, before the pod exists, until its lease expires.
  A pod Pending past its deadline is deleted and its reservation dropped. A running Horus pod whose
  reservation is missing (the ledger was lost) is adopted back from its annotation.

API calls that fail with 429, 5xx or a timeout are retried with exponential backoff, then raise
:class:`KubernetesApiError`. The caller passes the time in: nothing here reads the clock on its own.
"""

from __future__ import annotations

import json
import logging
import os
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any, TypeVar

import urllib3
from kubernetes import client as kube_client
from kubernetes import config as kube_config
from kubernetes.client.exceptions import ApiException
from kubernetes.config.config_exception import ConfigException

from horus_airflow.backends.binding import GPU_RESOURCE
from horus_airflow.backends.ledger import Booking, QueueEntry, Reservation, RoundBooking
from horus_airflow.backends.scheduler import CREDIT_WINDOW_S
from horus_airflow.errors import (
    KubernetesApiError,
    KubernetesConfigError,
    LedgerConflictError,
    NoPlacementError,
)
from horus_airflow.features.gpus import gpu_type_from_nvml
from horus_airflow.placement import ClusterState, Decision, GpuState, Resident
from horus_airflow.predictor.demand import Demand

log = logging.getLogger(__name__)

PRODUCT_LABEL = "nvidia.com/gpu.product"
COUNT_LABEL = "nvidia.com/gpu.count"
MEMORY_LABEL = "nvidia.com/gpu.memory"
ZONE_LABEL = "topology.kubernetes.io/zone"
RESERVATION_LABEL = "horus.ai/reservation"
BOOKING_ANNOTATION = "horus.ai/booking"
_RETRYABLE = {429, 500, 502, 503, 504}
_LIVE = {"Pending", "Running"}


@dataclass(frozen=True)
class KubernetesOptions:
    """Where the ledger lives (one namespace for the whole cluster: the pods may run in any) and how hard
    to try the API server."""

    namespace: str = "horus"
    ledger_name: str = "horus-ledger"
    lease_s: float = 300.0
    pending_deadline_s: float = 600.0
    request_timeout_s: float = 10.0
    attempts: int = 5
    backoff_s: float = 0.2
    max_backoff_s: float = 5.0


@dataclass(frozen=True)
class LedgerEntry:
    """One reservation as stored in the ledger and, for adoption after a restart, on its pod."""

    reservation_id: str
    job_id: str
    owner: str
    created_at: float
    lease_expires_at: float
    pending_deadline: float
    bookings: tuple[Booking, ...]

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> LedgerEntry:
        raw = json.loads(text)
        bookings = tuple(
            Booking(b["gpu_id"], float(b["util"]), float(b["util_p90"]), float(b["mem_mib"]), tuple(b.get("signature", ())))
            for b in raw["bookings"]
        )
        return cls(
            raw["reservation_id"], raw["job_id"], raw["owner"], float(raw["created_at"]),
            float(raw["lease_expires_at"]), float(raw["pending_deadline"]), bookings,
        )

    @property
    def reservation(self) -> Reservation:
        return Reservation(self.reservation_id, self.job_id, self.owner, tuple(b.gpu_id for b in self.bookings), self.lease_expires_at)


@dataclass(frozen=True)
class PodView:
    """What reconciliation needs of a pod."""

    namespace: str
    name: str
    phase: str
    node: str
    reservation_id: str | None
    deleting: bool
    gpu_request: int
    booking: str | None
    annotations: Mapping[str, str] = field(default_factory=dict)
    created: str = ""

    @property
    def live(self) -> bool:
        return self.phase in _LIVE and not self.deleting

    @classmethod
    def from_api(cls, raw: Mapping[str, Any]) -> PodView:
        meta, spec, status = raw.get("metadata", {}), raw.get("spec", {}), raw.get("status", {}) or {}
        requested = 0
        for container in spec.get("containers", []):
            resources = container.get("resources") or {}
            amount = (resources.get("limits") or {}).get(GPU_RESOURCE) or (resources.get("requests") or {}).get(GPU_RESOURCE)
            requested += int(amount or 0)
        return cls(
            meta.get("namespace", ""), meta.get("name", ""), status.get("phase", "Pending"), spec.get("nodeName", ""),
            (meta.get("labels") or {}).get(RESERVATION_LABEL), bool(meta.get("deletionTimestamp")), requested,
            (meta.get("annotations") or {}).get(BOOKING_ANNOTATION), dict(meta.get("annotations") or {}),
            meta.get("creationTimestamp") or "",
        )


@dataclass(frozen=True)
class Reconciled:
    """The ledger as it should be, and what changed: reasons per dropped reservation, adopted ones,
    pods to delete because they sat Pending past their deadline."""

    entries: dict[str, LedgerEntry]
    dropped: dict[str, str] = field(default_factory=dict)
    adopted: tuple[str, ...] = ()
    stuck: tuple[PodView, ...] = ()

    @property
    def changed(self) -> bool:
        return bool(self.dropped or self.adopted)


_T = TypeVar("_T")
_QUEUE_FULL_BYTES = 768 * 1024  # a ConfigMap holds 1 MiB: the rest is room for the bookings rounds add
_REASON_CHARS = 500  # a reason names GPUs: on a large cluster it is cut, so the ConfigMap stays small


def _waiting(ledger: _LedgerRead, now: float) -> list[QueueEntry]:
    waiting = [e for e in ledger.queue.values() if e.status(now) == "waiting"]
    return sorted(waiting, key=lambda e: (e.enqueued_at, e.entry_id))


def _without_stale_entries(ledger: _LedgerRead, now: float) -> dict[str, str]:
    """The ledger's data less the queue entries whose lease ran out, or whose booking is gone (released
    or dropped by reconciliation) before their task took it: a ConfigMap holds at most 1 MiB."""
    stale = {QUEUE_PREFIX + entry_id for entry_id, entry in ledger.queue.items()
             if entry.status(now) == "expired" or (entry.reservation_id is not None and entry.reservation_id not in ledger.entries)}
    return {k: v for k, v in ledger.data.items() if k not in stale}


def reconcile(entries: Mapping[str, LedgerEntry], pods: Mapping[str, PodView], now: float) -> Reconciled:
    """Which reservations still hold GPUs, given the Horus pods by reservation id. Pure."""
    kept: dict[str, LedgerEntry] = {}
    dropped: dict[str, str] = {}
    stuck: list[PodView] = []
    for rid, entry in entries.items():
        pod = pods.get(rid)
        if pod is None:
            if now < entry.lease_expires_at:
                kept[rid] = entry
            else:
                dropped[rid] = "no pod and its lease expired"
        elif not pod.live:
            dropped[rid] = f"pod {pod.name} is {'being deleted' if pod.deleting else pod.phase}"
        elif pod.phase == "Pending" and now > entry.pending_deadline:
            dropped[rid] = f"pod {pod.name} Pending past its deadline"
            stuck.append(pod)
        else:
            kept[rid] = entry
    adopted = []
    for rid, pod in pods.items():
        if rid not in entries and pod.live and pod.booking:
            try:
                kept[rid] = LedgerEntry.from_json(pod.booking)
                adopted.append(rid)
            except (ValueError, KeyError, TypeError) as exc:
                log.warning("pod %s/%s has an unreadable %s annotation (%s); not adopted", pod.namespace, pod.name, BOOKING_ANNOTATION, exc)
    return Reconciled(kept, dropped, tuple(adopted), tuple(stuck))


def node_gpus(node: Mapping[str, Any]) -> list[GpuState]:
    """The GPUs GPU feature discovery labelled on a node; [] for a node without (known) GPUs."""
    meta, spec, status = node.get("metadata", {}), node.get("spec", {}) or {}, node.get("status", {}) or {}
    labels, name = meta.get("labels") or {}, meta.get("name", "")
    product = labels.get(PRODUCT_LABEL)
    if not product:
        return []
    try:
        labelled = int(labels.get(COUNT_LABEL, "0"))
        memory_mib = float(labels.get(MEMORY_LABEL, "0"))
        allocatable = int((status.get("allocatable") or {}).get(GPU_RESOURCE, labelled))
    except ValueError:
        log.warning("node %s has GPU labels that are not numbers; left out", name)
        return []
    gpu_type = gpu_type_from_nvml(product, memory_mib)
    if gpu_type is None:
        log.warning("node %s: GPU %r is not in the spec table; left out of placement", name, product)
        return []
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])
    healthy = ready and not spec.get("unschedulable", False)
    rack = labels.get(ZONE_LABEL, "")
    return [
        GpuState(f"{name}/{i}", name, i, gpu_type, memory_mib, healthy=healthy, rack=rack)
        for i in range(min(labelled, allocatable))
    ]


def api_from_kubeconfig(path: str | None = None, context: str | None = None) -> kube_client.CoreV1Api:
    """A CoreV1Api from a kubeconfig (or the in-cluster service account when ``path`` is None and one
    exists); a configuration that does not work raises :class:`KubernetesConfigError` in one line."""
    try:
        if path is None and kube_config.incluster_config.SERVICE_HOST_ENV_NAME in os.environ:
            kube_config.load_incluster_config()
            return kube_client.CoreV1Api()
        return kube_client.CoreV1Api(kube_config.new_client_from_config(config_file=path, context=context))
    except (ConfigException, OSError, ValueError, TypeError) as exc:
        where = path or "the default kubeconfig"
        raise KubernetesConfigError(f"kubeconfig {where} does not work: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}") from None


class _Api:
    """Calls with a timeout, retries with backoff on 429/5xx/timeouts, raw JSON answers."""

    def __init__(self, options: KubernetesOptions, sleep: Callable[[float], None], host: str) -> None:
        self.options = options
        self.sleep = sleep
        self.host = host
        self.retries = 0

    def call(self, what: str, method: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        options = self.options
        last = ""
        for attempt in range(options.attempts):
            try:
                response = method(*args, _request_timeout=options.request_timeout_s, _preload_content=False, **kwargs)
                data = response.data
                return json.loads(data) if data else None
            except ApiException as exc:
                if exc.status not in _RETRYABLE:
                    raise
                last = f"{exc.status} {exc.reason}"
            except (urllib3.exceptions.HTTPError, TimeoutError, ConnectionError) as exc:
                last = type(exc).__name__
            if attempt + 1 < options.attempts:
                self.retries += 1
                self.sleep(min(options.max_backoff_s, options.backoff_s * 2**attempt))
        raise KubernetesApiError(f"Kubernetes API at {self.host}: {what} failed {options.attempts} times, last with {last}")


QUEUE_PREFIX = "queue."  # ConfigMap keys of queue entries: queue.<entry id>
WAITS_KEY = "queue-waits"  # recent waits of tasks that took their booking, for the credit policy


@dataclass(frozen=True)
class _LedgerRead:
    version: str
    data: dict[str, str]
    entries: dict[str, LedgerEntry]
    queue: dict[str, QueueEntry] = field(default_factory=dict)  # by entry id
    waits: tuple[tuple[str, float, float], ...] = ()  # (pool, enqueued at, booked at) of entries taken


@dataclass(frozen=True)
class ReadOnlyView:
    """The cluster as a reader sees it: the state, the live bookings by reservation id, the Horus pods
    and the entries waiting in the queue, oldest first."""

    state: ClusterState
    entries: Mapping[str, LedgerEntry]
    pods: tuple[PodView, ...]
    queue: tuple[QueueEntry, ...] = ()


@dataclass(frozen=True)
class _Read:
    nodes: list[dict[str, Any]]
    horus_pods: tuple[PodView, ...]
    foreign: tuple[PodView, ...]
    ledger: _LedgerRead


class KubernetesBackend:
    """Snapshot, reserve and release against the API server. ``clock`` is wall time: leases are shared
    by every worker."""

    def __init__(
        self,
        api: kube_client.CoreV1Api,
        options: KubernetesOptions | None = None,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.core = api
        self.options = options or KubernetesOptions()
        self.clock = clock
        self._api = _Api(self.options, sleep, api.api_client.configuration.host)
        self._gpus: dict[str, GpuState] = {}
        self._written: dict[str, LedgerEntry] = {}

    @property
    def retries(self) -> int:
        """API calls retried so far (429, 5xx, timeouts)."""
        return self._api.retries

    # --- reading ---------------------------------------------------------------------------------
    def snapshot(self) -> ClusterState:
        """The GPUs, who holds them, and the ledger version this was read at; reconciles on the way."""
        for _ in range(self.options.attempts):
            read = self._read(create_ledger=True)
            ledger = read.ledger
            result = reconcile(ledger.entries, {p.reservation_id: p for p in read.horus_pods if p.reservation_id}, self.clock())
            version = ledger.version
            if result.changed:
                data = {k: v for k, v in ledger.data.items() if k not in result.dropped}
                data.update({rid: result.entries[rid].to_json() for rid in result.adopted})
                try:
                    version = self._write_ledger(ledger.version, data)
                except LedgerConflictError:
                    continue
                for rid, why in result.dropped.items():
                    log.info("reservation %s released by reconciliation: %s", rid, why)
                if result.adopted:
                    log.warning("%d reservation(s) missing from the ledger were rebuilt from their running pods: %s",
                                len(result.adopted), ", ".join(result.adopted[:10]) + (" ..." if len(result.adopted) > 10 else ""))
            for pod in result.stuck:
                self._delete_pod(pod.namespace, pod.name)
            return self._state(read.nodes, result.entries, read.foreign, version)
        raise LedgerConflictError("the ledger kept changing while it was being reconciled")

    def view(self) -> ReadOnlyView:
        """What :meth:`snapshot` would see, and the Horus pods, without writing anything (no ledger is
        created, nothing reconciled or deleted): for readers such as the UI, which must not change a
        placement. Bookings reconciliation would drop are left out."""
        read = self._read(create_ledger=False)
        pods = {p.reservation_id: p for p in read.horus_pods if p.reservation_id}
        result = reconcile(read.ledger.entries, pods, self.clock())
        state = self._state(read.nodes, result.entries, read.foreign, read.ledger.version)
        return ReadOnlyView(state, result.entries, read.horus_pods, tuple(_waiting(read.ledger, self.clock())))

    def _read(self, create_ledger: bool) -> _Read:
        nodes = self._api.call("list nodes", self.core.list_node, label_selector=PRODUCT_LABEL)
        horus_pods = self._api.call("list Horus pods", self.core.list_pod_for_all_namespaces, label_selector=RESERVATION_LABEL)
        others = self._api.call(
            "list running pods", self.core.list_pod_for_all_namespaces, label_selector=f"!{RESERVATION_LABEL}",
            field_selector="status.phase!=Succeeded,status.phase!=Failed",
        )
        foreign = tuple(p for p in map(PodView.from_api, others["items"]) if p.gpu_request and p.node)
        return _Read(nodes["items"], tuple(map(PodView.from_api, horus_pods["items"])), foreign, self._read_ledger(create_ledger))

    def _state(
        self, nodes: list[dict[str, Any]], entries: Mapping[str, LedgerEntry], foreign: Sequence[PodView], version: str
    ) -> ClusterState:
        gpus = [gpu for node in nodes for gpu in node_gpus(node)]
        self._gpus = {g.gpu_id: g for g in gpus}
        residents: dict[str, list[Resident]] = {}
        for entry in sorted(entries.values(), key=lambda e: e.created_at):
            for b in entry.bookings:
                residents.setdefault(b.gpu_id, []).append(Resident(entry.job_id, b.util, b.util_p90, b.mem_mib, b.signature))
        taken_by_node: dict[str, int] = {}
        for pod in foreign:
            taken_by_node[pod.node] = taken_by_node.get(pod.node, 0) + pod.gpu_request
        states = []
        for gpu in reversed(gpus):  # GPUs held by pods outside Horus: which ones is not visible, so the last free ones
            own = residents.get(gpu.gpu_id, [])
            if taken_by_node.get(gpu.node, 0) > 0 and not own:
                taken_by_node[gpu.node] -= 1
                own = [Resident(f"external:{gpu.node}", 100.0, 100.0, gpu.memory_mib)]
            states.append(replace(gpu, residents=tuple(own)))
        return ClusterState(tuple(reversed(states)), version)

    def _read_ledger(self, create: bool = True) -> _LedgerRead:
        namespace, name = self.options.namespace, self.options.ledger_name
        try:
            raw = self._api.call("read the ledger", self.core.read_namespaced_config_map, name, namespace)
        except ApiException as exc:
            if exc.status != 404:
                raise KubernetesApiError(f"Kubernetes API: reading ConfigMap {namespace}/{name} refused: {exc.status} {exc.reason}") from None
            if not create:
                return _LedgerRead("", {}, {})
            raw = self._create_ledger()
        data = dict(raw.get("data") or {})
        entries, queue, waits = {}, {}, ()
        for key, value in data.items():
            try:
                if key == WAITS_KEY:
                    waits = tuple((str(pool), float(enqueued), float(booked)) for pool, enqueued, booked in json.loads(value))
                elif key.startswith(QUEUE_PREFIX):
                    queue[key[len(QUEUE_PREFIX):]] = QueueEntry.from_json(value)
                else:
                    entries[key] = LedgerEntry.from_json(value)
            except (ValueError, KeyError, TypeError) as exc:
                log.warning("ledger key %s is unreadable (%s); kept as it is and not counted", key, exc)
        return _LedgerRead(raw["metadata"]["resourceVersion"], data, entries, queue, waits)

    def _create_ledger(self) -> dict[str, Any]:
        namespace, name = self.options.namespace, self.options.ledger_name
        body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "labels": {"app.kubernetes.io/part-of": "horus"}}, "data": {}}
        try:
            return self._api.call("create the ledger", self.core.create_namespaced_config_map, namespace, body)
        except ApiException as exc:
            if exc.status == 409:  # another worker created it first
                return self._api.call("read the ledger", self.core.read_namespaced_config_map, name, namespace)
            raise KubernetesApiError(f"Kubernetes API: creating ConfigMap {namespace}/{name} refused: {exc.status} {exc.reason}") from None

    def _write_ledger(self, version: str, data: Mapping[str, str]) -> str:
        namespace, name = self.options.namespace, self.options.ledger_name
        body = {
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": namespace, "resourceVersion": version, "labels": {"app.kubernetes.io/part-of": "horus"}},
            "data": dict(data),
        }
        try:
            answer = self._api.call("write the ledger", self.core.replace_namespaced_config_map, name, namespace, body)
        except ApiException as exc:
            if exc.status == 409:
                raise LedgerConflictError(f"ledger changed since resourceVersion {version}") from None
            raise KubernetesApiError(f"Kubernetes API: writing ConfigMap {namespace}/{name} refused: {exc.status} {exc.reason}") from None
        return answer["metadata"]["resourceVersion"]

    def _delete_pod(self, namespace: str, name: str) -> None:
        try:
            self._api.call("delete a pod stuck Pending", self.core.delete_namespaced_pod, name, namespace)
            log.warning("deleted pod %s/%s: Pending past its deadline", namespace, name)
        except (ApiException, KubernetesApiError) as exc:
            log.warning("could not delete pod %s/%s stuck Pending: %s", namespace, name, exc)

    # --- writing ---------------------------------------------------------------------------------
    def entry(self, decision: Decision, demand: Demand, owner: str) -> LedgerEntry:
        """The ledger entry a decision would write (also the pod's booking annotation)."""
        now = self.clock()
        bookings = []
        for gpu_id in decision.gpu_ids:
            need = demand.on(self._gpus[gpu_id].gpu_type)
            bookings.append(Booking(gpu_id, need.util, need.util_p90, need.mem_mib, demand.signature))
        return LedgerEntry(
            uuid.uuid4().hex, demand.job_id, owner, now, now + self.options.lease_s,
            now + self.options.pending_deadline_s, tuple(bookings),
        )

    def reserve(self, decision: Decision, demand: Demand, owner: str) -> Reservation:
        entry = self.write_entry(self.entry(decision, demand, owner), str(decision.state_version))
        self._written[entry.reservation_id] = entry
        return entry.reservation

    def entry_of(self, reservation: Reservation) -> LedgerEntry:
        """The full entry behind a reservation this backend wrote (for the pod's booking annotation)."""
        written = self._written.get(reservation.reservation_id)
        return written if written is not None else self._read_ledger().entries[reservation.reservation_id]

    def write_entry(self, entry: LedgerEntry, expected_version: str) -> LedgerEntry:
        """Book at ``expected_version`` or raise LedgerConflictError. An owner that already holds a live
        reservation (a worker that restarted and re-attaches to its pod) gets that one back."""
        ledger = self._read_ledger()
        held = next((e for e in ledger.entries.values() if e.owner == entry.owner), None)
        if held is not None:
            log.info("owner %s already holds reservation %s; reusing it", entry.owner, held.reservation_id)
            return held
        if ledger.version != expected_version:
            raise LedgerConflictError(f"ledger at resourceVersion {ledger.version}, decision made at {expected_version}")
        try:
            self._write_ledger(expected_version, {**ledger.data, entry.reservation_id: entry.to_json()})
        except LedgerConflictError:
            # A write that timed out may have landed before the retry saw 409: check before re-deciding.
            if entry.reservation_id in self._read_ledger().data:
                return entry
            raise
        except KubernetesApiError:
            self._forget(entry.reservation_id)
            raise
        return entry

    def _forget(self, reservation_id: str) -> None:
        """After a failed write whose outcome is unknown: make sure it did not land."""
        try:
            self._remove(lambda rid, _entry: rid == reservation_id)
        except (KubernetesApiError, LedgerConflictError) as exc:
            log.warning("reservation %s may be left in the ledger until its lease expires: %s", reservation_id, exc)

    def release(self, reservation: Reservation) -> bool:
        """Idempotent: True if this call removed the reservation."""
        return self._remove(lambda rid, _entry: rid == reservation.reservation_id) > 0

    def release_owner(self, owner: str) -> int:
        """Release every reservation of an owner (a task instance); idempotent."""
        return self._remove(lambda _rid, entry: entry is not None and entry.owner == owner)

    def reclaim(self, owner: str) -> int:
        """Keep an earlier try's booking: its pod may still run, and the new try re-attaches to it
        (``reattach_on_restart``); :meth:`write_entry` hands that booking back. Reconciliation drops it
        once its pod is gone."""
        return 0

    def _remove(self, match: Callable[[str, LedgerEntry | None], bool]) -> int:
        def without(ledger: _LedgerRead) -> tuple[dict[str, str] | None, int]:
            gone = [rid for rid in ledger.data if match(rid, ledger.entries.get(rid))]
            return ({k: v for k, v in ledger.data.items() if k not in gone} if gone else None), len(gone)

        return self._update(without, "the release will be done by reconciliation")

    def _update(self, change: Callable[[_LedgerRead], tuple[dict[str, str] | None, _T]], fallback: str) -> _T:
        """Read the ledger, compute its new data (None: nothing to write) and what to return, and write it
        at the version read; on a conflict, read and compute again."""
        for _ in range(self.options.attempts * 4):
            ledger = self._read_ledger()
            data, result = change(ledger)
            if data is None:
                return result
            try:
                self._write_ledger(ledger.version, data)
            except LedgerConflictError:
                continue
            return result
        raise LedgerConflictError(f"the ledger kept changing; {fallback}")

    # --- the queue (the same ConfigMap: one compare-and-swap covers bookings and queue) ------------
    def now(self) -> float:
        return self.clock()

    def enqueue(self, owner: str, demand: Demand, profile: str, pool: str = "default",
                expected_runtime_s: float | None = None, priority: int = 0) -> QueueEntry:
        """Queue ``owner``'s demand; an entry an earlier try of the owner left waiting leaves the queue. An
        owner that still holds a live booking (a restarted worker re-attaching to its pod) gets an entry
        already booked with it, as :meth:`write_entry` hands the booking back."""
        now = self.clock()
        entry = QueueEntry(uuid.uuid4().hex, owner, demand, profile, pool, now, now + self.options.lease_s, expected_runtime_s,
                           priority=priority)

        def queued(ledger: _LedgerRead) -> tuple[dict[str, str], QueueEntry]:
            data = _without_stale_entries(ledger, now)
            for entry_id, other in ledger.queue.items():
                if other.owner == owner and other.status(now) == "waiting":
                    data.pop(QUEUE_PREFIX + entry_id, None)
            held = next((e for e in ledger.entries.values() if e.owner == owner), None)
            mine = entry if held is None else replace(
                entry, reservation_id=held.reservation_id, reason=f"its earlier try's booking {held.reservation_id} is kept")
            data[QUEUE_PREFIX + mine.entry_id] = mine.to_json()
            size = sum(len(k) + len(v.encode()) for k, v in data.items())
            if size > _QUEUE_FULL_BYTES:
                raise NoPlacementError(
                    f"job {demand.job_id} not queued: the ledger ConfigMap {self.options.namespace}/{self.options.ledger_name} "
                    f"would hold {size:,} bytes with {len(ledger.queue) + 1} queue entries, over the {_QUEUE_FULL_BYTES:,} "
                    f"kept for the queue of the API server's 1 MiB per object; retry when fewer tasks wait")
            return data, mine

        return self._update(queued, "the task could not be queued")

    def queue(self) -> tuple[str, list[QueueEntry]]:
        """The ledger's resourceVersion and the entries waiting now, oldest first."""
        ledger = self._read_ledger()
        return ledger.version, _waiting(ledger, self.clock())

    def queue_entry(self, entry_id: str) -> QueueEntry | None:
        return self._read_ledger().queue.get(entry_id)

    def book_round(self, version: str, round_id: str, bookings: list[RoundBooking], held: dict[str, str],
                   skips: dict[str, int]) -> list[Reservation]:
        """Book every entry a round chose and note why the others wait, in one PUT at ``version``: a 409
        (LedgerConflictError) means someone wrote since, and the round decides again."""
        ledger, now = self._read_ledger(), self.clock()
        if ledger.version != version:
            raise LedgerConflictError(f"ledger at resourceVersion {ledger.version}, round decided at {version}")
        data, written = dict(ledger.data), []
        for chosen in bookings:
            queued = ledger.queue[chosen.entry_id]
            booked = LedgerEntry(uuid.uuid4().hex, queued.demand.job_id, queued.owner, now, now + self.options.lease_s,
                                 now + self.options.pending_deadline_s, chosen.bookings)
            data[booked.reservation_id] = booked.to_json()
            data[QUEUE_PREFIX + chosen.entry_id] = replace(queued, reservation_id=booked.reservation_id, round=round_id,
                                                           reason=chosen.note.reason[:_REASON_CHARS]).to_json()
            written.append(booked)
        for entry_id, reason in held.items():
            data[QUEUE_PREFIX + entry_id] = replace(ledger.queue[entry_id], reason=reason[:_REASON_CHARS],
                                                    skips=skips.get(entry_id, 0)).to_json()
        self._write_ledger(version, data)
        self._written.update({e.reservation_id: e for e in written})
        return [e.reservation for e in written]

    def reservation(self, reservation_id: str) -> Reservation | None:
        entry = self._read_ledger().entries.get(reservation_id)
        return None if entry is None else entry.reservation

    def waits(self, window_s: float) -> dict[str, list[float]]:
        """Seconds each pool's entries queued in the last ``window_s`` waited: until booked, or until now
        for those still waiting (entries that gave up are left out)."""
        ledger, now = self._read_ledger(), self.clock()
        since, waits = now - window_s, {}
        spans = [(pool, enqueued, booked) for pool, enqueued, booked in ledger.waits]
        for entry in ledger.queue.values():
            booking = ledger.entries.get(entry.reservation_id or "")
            if entry.reservation_id is not None and booking is not None:
                spans.append((entry.pool, entry.enqueued_at, booking.created_at))
            elif entry.status(now) == "waiting":
                spans.append((entry.pool, entry.enqueued_at, now))
        for pool, enqueued, booked in spans:
            if enqueued > since:
                waits.setdefault(pool, []).append(booked - enqueued)
        return waits

    def renew_entry(self, entry_id: str) -> bool:
        """Keep a waiting entry alive; False if it was booked, left or had expired."""
        now = self.clock()

        def renewed(ledger: _LedgerRead) -> tuple[dict[str, str] | None, bool]:
            entry = ledger.queue.get(entry_id)
            if entry is None or entry.status(now) != "waiting":
                return None, False
            return {**ledger.data, QUEUE_PREFIX + entry_id: replace(entry, lease_expires_at=now + self.options.lease_s).to_json()}, True

        return self._update(renewed, "the entry's lease was not renewed")

    def take(self, entry_id: str) -> None:
        """The entry's task has its booking: it leaves the queue, and its wait is kept for the credit
        policy over the last hour (idempotent)."""
        now = self.clock()

        def taken(ledger: _LedgerRead) -> tuple[dict[str, str] | None, None]:
            entry = ledger.queue.get(entry_id)
            if entry is None:
                return None, None
            data = _without_stale_entries(ledger, now)
            data.pop(QUEUE_PREFIX + entry_id, None)
            booking = ledger.entries.get(entry.reservation_id or "")
            waits = [w for w in ledger.waits if w[1] > now - CREDIT_WINDOW_S]
            if booking is not None:
                waits.append((entry.pool, entry.enqueued_at, booking.created_at))
            data[WAITS_KEY] = json.dumps(waits, separators=(",", ":"))
            return data, None

        self._update(taken, "the entry expires with its lease")

    def leave(self, entry_id: str, reason: str) -> bool:
        """The entry's task gives up: it leaves the queue, and a booking a round made for it that it never
        took is released. True if this call changed anything."""
        def left(ledger: _LedgerRead) -> tuple[dict[str, str] | None, bool]:
            entry = ledger.queue.get(entry_id)
            if entry is None:
                return None, False
            log.info("queue entry %s of %s leaves: %s", entry_id, entry.owner, reason)
            gone = {QUEUE_PREFIX + entry_id, entry.reservation_id or ""}
            return {k: v for k, v in ledger.data.items() if k not in gone}, True

        return self._update(left, "the entry expires with its lease")

    def active(self) -> dict[str, LedgerEntry]:
        """The reservations in the ledger now (no reconciliation)."""
        return self._read_ledger().entries

