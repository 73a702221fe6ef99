"""Graph features of one training step, counted on the meta device so no real memory is touched."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode, conv_flop_count

from horus_airflow.catalog import resolve
from horus_airflow.jobs import JobSpec

_BYTES = {"fp32": 4, "amp": 2}


@dataclass(frozen=True)
class GraphFeatures:
    """What the predictor knows about a job before it runs (per training step, whole batch)."""

    model: str
    family: str
    dataset: str
    batch_size: int
    precision: str
    forward_flops: int
    train_flops: int
    params: int
    param_bytes: int
    activation_bytes: int
    input_bytes: int
    layers: int

    def as_params(self) -> dict[str, str]:
        """Flat string form for MLflow params and XCom."""
        return {f"feature.{k}": str(v) for k, v in asdict(self).items()}


def extract_features(spec: JobSpec) -> GraphFeatures:
    """Count FLOPs of forward and backward and the activations a step keeps, at the job's batch size."""
    resolved = resolve(spec.model, spec.dataset)
    element_bytes = _BYTES[spec.precision]
    with torch.device("meta"):
        net = resolved.build()
        inputs, targets = resolved.dataset.batch(spec.batch_size, "meta")
    activation_elements = 0
    leaves = [m for m in net.modules() if not list(m.children())]

    def count_outputs(_module: nn.Module, _args: object, output: object) -> None:
        nonlocal activation_elements
        for tensor in _tensors(output):
            activation_elements += tensor.numel()

    handles = [leaf.register_forward_hook(count_outputs) for leaf in leaves]
    try:
        with flop_counter() as forward_counter:
            logits = net(inputs)
        with flop_counter() as backward_counter:
            loss = nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
            loss.backward()
    finally:
        for handle in handles:
            handle.remove()
    forward = forward_counter.get_total_flops()
    params = sum(p.numel() for p in net.parameters())
    return GraphFeatures(
        model=resolved.workload.name,
        family=resolved.workload.family,
        dataset=resolved.dataset.name,
        batch_size=spec.batch_size,
        precision=spec.precision,
        forward_flops=forward,
        train_flops=forward + backward_counter.get_total_flops(),
        params=params,
        param_bytes=params * 4,
        activation_bytes=activation_elements * element_bytes,
        input_bytes=resolved.dataset.sample_bytes() * spec.batch_size,
        layers=len(leaves),
    )


def flop_counter() -> FlopCounterMode:
    """PyTorch's FLOP counter with grouped-convolution weight gradients counted correctly."""
    return FlopCounterMode(
        display=False, custom_mapping={torch.ops.aten.convolution_backward: _convolution_backward_flops}
    )


def _convolution_backward_flops(
    grad_out_shape: list[int],
    x_shape: list[int],
    w_shape: list[int],
    _bias: object,
    _stride: object,
    _padding: object,
    _dilation: object,
    transposed: bool,
    _output_padding: object,
    groups: int,
    output_mask: list[bool],
    out_shape: list[list[int] | None],
    **_kwargs: object,
) -> int:
    """torch 2.14's formula without its slip: the weight gradient of a grouped convolution is a
    convolution over ``C_in / groups`` channels per output channel, so its count is divided by ``groups``."""

    def swap(shape: list[int]) -> list[int]:
        return [shape[1], shape[0], *shape[2:]]

    flops = 0
    if output_mask[0] and out_shape[0] is not None:
        flops += conv_flop_count(grad_out_shape, w_shape, list(out_shape[0]), not transposed)
    if output_mask[1] and out_shape[1] is not None:
        grad_weight = swap(list(out_shape[1]))
        if transposed:
            weight_term = conv_flop_count(swap(grad_out_shape), swap(x_shape), grad_weight, transposed=False)
        else:
            weight_term = conv_flop_count(swap(x_shape), swap(grad_out_shape), grad_weight, transposed=False)
        flops += weight_term // groups
    return flops


def _tensors(output: object) -> list[torch.Tensor]:
    if isinstance(output, torch.Tensor):
        return [output]
    if isinstance(output, (tuple, list)):
        return [t for item in output for t in _tensors(item)]
    return []
