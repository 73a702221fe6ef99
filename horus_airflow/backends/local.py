"""Local backend: the GPUs of this machine, a SQLite ledger, jobs as child processes.

Inventory is what NVML reports. Where NVML finds no GPU, a declared inventory
(``HORUS_LOCAL_GPUS=2xa100-80gb``) lets placement run while the job itself runs on the CPU; such
GPUs are marked declared, and nothing GPU-side is measured for them.
"""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from pathlib import Path

from horus_airflow.backends.ledger import (
    Booking,
    DecisionNote,
    LiveBookings,
    QueueEntry,
    Reservation,
    RoundBooking,
    SqliteLedger,
)
from horus_airflow.errors import InventoryError
from horus_airflow.features.gpus import GPU_SPECS, gpu_spec, gpu_type_from_nvml
from horus_airflow.placement import ClusterState, Decision, GpuState
from horus_airflow.placement.state import Signature
from horus_airflow.predictor.demand import Demand
from horus_airflow.settings import Settings
from horus_airflow.telemetry import RunSummary, nvml
from horus_airflow.telemetry.wrapper import UNKNOWN_EXIT

log = logging.getLogger(__name__)

NODE = "local"
_INVENTORY_ITEM = re.compile(r"^\s*(?:([+-]?\d+)\s*[x*]\s*)?([a-z][a-z0-9-]*)\s*$", re.IGNORECASE)
MAX_DECLARED_GPUS = 64  # one machine: the largest single servers hold 16 GPUs; more is a typo, not a machine


def parse_inventory(text: str) -> list[GpuState]:
    """``'2xa100-80gb,1xt4'`` -> four declared GPUs, indexed in order."""
    gpus: list[GpuState] = []
    accepted = f"accepted: 'COUNTxTYPE[,COUNTxTYPE...]', e.g. '2xa100-80gb,1xt4', TYPE one of {', '.join(GPU_SPECS)}"
    for item in text.split(","):
        match = _INVENTORY_ITEM.match(item)
        if not match:
            raise InventoryError(f"HORUS_LOCAL_GPUS={text!r} does not parse at {item!r}; {accepted}")
        count = int(match.group(1) or 1)
        if count < 1:
            raise InventoryError(f"HORUS_LOCAL_GPUS={text!r}: count must be at least 1 in {item!r}; {accepted}")
        if len(gpus) + count > MAX_DECLARED_GPUS:
            raise InventoryError(f"HORUS_LOCAL_GPUS={text!r} declares more than {MAX_DECLARED_GPUS} GPUs on this one "
                                 f"machine; {accepted}")
        try:
            spec = gpu_spec(match.group(2))
        except InventoryError as exc:
            raise InventoryError(f"HORUS_LOCAL_GPUS={text!r}: {exc}") from None
        for _ in range(count):
            index = len(gpus)
            gpus.append(GpuState(f"{NODE}/{index}", NODE, index, spec.name, spec.memory_mib, declared=True))
    return gpus


def discover_inventory(declared: str | None) -> list[GpuState]:
    """Real GPUs when NVML reports any (a declaration is then ignored), else the declared ones."""
    real = nvml.discover_gpus()
    if real:
        if declared:
            log.warning("HORUS_LOCAL_GPUS=%r ignored: NVML reports %d real GPU(s)", declared, len(real))
        gpus = []
        for gpu in real:
            gpu_type = gpu_type_from_nvml(gpu.name, gpu.memory_mib)
            if gpu_type is None:
                log.warning("GPU %d (%s) is not in the spec table; it is left out of placement", gpu.index, gpu.name)
                continue
            gpus.append(GpuState(f"{NODE}/{gpu.index}", NODE, gpu.index, gpu_type, gpu.memory_mib))
        return gpus
    if not declared:
        raise InventoryError(
            "no GPU found by NVML and none declared; set HORUS_LOCAL_GPUS, e.g. HORUS_LOCAL_GPUS=2xa100-80gb, "
            "to place on declared GPUs while jobs run on the CPU"
        )
    return parse_inventory(declared)


_OOM_MARKERS = ("CUDA out of memory", "OutOfMemoryError", "CUDA_ERROR_OUT_OF_MEMORY", "CUBLAS_STATUS_ALLOC_FAILED")
_LOG_TAIL_BYTES = 64 * 1024


@dataclass(frozen=True)
class LaunchedJob:
    process: subprocess.Popen[bytes]
    run_dir: Path


class LocalBackend:
    def __init__(self, settings: Settings, clock: Callable[[], float] = time.time) -> None:
        self.settings = settings
        self.clock = clock
        self.gpus = discover_inventory(settings.local_gpus)
        self.ledger = SqliteLedger(settings.ledger_path)
        self._last_snapshot: ClusterState | None = None
        self._bookings = LiveBookings()
        self._index: dict[str, int] = {}
        self._built_from: list[GpuState] | None = None  # the inventory list the last snapshot was built from

    def snapshot(self) -> ClusterState:
        """The GPUs with their live bookings. The state is built from the last one this backend read,
        reading only the bookings written since and changing only the GPUs they touch: a scheduling
        round reads it often, and reading every booking and building the placer's arrays for thousands
        of GPUs from scratch costs more than the round itself. A new inventory is a new ``gpus`` list
        (the state is then built again); the list is not compared GPU by GPU each round."""
        now = self.clock()
        last = self._last_snapshot
        if last is None or self.gpus is not self._built_from:  # a new inventory: build from scratch
            self._built_from = self.gpus
            last = ClusterState(tuple(replace(gpu, residents=()) for gpu in self.gpus))
            self._bookings, self._index = LiveBookings(), {gpu.gpu_id: i for i, gpu in enumerate(last.gpus)}
        read = self.ledger.bookings_since(self._bookings.change, now)
        pairs = self.ledger.crashed_pairs()  # read after the version: a pair recorded since bumps it, so booking re-decides
        changes = {}
        for gpu_id in self._bookings.update(read, now):
            i = self._index.get(gpu_id)  # a booking of a GPU this machine no longer has holds nothing here
            residents = self._bookings.residents(gpu_id)
            if i is not None and last.gpus[i].residents != residents:
                changes[i] = replace(last.gpus[i], residents=residents)
        self._last_snapshot = last.with_changes(changes, read.version, pairs)
        return self._last_snapshot

    def gpu(self, gpu_id: str) -> GpuState:
        return next(g for g in self.gpus if g.gpu_id == gpu_id)

    def reserve(self, decision: Decision, demand: Demand, owner: str) -> Reservation:
        bookings = []
        for gpu_id in decision.gpu_ids:
            need = demand.on(self.gpu(gpu_id).gpu_type)
            bookings.append(Booking(gpu_id, need.util, need.util_p90, need.mem_mib, demand.signature))
        note = DecisionNote(decision.profile, decision.reason, decision.explanation())
        return self.ledger.reserve(
            decision.state_version, demand.job_id, owner, bookings, self.clock, self.settings.lease_seconds, note
        )

    def renew(self, reservation: Reservation) -> bool:
        return self.ledger.renew(reservation.reservation_id, self.clock, self.settings.lease_seconds)

    def now(self) -> float:
        return self.clock()

    def enqueue(self, owner: str, demand: Demand, profile: str, pool: str = "default",
                expected_runtime_s: float | None = None, priority: int = 0) -> QueueEntry:
        return self.ledger.enqueue(owner, demand, profile, pool, self.clock, self.settings.lease_seconds, expected_runtime_s,
                                   priority)

    def queue(self) -> tuple[int, list[QueueEntry]]:
        return self.ledger.queue(self.clock())

    def queue_entry(self, entry_id: str) -> QueueEntry | None:
        return self.ledger.queue_entry(entry_id)

    def book_round(self, version: int, round_id: str, bookings: list[RoundBooking], held: dict[str, str],
                   skips: dict[str, int]) -> list[Reservation]:
        return self.ledger.book_round(version, round_id, bookings, held, skips, self.clock, self.settings.lease_seconds)

    def reservation(self, reservation_id: str) -> Reservation | None:
        return self.ledger.reservation(reservation_id)

    def waits(self, window_s: float) -> dict[str, list[float]]:
        now = self.clock()
        return self.ledger.waits(now, now - window_s)

    def renew_entry(self, entry_id: str) -> bool:
        return self.ledger.renew_entry(entry_id, self.clock, self.settings.lease_seconds)

    def take(self, entry_id: str) -> None:
        self.ledger.take(entry_id, self.clock)

    def leave(self, entry_id: str, reason: str) -> bool:
        return self.ledger.leave(entry_id, self.clock, reason)

    def release(self, reservation: Reservation) -> bool:
        return self.ledger.release(reservation.reservation_id, self.clock)

    def release_owner(self, owner: str) -> int:
        return len(self.ledger.release_owner(owner, self.clock))

    def reclaim(self, owner: str) -> int:
        """Release what an earlier try of ``owner`` still holds. An owner runs one try at a time, so such
        a booking is a dead try's: its job was stopped with its launcher (``horus run --launcher-pid``),
        and waiting for its lease to expire would only hold a free GPU."""
        released = self.ledger.release_owner(owner, self.clock)
        if released:
            log.warning("released %d reservation(s) of an earlier try of %s: %s", len(released), owner, ", ".join(released))
        return len(released)

    @staticmethod
    def ran_out_of_gpu_memory(job: LaunchedJob) -> bool:
        """Whether the job's log ends with a CUDA out-of-memory error (PyTorch's ``OutOfMemoryError``,
        or the allocator's message that other frameworks print too)."""
        path = job.run_dir / "job.log"
        try:
            with path.open("rb") as handle:
                handle.seek(max(0, path.stat().st_size - _LOG_TAIL_BYTES))
                tail = handle.read().decode("utf-8", "replace")
        except OSError:
            return False
        return any(marker in tail for marker in _OOM_MARKERS)

    def record_crash(self, signature: Signature, partners: Iterable[Signature]) -> int:
        """A job with ``signature`` crashed out of memory next to jobs with these signatures: keep them
        apart from now on (the ``oom-anti-affinity`` filter). Returns how many pairs were new."""
        added = self.ledger.record_crashed_pairs({(signature, p) for p in partners if p}, self.clock()) if signature else 0
        if added:
            log.warning("recorded %d pair(s) that crashed out of memory together; they will not share a GPU again", added)
        return added

    def launch(self, command: list[str], reservation: Reservation, run_dir: Path) -> LaunchedJob:
        """Start ``command`` under the telemetry wrapper, pinned to the reserved GPUs."""
        run_dir.mkdir(parents=True, exist_ok=True)
        indices = ",".join(str(self.gpu(g).index) for g in reservation.gpu_ids)
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": indices, "HORUS_RESERVATION_ID": reservation.reservation_id}
        wrapped = [sys.executable, "-m", "horus_airflow.cli", "run", "--out", str(run_dir), "--launcher-pid", str(os.getpid()),
                   "--", *command]
        with (run_dir / "job.log").open("wb") as log_file:
            process = subprocess.Popen(wrapped, env=env, stdout=log_file, stderr=subprocess.STDOUT)
        log.info("launched %s on %s (CUDA_VISIBLE_DEVICES=%s), log %s", command[:4], reservation.gpu_ids, indices, run_dir / "job.log")
        return LaunchedJob(process, run_dir)

    def wait(self, job: LaunchedJob, reservation: Reservation, poll_s: float = 0.5) -> RunSummary:
        """Wait for the job, renewing its lease at a third of the lease time."""
        renew_every = self.settings.lease_seconds / 3
        last_renewal = self.clock()
        while job.process.poll() is None:
            time.sleep(poll_s)
            if self.clock() - last_renewal >= renew_every:
                if not self.renew(reservation):
                    log.warning("lease of reservation %s could not be renewed", reservation.reservation_id)
                last_renewal = self.clock()
        code = job.process.returncode
        exit_code = 128 - code if code < 0 else (code or 1)  # how the wrapper itself ended, when it wrote no summary
        summary = RunSummary.read(job.run_dir)
        if summary is None:
            return RunSummary(exit_code, 0.0, 0, False, None, None)
        if summary.exit_code == UNKNOWN_EXIT:  # rebuilt from the samples of a wrapper that was killed
            return replace(summary, exit_code=exit_code)
        return summary
