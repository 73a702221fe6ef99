"""Computation-graph features of a training job from a catalog name, a user's ``file.py:factory`` or an
ONNX file, counted on the meta device (no real memory)."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from horus_airflow.catalog import is_onnx
from horus_airflow.catalog.user import is_user_module
from horus_airflow.features.graph import GraphFeatures, torch_features
from horus_airflow.features.onnx_graph import onnx_features


def extract_features(
    model: str, batch_size: int, dataset: str | None = None, precision: str = "fp32", seq_len: int | None = None
) -> GraphFeatures:
    """Features of one training step. Results are cached per process; a user file's cache entry is
    keyed by its modification time, so editing the file re-counts it. Failed calls cache nothing."""
    return _cached(model, batch_size, dataset, precision, seq_len, _file_version(model))


@lru_cache(maxsize=512)
def _cached(model: str, batch_size: int, dataset: str | None, precision: str, seq_len: int | None, _version: float) -> GraphFeatures:
    if is_onnx(model):
        return onnx_features(model, batch_size, dataset, precision, seq_len)
    return torch_features(model, batch_size, dataset, precision, seq_len)


def _file_version(model: str) -> float:
    location = model.rpartition(":")[0] if is_user_module(model) else model if is_onnx(model) else ""
    path = Path(location)
    return path.stat().st_mtime if location and path.is_file() else 0.0


__all__ = ["GraphFeatures", "extract_features"]
