"""JobSpec: everything Horus needs to know about a training task before it runs."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from horus_airflow.errors import InvalidJobError
from horus_airflow.names import is_onnx

if TYPE_CHECKING:  # the features bring PyTorch: a DAG file that builds a JobSpec must parse without it
    from horus_airflow.features import GraphFeatures

PRECISIONS = ("fp32", "amp")
MAX_BATCH_SIZE = 1 << 20
MAX_GPUS = 64
MAX_SEQ_LEN = 1 << 17


@dataclass(frozen=True)
class JobSpec:
    """A training job: a model with its batch size, input and GPUs.

    ``model`` is a catalog name, a user's ``path/to/file.py:factory`` or a ``model.onnx`` file.
    ``dataset`` None means the model's default dataset; ``seq_len`` overrides a text or translation
    dataset's sequence length. ``command`` None runs the catalog's built-in
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
    seq_len: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.model, str) or not self.model.strip():
            raise InvalidJobError(
                f"model must be a catalog name, path/to/file.py:factory or model.onnx, got {self.model!r}"
            )
        _require_int_in("batch_size", self.batch_size, 1, MAX_BATCH_SIZE)
        _require_int_in("gpus", self.gpus, 1, MAX_GPUS)
        _require_int_in("steps", self.steps, 1, 10_000_000)
        if self.seq_len is not None:
            _require_int_in("seq_len", self.seq_len, 1, MAX_SEQ_LEN)
        if self.precision not in PRECISIONS:
            raise InvalidJobError(
                f"precision must be one of {', '.join(PRECISIONS)}, got {self.precision!r}"
            )
        if self.command is not None and (not self.command or not all(isinstance(a, str) for a in self.command)):
            raise InvalidJobError("command must be a non-empty list of strings, got {!r}".format(self.command))

    @property
    def display_name(self) -> str:
        return self.name or f"{Path(self.model.partition(':')[0]).stem}-b{self.batch_size}"

    def features(self) -> GraphFeatures:
        """The graph features of this job's training step (cached per process)."""
        from horus_airflow.features import extract_features

        return extract_features(self.model, self.batch_size, self.dataset, self.precision, self.seq_len)

    @classmethod
    def parse(cls, text: str, **fields: object) -> JobSpec:
        """``MODEL:BATCH[:amp][@DATASET]`` (catalog models), e.g. ``resnet50:64:amp@imagenet``; ``fields``
        sets the rest (``steps``, ``name``...)."""
        body, _, dataset = text.partition("@")
        parts = body.split(":")
        try:
            if len(parts) not in (2, 3) or (len(parts) == 3 and parts[2] != "amp"):
                raise ValueError
            return cls(model=parts[0], batch_size=int(parts[1]), dataset=dataset or None,
                       precision="amp" if len(parts) == 3 else "fp32", **fields)  # type: ignore[arg-type]
        except (ValueError, InvalidJobError) as exc:
            detail = f": {exc}" if str(exc) else ""
            raise InvalidJobError(f"job {text!r} is not MODEL:BATCH[:amp][@DATASET], e.g. resnet50:64:amp@imagenet{detail}") from None


def require_trainer(model: str, command: object) -> None:
    """An ONNX graph can be predicted for but not trained by the built-in trainer: it needs a command."""
    if command is None and is_onnx(model):
        raise InvalidJobError(
            f"an ONNX model ({model!r}) cannot be trained by the built-in trainer: give command=[...] "
            "that trains it; Horus predicts its demand from the graph"
        )


def _require_int_in(label: str, value: object, low: int, high: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidJobError(f"{label} must be an integer from {low} to {high}, got {value!r}")
    if not low <= value <= high:
        raise InvalidJobError(f"{label} must be an integer from {low} to {high}, got {value}")
