"""JobSpec: everything Horus needs to know about a training task before it runs."""

from __future__ import annotations

from dataclasses import dataclass, field

from horus_airflow.errors import InvalidJobError

PRECISIONS = ("fp32", "amp")
MAX_BATCH_SIZE = 1 << 20
MAX_GPUS = 64


@dataclass(frozen=True)
class JobSpec:
    """A training job: a catalog model (or a user command) with its batch size, input and GPUs.

    ``dataset`` None means the model's default dataset. ``command`` None runs the catalog's built-in
    trainer for ``steps`` steps; otherwise it is the user's own training command, still described by
    ``model`` so that its demand can be predicted.
    """

    model: str
    batch_size: int
    dataset: str | None = None
    precision: str = "fp32"
    gpus: int = 1
    steps: int = 20
    command: tuple[str, ...] | None = None
    name: str = field(default="")

    def __post_init__(self) -> None:
        if not isinstance(self.model, str) or not self.model.strip():
            raise InvalidJobError("model must be a non-empty catalog name, got {!r}".format(self.model))
        _require_int_in("batch_size", self.batch_size, 1, MAX_BATCH_SIZE)
        _require_int_in("gpus", self.gpus, 1, MAX_GPUS)
        _require_int_in("steps", self.steps, 1, 10_000_000)
        if self.precision not in PRECISIONS:
            raise InvalidJobError(
                f"precision must be one of {', '.join(PRECISIONS)}, got {self.precision!r}"
            )
        if self.command is not None and (not self.command or not all(isinstance(a, str) for a in self.command)):
            raise InvalidJobError("command must be a non-empty list of strings, got {!r}".format(self.command))

    @property
    def display_name(self) -> str:
        return self.name or f"{self.model}-b{self.batch_size}"


def _require_int_in(label: str, value: object, low: int, high: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidJobError(f"{label} must be an integer from {low} to {high}, got {value!r}")
    if not low <= value <= high:
        raise InvalidJobError(f"{label} must be an integer from {low} to {high}, got {value}")
