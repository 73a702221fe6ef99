"""Analytic prior: a step-time model of GPU busy time against the time one training step takes, and
peak memory counted from its parts. No constant here was fitted to a utilization or memory target;
docs/PREDICTOR.md says where each one comes from.

Used alone until a trained model exists, and as an input of the trained model, which corrects it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from horus_airflow.features.gpus import GpuSpec
from horus_airflow.features.graph import GraphFeatures, allocated_bytes
from horus_airflow.predictor.demand import Demand, GpuDemand, judge_confidence

_MIB = 1024 * 1024


@dataclass(frozen=True)
class PriorEstimate:
    """The step-time model's parts on one GPU type; the trained model uses them as features."""

    gpu_s: float  # kernels running
    host_s: float  # what the host does per step that the GPU cannot hide: dispatch, loading, copying
    step_s: float
    util: float
    mem_mib: float
    sm_share: float  # the GPU's compute the step asks for, 0-1 of the step time
    bandwidth_share: float  # the GPU's memory bandwidth the step asks for, 0-1 of the step time


@dataclass(frozen=True)
class AnalyticPrior:
    """Utilization = GPU busy time / step time, as NVML counts it (a memory-bound kernel is busy too).

    GPU time, per operator class: matrix products and convolutions at the larger of their FLOPs over the
    achievable FLOP/s (tensor-core peak under AMP) and their bytes over the achievable bandwidth;
    everything else (normalizations, activations, reductions, embeddings) at its bytes over the
    bandwidth; recurrent products at a low efficiency (small sequential products per time step); the
    optimizer's update at its bytes; and a floor per kernel launched.

    Step time = max(GPU time, host dispatch time) + input loading + host-to-device copy + a fixed
    per-step cost (the loss read back, the loader's next batch): the host can run ahead of the GPU
    within a step, but not across the synchronisation at its end.

    Memory = runtime overhead (CUDA context and the libraries' kernel images, and the local memory the
    driver reserves per SM) + weights + optimizer state + the batch + the larger of the step's counted
    peak (activations, gradients as they appear, transients; AMP's half-precision weight copies) and
    the optimizer step's (all gradients and its temporaries).
    """

    compute_efficiency: float = 0.5
    amp_compute_efficiency: float = 0.35
    recurrent_efficiency: float = 0.1
    bandwidth_efficiency: float = 0.7
    kernel_floor_s: float = 2.5e-6
    dispatch_s_per_kernel: float = 9e-6
    optimizer_call_s: float = 25e-6
    step_overhead_s: float = 150e-6
    host_to_device_gbs: float = 10.0
    runtime_mib: float = 1230.0
    stack_bytes_per_thread: int = 1024
    p90_margin: float = 1.1
    notes: tuple[str, ...] = ()  # why the prior is used, for placement explanations

    name = "prior"

    def predict(self, job_id: str, features: GraphFeatures, gpus: int, specs: list[GpuSpec]) -> Demand:
        per_type = {spec.name: self.predict_one(features, spec) for spec in specs}
        confidence, reasons = judge_confidence(per_type, features.traced, features.batch_size)
        return Demand(job_id=job_id, gpus=gpus, per_type=per_type, predictor=self.name, confidence=confidence,
                      notes=(*self.notes, *reasons))

    def predict_one(self, features: GraphFeatures, spec: GpuSpec) -> GpuDemand:
        estimate = self.estimate(features, spec)
        return GpuDemand(util=estimate.util, util_p90=min(100.0, estimate.util * self.p90_margin), mem_mib=estimate.mem_mib)

    def estimate(self, features: GraphFeatures, spec: GpuSpec) -> PriorEstimate:
        amp = features.precision == "amp"
        flops = (spec.fp16_tensor_tflops if amp else spec.fp32_tflops) * 1e12
        flops *= self.amp_compute_efficiency if amp else self.compute_efficiency
        bandwidth = spec.memory_bandwidth_gbs * 1e9 * self.bandwidth_efficiency
        dense_flops = features.flops_conv + features.flops_matmul + features.flops_attention
        compute_s = dense_flops / flops + features.flops_recurrent / (spec.fp32_tflops * 1e12 * self.recurrent_efficiency)
        dense_s = max(compute_s, features.bytes_dense / bandwidth)
        optimizer = _OptimizerStep.of(features)
        memory_s = (features.bytes_other + optimizer.bytes_moved) / bandwidth
        kernels = features.kernels + optimizer.kernels
        gpu_s = dense_s + memory_s + kernels * self.kernel_floor_s
        dispatch_s = kernels * self.dispatch_s_per_kernel + optimizer.calls * self.optimizer_call_s
        host_s = (features.batch_size * features.host_us_per_sample * 1e-6
                  + features.input_bytes / (self.host_to_device_gbs * 1e9) + self.step_overhead_s)
        step_s = max(gpu_s, dispatch_s) + host_s
        util = min(100.0, max(1.0, 100.0 * gpu_s / step_s))
        return PriorEstimate(gpu_s=gpu_s, host_s=host_s + max(0.0, dispatch_s - gpu_s), step_s=step_s, util=util,
                             mem_mib=self.memory_mib(features, spec, optimizer),
                             sm_share=min(1.0, compute_s / step_s),
                             bandwidth_share=min(1.0, (features.bytes_dense + features.bytes_other) / bandwidth / step_s))

    def memory_mib(self, features: GraphFeatures, spec: GpuSpec, optimizer: _OptimizerStep | None = None) -> float:
        optimizer = optimizer or _OptimizerStep.of(features)
        gradients = features.trainable_params * 4
        amp_weights = features.params * 2 if features.precision == "amp" else 0  # autocast's cached fp16 copies
        resident = (allocated_bytes(features.param_bytes) + optimizer.state_bytes + allocated_bytes(features.input_bytes))
        step = max(features.peak_step_bytes + amp_weights, gradients + optimizer.temporary_bytes)
        local_memory = spec.sm_count * spec.max_threads_per_sm * self.stack_bytes_per_thread
        return self.runtime_mib + local_memory / _MIB + (resident + step) / _MIB


@dataclass(frozen=True)
class _OptimizerStep:
    """What ``optimizer.step()`` costs with PyTorch's default multi-tensor (foreach) implementation.

    SGD with momentum keeps one buffer per weight, Adam two; an update reads the weights, their
    gradients and the state and writes the weights and the state back; Adam's foreach update also
    writes and reads one temporary list the size of the weights (the denominator). One foreach call
    launches a kernel per chunk of at most 36 (Adam, four lists) or 64 (SGD, two to three lists)
    tensors (``multi_tensor_apply``'s ``depth_to_max_tensors``)."""

    state_bytes: int
    temporary_bytes: int
    bytes_moved: int
    calls: int
    kernels: int

    @classmethod
    def of(cls, features: GraphFeatures) -> _OptimizerStep:
        factor = features.optimizer_state_factor
        weight_bytes = features.trainable_params * 4
        adam = factor >= 2
        temporary = weight_bytes if adam else 0
        calls = 12 if adam else 3
        per_launch = 36 if adam else 64
        return cls(
            state_bytes=factor * weight_bytes,
            temporary_bytes=temporary,
            bytes_moved=(3 + 2 * factor) * weight_bytes + 3 * temporary,
            calls=calls,
            kernels=calls * math.ceil(features.param_tensors / per_launch),
        )
