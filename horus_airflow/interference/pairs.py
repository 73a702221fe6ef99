"""Measured co-location pairs as the interference models learn from them: one row per ordered pair
(job A next to job B on one GPU type) with A's normalized speed, whether the pair ran at all, both jobs'
predicted demand on that GPU and their signatures."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from horus_airflow.errors import HorusError
from horus_airflow.features.gpus import GpuSpec, gpu_spec
from horus_airflow.features.graph import GraphFeatures
from horus_airflow.interference.base import SIGNATURE_FIELDS, demand_shares, signature
from horus_airflow.predictor.prior import AnalyticPrior

JOB_COLUMNS = ("util", "util_p90", "mem")
PAIR_COLUMNS = (
    "gpu_type", "job_a", "job_b", "family_a", "family_b", "speed_a", "fits",
    *(f"{c}_{side}" for side in "ab" for c in JOB_COLUMNS),
    *(f"{side}.{f}" for side in "ab" for f in SIGNATURE_FIELDS),
)
# A's speed never rises when its partner, or the pair together, asks more of the GPU.
MONOTONE_DECREASING = ("util_b", "util_p90_b", "summed_util", "sm_b", "bandwidth_b", "summed_sm", "summed_bandwidth")
DESIGN_COLUMNS = (
    *(f"a.{f}" for f in SIGNATURE_FIELDS), *(f"b.{f}" for f in SIGNATURE_FIELDS),
    "util_a", "util_p90_a", "mem_frac_a", "util_b", "util_p90_b", "mem_frac_b", "summed_util", "summed_mem_frac",
    "sm_a", "bandwidth_a", "sm_b", "bandwidth_b", "summed_sm", "summed_bandwidth",
    "gpu_log_fp32_tflops", "gpu_log_fp16_tflops", "gpu_bandwidth_gbs", "gpu_memory_mib", "gpu_sm_count",
)


def pair_row(gpu: str, sides: tuple[tuple[str, str, GraphFeatures], tuple[str, str, GraphFeatures]], speed_a: float | None,
             prior: AnalyticPrior) -> dict[str, object]:
    """One ordered pair in ``PAIR_COLUMNS``: each side is (job name, family, features); its demand columns are
    the analytic prior's on that GPU, so pairs do not depend on which predictor version is champion.
    ``speed_a`` is None when the pair could not run together."""
    row: dict[str, object] = {"gpu_type": gpu, "job_a": sides[0][0], "job_b": sides[1][0], "family_a": sides[0][1],
                              "family_b": sides[1][1], "speed_a": speed_a, "fits": speed_a is not None}
    for side, (_, _, features) in zip("ab", sides):
        demand = prior.predict_one(features, gpu_spec(gpu))
        row.update({f"util_{side}": demand.util, f"util_p90_{side}": demand.util_p90, f"mem_{side}": demand.mem_mib})
        row.update({f"{side}.{f}": value for f, value in zip(SIGNATURE_FIELDS, signature(features))})
    return row


def read_pairs(path: Path | str) -> pd.DataFrame:
    try:
        frame = pd.read_csv(path)
    except FileNotFoundError:
        raise HorusError(f"co-location pairs not found: {str(path)!r}") from None
    missing = [c for c in PAIR_COLUMNS if c not in frame.columns]
    if missing:
        raise HorusError(f"co-location pairs lack columns: {', '.join(missing)}; expected: {', '.join(PAIR_COLUMNS)}")
    frame["fits"] = frame["fits"].astype(str).str.lower().isin(["true", "1"])
    return frame


def gpu_columns(spec: GpuSpec) -> list[float]:
    return [float(np.log10(spec.fp32_tflops)), float(np.log10(spec.fp16_tensor_tflops)), spec.memory_bandwidth_gbs,
            float(spec.memory_mib), float(spec.sm_count)]


def design_matrix(pairs: pd.DataFrame) -> np.ndarray:
    """One design row per pair row, in ``DESIGN_COLUMNS`` order."""
    specs = {name: gpu_columns(gpu_spec(name)) for name in pairs["gpu_type"].unique()}
    memory = pairs["gpu_type"].map(lambda g: gpu_spec(g).memory_mib).to_numpy(dtype=float)
    signatures = pairs[[f"{side}.{f}" for side in "ab" for f in SIGNATURE_FIELDS]].to_numpy(dtype=float)
    mem_a, mem_b = pairs["mem_a"].to_numpy(dtype=float) / memory, pairs["mem_b"].to_numpy(dtype=float) / memory
    util_a, util_b = pairs["util_a"].to_numpy(dtype=float), pairs["util_b"].to_numpy(dtype=float)
    width = len(SIGNATURE_FIELDS)
    shares = np.array([
        [*demand_shares(ua, tuple(sig[:width]), gpu_spec(g)), *demand_shares(ub, tuple(sig[width:]), gpu_spec(g))]
        for ua, ub, sig, g in zip(util_a, util_b, signatures, pairs["gpu_type"])
    ]).reshape(-1, 4)
    demand = np.column_stack([util_a, pairs["util_p90_a"], mem_a, util_b, pairs["util_p90_b"], mem_b,
                              util_a + util_b, mem_a + mem_b, shares, shares[:, 0] + shares[:, 2], shares[:, 1] + shares[:, 3]])
    gpu = np.array([specs[g] for g in pairs["gpu_type"]])
    return np.column_stack([signatures, demand, gpu]).astype(float)
