"""Users' own models: ``file.py:factory`` modules and ONNX graphs, their errors, and untraceable graphs."""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import pytest
import torch
import torchvision

from horus_airflow.errors import InvalidJobError
from horus_airflow.features import extract_features
from horus_airflow.features.gpus import GPU_SPECS
from horus_airflow.predictor import AnalyticPrior

SMALL_NET = """
from torch import nn

def build():
    return nn.Sequential(nn.Flatten(), nn.Linear(3 * 32 * 32, 256), nn.ReLU(), nn.Linear(256, 10))

def broken():
    raise RuntimeError("no GPU budget for this one")

def untraceable():
    class DataDependent(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(3 * 32 * 32, 10)

        def forward(self, x):
            if x.sum().item() > 0:  # reads a value: impossible on the meta device
                return self.fc(x.flatten(1))
            return self.fc(x.flatten(1)) * 2

    return DataDependent()
"""


@pytest.fixture
def user_file(tmp_path: Path) -> Path:
    path = tmp_path / "my_models.py"
    path.write_text(SMALL_NET)
    return path


def test_a_user_module_gets_the_same_features_as_the_catalog(user_file: Path) -> None:
    features = extract_features(f"{user_file}:build", 16, "cifar10")
    assert features.source == "module" and features.traced
    assert features.params == 3 * 32 * 32 * 256 + 256 + 256 * 10 + 10
    assert features.forward_flops == 2 * 16 * (3 * 32 * 32 * 256 + 256 * 10)
    assert features.layers_linear == 2 and features.layers_activation == 1


@pytest.mark.parametrize(
    ("reference", "message"),
    [
        ("{file}:broken", "user model factory .* raised RuntimeError: no GPU budget"),
        ("{file}:missing", "has no callable 'missing'; its callables: broken, build, untraceable"),
        ("{dir}/nowhere.py:build", "user module file not found"),
    ],
)
def test_user_module_errors_name_the_problem(user_file: Path, reference: str, message: str) -> None:
    model = reference.format(file=user_file, dir=user_file.parent)
    with pytest.raises(InvalidJobError, match=message):
        extract_features(model, 4, "cifar10")


def test_a_user_module_needs_a_dataset(user_file: Path) -> None:
    with pytest.raises(InvalidJobError, match="needs a dataset to know its input; accepted: .*cifar10"):
        extract_features(f"{user_file}:build", 4)


def test_a_failed_call_caches_nothing(user_file: Path) -> None:
    with pytest.raises(InvalidJobError):
        extract_features(f"{user_file}:later", 4, "cifar10")
    user_file.write_text(SMALL_NET + "\nlater = build\n")
    stat = user_file.stat()
    os.utime(user_file, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    assert extract_features(f"{user_file}:later", 4, "cifar10").traced


def test_an_untraceable_graph_still_gets_a_low_confidence_prediction(user_file: Path) -> None:
    features = extract_features(f"{user_file}:untraceable", 8, "cifar10")
    assert not features.traced
    assert features.params == 3 * 32 * 32 * 10 + 10 and features.train_flops > 0
    demand = AnalyticPrior().predict("j", features, 1, [GPU_SPECS["t4"]])
    assert demand.confidence == "low" and "low confidence" in demand.explained()
    assert 0 < demand.on("t4").util <= 100 and demand.on("t4").mem_mib > 0


@pytest.fixture(scope="module")
def resnet18_onnx(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("onnx") / "resnet18.onnx"
    net = torchvision.models.resnet18(num_classes=10).eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.onnx.export(net, (torch.randn(1, 3, 32, 32),), str(path), dynamo=False, input_names=["x"],
                          dynamic_axes={"x": {0: "batch"}})
    return path


@pytest.mark.integration
def test_onnx_forward_flops_match_pytorch_counts(resnet18_onnx: Path) -> None:
    from_onnx = extract_features(str(resnet18_onnx), 32, "cifar10")
    from_torch = extract_features("resnet18", 32, "cifar10")
    assert from_onnx.source == "onnx" and from_onnx.traced
    assert from_onnx.forward_flops == from_torch.forward_flops
    assert from_onnx.layers_conv == from_torch.layers_conv == 20
    assert from_onnx.params == pytest.approx(from_torch.params, rel=0.01)  # batch norms folded into convolutions
    assert from_onnx.train_flops == 3 * from_onnx.forward_flops


def test_a_file_that_is_not_onnx_is_refused(tmp_path: Path) -> None:
    fake = tmp_path / "model.onnx"
    fake.write_bytes(b"certainly not protobuf")
    with pytest.raises(InvalidJobError, match="is not a valid ONNX model"):
        extract_features(str(fake), 8)
    with pytest.raises(InvalidJobError, match="ONNX file not found"):
        extract_features(str(tmp_path / "absent.onnx"), 8)
