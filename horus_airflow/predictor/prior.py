"""Analytic prior: a roofline estimate of GPU busy time against host-side time per training step, and
peak memory from what a step keeps resident.

Used alone until a trained model exists, and as an input of the trained model. Its constants are
round engineering figures, not fitted to data; the trained predictor corrects it where measurements
exist.
"""

from __future__ import annotations

from dataclasses import dataclass

from horus_airflow.features.gpus import GpuSpec
from horus_airflow.features.graph import GraphFeatures
from horus_airflow.predictor.demand import Demand, GpuDemand, judge_confidence

_MIB = 1024 * 1024


@dataclass(frozen=True)
class PriorEstimate:
    """The prior's intermediate quantities; the trained model uses them as features."""

    gpu_s: float
    host_s: float
    util: float
    mem_mib: float


@dataclass(frozen=True)
class AnalyticPrior:
    """GPU time = max(FLOPs / achievable FLOP/s, bytes / achievable bandwidth) + kernel floors;
    host time = kernel dispatch + input copy + per-sample loading or environment work;
    utilization = GPU time / step time (NVML counts a memory-bound kernel as busy too).
    Memory = CUDA context + weights, gradients and optimizer state + saved activations + workspace."""

    compute_efficiency: float = 0.45
    recurrent_efficiency: float = 0.15  # small sequential products per time step
    bandwidth_efficiency: float = 0.6
    kernel_floor_s: float = 3e-6
    dispatch_s_per_kernel: float = 12e-6
    host_to_device_gbs: float = 10.0
    cuda_context_mib: float = 500.0
    workspace_fraction: float = 0.1
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
        peak = (spec.fp16_tensor_tflops if features.precision == "amp" else spec.fp32_tflops) * 1e12
        dense = features.flops_conv + features.flops_matmul + features.flops_attention
        compute_s = dense / (peak * self.compute_efficiency) + features.flops_recurrent / (peak * self.recurrent_efficiency)
        state_bytes = features.param_bytes * (2 + features.optimizer_state_factor)
        traffic = 3 * features.activation_bytes + 2 * state_bytes
        memory_s = traffic / (spec.memory_bandwidth_gbs * 1e9 * self.bandwidth_efficiency)
        kernels = 3 * features.layers + 2
        gpu_s = max(compute_s, memory_s) + kernels * self.kernel_floor_s
        host_s = (
            kernels * self.dispatch_s_per_kernel
            + features.input_bytes / (self.host_to_device_gbs * 1e9)
            + features.batch_size * features.host_us_per_sample * 1e-6
        )
        util = min(100.0, max(1.0, 100.0 * gpu_s / max(gpu_s, host_s)))
        amp_copy = features.params * 2 if features.precision == "amp" else 0
        tensors = state_bytes + amp_copy + features.activation_bytes + features.input_bytes
        mem = self.cuda_context_mib + tensors / _MIB * (1 + self.workspace_fraction)
        return PriorEstimate(gpu_s=gpu_s, host_s=host_s, util=util, mem_mib=mem)
