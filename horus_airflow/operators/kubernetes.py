"""HorusKubernetesPodOperator: a KubernetesPodOperator whose pod lands on the GPUs the placer chooses."""

from __future__ import annotations

import json
import logging
import time
import uuid
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from airflow.providers.cncf.kubernetes.operators.pod import KubernetesPodOperator
from airflow.sdk import Context
from airflow.sdk.exceptions import AirflowException, AirflowFailException, TaskDeferred
from kubernetes.client import models as k8s
from kubernetes.client.exceptions import ApiException
from kubernetes.config.config_exception import ConfigException

from horus_airflow.backends.binding import BINDINGS
from horus_airflow.errors import (
    BindingError,
    HorusError,
    KubernetesConfigError,
    NoPlacementError,
)
from horus_airflow.jobs import JobSpec
from horus_airflow.operators.checks import check_job, check_placement_timeout, check_profile, check_queue_priority
from horus_airflow.operators.failures import as_airflow_errors
from horus_airflow.operators.owner import task_owner
from horus_airflow.settings import Settings
from horus_airflow.run_schema import Tag

if TYPE_CHECKING:  # the placer, predictor and registry are imported when a task runs, not when its DAG parses
    from horus_airflow.backends import Acquired
    from horus_airflow.backends.kubernetes import KubernetesBackend, LedgerEntry
    from horus_airflow.placement import ClusterState, Decision, GpuState
    from horus_airflow.predictor import Demand
    from horus_airflow.service import PlacementService

log = logging.getLogger(__name__)

XCOM_KEY = "horus_placement"
CO_RESIDENTS_ANNOTATION = "horus.ai/co-residents"
_PENDING_MARGIN_S = 60.0


class HorusKubernetesPodOperator(KubernetesPodOperator):
    """Everything ``KubernetesPodOperator`` does (image, cmds, env, volumes, ``pod_template_file``,
    ``full_pod_spec``, ``on_finish_action``, ``deferrable=True``), plus: predict the job's GPU demand from
    its model graph, place it with a profile, book the GPUs in the cluster's ledger, and bind the pod to
    them. Placement happens in :meth:`build_pod_request_obj`, so it works in deferrable mode too.

    The demand, the placement and its explanation go into the pod's annotations (``horus.ai/*``) and the
    XCom ``horus_placement``. The booking is released when the task ends, fails, is killed or cleared, and
    a pod still Pending at the end is deleted; reconciliation is the safety net for a worker that died.

    :param model: catalog model name, ``path/to/file.py:factory`` (give ``dataset``) or ``model.onnx``:
        what the pod trains, for prediction. The pod runs ``image``/``cmds`` as usual.
    :param batch_size: training batch size.
    :param dataset: dataset whose input shape the job trains on; default: the model's own.
    :param seq_len: sequence length for text and translation datasets.
    :param precision: ``fp32`` or ``amp``.
    :param gpus: GPUs the pod needs (one node).
    :param profile: placement profile (docs/PLACEMENT.md) or a YAML path; default ``HORUS_PROFILE``.
    :param binding: ``visible-devices`` (default), ``hybrid`` or ``device-plugin`` (docs/KUBERNETES.md).
    :param placement_timeout: seconds to wait for free GPUs before failing.
    :param queue_priority: a whole number; a queued pod of a higher one is placed before any of a lower
        one, whatever the queue policy. Default 0 (as :class:`HorusTrainingOperator`'s).
    :param dry_run_state: a cluster-state JSON (docs/PLACEMENT.md) to place against in ``dry_run()``,
        which reads no cluster; without it a dry run builds the pod unplaced.
    """

    template_fields: Sequence[str] = (*KubernetesPodOperator.template_fields, "model", "dataset", "precision", "profile", "binding")

    def __init__(
        self,
        *,
        model: str,
        batch_size: int,
        dataset: str | None = None,
        seq_len: int | None = None,
        precision: str = "fp32",
        gpus: int = 1,
        profile: str | None = None,
        binding: str = "visible-devices",
        placement_timeout: float = 600.0,
        queue_priority: int = 0,
        dry_run_state: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if binding not in BINDINGS and "{{" not in binding:
            raise BindingError(f"unknown binding mode {binding!r}; accepted: {', '.join(BINDINGS)}")
        check_job(model=model, batch_size=batch_size, dataset=dataset, seq_len=seq_len, precision=precision, gpus=gpus,
                  command_required_for_onnx=False)  # the pod's image trains it
        check_profile(profile)
        check_placement_timeout(placement_timeout)
        check_queue_priority(queue_priority)
        self.model = model
        self.batch_size = batch_size
        self.dataset = dataset
        self.seq_len = seq_len
        self.precision = precision
        self.gpus = gpus
        self.profile = profile
        self.binding = binding
        self.placement_timeout = placement_timeout
        self.queue_priority = queue_priority
        self.dry_run_state = dry_run_state
        self._owner: str | None = None
        self._booked: tuple[Demand, Acquired] | None = None  # what a queued wait booked, for build_pod_request_obj

    # --- waiting in the queue ----------------------------------------------------------------------
    def execute(self, context: Context) -> Any:
        """With ``deferrable=True`` the task first queues its demand and, unless the first round books
        it, waits in the triggerer (:class:`~horus_airflow.triggers.BookingTrigger`) holding no worker
        slot; then the pod runs as ``KubernetesPodOperator`` runs it, deferred too."""
        if self.deferrable and self._booked is None:
            self._queue_or_defer(context)
        return super().execute(context)

    def _queue_or_defer(self, context: Context) -> None:
        from horus_airflow.triggers import BookingTrigger

        self._owner = task_owner(context["ti"])
        with as_airflow_errors():
            backend = self._backend
            first = self._gpu_snapshot(backend)
            service = self._service(backend)
            demand = service.plan(self._job_spec(), f"{self.task_id}-{uuid.uuid4().hex[:8]}", [g.gpu_type for g in first.gpus]).demand
            entry = service.enqueue(demand, self._owner, priority=self.queue_priority)
            seen = service.look(entry.entry_id)
            if seen.status == "booked":
                self._booked = (demand, service.take(seen))
                return
            if seen.status != "waiting":
                raise NoPlacementError(f"job {demand.job_id} left the queue ({seen.status}): {seen.entry.reason if seen.entry else ''}")
        log.info("queued as %s: %s; deferring", entry.entry_id, (seen.entry.reason if seen.entry else "") or "waiting for the next round")
        self.defer(trigger=BookingTrigger(entry.entry_id, time.time() + self.placement_timeout, kubernetes=self._trigger_options()),
                   method_name="execute_queued")

    def execute_queued(self, context: Context, event: dict[str, Any]) -> Any:
        """Resumed by the trigger: take the booking a round made and run the pod on it, or fail with why
        the task was not placed."""
        from horus_airflow.backends.scheduler import booked_acquisition

        if event.get("status") != "booked":
            raise AirflowException(f"not placed: queue entry {event.get('entry_id')} {event.get('status')}: {event.get('reason')}")
        self._owner = task_owner(context["ti"])
        with as_airflow_errors():
            backend = self._backend
            entry = backend.queue_entry(event["entry_id"])
            if entry is None or entry.status(backend.now()) != "booked":
                raise NoPlacementError(f"queue entry {event['entry_id']} is no longer booked: {entry.reason if entry else 'gone'}")
            backend.take(entry.entry_id)
            self._booked = (entry.demand, booked_acquisition(backend, entry, None, 0, float(event.get("waited_s", 0.0))))
        return super().execute(context)

    def _trigger_options(self) -> dict[str, Any]:
        """How the trigger reaches the same API server and ledger as this task."""
        options = self._backend.options
        return {"conn_id": self.kubernetes_conn_id, "in_cluster": self.in_cluster, "config_file": self.config_file,
                "cluster_context": self.cluster_context, "namespace": options.namespace, "lease_s": options.lease_s,
                "pending_deadline_s": options.pending_deadline_s}

    # --- placement -------------------------------------------------------------------------------
    def build_pod_request_obj(self, context: Context | None = None, *, dry_run: bool = False) -> k8s.V1Pod:
        try:
            pod = super().build_pod_request_obj(context, dry_run=dry_run)
        except ConfigException as exc:
            raise AirflowFailException(str(self._config_error(exc))) from None
        with as_airflow_errors():
            spec = self._job_spec()
            if dry_run:
                return self._place_dry(pod, spec)
            if context is None:
                raise AirflowException("Horus places a pod only inside a task run or a dry run")
            return self._place(pod, spec, context)

    def _job_spec(self) -> JobSpec:
        return JobSpec(
            model=self.model, batch_size=self.batch_size, dataset=self.dataset, seq_len=self.seq_len,
            precision=self.precision, gpus=self.gpus, name=self.task_id,
        )

    @cached_property
    def _settings(self) -> Settings:
        return Settings.from_env()

    @cached_property
    def _backend(self) -> KubernetesBackend:
        from horus_airflow.backends.kubernetes import KubernetesBackend, KubernetesOptions

        settings = self._settings
        pending = float(self.startup_timeout_seconds) + float(self.schedule_timeout_seconds or 0) + _PENDING_MARGIN_S
        options = KubernetesOptions(
            namespace=settings.kubernetes_namespace, lease_s=settings.lease_seconds, pending_deadline_s=pending
        )
        try:
            client = self.client
        except (ConfigException, OSError, ValueError, TypeError) as exc:
            raise self._config_error(exc) from None
        return KubernetesBackend(client, options)

    def _config_error(self, exc: Exception) -> KubernetesConfigError:
        where = self.config_file or "the default kubeconfig"
        first_line = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return KubernetesConfigError(f"kubeconfig {where} does not work: {first_line}")

    def _service(self, backend: KubernetesBackend | None = None) -> PlacementService:
        from horus_airflow.service import PlacementService

        return PlacementService(self._settings, self.profile, backend)

    def _place(self, pod: k8s.V1Pod, spec: JobSpec, context: Context) -> k8s.V1Pod:
        from horus_airflow.backends.binding import GpuTarget, binding
        from horus_airflow.backends.kubernetes import BOOKING_ANNOTATION, RESERVATION_LABEL

        ti = context["ti"]
        self._owner = task_owner(ti)
        backend = self._backend
        service = self._service(backend)
        if self._booked is not None:  # booked while queued (deferrable): placed already
            (demand, acquired), self._booked = self._booked, None
        else:
            first = self._gpu_snapshot(backend)
            demand = service.plan(spec, pod.metadata.name, [g.gpu_type for g in first.gpus]).demand
            acquired = service.book(demand, self._owner, self.placement_timeout, state=first, priority=self.queue_priority)
        try:
            entry = backend.entry_of(acquired.reservation)
            placed = self._placed_gpus(entry, acquired.state)
            co_residents = sorted({r.job_id for g in placed for r in g.residents if r.job_id != entry.job_id})
            target = GpuTarget(placed[0].node, tuple(g.index for g in placed), bool(co_residents))
            binding(self.binding).apply(pod, target, self.base_container_name)
            pod.metadata.labels[RESERVATION_LABEL] = entry.reservation_id
            annotations = self._annotations(acquired.decision, demand, placed, service.interference_label)
            annotations[BOOKING_ANNOTATION] = entry.to_json()
            annotations[CO_RESIDENTS_ANNOTATION] = ",".join(co_residents)
            pod.metadata.annotations = {**(pod.metadata.annotations or {}), **annotations}
            outcome = self._outcome(acquired, demand, placed, entry.reservation_id)
            ti.xcom_push(key=XCOM_KEY, value=outcome)
        except BaseException:
            backend.release(acquired.reservation)
            raise
        log.info("placed %s on %s (%s binding): %s", pod.metadata.name, ",".join(g.gpu_id for g in placed), self.binding, acquired.decision.reason)
        return pod

    @staticmethod
    def _gpu_snapshot(backend: KubernetesBackend) -> ClusterState:
        state = backend.snapshot()
        if not state.gpus:
            raise AirflowException(
                "no GPU nodes found: Horus reads nodes labelled nvidia.com/gpu.product, nvidia.com/gpu.count and "
                "nvidia.com/gpu.memory by NVIDIA GPU feature discovery (docs/KUBERNETES.md)"
            )
        return state

    @staticmethod
    def _placed_gpus(entry: LedgerEntry, state: ClusterState) -> list[GpuState]:
        by_id = {g.gpu_id: g for g in state.gpus}
        placed = [by_id[b.gpu_id] for b in entry.bookings]
        if len({g.node for g in placed}) != 1:
            raise BindingError(
                f"a pod runs on one node, but the placement spans {sorted({g.node for g in placed})}; use a profile whose "
                "locality keeps max_nodes at 1"
            )
        return placed

    def _place_dry(self, pod: k8s.V1Pod, spec: JobSpec) -> k8s.V1Pod:
        from horus_airflow.backends.binding import GpuTarget, binding
        from horus_airflow.placement import ClusterState

        if not self.dry_run_state:
            pod.metadata.annotations = {**(pod.metadata.annotations or {}), "horus.ai/placement-reason": "dry run without dry_run_state: not placed"}
            return pod
        state = ClusterState.from_dict(json.loads(Path(self.dry_run_state).read_text()))
        service = self._service()
        demand = service.plan(spec, pod.metadata.name, [g.gpu_type for g in state.gpus]).demand
        decision = service.decide(demand, state)
        if not decision.placed:
            raise AirflowException(f"dry run: {decision.reason}")
        by_id = {g.gpu_id: g for g in state.gpus}
        placed = [by_id[g] for g in decision.gpu_ids]
        target = GpuTarget(placed[0].node, tuple(g.index for g in placed), any(g.residents for g in placed))
        binding(self.binding).apply(pod, target, self.base_container_name)
        pod.metadata.annotations = {**(pod.metadata.annotations or {}), **self._annotations(decision, demand, placed, service.interference_label)}
        return pod

    def _annotations(self, decision: Decision, demand: Demand, placed: list[GpuState], interference: str) -> dict[str, str]:
        need = demand.on(placed[0].gpu_type)
        return {
            **decision.annotations(),
            "horus.ai/binding": self.binding,
            "horus.ai/gpu-type": placed[0].gpu_type,
            "horus.ai/predictor": demand.predictor,
            "horus.ai/interference": interference,
            "horus.ai/predicted-util": f"{need.util:.1f}",
            "horus.ai/predicted-util-p90": f"{need.util_p90:.1f}",
            "horus.ai/predicted-mem-mib": f"{need.mem_mib:.0f}",
        }

    def _outcome(self, acquired: Acquired, demand: Demand, placed: list[GpuState], reservation_id: str) -> dict[str, Any]:
        need, decision = demand.on(placed[0].gpu_type), acquired.decision
        return {
            "job_id": demand.job_id,
            "reservation_id": reservation_id,
            "node": placed[0].node,
            "gpu_ids": [g.gpu_id for g in placed],
            "gpu_indices": [g.index for g in placed],
            "gpu_type": placed[0].gpu_type,
            "binding": self.binding,
            "predicted": {"util": need.util, "util_p90": need.util_p90, "mem_mib": need.mem_mib},
            "predictor": demand.predictor,
            "confidence": demand.confidence,
            "reason": decision.reason,
            "ledger_conflicts": acquired.conflicts,
            "placement_s": round(acquired.seconds, 3),
            "explanation": decision.to_dict(top=5),
        }

    # --- release, whatever happens ----------------------------------------------------------------
    def _release(self, remote_pod: k8s.V1Pod | None = None) -> None:
        if self._owner is None:
            return
        backend = self._backend
        if remote_pod is not None and remote_pod.status is not None and remote_pod.status.phase == "Pending":
            try:
                self.client.delete_namespaced_pod(remote_pod.metadata.name, remote_pod.metadata.namespace)
                log.warning("deleted pod %s: still Pending when the task ended", remote_pod.metadata.name)
            except ApiException as exc:
                if exc.status != 404:
                    log.warning("could not delete Pending pod %s: %s %s", remote_pod.metadata.name, exc.status, exc.reason)
        try:
            released = self._service(backend).release_owner(self._owner)
            log.info("released %d GPU reservation(s) of %s", released, self._owner)
        except HorusError as exc:
            log.warning("release of %s's reservation failed (%s); reconciliation will drop it once its pod is gone", self._owner, exc)

    def post_complete_action(self, *, pod: k8s.V1Pod, remote_pod: k8s.V1Pod, context: Context, result: dict | None, **kwargs: Any) -> None:
        try:
            super().post_complete_action(pod=pod, remote_pod=remote_pod, context=context, result=result, **kwargs)
        finally:
            self._release(remote_pod)
            self._log_profiling_run(remote_pod, context)

    def _log_profiling_run(self, remote_pod: k8s.V1Pod | None, context: Context) -> None:
        """A profiling run for the pod: job, features, prediction and placement (from the pod's own
        annotations, so the deferrable path has them too). GPU metrics are not measured here; `horus
        telemetry import` adds the DCGM exporter's to this very run (it finds it by ``horus.pod``).

        As on the local backend, a run that cannot be logged fails the task (after its GPUs are
        released): the run is the only record of the job's prediction and placement, and retraining
        learns from it, so losing it quietly is worse than a retry."""
        from horus_airflow.backends.kubernetes import BOOKING_ANNOTATION, LedgerEntry
        from horus_airflow.registry.profiling import log_pod_run

        annotations = (remote_pod.metadata.annotations or {}) if remote_pod is not None and remote_pod.metadata else {}
        if BOOKING_ANNOTATION not in annotations:
            return
        entry = LedgerEntry.from_json(annotations[BOOKING_ANNOTATION])
        phase = remote_pod.status.phase if remote_pod.status else None
        exit_code = 0 if phase == "Succeeded" else (1 if phase == "Failed" else -1)
        ti = context["ti"]
        tags = {
            Tag.SOURCE: "kubernetes",
            Tag.POD: f"{remote_pod.metadata.namespace}/{remote_pod.metadata.name}",
            Tag.RESERVATION_ID: entry.reservation_id,
            Tag.PLACEMENT_REASON: annotations.get("horus.ai/placement-reason", ""),
            Tag.PLACEMENT_PROFILE: annotations.get("horus.ai/profile", ""),
            Tag.INTERFERENCE: annotations.get("horus.ai/interference", ""),
            Tag.AIRFLOW_DAG_ID: ti.dag_id, Tag.AIRFLOW_TASK_ID: ti.task_id, Tag.AIRFLOW_RUN_ID: ti.run_id,
            Tag.AIRFLOW_TRY_NUMBER: str(ti.try_number), Tag.OWNER: task_owner(ti),
        }
        spec = self._job_spec()
        try:
            run_id = log_pod_run(self._settings, spec, spec.features(), entry.bookings, annotations.get("horus.ai/gpu-type", ""),
                                 annotations.get("horus.ai/predictor", "prior"), annotations.get(CO_RESIDENTS_ANNOTATION, ""),
                                 annotations.get("horus.ai/explanation", "{}"), exit_code, tags)
        except HorusError as exc:
            raise AirflowException(f"pod {tags[Tag.POD]} ran, but its profiling run was not logged: {exc}") from exc
        log.info("profiling run %s logged for pod %s", run_id, tags[Tag.POD])

    def execute_async(self, context: Context) -> None:
        try:
            super().execute_async(context)
        except TaskDeferred:
            raise
        except BaseException:
            self._release(self.pod)
            raise

    def trigger_reentry(self, context: Context, event: dict[str, Any]) -> Any:
        self._owner = task_owner(context["ti"])
        try:
            result = super().trigger_reentry(context, event)
        except TaskDeferred:
            raise
        except BaseException:
            self._release()
            raise
        self._release()
        return result

    def on_kill(self) -> None:
        try:
            super().on_kill()
        finally:
            self._release()
