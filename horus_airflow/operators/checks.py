"""What an operator checks when Airflow parses its DAG file: every argument that is not a Jinja template,
without importing PyTorch, so that a mistake shows as the DAG's import error in Airflow's UI instead of a
task failing at run time. Templated arguments are checked again, rendered, when the task runs."""

from __future__ import annotations

import shlex
from collections.abc import Sequence

from horus_airflow.errors import InvalidJobError
from horus_airflow.jobs import PRECISIONS, JobSpec, require_trainer
from horus_airflow.names import DATASETS, MODELS, is_onnx, is_user_module, require_profile, unknown
from horus_airflow.validation import in_range, whole

QUEUE_PRIORITY_LIMIT = 1_000_000_000  # Kubernetes' ceiling for a user's PriorityClass; the floor mirrors it


def is_template(value: object) -> bool:
    """A Jinja template: its value is known only once Airflow renders it for a task run."""
    return isinstance(value, str) and "{{" in value


def command_argv(command: str | Sequence[str] | None) -> tuple[str, ...] | None:
    """A command as its arguments: a list as given, a string split the way a shell would
    (``"python train.py --lr 0.1"``), never letter by letter."""
    if command is None:
        return None
    if isinstance(command, str):
        try:
            argv = shlex.split(command)
        except ValueError as exc:
            raise InvalidJobError(f"command {command!r} does not split into arguments ({exc}); give a list of strings "
                                  "or a string a shell could run") from None
        if not argv:
            raise InvalidJobError("command is an empty string; give the training command, e.g. \"python train.py\"")
        return tuple(argv)
    if not isinstance(command, (list, tuple)):
        raise InvalidJobError(f"command must be a list of strings or a string, got {type(command).__name__}")
    return tuple(command)


def check_job(
    *, model: str, batch_size: int, dataset: str | None, seq_len: int | None, precision: str, gpus: int,
    steps: int = 1, command: str | Sequence[str] | None = None, command_required_for_onnx: bool = True,
) -> None:
    """Raise :class:`InvalidJobError` for a job that cannot run as given. A templated value is left to
    the run (its rendered form is checked then)."""
    JobSpec(
        model=model if not is_template(model) else "templated",
        batch_size=batch_size, seq_len=seq_len, gpus=gpus, steps=steps,
        precision=precision if not is_template(precision) else PRECISIONS[0],
        command=None if command is None or is_template(command) else command_argv(command),
    )
    if is_template(model) or is_user_module(model):
        if is_user_module(model) and dataset is None:
            raise InvalidJobError(f"user model {model!r} needs a dataset to know its input; accepted: {', '.join(DATASETS)}")
        return
    if is_onnx(model):
        if command_required_for_onnx:
            require_trainer(model, command)
        return
    if model not in MODELS:
        raise InvalidJobError(unknown("model", model, MODELS) + " Or give path/to/file.py:factory or model.onnx.")
    if dataset is None or is_template(dataset):
        return
    if dataset not in DATASETS:
        raise InvalidJobError(unknown("dataset", dataset, DATASETS))
    fitting = MODELS[model][1]
    if dataset not in fitting:
        raise InvalidJobError(f"model {model!r} cannot train on {dataset!r}; datasets that fit {model!r}: {', '.join(fitting)}")


def check_profile(profile: str | None) -> None:
    """A profile named in a DAG file exists: a built-in name, or a path to a YAML file (read at run time,
    where it may live on the workers only)."""
    if profile is not None and not is_template(profile):
        require_profile(profile)


def check_queue_priority(priority: int) -> None:
    try:
        whole(priority, "queue_priority (higher is placed first)", -QUEUE_PRIORITY_LIMIT, QUEUE_PRIORITY_LIMIT)
    except ValueError as exc:
        raise InvalidJobError(str(exc)) from None


def check_placement_timeout(seconds: float, poll_interval: float = 2.0) -> None:
    try:
        in_range(seconds, "placement_timeout (seconds to wait for GPUs)", 0.0, above=True)
        in_range(poll_interval, "poll_interval (seconds between looks at the queue)", 0.0, 600.0, above=True)
    except ValueError as exc:
        raise InvalidJobError(str(exc)) from None
