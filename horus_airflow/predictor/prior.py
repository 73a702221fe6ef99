"""Analytic prior: a roofline estimate of GPU busy time against host-side time per training step.

Used alone until a trained model exists. Its constants are round engineering figures, not fitted to
data; the trained predictor replaces it where measurements exist.
"""

from __future__ import annotations

from dataclasses import dataclass

from horus_airflow.features.gpus import GpuSpec
from horus_airflow.features.graph import GraphFeatures
from horus_airflow.predictor.demand import Demand, GpuDemand

_MIB = 1024 * 1024


@dataclass(frozen=True)
class AnalyticPrior:
    """GPU time = max(FLOPs / achievable FLOP/s, bytes / achievable bandwidth) + kernel floors;
    host time = op dispatch + input copy; utilization = GPU time / step time."""

    compute_efficiency: float = 0.45
    bandwidth_efficiency: float = 0.6
    kernel_floor_s: float = 3e-6
    dispatch_s_per_kernel: float = 12e-6
    host_to_device_gbs: float = 10.0
    optimizer_state_factor: float = 1.0  # SGD with momentum: one extra copy of the weights
    cuda_context_mib: float = 500.0
    workspace_fraction: float = 0.1
    p90_margin: float = 1.1

    name = "prior"

    def predict(self, job_id: str, features: GraphFeatures, gpus: int, specs: list[GpuSpec]) -> Demand:
        return Demand(
            job_id=job_id,
            gpus=gpus,
            per_type={spec.name: self.predict_one(features, spec) for spec in specs},
            predictor=self.name,
        )

    def predict_one(self, features: GraphFeatures, spec: GpuSpec) -> GpuDemand:
        peak_tflops = spec.fp16_tensor_tflops if features.precision == "amp" else spec.fp32_tflops
        kernels = features.layers * 3 + 2
        compute_s = features.train_flops / (peak_tflops * 1e12 * self.compute_efficiency)
        traffic = 3 * features.activation_bytes + 4 * features.param_bytes
        memory_s = traffic / (spec.memory_bandwidth_gbs * 1e9 * self.bandwidth_efficiency)
        gpu_s = max(compute_s, memory_s) + kernels * self.kernel_floor_s
        host_s = kernels * self.dispatch_s_per_kernel + features.input_bytes / (self.host_to_device_gbs * 1e9)
        util = min(100.0, max(1.0, 100.0 * gpu_s / max(gpu_s, host_s)))
        state_bytes = features.param_bytes * (2 + self.optimizer_state_factor)
        tensors_mib = (state_bytes + features.activation_bytes + features.input_bytes) / _MIB
        mem = self.cuda_context_mib + tensors_mib * (1 + self.workspace_fraction)
        return GpuDemand(util=util, util_p90=min(100.0, util * self.p90_margin), mem_mib=mem)
