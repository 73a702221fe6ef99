"""The predictor's training data: one row per measured job (what profiling runs export).

Columns, in this order (``docs/PREDICTOR.md`` documents each):

- ``origin``, ``origin_ref``: where the measurement comes from (a dataset name, ``profiling``) and its
  id there (row id, MLflow run id);
- ``gpu_type``: a key of the GPU spec table;
- every :class:`~horus_airflow.features.GraphFeatures` field;
- targets ``gpu_util`` (mean, 0-100), ``gpu_util_p90`` (0-100) and ``gpu_mem_mib`` (peak); a target may
  be empty when it was not measured, and a model for it is trained only from the rows that have it.

Validation never drops a row silently: rows that break the schema are set aside with their reason.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path

import pandas as pd

from horus_airflow.errors import HorusError
from horus_airflow.features.gpus import GPU_SPECS
from horus_airflow.features.graph import GraphFeatures

TARGETS = ("gpu_util", "gpu_util_p90", "gpu_mem_mib")
COLUMNS = ("origin", "origin_ref", "gpu_type", *(f.name for f in fields(GraphFeatures)), *TARGETS)


class TrainingDataError(HorusError):
    """The training data cannot be used at all (missing columns, no valid row)."""


@dataclass(frozen=True)
class ValidatedData:
    """Rows fit for training, and the rows set aside with a ``reason`` column."""

    rows: pd.DataFrame
    rejected: pd.DataFrame


def read_training_data(path: Path | str) -> ValidatedData:
    try:
        frame = pd.read_csv(path)
    except FileNotFoundError:
        raise TrainingDataError(f"training data not found: {str(path)!r}") from None
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
        raise TrainingDataError(f"{str(path)!r} is not a readable CSV: {exc}") from exc
    return validate(frame)


def validate(frame: pd.DataFrame) -> ValidatedData:
    """Check the schema, then each row: known GPU type, positive batch size and FLOPs, targets in range,
    at least one target, no duplicate of an earlier row (same origin and reference)."""
    missing = [c for c in COLUMNS if c not in frame.columns]
    if missing:
        raise TrainingDataError(
            f"training data lacks columns: {', '.join(missing)}; the schema is: {', '.join(COLUMNS)}"
        )
    frame = frame.loc[:, list(COLUMNS)].copy()
    reasons = pd.Series("", index=frame.index, dtype="object")

    def reject(mask: pd.Series, why: str) -> None:
        reasons[mask & (reasons == "")] = why

    for column in TARGETS:
        frame[column] = pd.to_numeric(frame[column], errors="coerce")
    reject(~frame["gpu_type"].isin(list(GPU_SPECS)), "unknown gpu_type")
    for column in ("batch_size", "train_flops", "params"):
        values = pd.to_numeric(frame[column], errors="coerce")
        reject(~(values > 0), f"{column} must be a positive number")
    reject(frame[list(TARGETS)].isna().all(axis=1), "no target measured")
    for column in ("gpu_util", "gpu_util_p90"):
        reject(~(frame[column].isna() | frame[column].between(0, 100)), f"{column} outside 0-100")
    reject(~(frame["gpu_mem_mib"].isna() | (frame["gpu_mem_mib"] > 0)), "gpu_mem_mib must be positive")
    reject(frame.duplicated(subset=["origin", "origin_ref"], keep="first"), "duplicate of an earlier row")
    good = reasons == ""
    rejected = frame[~good].assign(reason=reasons[~good])
    if not good.any():
        raise TrainingDataError(f"no valid training row among {len(frame)}; reasons: {sorted(set(reasons))}")
    return ValidatedData(frame[good].reset_index(drop=True), rejected.reset_index(drop=True))
