"""BookingTrigger: wait in the triggerer until a scheduling round books a queued task's GPUs.

The task queued its demand in the ledger and deferred. Each look runs a scheduling round (any process
may) and reads the entry back, in a thread so the triggerer's event loop never blocks on SQLite or on
the placer; between looks the entry's lease is renewed. The trigger fires once: ``booked`` (the task
resumes and takes the booking), ``timeout`` (it left the queue at its deadline) or the state of an entry
that is no longer waiting (``expired``, ``left``, ``gone``). A triggerer restart re-creates the trigger
from :meth:`serialize`; the entry, in the ledger, is not touched by it. Killing or clearing the task
(``on_kill``) takes the entry out of the queue.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import AsyncIterator
from functools import cached_property
from typing import TYPE_CHECKING, Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

if TYPE_CHECKING:
    from horus_airflow.service import PlacementService

log = logging.getLogger(__name__)

# What the triggerer needs to reach the same ledger and models as the task that deferred.
_CARRIED = ("HORUS_HOME", "HORUS_LOCAL_GPUS", "HORUS_LEASE_SECONDS", "MLFLOW_TRACKING_URI", "HORUS_PROJECT_ROOT")


class BookingTrigger(BaseTrigger):
    """:param entry_id: the queue entry of the deferred task.
    :param deadline: wall-clock time (epoch seconds) after which the task stops waiting.
    :param environment: the task's Horus settings (``HORUS_HOME`` and the rest), so a triggerer started
        with other variables reads the same ledger; default: this process's.
    :param poll_s: seconds between looks.
    :param kubernetes: for a queue in the Kubernetes ledger: how the pod operator reaches the API server
        (``conn_id``, ``in_cluster``, ``config_file``, ``cluster_context``, as its ``KubernetesHook``) and
        the ledger's options (``namespace``, ``lease_s``, ``pending_deadline_s``); none: the local ledger."""

    def __init__(self, entry_id: str, deadline: float, environment: dict[str, str] | None = None,
                 poll_s: float = 2.0, kubernetes: dict[str, Any] | None = None) -> None:
        super().__init__()
        self.entry_id = entry_id
        self.deadline = deadline
        self.environment = environment if environment is not None else {k: os.environ[k] for k in _CARRIED if k in os.environ}
        self.poll_s = poll_s
        self.kubernetes = kubernetes

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return ("horus_airflow.triggers.booking.BookingTrigger",
                {"entry_id": self.entry_id, "deadline": self.deadline, "environment": self.environment,
                 "poll_s": self.poll_s, "kubernetes": self.kubernetes})

    async def run(self) -> AsyncIterator[TriggerEvent]:
        started = time.time()
        while True:
            event = await asyncio.to_thread(self._look)
            if event is not None:
                yield TriggerEvent({**event, "entry_id": self.entry_id, "waited_s": time.time() - started})
                return
            await asyncio.sleep(self.poll_s)

    async def on_kill(self) -> None:
        await asyncio.to_thread(self._leave, "the task was killed or cleared while queued")

    @cached_property
    def _service(self) -> PlacementService:
        """Built once per trigger (the interference champion and the GPU inventory are read once), in the
        triggerer, never when the task defers: the task's process does not need PyTorch for it."""
        from horus_airflow.backends import LocalBackend
        from horus_airflow.service import PlacementService
        from horus_airflow.settings import Settings

        settings = Settings.from_env({**os.environ, **self.environment})
        if self.kubernetes is None:
            return PlacementService(settings, None, LocalBackend(settings))
        from airflow.providers.cncf.kubernetes.hooks.kubernetes import KubernetesHook

        from horus_airflow.backends.kubernetes import KubernetesBackend, KubernetesOptions

        k = self.kubernetes
        hook = KubernetesHook(conn_id=k["conn_id"], in_cluster=k["in_cluster"], config_file=k["config_file"],
                              cluster_context=k["cluster_context"])
        options = KubernetesOptions(namespace=k["namespace"], lease_s=k["lease_s"], pending_deadline_s=k["pending_deadline_s"])
        return PlacementService(settings, None, KubernetesBackend(hook.core_v1_client, options))

    def _look(self) -> dict[str, Any] | None:
        service = self._service
        seen = service.look(self.entry_id)
        reason = seen.entry.reason if seen.entry is not None else "the ledger has no such entry"
        if seen.status == "booked":
            return {"status": "booked", "reason": reason}
        if seen.status != "waiting":
            return {"status": seen.status, "reason": reason}
        if time.time() >= self.deadline:
            service.backend.leave(self.entry_id, f"not placed before its deadline: {reason}")
            return {"status": "timeout", "reason": reason}
        service.backend.renew_entry(self.entry_id)
        log.info("queue entry %s waits: %s", self.entry_id, reason)
        return None

    def _leave(self, reason: str) -> None:
        self._service.backend.leave(self.entry_id, reason)
