"""The whole path of one local training task: spec -> demand -> placement -> booking (the
:class:`~horus_airflow.service.PlacementService`) -> run -> release -> profiling run. The local operator
is a thin face over :func:`run_job`."""

from __future__ import annotations

import logging
import sys
import uuid
from dataclasses import dataclass
from typing import Callable

from horus_airflow.backends import Acquired, LocalBackend
from horus_airflow.backends.ledger import QueueEntry
from horus_airflow.backends.local import LaunchedJob
from horus_airflow.backends.scheduler import booked_acquisition
from horus_airflow.errors import InvalidJobError, NoPlacementError
from horus_airflow.jobs import JobSpec, require_trainer
from horus_airflow.placement import GpuState
from horus_airflow.predictor import Demand, GpuDemand
from horus_airflow.registry import ProfilingRecord, log_profiling_run
from horus_airflow.registry.profiling import expected_runtime_s
from horus_airflow.service import Planned, PlacementService
from horus_airflow.settings import Settings
from horus_airflow.telemetry import RunSummary
from horus_airflow.run_schema import Tag

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class JobOutcome:
    """What a task reports back (XCom, the demo's summary table)."""

    job_id: str
    model: str
    gpu_ids: tuple[str, ...]
    gpu_type: str
    gpu_declared: bool
    predicted_util: float
    predicted_mem_mib: float
    predictor: str
    reason: str
    mlflow_run_id: str
    exit_code: int
    ledger_conflicts: int
    placement_s: float


def training_command(spec: JobSpec) -> list[str]:
    """The user's command, or the built-in trainer for a catalog model or a user's module."""
    if spec.command:
        return list(spec.command)
    require_trainer(spec.model, spec.command)
    command = [sys.executable, "-m", "horus_airflow.catalog.train", "--model", spec.model]
    command += ["--batch-size", str(spec.batch_size), "--steps", str(spec.steps)]
    if spec.dataset:
        command += ["--dataset", spec.dataset]
    if spec.seq_len:
        command += ["--seq-len", str(spec.seq_len)]
    if spec.precision == "amp":
        command.append("--amp")
    return command


def run_job(
    spec: JobSpec,
    settings: Settings,
    owner: str,
    profile_name: str | None = None,
    placement_timeout_s: float = 600.0,
    context_tags: dict[str, str] | None = None,
    on_launch: Callable[[LaunchedJob], None] | None = None,
    backend: LocalBackend | None = None,
    priority: int = 0,
) -> JobOutcome:
    """Run one job end to end, waiting (blocking) in the queue for its GPUs (``priority``: higher goes
    first). Bad input fails before anything is reserved or logged; once a GPU is reserved it is
    released whatever happens."""
    backend = backend or LocalBackend(settings)
    service = PlacementService(settings, profile_name, backend)
    training_command(spec)  # a job that cannot be launched fails before it waits
    job = service.plan(spec, f"{spec.display_name}-{uuid.uuid4().hex[:8]}", [g.gpu_type for g in backend.gpus])
    acquired = service.book(job.demand, owner, placement_timeout_s,
                            expected_runtime_s=expected_runtime_s(settings, spec, job.features.dataset), priority=priority)
    return run_booked(job, acquired, settings, backend, service, owner, context_tags, on_launch)


@dataclass(frozen=True)
class QueuedJob:
    """A job planned and queued; ``acquired`` when the first round already booked it. ``service``
    runs it on (:func:`run_booked`)."""

    job: Planned
    entry: QueueEntry
    acquired: Acquired | None
    service: PlacementService


def queue_job(spec: JobSpec, settings: Settings, owner: str, profile_name: str | None = None,
              backend: LocalBackend | None = None, priority: int = 0) -> QueuedJob:
    """Plan the job, queue it and look once: what a deferrable task does before it defers."""
    backend = backend or LocalBackend(settings)
    service = PlacementService(settings, profile_name, backend)
    training_command(spec)
    job = service.plan(spec, f"{spec.display_name}-{uuid.uuid4().hex[:8]}", [g.gpu_type for g in backend.gpus])
    entry = service.enqueue(job.demand, owner, expected_runtime_s(settings, spec, job.features.dataset), priority)
    try:
        seen = service.look(entry.entry_id)
        acquired = service.take(seen) if seen.status == "booked" else None
    except BaseException as exc:
        backend.leave(entry.entry_id, f"the task stopped waiting: {exc}"[:500])
        raise
    return QueuedJob(job, entry, acquired, service)


def resume_job(
    spec: JobSpec,
    settings: Settings,
    entry_id: str,
    owner: str,
    waited_s: float = 0.0,
    context_tags: dict[str, str] | None = None,
    on_launch: Callable[[LaunchedJob], None] | None = None,
    backend: LocalBackend | None = None,
) -> JobOutcome:
    """Run a queued job whose entry a round has booked (the trigger said so): take the booking, then run
    as :func:`run_job` does. The demand is the queued one, so the booking and the job's record agree."""
    backend = backend or LocalBackend(settings)
    entry = backend.queue_entry(entry_id)
    if entry is None or entry.reservation_id is None:
        raise NoPlacementError(f"queue entry {entry_id} has no booking ({entry.status(backend.now()) if entry else 'gone'})")
    backend.take(entry_id)
    acquired = booked_acquisition(backend, entry, None, 0, waited_s)
    job = Planned(spec, entry.demand.job_id, spec.features(), entry.demand)
    service = PlacementService(settings, entry.profile, backend)
    return run_booked(job, acquired, settings, backend, service, owner, context_tags, on_launch)


def run_booked(job: Planned, acquired: Acquired, settings: Settings, backend: LocalBackend, service: PlacementService,
               owner: str, context_tags: dict[str, str] | None = None,
               on_launch: Callable[[LaunchedJob], None] | None = None) -> JobOutcome:
    """Launch a job on its booked GPUs, wait, release (``service`` then books the queue onto them), log
    its profiling run."""
    log.info("placed %s: %s", job.job_id, acquired.decision.reason)
    tags = {"horus.interference": service.interference_label, Tag.OWNER: owner, **(context_tags or {})}
    [outcome] = _run_together([(job, training_command(job.spec))], backend, service, acquired, settings, tags, on_launch)
    return outcome


def profile_pair(
    first: JobSpec,
    second: JobSpec,
    settings: Settings,
    owner: str,
    placement_timeout_s: float = 600.0,
    context_tags: dict[str, str] | None = None,
    backend: LocalBackend | None = None,
) -> tuple[JobOutcome, JobOutcome]:
    """Run two jobs at once on one GPU that nobody else uses, and log each as a profiling run whose
    co-resident is the other (tags ``horus.pair_id``, ``horus.co_residents``): the measurements the
    interference model learns from. Their speeds are compared with the same jobs profiled alone."""
    if first.gpus != 1 or second.gpus != 1:
        raise InvalidJobError(f"pairs are profiled on one GPU: both jobs need gpus=1, got {first.gpus} and {second.gpus}")
    backend = backend or LocalBackend(settings)
    service = PlacementService(settings, "exclusive", backend)
    gpu_types = [g.gpu_type for g in backend.gpus]
    jobs = [(service.plan(spec, f"{spec.display_name}-{uuid.uuid4().hex[:8]}", gpu_types), training_command(spec))
            for spec in (first, second)]
    pair_id = uuid.uuid4().hex[:12]
    demands = [job.demand for job, _ in jobs]
    combined = {
        t: GpuDemand(sum(d.on(t).util for d in demands), sum(d.on(t).util_p90 for d in demands), sum(d.on(t).mem_mib for d in demands))
        for t in demands[0].per_type
    }
    acquired = service.book(Demand(f"pair-{pair_id}", 1, combined, predictor=demands[0].predictor), owner, placement_timeout_s)
    log.info("pair %s placed: %s", pair_id, acquired.decision.reason)
    first_outcome, second_outcome = _run_together(jobs, backend, service, acquired, settings,
                                                  {"horus.pair_id": pair_id, Tag.OWNER: owner, **(context_tags or {})})
    return first_outcome, second_outcome


def _remember_crashes(jobs: list[tuple[Planned, list[str]]], launched: list[LaunchedJob], summaries: list[RunSummary],
                      placed_on: tuple[GpuState, ...], backend: LocalBackend) -> None:
    """A job that ran out of GPU memory next to other jobs is kept apart from them from now on
    (``oom-anti-affinity``); recorded before the GPUs are released, so no placer sees them free without it."""
    for (job, _command), handle, summary in zip(jobs, launched, summaries):
        if summary.exit_code == 0 or not backend.ran_out_of_gpu_memory(handle):
            continue
        partners = [r.signature for gpu in placed_on for r in gpu.residents]
        partners += [other.demand.signature for other, _ in jobs if other is not job]
        if partners:
            backend.record_crash(job.demand.signature, partners)


def _run_together(
    jobs: list[tuple[Planned, list[str]]],
    backend: LocalBackend,
    service: PlacementService,
    acquired: Acquired,
    settings: Settings,
    tags: dict[str, str],
    on_launch: Callable[[LaunchedJob], None] | None = None,
) -> list[JobOutcome]:
    """Launch every job on the acquired GPUs, wait for all, release (and book the queue onto the freed
    GPUs), then log one profiling run each."""
    decision, reservation = acquired.decision, acquired.reservation
    placed_on = tuple(gpu for gpu in acquired.state.gpus if gpu.gpu_id in decision.gpu_ids)
    launched: list[LaunchedJob] = []
    try:
        for job, command in jobs:
            launched.append(backend.launch(command, reservation, settings.runs_dir / job.job_id))
            if on_launch:
                on_launch(launched[-1])
        summaries = [backend.wait(handle, reservation) for handle in launched]
        _remember_crashes(jobs, launched, summaries, placed_on, backend)
    except BaseException:
        for handle in launched:  # no job keeps running on a GPU that is about to be released
            if handle.process.poll() is None:
                handle.process.terminate()
        raise
    finally:
        service.release(reservation)
    outcomes = []
    for (job, _command), summary in zip(jobs, summaries):
        predicted = job.demand.on(placed_on[0].gpu_type)
        partners = tuple(other.job_id for other, _ in jobs if other is not job)
        residents = tuple(sorted({r.job_id for gpu in placed_on for r in gpu.residents} | set(partners)))
        run_id = log_profiling_run(
            settings,
            ProfilingRecord(job.spec, job.features, predicted, job.demand.predictor, decision, placed_on, summary,
                            settings.runs_dir / job.job_id, {**tags, Tag.RESERVATION_ID: reservation.reservation_id},
                            co_residents=residents),
        )
        outcomes.append(JobOutcome(
            job_id=job.job_id,
            model=job.spec.model,
            gpu_ids=decision.gpu_ids,
            gpu_type=placed_on[0].gpu_type,
            gpu_declared=placed_on[0].declared,
            predicted_util=predicted.util,
            predicted_mem_mib=predicted.mem_mib,
            predictor=job.demand.predictor,
            reason=decision.reason,
            mlflow_run_id=run_id,
            exit_code=summary.exit_code,
            ledger_conflicts=acquired.conflicts,
            placement_s=round(acquired.seconds, 3),
        ))
    return outcomes
