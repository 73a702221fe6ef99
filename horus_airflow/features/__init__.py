"""Computation-graph features of a training job from a catalog name, a user's ``file.py:factory`` or an
ONNX file, counted on the meta device (no real memory).

PyTorch is imported when features are first counted, not with this package: ``features.gpus`` (the GPU
spec table) is read by the placer and by operators when Airflow parses a DAG file."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from horus_airflow.names import is_onnx, is_user_module

if TYPE_CHECKING:
    from horus_airflow.features.graph import GraphFeatures


def extract_features(
    model: str, batch_size: int, dataset: str | None = None, precision: str = "fp32", seq_len: int | None = None
) -> GraphFeatures:
    """Features of one training step. Results are cached per process; a user file's cache entry is
    keyed by its modification time, so editing the file re-counts it. Failed calls cache nothing."""
    return _cached(model, batch_size, dataset, precision, seq_len, _file_version(model))


@lru_cache(maxsize=512)
def _cached(model: str, batch_size: int, dataset: str | None, precision: str, seq_len: int | None, _version: float) -> GraphFeatures:
    if is_onnx(model):
        from horus_airflow.features.onnx_graph import onnx_features

        return onnx_features(model, batch_size, dataset, precision, seq_len)
    from horus_airflow.features.graph import torch_features

    return torch_features(model, batch_size, dataset, precision, seq_len)


def _file_version(model: str) -> float:
    location = model.rpartition(":")[0] if is_user_module(model) else model if is_onnx(model) else ""
    path = Path(location)
    return path.stat().st_mtime if location and path.is_file() else 0.0


def __getattr__(name: str) -> Any:
    if name == "GraphFeatures":
        from horus_airflow.features.graph import GraphFeatures

        return GraphFeatures
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["GraphFeatures", "extract_features"]
