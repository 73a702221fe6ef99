"""The same feature set from an ONNX graph: shapes from ONNX shape inference, FLOPs from each node's
operator and shapes. ONNX holds the forward pass only, so the training step is taken as three forward
passes (backward of a product costs two), the usual estimate, for FLOPs, kernels and bytes moved alike;
every output of a computing node is taken as saved for backward, and the step's peak as those plus one
gradient per weight and the largest output as a transient."""

from __future__ import annotations

import math
from pathlib import Path

import onnx
from onnx import shape_inference

from horus_airflow.catalog import resolve_dataset
from horus_airflow.errors import InvalidJobError
from horus_airflow.features.graph import PRECISION_BYTES, GraphFeatures

_TRAIN_FACTOR = 3
_NORM_OPS = {"BatchNormalization", "LayerNormalization", "InstanceNormalization", "GroupNormalization", "RMSNormalization"}
_ACTIVATION_OPS = {"Relu", "LeakyRelu", "PRelu", "Gelu", "Sigmoid", "Tanh", "Softmax", "LogSoftmax", "HardSwish",
                   "HardSigmoid", "Elu", "Selu", "Softplus", "Mish", "Clip"}
_POOL_OPS = {"MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool", "LpPool"}
_RECURRENT_GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}
_DENSE_OPS = {"Conv", "ConvTranspose", "Gemm", "MatMul", *_RECURRENT_GATES}
_NO_COMPUTE_OPS = {"Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Shape", "Constant", "Identity",
                   "Concat", "Slice", "Cast", "Split", "Expand", "ConstantOfShape", "Size", "Range", "Gather",
                   "Dropout"}


def onnx_features(path: str, batch_size: int, dataset: str | None = None, precision: str = "fp32",
                  seq_len: int | None = None) -> GraphFeatures:
    """Count an ONNX model's training step at ``batch_size``; symbolic batch dimensions are set to it
    and other symbolic dimensions to ``seq_len``."""
    if precision not in PRECISION_BYTES:
        raise InvalidJobError(f"precision must be one of {', '.join(PRECISION_BYTES)}, got {precision!r}")
    graph_model = _load(path)
    weights = {init.name: init for init in graph_model.graph.initializer}
    inputs = [i for i in graph_model.graph.input if i.name not in weights]
    _fix_symbolic_dims(inputs, batch_size, seq_len, path)
    try:
        inferred = shape_inference.infer_shapes(graph_model, data_prop=True)
    except Exception as exc:
        raise InvalidJobError(f"ONNX shape inference failed on {path!r}: {exc}") from exc
    shapes = _shapes(inferred, weights)
    counts = _count_nodes(inferred.graph, shapes, weights)
    element_bytes = PRECISION_BYTES[precision]
    params = sum(math.prod(w.dims) for w in weights.values())
    input_elements = sum(math.prod(shapes.get(i.name, ())) for i in inputs)
    data = resolve_dataset(dataset, seq_len) if dataset else None
    forward = counts["conv"] + counts["matmul"] + counts["attention"] + counts["recurrent"]
    layers = {k: v for k, v in counts.items() if k.startswith("layers")}
    return GraphFeatures(
        model=Path(path).name,
        family=f"onnx:{Path(path).stem}",
        dataset=data.name if data else "onnx-inputs",
        input_kind=data.kind if data else "tensor",
        source="onnx",
        traced=counts["unknown_outputs"] == 0,
        batch_size=batch_size,
        precision=precision,
        precision_bytes=element_bytes,
        optimizer_state_factor=2,
        forward_flops=forward,
        train_flops=_TRAIN_FACTOR * forward,
        flops_conv=_TRAIN_FACTOR * counts["conv"],
        flops_matmul=_TRAIN_FACTOR * counts["matmul"],
        flops_attention=_TRAIN_FACTOR * counts["attention"],
        flops_recurrent=_TRAIN_FACTOR * counts["recurrent"],
        flops_norm=_TRAIN_FACTOR * counts["norm"],
        flops_elementwise=_TRAIN_FACTOR * counts["elementwise"],
        params=params,
        param_bytes=params * 4,
        trainable_params=params,
        param_tensors=len(weights),
        activation_bytes=counts["activation_elements"] * element_bytes,
        peak_step_bytes=(counts["activation_elements"] + counts["largest_output"]) * element_bytes + params * 4,
        kernels=_TRAIN_FACTOR * counts["layers"],
        bytes_dense=_TRAIN_FACTOR * counts["dense_elements"] * element_bytes,
        bytes_other=_TRAIN_FACTOR * counts["other_elements"] * element_bytes,
        input_bytes=input_elements * 4,
        input_elements=input_elements // batch_size,
        host_us_per_sample=data.host_us_per_sample if data else 0.0,
        depth=layers["layers_conv"] + layers["layers_linear"] + layers["layers_recurrent"] + layers["layers_attention"],
        **layers,
    )


def _load(path: str) -> onnx.ModelProto:
    if not Path(path).is_file():
        raise InvalidJobError(f"ONNX file not found: {path!r}")
    try:
        graph_model = onnx.load(path)
        onnx.checker.check_model(graph_model)
    except Exception as exc:
        raise InvalidJobError(f"{path!r} is not a valid ONNX model: {type(exc).__name__}: {exc}") from exc
    return graph_model


def _fix_symbolic_dims(inputs: list[onnx.ValueInfoProto], batch_size: int, seq_len: int | None, path: str) -> None:
    for value in inputs:
        for position, dim in enumerate(value.type.tensor_type.shape.dim):
            if dim.HasField("dim_value"):
                continue
            if position == 0:
                dim.dim_value = batch_size
            elif seq_len is not None:
                dim.dim_value = seq_len
            else:
                raise InvalidJobError(
                    f"ONNX input {value.name!r} of {path!r} has a symbolic dimension {dim.dim_param or position!r}; "
                    "give seq_len to set it"
                )


def _shapes(graph_model: onnx.ModelProto, weights: dict[str, onnx.TensorProto]) -> dict[str, tuple[int, ...]]:
    shapes = {name: tuple(w.dims) for name, w in weights.items()}
    graph = graph_model.graph
    for value in (*graph.input, *graph.value_info, *graph.output):
        dims = value.type.tensor_type.shape.dim
        if dims and all(d.HasField("dim_value") for d in dims):
            shapes[value.name] = tuple(d.dim_value for d in dims)
    return shapes


def _count_nodes(graph: onnx.GraphProto, shapes: dict[str, tuple[int, ...]], weights: dict[str, onnx.TensorProto]) -> dict[str, int]:
    counts = dict.fromkeys(
        ("conv", "matmul", "attention", "recurrent", "norm", "elementwise", "activation_elements", "unknown_outputs",
         "largest_output", "dense_elements", "other_elements",
         "layers", "layers_conv", "layers_linear", "layers_attention", "layers_recurrent", "layers_norm",
         "layers_activation", "layers_pool", "layers_embedding", "layers_dropout"), 0)
    for node in graph.node:
        op = node.op_type
        outputs = [shapes.get(o) for o in node.output if o]
        if any(shape is None for shape in outputs):
            counts["unknown_outputs"] += 1
            continue
        out_elements = sum(math.prod(s) for s in outputs if s is not None)
        if op == "Dropout":
            counts["layers_dropout"] += 1
        if op == "Gather" and node.input[0] in weights:
            counts["layers_embedding"] += 1
        if op in _NO_COMPUTE_OPS:
            continue
        counts["layers"] += 1
        counts["activation_elements"] += out_elements
        counts["largest_output"] = max(counts["largest_output"], out_elements)
        moved = out_elements + sum(math.prod(shapes.get(i, ())) for i in node.input if i and i in shapes)
        counts["dense_elements" if op in _DENSE_OPS else "other_elements"] += moved
        if op in ("Conv", "ConvTranspose"):
            counts["conv"] += _conv_flops(node, shapes)
            counts["layers_conv"] += 1
        elif op in ("Gemm", "MatMul"):
            flops = _product_flops(node, shapes)
            if any(name in weights for name in node.input[:2]):
                counts["matmul"] += flops
                counts["layers_linear"] += 1
            else:  # activation x activation: the score and value products of attention
                counts["attention"] += flops
                counts["layers_attention"] += 1
        elif op in _RECURRENT_GATES:
            counts["recurrent"] += _recurrent_flops(node, shapes, _RECURRENT_GATES[op])
            counts["layers_recurrent"] += 1
        elif op in _NORM_OPS:
            counts["norm"] += 5 * out_elements
            counts["layers_norm"] += 1
        else:
            counts["elementwise"] += out_elements
            counts["layers_activation"] += op in _ACTIVATION_OPS
            counts["layers_pool"] += op in _POOL_OPS
    counts["layers_attention"] //= 2  # two products per attention block
    return counts


def _conv_flops(node: onnx.NodeProto, shapes: dict[str, tuple[int, ...]]) -> int:
    weight = shapes[node.input[1]]
    kernel = math.prod(weight[2:])
    if node.op_type == "ConvTranspose":
        source = shapes[node.input[0]]
        return 2 * math.prod(source) * weight[1] * kernel
    out = shapes[node.output[0]]
    return 2 * math.prod(out) * weight[1] * kernel  # weight is C_out x C_in/groups x kernel


def _product_flops(node: onnx.NodeProto, shapes: dict[str, tuple[int, ...]]) -> int:
    left, out = shapes[node.input[0]], shapes[node.output[0]]
    transposed = node.op_type == "Gemm" and any(a.name == "transA" and a.i for a in node.attribute)
    inner = left[0] if transposed else left[-1]
    return 2 * math.prod(out) * inner


def _recurrent_flops(node: onnx.NodeProto, shapes: dict[str, tuple[int, ...]], gates: int) -> int:
    seq, batch, features = shapes[node.input[0]]
    hidden = next(a.i for a in node.attribute if a.name == "hidden_size")
    directions = shapes[node.input[1]][0]
    return 2 * gates * seq * batch * directions * (features + hidden) * hidden

