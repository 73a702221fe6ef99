"""Job descriptions, the catalog, graph features and the prior: real PyTorch graphs on the meta device."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from horus_airflow.catalog import ResolvedWorkload, Workload, resolve
from horus_airflow.catalog.datasets import EnvironmentData
from horus_airflow.errors import InvalidJobError, InventoryError
from horus_airflow.features.gpus import GPU_SPECS, gpu_spec, gpu_type_from_nvml
from horus_airflow.features.graph import _StepCounter, allocated_bytes, features_of
from horus_airflow.jobs import JobSpec
from horus_airflow.predictor import AnalyticPrior


@pytest.mark.parametrize("batch_size", [0, -4, 2.5, True, 1 << 30])
def test_batch_size_must_be_a_positive_integer(batch_size: object) -> None:
    with pytest.raises(InvalidJobError, match="batch_size must be an integer from 1 to"):
        JobSpec(model="resnet18", batch_size=batch_size)  # type: ignore[arg-type]


def test_unknown_model_names_the_closest_catalog_entries() -> None:
    with pytest.raises(InvalidJobError, match=r"unknown model 'resnt18'\. Did you mean: resnet18, resnet101, resnet50\?"):
        resolve("resnt18")


def test_wrong_dataset_pairing_lists_the_datasets_that_fit() -> None:
    with pytest.raises(InvalidJobError, match="datasets that fit 'lstm_lm': wikitext103, wikitext2"):
        resolve("lstm_lm", "cifar10")


def test_unknown_gpu_type_lists_accepted_names() -> None:
    with pytest.raises(InventoryError, match="Did you mean: a100-40gb, a100-80gb"):
        gpu_spec("a100")


@pytest.mark.parametrize(
    ("nvml_name", "memory", "expected"),
    [("Tesla K80", 11441, "k80"),
     ("Tesla P100-PCIE-16GB", 16280, "p100"), ("Tesla P100-SXM2-16GB", 16280, "p100"),
     ("Tesla P100-PCIE-12GB", 12198, "p100-12gb"),
     ("Tesla V100-SXM2-16GB", 16160, "v100"), ("Tesla V100-PCIE-16GB", 16160, "v100"),
     ("Tesla V100-SXM2-32GB", 32510, "v100-32gb"), ("Tesla V100-PCIE-32GB", 32510, "v100-32gb"),
     ("Tesla V100S-PCIE-32GB", 32510, "v100-32gb"), ("Tesla V100-SXM2", 32510, "v100-32gb"),
     ("Tesla T4", 15360, "t4"), ("NVIDIA T4", 15360, "t4"), ("NVIDIA A10", 23028, "a10"),
     ("NVIDIA A100-SXM4-40GB", 40960, "a100-40gb"), ("NVIDIA A100-PCIE-40GB", 40960, "a100-40gb"),
     ("NVIDIA A100-SXM4-80GB", 81920, "a100-80gb"), ("NVIDIA A100 80GB PCIe", 81920, "a100-80gb"),
     ("NVIDIA A100-SXM4-80GB", 0, "a100-80gb"), ("NVIDIA A100-SXM4", 81920, "a100-80gb"),
     ("NVIDIA H100 80GB HBM3", 81559, "h100"), ("NVIDIA H100 PCIe", 81559, "h100-pcie"),
     ("NVIDIA H100 NVL", 95830, "h100-nvl"), ("NVIDIA H200", 143771, "h200"), ("NVIDIA H200 NVL", 143771, "h200"),
     ("NVIDIA L4", 23034, "l4"), ("NVIDIA L40", 46068, "l40"), ("NVIDIA L40S", 46068, "l40s"),
     ("NVIDIA GeForce RTX 2080 Ti", 11264, "rtx2080ti"), ("NVIDIA GeForce RTX 3090", 24576, "rtx3090"),
     ("NVIDIA GeForce RTX 4090", 24564, "rtx4090"),
     # GPU feature discovery's labels on Kubernetes nodes: dashes for spaces, -SHARED when time-sliced
     ("NVIDIA-L40", 46068, "l40"), ("Tesla-V100-SXM2-32GB", 32510, "v100-32gb"), ("NVIDIA-H100-NVL-SHARED", 95830, "h100-nvl"),
     # not in the table: never a near miss
     ("Quadro P2000", 5000, None), ("NVIDIA A10G", 23028, None), ("NVIDIA L4000", 20000, None),
     ("NVIDIA GeForce RTX 3090 Ti", 24564, None)],
)
def test_nvml_names_map_to_the_spec_table(nvml_name: str, memory: int, expected: str | None) -> None:
    assert gpu_type_from_nvml(nvml_name, memory) == expected


def test_every_gpu_type_is_reachable_from_an_nvml_name() -> None:
    from horus_airflow.features.gpus import _NVML_PRODUCTS

    assert {key for keys in _NVML_PRODUCTS.values() for key in keys} == set(GPU_SPECS)


def test_depthwise_convolution_flops_match_a_hand_count() -> None:
    """torch 2.14 over-counts grouped weight gradients by the group count; ours must not."""
    with torch.device("meta"):
        conv = nn.Conv2d(8, 8, 3, padding=1, groups=8, bias=False)
        x = torch.randn(2, 8, 5, 5, requires_grad=True)
    step = _StepCounter([])
    with step:
        y = conv(x)
        forward = step.flops.total
        y.sum().backward()
    hand = 2 * (2 * 5 * 5) * 8 * (3 * 3)  # 2 FLOPs per MAC x output positions x channels x taps
    assert forward == hand
    assert step.flops.total - forward == 2 * hand  # grad wrt input + grad wrt weight


def test_step_counter_agrees_with_pytorchs_flop_counter_and_counts_fused_kernels_once() -> None:
    """The FLOPs are PyTorch's formulas on the dispatched operators; a fused backward (SiLU's) is one kernel,
    where PyTorch's FlopCounterMode would decompose it into seven."""
    from torch.utils.flop_counter import FlopCounterMode

    with torch.device("meta"):
        net = nn.Sequential(nn.Linear(16, 32), nn.SiLU(), nn.Linear(32, 4))
        x = torch.randn(8, 16)
    step = _StepCounter([])
    with step:
        net(x).sum().backward()
    with FlopCounterMode(display=False) as reference:
        net(x).sum().backward()
    assert step.flops.total == reference.get_total_flops() > 0
    with torch.device("meta"):
        silu_input = torch.randn(8, 32, requires_grad=True)
    step = _StepCounter([])
    with step:
        nn.functional.silu(silu_input).sum().backward()
    # silu, sum, ones_like (the loss's gradient) and silu_backward; expanding the gradient is a view
    assert step.kernels == 4


def test_resnet18_features_match_torchvision_and_scale_with_batch() -> None:
    small = JobSpec(model="resnet18", batch_size=16).features()
    large = JobSpec(model="resnet18", batch_size=32).features()
    assert small.params == 11_181_642  # torchvision resnet18 with a 10-class head
    assert large.forward_flops == 2 * small.forward_flops
    assert large.train_flops == pytest.approx(3 * large.forward_flops, rel=0.05)
    assert large.activation_bytes == pytest.approx(2 * small.activation_bytes, rel=0.01)  # BN saves per-channel stats too
    assert small.dataset == "cifar10" and small.family == "resnet"


def test_prior_is_bounded_and_faster_gpus_are_less_busy() -> None:
    features = JobSpec(model="resnet18", batch_size=32).features()
    demand = AnalyticPrior().predict("j", features, 1, [GPU_SPECS["k80"], GPU_SPECS["h200"]])
    k80, h200 = demand.on("k80"), demand.on("h200")
    assert 0 < h200.util < k80.util <= 100
    assert k80.util <= k80.util_p90 <= 100
    assert h200.mem_mib > k80.mem_mib > features.param_bytes / 2**20  # more SMs, more local memory reserved


def _mlp_features(build: object, batch: int = 64, precision: str = "fp32") -> object:
    data = EnvironmentData("vectors", (64,), 10, host_us_per_sample=0.0)
    workload = Workload("mlp", "mlp", ("state",), data.name, lambda _d: build())  # type: ignore[arg-type,misc]
    return features_of(ResolvedWorkload(workload, data), batch, precision)


def test_saved_activations_are_counted_once_per_storage_and_frozen_layers_save_nothing() -> None:
    """Hand counts at batch 64: a linear layer saves its input for its weight gradient; a ReLU saves
    its output, which the next linear layer saves too (one storage, counted once); cross entropy saves
    its log-softmax (64 x 10) and its total weight (one float); the batch and the weights are not
    activations, and a frozen layer saves nothing for a weight gradient it does not need."""
    hidden, loss = 64 * 128 * 4, 64 * 10 * 4 + 4

    def chain(frozen: bool) -> nn.Module:
        middle = nn.Linear(128, 128)
        middle.requires_grad_(not frozen)
        return nn.Sequential(nn.Linear(64, 128), middle, nn.Linear(128, 10))

    for inplace in (True, False):
        relu = _mlp_features(lambda: nn.Sequential(nn.Linear(64, 128), nn.ReLU(inplace=inplace), nn.Linear(128, 10)))
        assert relu.activation_bytes == hidden + loss
    trained, frozen = _mlp_features(lambda: chain(False)), _mlp_features(lambda: chain(True))
    assert trained.activation_bytes == 2 * hidden + loss
    assert frozen.activation_bytes == hidden + loss
    assert frozen.trainable_params == trained.trainable_params - (128 * 128 + 128)
    assert trained.peak_step_bytes >= trained.activation_bytes
    amp = _mlp_features(lambda: chain(False), precision="amp")
    assert amp.activation_bytes == trained.activation_bytes // 2


def test_the_caching_allocator_rounding_is_counted() -> None:
    assert allocated_bytes(1) == 512 and allocated_bytes(513) == 1024 and allocated_bytes(1 << 20) == 1 << 20
    assert allocated_bytes((1 << 20) + 1) == 2 << 20 and allocated_bytes(5 << 20) == 6 << 20


def test_kernels_and_bytes_are_counted_per_step() -> None:
    small, large = JobSpec(model="resnet18", batch_size=16).features(), JobSpec(model="resnet18", batch_size=64).features()
    assert small.kernels == large.kernels > 100  # one per operator, whatever the batch
    assert large.bytes_other > 3 * small.bytes_other and large.bytes_dense > small.bytes_dense
    assert large.peak_step_bytes > small.peak_step_bytes >= small.trainable_params * 4  # every gradient exists at the end


def test_the_prior_knows_busy_jobs_from_idle_ones_for_physical_reasons() -> None:
    """Host-bound jobs (an RL agent stepping its environment, a small MLP launching tiny kernels, a
    recommender of embedding lookups) come out low; large convolutions and transformers high. ResNet-50
    on ImageNet is the lowest of those: one loader worker's measured JPEG decoding (2.7 ms a sample) is
    40 % of its step, as the prior models one worker."""
    prior, v100 = AnalyticPrior(), GPU_SPECS["v100"]
    low = [JobSpec(model=m, batch_size=b).features() for m, b in (("dqn", 32), ("ncf", 256), ("td3", 100))]
    high = [JobSpec(model=m, batch_size=b, dataset=d).features() for m, b, d in
            (("resnet50", 64, "imagenet"), ("bert_base", 16, "squad"), ("vgg16", 32, "cifar10"))]
    assert all(prior.estimate(f, v100).util < 20 for f in low)
    assert all(prior.estimate(f, v100).util > 55 for f in high)


def test_memory_is_counted_from_its_parts() -> None:
    """Weights, gradients and two Adam moments of bert_base, plus its counted step, plus the runtime:
    a bigger batch costs about its activations more; a bigger GPU reserves more local memory."""
    prior = AnalyticPrior()
    small, large = JobSpec(model="bert_base", batch_size=8).features(), JobSpec(model="bert_base", batch_size=16).features()
    a100, h100 = GPU_SPECS["a100-80gb"], GPU_SPECS["h100"]
    state_mib = small.param_bytes * 3 / 2**20  # weights and two Adam moments (fp32)
    assert prior.memory_mib(small, a100) > prior.runtime_mib + state_mib + small.peak_step_bytes / 2**20
    grown = prior.memory_mib(large, a100) - prior.memory_mib(small, a100)
    assert grown == pytest.approx((large.peak_step_bytes - small.peak_step_bytes) / 2**20, rel=0.05)
    assert prior.memory_mib(small, h100) - prior.memory_mib(small, a100) == pytest.approx((132 - 108) * 2048 * 1024 / 2**20)
