"""The predictor's output and the placer's input."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Mapping

from horus_airflow.errors import InvalidDemandError, NoPlacementError


@dataclass(frozen=True)
class GpuDemand:
    """What one worker of a job asks of one GPU of a given type."""

    util: float
    util_p90: float
    mem_mib: float

    def __post_init__(self) -> None:
        for name in ("util", "util_p90", "mem_mib"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or math.isnan(value) or math.isinf(value) or value < 0:
                raise InvalidDemandError(
                    f"predicted {name} must be a finite number >= 0, got {value!r}: the predictor is broken or the "
                    "demand was written by hand wrongly; nothing was placed"
                )


@dataclass(frozen=True)
class Demand:
    """A job's predicted demand on every GPU type it could land on.

    ``predictor`` says who predicted it (``prior`` or ``name/version`` of a registered model);
    ``confidence`` is ``low`` when the graph could not be traced; ``notes`` say why a fallback was used.
    """

    job_id: str
    gpus: int
    per_type: Mapping[str, GpuDemand] = field(default_factory=dict)
    predictor: str = "prior"
    confidence: str = "normal"
    notes: tuple[str, ...] = ()
    signature: tuple[float, ...] = ()  # for the interference model (horus_airflow.interference.signature)

    def explained(self) -> str:
        """One line for placement explanations."""
        extra = "; ".join((*(("low confidence: graph not traced",) if self.confidence == "low" else ()), *self.notes))
        return f"predicted by {self.predictor}" + (f" ({extra})" if extra else "")

    def on(self, gpu_type: str) -> GpuDemand:
        try:
            return self.per_type[gpu_type]
        except KeyError:
            raise NoPlacementError(
                f"no prediction for GPU type {gpu_type!r}; predicted for: {', '.join(self.per_type)}"
            ) from None
