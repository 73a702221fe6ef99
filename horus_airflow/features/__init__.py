"""Computation-graph features of a training job, measured on the meta device (no real memory)."""

from horus_airflow.features.graph import GraphFeatures, extract_features

__all__ = ["GraphFeatures", "extract_features"]
