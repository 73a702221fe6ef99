"""The predictor's output and the placer's input."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping

from horus_airflow.errors import InvalidDemandError, NoPlacementError
from horus_airflow.features.gpus import GPU_SPECS

# Per-GPU batches beyond this are outside every public training measurement we know of (the shipped ones
# reach 7,000; recommendation models, the largest, use a few tens of thousands): the models extrapolate.
UNMEASURED_BATCH = 65_536
# With low confidence the placer books the p90 utilization and this much more memory than predicted.
LOW_CONFIDENCE_MEMORY_FACTOR = 1.25


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
    ``confidence`` is ``low`` when the prediction is a guess (:func:`judge_confidence`), and the notes
    say why; they also say why a fallback was used.
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
        extra = "; ".join((*(("low confidence",) if self.confidence == "low" else ()), *self.notes))
        return f"predicted by {self.predictor}" + (f" ({extra})" if extra else "")

    def to_dict(self) -> dict[str, object]:
        """JSON form, as a queued job keeps it in the ledger."""
        return {"job_id": self.job_id, "gpus": self.gpus,
                "per_type": {t: [d.util, d.util_p90, d.mem_mib] for t, d in self.per_type.items()},
                "predictor": self.predictor, "confidence": self.confidence, "notes": list(self.notes),
                "signature": list(self.signature)}

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> Demand:
        return cls(raw["job_id"], int(raw["gpus"]), {t: GpuDemand(*values) for t, values in raw["per_type"].items()},
                   raw["predictor"], raw["confidence"], tuple(raw["notes"]), tuple(float(x) for x in raw["signature"]))

    def on(self, gpu_type: str) -> GpuDemand:
        try:
            return self.per_type[gpu_type]
        except KeyError:
            raise NoPlacementError(
                f"no prediction for GPU type {gpu_type!r}; predicted for: {', '.join(self.per_type)}"
            ) from None


def judge_confidence(per_type: Mapping[str, GpuDemand], traced: bool, batch_size: int,
                     unmeasured_types: tuple[str, ...] = (), measured_types: tuple[str, ...] = ()) -> tuple[str, tuple[str, ...]]:
    """``low``, with the reasons, for a prediction outside what any model here has seen: a graph that
    could not be traced, a batch beyond every measurement, memory above every GPU it was asked about,
    a GPU type the trained model has no measured row of (its correction is carried over from others)."""
    reasons = []
    if unmeasured_types:
        reasons.append(f"no measured job on {', '.join(unmeasured_types)} (the model was fitted on "
                       f"{', '.join(measured_types) or 'no GPU type'}): its correction there is carried over")
    if not traced:
        reasons.append("graph not traced: estimated from parameters and input size")
    if batch_size > UNMEASURED_BATCH:
        reasons.append(f"batch size {batch_size:,} is beyond every measured job (up to {UNMEASURED_BATCH:,}): extrapolated")
    known = {t: d for t, d in per_type.items() if t in GPU_SPECS}
    if known and all(d.mem_mib > GPU_SPECS[t].memory_mib for t, d in known.items()):
        largest = max(GPU_SPECS[t].memory_mib for t in known)
        least = min(d.mem_mib for d in known.values())
        reasons.append(f"predicted memory {least / 1024:,.0f} GiB is above every GPU's ({largest / 1024:,.0f} GiB): "
                       "the job cannot run on one GPU as given (smaller batch, more GPUs)")
    return ("low" if reasons else "normal"), tuple(reasons)
