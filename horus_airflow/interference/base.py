"""What every interference model answers: given the jobs that would share one GPU, each job's
normalized speed (throughput while sharing / throughput alone; 1.0 = no slowdown) and whether they fit
together at all."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol, Sequence

from horus_airflow.features.gpus import GpuSpec
from horus_airflow.features.graph import GraphFeatures

INPUT_KINDS = ("image", "text", "translation", "interactions", "points", "frames", "state", "tensor")
SIGNATURE_FIELDS = (
    "log_train_flops", "log_params", "log_activation_bytes", "log_batch_size", "share_conv", "share_matmul",
    "share_attention", "share_recurrent", "log_host_us_per_sample", "input_kind", "log_bytes_per_flop", "log_kernels",
)
_LOG_BYTES_PER_FLOP = SIGNATURE_FIELDS.index("log_bytes_per_flop")


def signature(features: GraphFeatures) -> tuple[float, ...]:
    """The GPU-independent part of a job that the learned model sees: small, so the ledger can keep it."""
    train = max(features.train_flops, 1)
    kind = INPUT_KINDS.index(features.input_kind) if features.input_kind in INPUT_KINDS else len(INPUT_KINDS)
    return (
        math.log10(train), math.log10(max(features.params, 1)), math.log10(max(features.activation_bytes, 1)),
        math.log10(features.batch_size), features.flops_conv / train, features.flops_matmul / train,
        features.flops_attention / train, features.flops_recurrent / train,
        math.log10(1.0 + features.host_us_per_sample), float(kind),
        math.log10((1.0 + features.bytes_dense + features.bytes_other) / train), math.log10(1.0 + features.kernels),
    )


def demand_shares(util: float, job_signature: tuple[float, ...], gpu: GpuSpec) -> tuple[float, float]:
    """A job's predicted share of the GPU's SM time and of its memory bandwidth (0-1 each): its busy
    time (``util``) split by how long its FLOPs take at the GPU's peak against how long its bytes take at
    the GPU's bandwidth. Two jobs contend on what both ask for; the split is what transfers to a GPU
    whose balance of compute and bandwidth differs."""
    per_flop_compute = 1.0 / (gpu.fp32_tflops * 1e12)
    per_flop_memory = 10 ** job_signature[_LOG_BYTES_PER_FLOP] / (gpu.memory_bandwidth_gbs * 1e9)
    compute = per_flop_compute / (per_flop_compute + per_flop_memory)
    busy = util / 100.0
    return busy * compute, busy * (1.0 - compute)


@dataclass(frozen=True)
class CoRunner:
    """One job on the GPU in question: its predicted demand there, and its signature (empty when
    unknown, e.g. a reservation made without one)."""

    util: float
    util_p90: float
    mem_mib: float
    signature: tuple[float, ...] = ()


@dataclass(frozen=True)
class Interference:
    speeds: tuple[float, ...]
    fits: bool
    note: str = ""  # why a model other than the one asked answered (a job it has not seen)


class InterferenceModel(Protocol):
    name: str

    def predict(self, jobs: Sequence[CoRunner], gpu: GpuSpec) -> Interference: ...

    def predict_many(self, groups: Sequence[Sequence[CoRunner]], gpu: GpuSpec) -> list[Interference]:
        """Several independent groups on the same GPU type (the placer asks about many GPUs at once)."""
        ...
