"""HorusTrainingOperator: run one training task on the GPU the placer chooses, on this machine."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator, Context, conf
from airflow.sdk.exceptions import AirflowException

from horus_airflow.operators.checks import check_job, check_placement_timeout, check_profile, check_queue_priority, command_argv
from horus_airflow.operators.failures import as_airflow_errors
from horus_airflow.operators.owner import task_owner
from horus_airflow.settings import Settings

if TYPE_CHECKING:
    from horus_airflow.backends.local import LaunchedJob
    from horus_airflow.jobs import JobSpec
    from horus_airflow.pipeline import JobOutcome

log = logging.getLogger(__name__)


class HorusTrainingOperator(BaseOperator):
    """Predict the job's GPU demand from its model graph, place it, run it pinned to the chosen GPU
    under telemetry, log a profiling run to MLflow and release the GPU, whatever happens.

    :param model: catalog model name (e.g. ``resnet18``), ``path/to/file.py:factory`` (a function
        returning your ``torch.nn.Module``; give ``dataset``) or ``model.onnx`` (give ``command``).
    :param batch_size: training batch size.
    :param dataset: dataset whose input shape the job trains on; default: the model's own.
    :param seq_len: sequence length for text and translation datasets; default: the dataset's.
    :param steps: training steps of the built-in trainer.
    :param precision: ``fp32`` or ``amp``.
    :param gpus: GPUs the job needs (all on one node).
    :param command: the user's own training command, a list of arguments or a string split as a shell
        would (``"python train.py --lr 0.1"``); ``model`` still describes it for prediction.
    :param profile: placement profile: ``exclusive``, ``gandiva-pack``, ``binpack``, ``spread``, ``horus-paper``,
        ``horus-ml`` (docs/PLACEMENT.md) or a YAML path; default ``HORUS_PROFILE`` or ``horus-paper``.
    :param placement_timeout: seconds to wait for a GPU before failing.
    :param queue_priority: a whole number; a queued job of a higher one is placed before any of a lower
        one, whatever the queue policy (which orders jobs of one priority). Default 0. Not Airflow's
        ``priority_weight``, which orders executor slots and by default sums the downstream tasks'.
    :param deferrable: while its job is queued, wait in the triggerer (:class:`~horus_airflow.triggers.BookingTrigger`),
        holding no worker slot; ``False`` waits in the worker. Default: Airflow's
        ``[operators] default_deferrable``. Either way the job waits in the ledger's queue, and a
        scheduling round books it in the queue policy's order (docs/SCHEDULER.md).

    Every argument that is not a template is checked when the DAG file is parsed (without PyTorch), so
    a mistake is the DAG's import error; bad input found when the task runs fails it without retries.

    Returns (XCom) the placement outcome: GPUs, predicted demand, reason and MLflow run id.
    """

    template_fields: Sequence[str] = ("model", "dataset", "precision", "profile", "command")
    ui_color = "#f0e4ff"

    def __init__(
        self,
        *,
        model: str,
        batch_size: int,
        dataset: str | None = None,
        seq_len: int | None = None,
        steps: int = 20,
        precision: str = "fp32",
        gpus: int = 1,
        command: list[str] | str | None = None,
        profile: str | None = None,
        placement_timeout: float = 600.0,
        queue_priority: int = 0,
        deferrable: bool = conf.getboolean("operators", "default_deferrable", fallback=False),
        poll_interval: float = 2.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        check_job(model=model, batch_size=batch_size, dataset=dataset, seq_len=seq_len, precision=precision, gpus=gpus,
                  steps=steps, command=command)
        check_profile(profile)
        check_placement_timeout(placement_timeout, poll_interval)
        check_queue_priority(queue_priority)
        self.model = model
        self.batch_size = batch_size
        self.dataset = dataset
        self.seq_len = seq_len
        self.steps = steps
        self.precision = precision
        self.gpus = gpus
        self.command = command
        self.profile = profile
        self.placement_timeout = placement_timeout
        self.queue_priority = queue_priority
        self.deferrable = deferrable
        self.poll_interval = poll_interval
        self._job: LaunchedJob | None = None

    def execute(self, context: Context) -> dict[str, Any]:
        # Imported here, not at the top: every DAG file imports this module at each parse, and the
        # pipeline brings PyTorch, MLflow and LightGBM (5 s a parse; under load past the DAG processor's timeout)
        from horus_airflow.pipeline import queue_job, run_booked, run_job

        ti = context["ti"]
        settings = Settings.from_env()
        with as_airflow_errors():
            spec = self._spec()
            if not self.deferrable:
                outcome = run_job(spec, settings, owner=task_owner(ti), profile_name=self.profile,
                                  placement_timeout_s=self.placement_timeout, context_tags=_tags(ti),
                                  on_launch=self._remember, priority=self.queue_priority)
                return self._finished(outcome)
            from horus_airflow.backends import LocalBackend

            backend = LocalBackend(settings)
            queued = queue_job(spec, settings, task_owner(ti), self.profile, backend, self.queue_priority)
            if queued.acquired is not None:
                outcome = run_booked(queued.job, queued.acquired, settings, backend, queued.service,
                                     task_owner(ti), _tags(ti), self._remember)
                return self._finished(outcome)
        from horus_airflow.triggers import BookingTrigger

        log.info("queued as %s: %s; deferring", queued.entry.entry_id, queued.entry.reason or "waiting for the next round")
        self.defer(trigger=BookingTrigger(queued.entry.entry_id, time.time() + self.placement_timeout, poll_s=self.poll_interval),
                   method_name="execute_booked")

    def execute_booked(self, context: Context, event: dict[str, Any]) -> dict[str, Any]:
        """Resumed by the trigger: run the job on the GPUs a round booked, or fail with why it was not."""
        from horus_airflow.pipeline import resume_job

        if event.get("status") != "booked":
            raise AirflowException(f"not placed: queue entry {event.get('entry_id')} {event.get('status')}: {event.get('reason')}")
        ti = context["ti"]
        with as_airflow_errors():
            outcome = resume_job(self._spec(), Settings.from_env(), event["entry_id"], task_owner(ti),
                                 float(event.get("waited_s", 0.0)), _tags(ti), self._remember)
        return self._finished(outcome)

    def _spec(self) -> JobSpec:
        from horus_airflow.jobs import JobSpec

        return JobSpec(model=self.model, batch_size=self.batch_size, dataset=self.dataset, seq_len=self.seq_len,
                       precision=self.precision, gpus=self.gpus, steps=self.steps, command=command_argv(self.command),
                       name=self.task_id)

    def _finished(self, outcome: JobOutcome) -> dict[str, Any]:
        self._job = None
        if outcome.exit_code != 0:
            raise AirflowException(
                f"training job {outcome.job_id} exited with code {outcome.exit_code}; "
                f"GPU released; profiling run {outcome.mlflow_run_id} has its log"
            )
        log.info("done on %s: %s", ",".join(outcome.gpu_ids), outcome.reason)
        return asdict(outcome)

    def _remember(self, job: LaunchedJob) -> None:
        self._job = job

    def on_kill(self) -> None:
        if self._job is not None and self._job.process.poll() is None:
            log.info("terminating training process %d", self._job.process.pid)
            self._job.process.terminate()


def _tags(ti: Any) -> dict[str, str]:
    return {"airflow.dag_id": ti.dag_id, "airflow.task_id": ti.task_id, "airflow.run_id": ti.run_id,
            "airflow.try_number": str(ti.try_number)}
