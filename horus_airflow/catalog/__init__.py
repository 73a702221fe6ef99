"""Built-in workloads: catalog names to PyTorch modules plus the inputs their datasets imply."""

from __future__ import annotations

import difflib
from dataclasses import dataclass

from torch import nn

from horus_airflow.catalog.datasets import DATASETS, Dataset
from horus_airflow.catalog.models import WORKLOADS, Workload
from horus_airflow.errors import InvalidJobError


@dataclass(frozen=True)
class ResolvedWorkload:
    """A catalog model paired with a dataset it can train on."""

    workload: Workload
    dataset: Dataset

    def build(self) -> nn.Module:
        return self.workload.build(self.dataset)


def resolve(model: str, dataset: str | None = None) -> ResolvedWorkload:
    """Pair a model name with a dataset, or explain which names and pairings are accepted."""
    workload = WORKLOADS.get(model)
    if workload is None:
        raise InvalidJobError(_unknown("model", model, WORKLOADS))
    data_name = dataset or workload.default_dataset
    data = DATASETS.get(data_name)
    if data is None:
        raise InvalidJobError(_unknown("dataset", data_name, DATASETS))
    if data.kind != workload.input_kind:
        fitting = sorted(n for n, d in DATASETS.items() if d.kind == workload.input_kind)
        raise InvalidJobError(
            f"model {model!r} takes {workload.input_kind} input but dataset {data_name!r} gives "
            f"{data.kind}; datasets that fit {model!r}: {', '.join(fitting)}"
        )
    return ResolvedWorkload(workload, data)


def _unknown(what: str, name: str, accepted: dict[str, object]) -> str:
    close = difflib.get_close_matches(name, accepted, n=3, cutoff=0.5)
    hint = f" Did you mean: {', '.join(close)}?" if close else ""
    return f"unknown {what} {name!r}.{hint} Accepted: {', '.join(sorted(accepted))}."


__all__ = ["DATASETS", "WORKLOADS", "ResolvedWorkload", "Workload", "resolve"]
